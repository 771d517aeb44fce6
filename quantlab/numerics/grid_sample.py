"""Fixed-point grid_sample: grid quantization, the integer kernel, W splitting and size limits.

Model of the hardware (j6-numerics s.4; bit-exact-emulation s.5):
  * the grid is held as integers, either NORMALIZED (the [-1, 1] grid per axis with the fixed
    scale ``(2/W + 1)/qmax``, ``(2/(W-1) + 1)/qmax`` with align_corners) or ABSOLUTE (pixel
    positions in Q(b-1-F).F, ``F = clamp(b - 1 - ceil(log2(D + 1)), 0, 8)``, D the largest side);
  * each grid code is turned into a source pixel position with ``P`` fractional bits: exact for
    ABSOLUTE (P = F); for NORMALIZED the exact rational position is rounded once to P =
    ``weight_frac_bits`` bits with ``coord_round`` (both assumed, named arguments);
  * bilinear weights are ``(2^P - f, f)`` per axis, ``sum(v * wy * wx)`` is accumulated in int64
    (2P fractional bits, exact) and rounded once to the input's codes (scale and dtype of the
    input) with ``out_rounding``; nearest takes the pixel at the position rounded with
    ``nearest_round`` (assumed HALF_EVEN, PyTorch's ``nearbyint``);
  * padding acts on integer indices: ZEROS reads 0 outside, BORDER clamps indices.

Layout as ``torch.nn.functional.grid_sample``: input [N, C, H, W], grid [N, Ho, Wo, 2] (x, y).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import quantize
from quantlab.numerics.rounding import Round, round_float, rshift_round
from quantlab.platforms import GridCoord

ABS_MAX_FRAC_BITS = 8  # cap on F of the absolute format (bit-exact-emulation s.5.2)


class SampleMode(enum.Enum):
    """Interpolation: BILINEAR (4 neighbours, fixed-point weights) or NEAREST (one pixel)."""

    BILINEAR = "bilinear"
    NEAREST = "nearest"


class Padding(enum.Enum):
    """Outside the input: ZEROS reads value 0, BORDER repeats the edge pixel (clamped index)."""

    ZEROS = "zeros"
    BORDER = "border"


class NanRule(enum.Enum):
    """What quantize_grid does with NaN grid values.

    RAISE:     ValueError naming the count (the default: a NaN grid is a model bug).
    ZERO_CODE: the lab's quantize rule (NaN -> code 0, the image centre for NORMALIZED grids,
               pixel 0 for ABSOLUTE ones); the count is kept in ``QGrid.nan_count``.
    """

    RAISE = "raise"
    ZERO_CODE = "zero_code"


@dataclass(frozen=True)
class QGrid:
    """A quantized grid: int codes [N, Ho, Wo, 2] (x, y) plus what maps them to pixels.

    NORMALIZED: value = code * scale (per axis). ABSOLUTE: pixel = code / 2**frac_bits.
    """

    codes: Tensor
    coord: GridCoord
    dtype: DType
    in_h: int
    in_w: int
    align_corners: bool
    scale_x: float = 0.0  # NORMALIZED only (float32 value)
    scale_y: float = 0.0
    frac_bits: int = 0  # ABSOLUTE only
    nan_count: int = 0


def normalized_grid_scale(size: int, dtype: DType, align_corners: bool) -> float:
    """The fixed per-axis grid scale ``(2/size + 1)/qmax`` (``2/(size-1)`` with align_corners).

    float64 arithmetic rounded once to float32 (returned as a Python float). The int range then
    covers [-1 - 2/size, 1 + 2/size]: the image plus one pixel of margin (j6-numerics s.4).
    """
    _check_size("size", size)
    margin = 2.0 / (max(size - 1, 1) if align_corners else size)
    return float(np.float32((margin + 1.0) / dtype.qmax))


def absolute_frac_bits(max_side: int, dtype: DType) -> int:
    """F = clamp(bits - 1 - ceil(log2(D + 1)), 0, 8) for the absolute Q-format (s.5.2)."""
    _check_size("max_side", max_side)
    int_bits = math.ceil(math.log2(max_side + 1))
    return int(min(max(dtype.bits - 1 - int_bits, 0), ABS_MAX_FRAC_BITS))


def unnormalize(g: Tensor, size: int, align_corners: bool) -> Tensor:
    """PyTorch's pixel position of a normalized coordinate, in float64 (exact for float32 g)."""
    g = g.to(torch.float64)
    if align_corners:
        return (g + 1) / 2 * (size - 1)
    return ((g + 1) * size - 1) / 2


