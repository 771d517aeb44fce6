"""Integer grid_sample on a quantized grid (j6-numerics s.4; bit-exact-emulation s.5).

Each grid code becomes a source pixel position with ``P`` fractional bits: exact for ABSOLUTE
(P = F); for NORMALIZED the exact rational position is rounded once to P = ``weight_frac_bits``
bits with ``coord_round`` (both assumed, named arguments). Bilinear weights are
``(2^P - f, f)`` per axis, ``sum(v * wy * wx)`` is accumulated in int64 (2P fractional bits,
exact) and rounded once to the input's codes (scale and dtype of the input) with
``out_rounding``; nearest takes the pixel at the position rounded with ``nearest_round``
(assumed HALF_EVEN, PyTorch's ``nearbyint``). Padding acts on integer indices: ZEROS reads 0
outside, BORDER clamps indices. Layout as ``torch.nn.functional.grid_sample``: input
[N, C, H, W], grid [N, Ho, Wo, 2] (x, y).
"""

from __future__ import annotations

import enum
import math

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample.grid import GridCoord, QGrid
from quantlab.numerics.rounding import Round, rshift_round
from quantlab.numerics.scales import check_scale


class SampleMode(enum.Enum):
    """Interpolation: BILINEAR (4 neighbours, fixed-point weights) or NEAREST (one pixel)."""

    BILINEAR = "bilinear"
    NEAREST = "nearest"


class Padding(enum.Enum):
    """Outside the input: ZEROS reads value 0, BORDER repeats the edge pixel (clamped index)."""

    ZEROS = "zeros"
    BORDER = "border"


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
    check_scale(x_scale, "x_scale")
    if x_codes.is_floating_point() or x_codes.dtype == torch.bool:
        raise TypeError(f"x_codes must hold integer codes of {x_dtype.name}, got {x_codes.dtype}")
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
        x0, y0 = rshift_round(px, p, Round.FLOOR), rshift_round(py, p, Round.FLOOR)
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