def normalize(x: Tensor, size: int, align_corners: bool) -> Tensor:
    """Inverse of ``unnormalize``: pixel position -> normalized coordinate (float64)."""
    x = x.to(torch.float64)
    if align_corners:
        return 2 * x / max(size - 1, 1) - 1
    return (2 * x + 1) / size - 1


def quantize_grid(
    grid: Tensor,
    in_h: int,
    in_w: int,
    align_corners: bool,
    coord: GridCoord,
    dtype: DType = DType.INT16,
    rounding: Round = Round.HALF_EVEN,
    on_nan: NanRule = NanRule.RAISE,
    max_side: int | None = None,
) -> QGrid:
    """Quantize a float normalized grid [N, Ho, Wo, 2] the way the device holds it.

    NORMALIZED: ``clamp(round(g / s_axis))`` via ``quantize`` (float32 division, one rounding).
    ABSOLUTE: ``clamp(round(unnormalize(g) * 2**F))``; the pixel position is exact in float64 and
    the product by 2**F is exact, so this is one rounding of the exact value. F comes from
    ``max_side`` (default: the largest of in_h, in_w, Ho, Wo).
    Saturation: clamps to the dtype's range; +-inf saturate. NaN: ``on_nan``.
    """
    if not dtype.is_int or dtype is DType.INT32:
        raise ValueError(f"grid dtype must be INT8 or INT16, got {dtype.name}")
    if grid.dim() != 4 or grid.shape[-1] != 2:
        raise ValueError(f"grid must have shape [N, Ho, Wo, 2], got {tuple(grid.shape)}")
    _check_size("in_h", in_h)
    _check_size("in_w", in_w)
    nan = int(torch.isnan(grid).sum())
    if nan and on_nan is NanRule.RAISE:
        raise ValueError(
            f"grid holds {nan} NaN values; grid_sample needs finite coordinates "
            "(on_nan=ZERO_CODE maps NaN to code 0 as quantize does)"
        )
    g = torch.nan_to_num(grid.to(torch.float32), nan=0.0)
    if coord is GridCoord.NORMALIZED:
        sx = normalized_grid_scale(in_w, dtype, align_corners)
        sy = normalized_grid_scale(in_h, dtype, align_corners)
        cx = quantize(g[..., 0], sx, dtype, rounding)
        cy = quantize(g[..., 1], sy, dtype, rounding)
        codes = torch.stack([cx, cy], dim=-1)
        return QGrid(codes, coord, dtype, in_h, in_w, align_corners, sx, sy, 0, nan)
    if coord is GridCoord.ABSOLUTE:
        d = max_side if max_side is not None else max(in_h, in_w, grid.shape[1], grid.shape[2])
        f = absolute_frac_bits(d, dtype)
        px = unnormalize(g[..., 0], in_w, align_corners) * (1 << f)
        py = unnormalize(g[..., 1], in_h, align_corners) * (1 << f)
        codes = torch.stack([px, py], dim=-1)
        codes = round_float(codes, rounding).clamp(dtype.qmin, dtype.qmax)
        return QGrid(
            codes.to(dtype.torch_dtype),
            coord,
            dtype,
            in_h,
            in_w,
            align_corners,
            frac_bits=f,
            nan_count=nan,
        )
    raise ValueError(f"coord must be one of {[c.name for c in GridCoord]}, got {coord!r}")


def _float32_parts(s: float) -> tuple[int, int]:
    """s (a positive float32 value) = M / 2**E exactly, M < 2**24."""
    m, e = math.frexp(s)
    return int(m * (1 << 24)), 24 - e


def grid_positions_fixed(
    qgrid: QGrid, weight_frac_bits: int = 8, coord_round: Round = Round.HALF_UP
) -> tuple[Tensor, Tensor, int]:
    """Source pixel positions (x, y) as int64 with P fractional bits; returns (x, y, P).

    ABSOLUTE: the codes themselves (P = frac_bits, exact).
    NORMALIZED: the exact rational position of ``code * scale`` (unnormalized as PyTorch does)
    rounded once to P = ``weight_frac_bits`` bits with ``coord_round`` (assumed).
    Exactness: scale = M/2**E (float32), so ``x * 2**P = ((c*M + 2**E) * W - 2**E) * 2**P /
    2**(E+1)`` (align_corners=False; ``(c*M + 2**E)*(W-1)`` with True): integer numerator,
    power-of-two denominator, one ``rshift_round``; ValueError if the numerator could pass 2**62.
    """
    if qgrid.coord is GridCoord.ABSOLUTE:
        c = qgrid.codes.to(torch.int64)
        return c[..., 0].clone(), c[..., 1].clone(), qgrid.frac_bits
    if not 0 <= weight_frac_bits <= 15:
        raise ValueError(f"weight_frac_bits must be in [0, 15], got {weight_frac_bits}")
    c = qgrid.codes.to(torch.int64)
    xs = _normalized_axis_fixed(
        c[..., 0],
        qgrid.scale_x,
        qgrid.in_w,
        qgrid.align_corners,
        weight_frac_bits,
        coord_round,
        qgrid.dtype,
    )
    ys = _normalized_axis_fixed(
        c[..., 1],
        qgrid.scale_y,
        qgrid.in_h,
        qgrid.align_corners,
        weight_frac_bits,
        coord_round,
        qgrid.dtype,
    )
    return xs, ys, weight_frac_bits


def _normalized_axis_fixed(
    c: Tensor, scale: float, size: int, align: bool, p: int, rnd: Round, dtype: DType
) -> Tensor:
    m, e = _float32_parts(scale)
    mult = size - 1 if align else size
    bound = (max(-dtype.qmin, dtype.qmax) * m + (1 << e)) * mult + (1 << e)
    if bound << max(p - e - 1, 0) >= 1 << 62:
        raise ValueError(
            f"grid position numerator could reach 2**62 (size={size}, scale={scale}); "
            "split the input (split_grid_sample) to reduce the size"
        )
    num = (c * m + (1 << e)) * mult
    if not align:
        num = num - (1 << e)
    shift = e + 1 - p
    if shift >= 0:
        return rshift_round(num, shift, rnd)
    return num << (-shift)


def _gather(x: Tensor, iy: Tensor, ix: Tensor, padding: Padding) -> Tensor:
    """x [N, C, H, W] integer codes; iy, ix [N, M] int64 -> int64 [N, C, M] with the padding
    rule (gathers in x's own dtype: the whole input is never widened)."""
    n, ch, h, w = x.shape
    if padding is Padding.BORDER:
        inside = torch.ones_like(ix, dtype=torch.bool)
    else:
        inside = (ix >= 0) & (ix < w) & (iy >= 0) & (iy < h)
    flat = iy.clamp(0, h - 1) * w + ix.clamp(0, w - 1)
    vals = torch.gather(x.reshape(n, ch, h * w), 2, flat.unsqueeze(1).expand(n, ch, -1))
    vals = vals.to(torch.int64)
    return torch.where(inside.unsqueeze(1), vals, torch.zeros((), dtype=vals.dtype))


def grid_sample_fixed(
    x_codes: Tensor,
    x_scale: float | Tensor,
    x_dtype: DType,
    qgrid: QGrid,
    mode: SampleMode = SampleMode.BILINEAR,
    padding_mode: Padding = Padding.ZEROS,
    align_corners: bool = False,
    out_rounding: Round = Round.HALF_UP,
    weight_frac_bits: int = 8,
    coord_round: Round = Round.HALF_UP,
    nearest_round: Round = Round.HALF_EVEN,
) -> Tensor:
    """Integer grid_sample; returns codes [N, C, Ho, Wo] in ``x_dtype`` at the input's scale.

    Rounding: positions as in ``grid_positions_fixed``; bilinear output = ``sum(v * wy * wx)``
    (int64, 2P fractional bits, exact) rounded once by ``out_rounding`` (assumed HALF_UP);
    nearest index = position rounded by ``nearest_round``.
    Saturation: the result is a convex combination of input codes (or 0), so it stays in range;
    it is clamped to ``x_dtype`` all the same.
    ``x_scale`` is the input's (and so the output's) scale; it does not enter the integer math.
    """
    if not x_dtype.is_int:
        raise ValueError(f"x_dtype must be an integer dtype, got {x_dtype.name}")
    s = torch.as_tensor(x_scale, dtype=torch.float64)
    if not bool(torch.isfinite(s).all() & (s > 0).all()):
        raise ValueError(f"x_scale must be finite and > 0, got {x_scale}")
    if x_codes.dim() != 4:
        raise ValueError(f"x_codes must have shape [N, C, H, W], got {tuple(x_codes.shape)}")
    n, _, h, w = x_codes.shape
    if (h, w) != (qgrid.in_h, qgrid.in_w) or qgrid.codes.shape[0] != n:
        raise ValueError(
            f"grid was quantized for N={qgrid.codes.shape[0]}, H={qgrid.in_h}, W={qgrid.in_w}; "
            f"input has N={n}, H={h}, W={w}"
        )
    if qgrid.align_corners != align_corners:
        raise ValueError("align_corners differs from the one the grid was quantized with")
    x = x_codes if x_codes.dtype == x_dtype.torch_dtype else x_codes.to(torch.int64)
    ho, wo = qgrid.codes.shape[1:3]
    px, py, p = grid_positions_fixed(qgrid, weight_frac_bits, coord_round)
    px, py = px.reshape(n, -1), py.reshape(n, -1)
    if mode is SampleMode.NEAREST:
        ix = rshift_round(px, p, nearest_round)
        iy = rshift_round(py, p, nearest_round)
        out = _gather(x, iy, ix, padding_mode)
    elif mode is SampleMode.BILINEAR:
        one = 1 << p
        x0, y0 = px >> p, py >> p
        fx, fy = px - (x0 << p), py - (y0 << p)
        acc = torch.zeros((n, x.shape[1]) + px.shape[1:], dtype=torch.int64)
        for dy, wy in ((0, one - fy), (1, fy)):
            for dx, wx in ((0, one - fx), (1, fx)):
                acc += _gather(x, y0 + dy, x0 + dx, padding_mode) * (wy * wx).unsqueeze(1)
        out = rshift_round(acc, 2 * p, out_rounding)
    else:
        raise ValueError(f"mode must be one of {[m.name for m in SampleMode]}, got {mode!r}")
    out = out.clamp(x_dtype.qmin, x_dtype.qmax)
    return out.reshape(n, -1, ho, wo).to(x_dtype.torch_dtype)


# --------------------------------------------------------------------------- size limits


def grid_limit_violation(h: int, w: int, max_side: int, max_area: int) -> str | None:
    """A sentence naming the broken limit (H, W <= max_side; H*W <= max_area; 0 = none) or None."""
    if max_side and (h > max_side or w > max_side):
        return f"H={h}, W={w} exceed grid_max_side={max_side} (H, W must be in [1, {max_side}])"
    if max_area and h * w > max_area:
        return f"H*W={h * w} exceeds grid_max_area={max_area}"
    return None


def check_grid_limits(h: int, w: int, platform) -> None:
    """Raise ValueError if an H x W grid_sample input breaks the platform's size limits.

    Limits: ``platform.grid_max_side`` (H, W) and ``platform.grid_max_area`` (H*W); 0 = none.
    """
    _check_size("h", h)
    _check_size("w", w)
    msg = grid_limit_violation(h, w, platform.grid_max_side, platform.grid_max_area)
    if msg is not None:
        raise ValueError(
            f"grid_sample input {h}x{w} is not supported on {platform.name}: {msg} "
            "(platform.grid_max_side / platform.grid_max_area); split W with split_grid_sample"
        )


def _check_size(name: str, v: int) -> None:
    if int(v) != v or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v}")


# --------------------------------------------------------------------------- W splitting


@dataclass(frozen=True)
class SplitPlan:
    """How a width-W input is cut into k parts: part p reads columns [lo[p], hi[p]).

    ``part`` [N, Ho, Wo] is the part each grid point is routed to (the one whose core
    [p*W/k, (p+1)*W/k) holds its float source x; points left or right of the image go to the
    first or last part); ``local_grids[p]`` is the float32 grid re-normalized to part p.
    """

    k: int
    halo: int
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    part: Tensor
    local_grids: tuple[Tensor, ...]


def required_halo(part_w: int, dtype: DType, weight_frac_bits: int = 8) -> int:
    """Columns a part needs beyond its core: 1 (bilinear neighbour) + ceil(max position error).

    Max position error of a NORMALIZED grid on a width ``part_w + 2*halo`` part: half a grid
    step ``(width/2 + 1)/qmax`` plus 2**-P; iterated to a fixed point.
    """
    halo = 1
    for _ in range(64):
        width = part_w + 2 * halo
        err = (width / 2 + 1) / dtype.qmax / 2 + 2.0**-weight_frac_bits
        new = 1 + math.ceil(err)
        if new == halo:
            return halo
        halo = new
    raise ValueError(f"no halo fits a part of width {part_w} with a {dtype.name} grid")


def plan_split(grid: Tensor, in_w: int, k: int, halo: int, align_corners: bool) -> SplitPlan:
    """Cut W into k equal parts (k must divide W) with ``halo`` extra columns on inner sides."""
    if not isinstance(k, int) or k < 1 or in_w % k:
        divisors = [d for d in range(1, min(in_w, 64) + 1) if in_w % d == 0]
        raise ValueError(
            f"split count k={k} must be a positive integer dividing W={in_w}; "
            f"allowed k (up to 64): {divisors}"
        )
    if halo < 0:
        raise ValueError(f"halo must be >= 0, got {halo}")
    if torch.isnan(grid).any():
        raise ValueError("grid holds NaN values; cannot route points to parts")
    pw = in_w // k
    lo = tuple(max(0, p * pw - halo) for p in range(k))
    hi = tuple(min(in_w, (p + 1) * pw + halo) for p in range(k))
    xs = unnormalize(grid[..., 0], in_w, align_corners)
    part = torch.floor(xs / pw).clamp(0, k - 1).to(torch.int64)
    local = []
    for p in range(k):
        gx = normalize(xs - lo[p], hi[p] - lo[p], align_corners).to(torch.float32)
        local.append(torch.stack([gx, grid[..., 1].to(torch.float32)], dim=-1))
    return SplitPlan(k, halo, lo, hi, part, tuple(local))


def split_grid_sample(
    x_codes: Tensor,
    x_scale: float | Tensor,
    x_dtype: DType,
    grid: Tensor,
    k: int,
    halo: int | None = None,
    mode: SampleMode = SampleMode.BILINEAR,
    padding_mode: Padding = Padding.ZEROS,
    align_corners: bool = False,
    coord: GridCoord = GridCoord.NORMALIZED,
    grid_dtype: DType = DType.INT16,
    grid_rounding: Round = Round.HALF_EVEN,
    out_rounding: Round = Round.HALF_UP,
    weight_frac_bits: int = 8,
    coord_round: Round = Round.HALF_UP,
) -> Tensor:
    """Sample W in k parts: each part (core W/k plus ``halo`` columns, default
    ``required_halo``) gets its own re-normalized grid, quantized with its own scale; each point
    takes the output of the part it is routed to (``plan_split``). Exact: the combination is a
    selection of integer codes. Returns codes [N, C, Ho, Wo] at the input's scale and dtype.
    Errors: ValueError if k does not divide W or the grid holds NaN.
    """
    w = x_codes.shape[-1]
    if halo is None:
        halo = required_halo(w // max(k, 1), grid_dtype, weight_frac_bits) if k > 1 else 0
    plan = plan_split(grid, w, k, halo, align_corners)
    out = None
    for p in range(k):
        xp = x_codes[..., plan.lo[p] : plan.hi[p]]
        q = quantize_grid(
            plan.local_grids[p],
            xp.shape[-2],
            xp.shape[-1],
            align_corners,
            coord,
            grid_dtype,
            grid_rounding,
            max_side=None,
        )
        op = grid_sample_fixed(
            xp,
            x_scale,
            x_dtype,
            q,
            mode,
            padding_mode,
            align_corners,
            out_rounding,
            weight_frac_bits,
            coord_round,
        )
        sel = (plan.part == p).unsqueeze(1)
        out = torch.where(sel, op, torch.zeros((), dtype=op.dtype) if out is None else out)
    return out


# --------------------------------------------------------------------------- reference


def _round_fraction(v: Fraction, mode: Round) -> int:
    f = v.numerator // v.denominator
    r = v - f
    half = Fraction(1, 2)
    if mode is Round.FLOOR:
        return f
    if mode is Round.TRUNC:
        return f if (v >= 0 or r == 0) else f + 1
    if r != half:
        return f + 1 if r > half else f
    if mode is Round.HALF_UP:
        return f + 1
    if mode is Round.HALF_AWAY:
        return f + 1 if v > 0 else f
    return f + (f & 1)  # HALF_EVEN


def grid_sample_reference(
    x_codes: Tensor,
    x_dtype: DType,
    qgrid: QGrid,
    mode: SampleMode = SampleMode.BILINEAR,
    padding_mode: Padding = Padding.ZEROS,
    out_rounding: Round = Round.HALF_UP,
    weight_frac_bits: int = 8,
    coord_round: Round = Round.HALF_UP,
    nearest_round: Round = Round.HALF_EVEN,
) -> Tensor:
    """Slow, obviously correct twin of ``grid_sample_fixed``: Python ints and Fractions, loops.

    Position: the exact rational ``unnormalize(code * scale)`` (Fraction) rounded to P bits;
    ABSOLUTE codes are taken as they are. Then the textbook bilinear/nearest formula per pixel.
    """
    xs = x_codes.to(torch.int64).numpy()
    codes = qgrid.codes.to(torch.int64).numpy()
    n, ch, h, w = xs.shape
    _, ho, wo, _ = codes.shape
    out = np.zeros((n, ch, ho, wo), dtype=np.int64)
    if qgrid.coord is GridCoord.ABSOLUTE:
        p = qgrid.frac_bits
    else:
        p = weight_frac_bits
    one = 1 << p

    def position(code: int, scale: float, size: int) -> int:
        if qgrid.coord is GridCoord.ABSOLUTE:
            return code
        g = Fraction(code) * Fraction(scale)
        if qgrid.align_corners:
            pos = (g + 1) / 2 * (size - 1)
        else:
            pos = ((g + 1) * size - 1) / 2
        return _round_fraction(pos * one, coord_round)

    def pixel(b: int, c: int, iy: int, ix: int) -> int:
        if padding_mode is Padding.BORDER:
            iy, ix = min(max(iy, 0), h - 1), min(max(ix, 0), w - 1)
        elif not (0 <= iy < h and 0 <= ix < w):
            return 0
        return int(xs[b, c, iy, ix])

    for b in range(n):
        for i in range(ho):
            for j in range(wo):
                px = position(int(codes[b, i, j, 0]), qgrid.scale_x, w)
                py = position(int(codes[b, i, j, 1]), qgrid.scale_y, h)
                for c in range(ch):
                    if mode is SampleMode.NEAREST:
                        ix = _round_fraction(Fraction(px, one), nearest_round)
                        iy = _round_fraction(Fraction(py, one), nearest_round)
                        v = pixel(b, c, iy, ix)
                    else:
                        x0, y0 = px // one, py // one
                        fx, fy = px - x0 * one, py - y0 * one
                        acc = (
                            pixel(b, c, y0, x0) * (one - fy) * (one - fx)
                            + pixel(b, c, y0, x0 + 1) * (one - fy) * fx
                            + pixel(b, c, y0 + 1, x0) * fy * (one - fx)
                            + pixel(b, c, y0 + 1, x0 + 1) * fy * fx
                        )
                        v = _round_fraction(Fraction(acc, one * one), out_rounding)
                    out[b, c, i, j] = min(max(v, x_dtype.qmin), x_dtype.qmax)
    return torch.from_numpy(out).to(x_dtype.torch_dtype)
