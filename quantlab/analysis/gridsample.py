"""Measuring fixed-point grid_sample: test grids, textures, coordinate and output errors.

Everything here composes ``quantlab.numerics.grid_sample``; the numbers it returns are the
columns of the gridsample_split experiment. Positions are compared on the x axis (the wide one):
``grid`` error is the position the integer grid codes denote (exact dequantization) minus the
float position; ``kernel`` error is the position the kernel interpolates at (P-bit fixed point).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample import (
    Padding,
    QGrid,
    SampleMode,
    absolute_frac_bits,
    grid_positions_fixed,
    normalize,
    plan_split,
    quantize_grid,
    required_halo,
    split_grid_sample,
    unnormalize,
)
from quantlab.numerics.rounding import Round, rshift_round
from quantlab.platforms import GridCoord


class GridVariant(enum.Enum):
    """How the grid is held: the J6 normalised int16 grid (s.4), an int8 one, or absolute
    int16 Q(15-F).F pixel positions (bit-exact-emulation s.5.2)."""

    INT16_NORMALIZED = "int16_normalized"
    INT8_NORMALIZED = "int8_normalized"
    INT16_ABSOLUTE = "int16_absolute"

    @property
    def coord(self) -> GridCoord:
        return GridCoord.ABSOLUTE if self is GridVariant.INT16_ABSOLUTE else GridCoord.NORMALIZED

    @property
    def dtype(self) -> DType:
        return DType.INT8 if self is GridVariant.INT8_NORMALIZED else DType.INT16


class GridKind(enum.Enum):
    """Test grids, all spanning the whole input width.

    IDENTITY:    output points on input pixel centres (evenly spaced columns, all rows).
    SHIFT:       the identity moved by sub-pixel shifts: column j by (j mod 16 + 1/2)/16 px
                 in x and row i by (i mod 16 + 1/2)/16 px in y (1/32, 3/32, ..., 31/32 px;
                 no exact half-pixel ties, where float nearest itself is a coin toss).
    SMOOTH_WARP: evenly spread points displaced by a smooth random field of up to 4 px.
    HOMOGRAPHY:  a mild perspective map of the output rectangle onto the input.
    """

    IDENTITY = "identity"
    SHIFT = "shift"
    SMOOTH_WARP = "smooth_warp"
    HOMOGRAPHY = "homography"


def make_grid(
    kind: GridKind, h: int, w: int, ho: int, wo: int, align_corners: bool, gen: torch.Generator
) -> Tensor:
    """A float32 normalized grid [1, ho, wo, 2] of ``kind`` over an h x w input."""
    j = torch.arange(wo, dtype=torch.float64)
    i = torch.arange(ho, dtype=torch.float64)
    yy, xx = torch.meshgrid(i, j, indexing="ij")
    if kind in (GridKind.IDENTITY, GridKind.SHIFT):
        px = torch.floor(xx * (w - 1) / max(wo - 1, 1))
        py = torch.floor(yy * (h - 1) / max(ho - 1, 1))
        if kind is GridKind.SHIFT:
            px = px + (torch.remainder(xx, 16) + 0.5) / 16
            py = py + (torch.remainder(yy, 16) + 0.5) / 16
    elif kind is GridKind.SMOOTH_WARP:
        px = (xx + 0.5) * (w - 1) / wo
        py = (yy + 0.5) * (h - 1) / ho
        coarse = torch.rand(1, 2, 4, 16, generator=gen, dtype=torch.float64) * 8 - 4
        field = F.interpolate(coarse, size=(ho, wo), mode="bicubic", align_corners=True)[0]
        px = (px + field[0]).clamp(0, w - 1)
        py = (py + field[1]).clamp(0, h - 1)
    elif kind is GridKind.HOMOGRAPHY:
        u = (xx + 0.5) / wo  # [0, 1]
        v = (yy + 0.5) / ho
        den = 1 + 0.08 * u + 0.05 * v
        px = (0.02 + 0.95 * u + 0.01 * v) / den * (w - 1) / 0.96
        py = (0.03 + 0.02 * u + 0.9 * v) / den * (h - 1) / 0.95
        px, py = px.clamp(0, w - 1), py.clamp(0, h - 1)
    else:
        raise ValueError(f"grid kind must be one of {[k.name for k in GridKind]}, got {kind!r}")
    g = torch.stack([normalize(px, w, align_corners), normalize(py, h, align_corners)], -1)
    return g.to(torch.float32)[None]


def smooth_texture(h: int, w: int, feature_px: float, dtype: DType, gen: torch.Generator) -> Tensor:
    """Input codes [1, 1, h, w]: uniform noise on a grid ``feature_px`` coarser in both axes,
    bilinearly upsampled, scaled to the dtype's full range."""
    cw = max(2, math.ceil(w / feature_px) + 1)
    ch = max(2, math.ceil(h / feature_px) + 1)
    coarse = torch.rand(1, 1, ch, cw, generator=gen) * 2 - 1
    fine = F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=True)
    return torch.round(fine * dtype.qmax).clamp(dtype.qmin, dtype.qmax).to(dtype.torch_dtype)


@dataclass(frozen=True)
class Positions:
    """Per grid point: float x/y, the x the grid codes denote, the x/y the kernel interpolates
    at (pixels, float64, exact: P-bit integers over 2**P) and the kernel's nearest source
    indices (the P-bit position rounded HALF_EVEN, as ``grid_sample_fixed`` does for NEAREST)."""

    float_x: Tensor
    float_y: Tensor
    grid_x: Tensor
    kernel_x: Tensor
    kernel_y: Tensor
    nearest_x: Tensor  # int64
    nearest_y: Tensor


def _code_positions(q: QGrid) -> Tensor:
    c = q.codes[..., 0].to(torch.float64)
    if q.coord is GridCoord.ABSOLUTE:
        return c / (1 << q.frac_bits)
    return unnormalize(c * q.scale_x, q.in_w, q.align_corners)


def fixed_positions(
    grid: Tensor,
    h: int,
    w: int,
    k: int,
    align_corners: bool,
    variant: GridVariant,
    weight_frac_bits: int = 8,
    halo: int | None = None,
    coord_round: Round = Round.HALF_UP,
) -> Positions:
    """Where the fixed kernel samples each point when W is cut in ``k`` parts (k = 1: whole)."""
    if halo is None:
        halo = required_halo(w // k, variant.dtype, weight_frac_bits) if k > 1 else 0
    plan = plan_split(grid, w, k, halo, align_corners)
    fx = unnormalize(grid[..., 0], w, align_corners)
    fy = unnormalize(grid[..., 1], h, align_corners)
    gx, kx, ky = torch.zeros_like(fx), torch.zeros_like(fx), torch.zeros_like(fy)
    nx = torch.zeros_like(fx, dtype=torch.int64)
    ny = torch.zeros_like(nx)
    for p in range(k):
        q = quantize_grid(
            plan.local_grids[p],
            h,
            plan.hi[p] - plan.lo[p],
            align_corners,
            variant.coord,
            variant.dtype,
        )
        px, py, bits = grid_positions_fixed(q, weight_frac_bits, coord_round)
        sel = plan.part == p
        gx = torch.where(sel, _code_positions(q) + plan.lo[p], gx)
        kx = torch.where(sel, px.to(torch.float64) / (1 << bits) + plan.lo[p], kx)
        ky = torch.where(sel, py.to(torch.float64) / (1 << bits), ky)
        nx = torch.where(sel, rshift_round(px, bits, Round.HALF_EVEN) + plan.lo[p], nx)
        ny = torch.where(sel, rshift_round(py, bits, Round.HALF_EVEN), ny)
    return Positions(fx, fy, gx, kx, ky, nx, ny)


def predicted_step_px(w: int, k: int, variant: GridVariant, h: int, ho: int, wo: int) -> float:
    """Grid step in pixels: ``W/(2 qmax k)`` (normalized: W/(65534 k) for int16), or 2**-F."""
    if variant.coord is GridCoord.NORMALIZED:
        return w / (2 * variant.dtype.qmax * k)
    return 2.0 ** -absolute_frac_bits(max(h, w // k, ho, wo), variant.dtype)


def measure_case(
    x_codes: Tensor,
    x_dtype: DType,
    grid: Tensor,
    k: int,
    mode: SampleMode,
    align_corners: bool,
    variant: GridVariant,
    weight_frac_bits: int = 8,
) -> dict:
    """Coordinate and output errors of one case (split into k parts) against float sampling of
    the same integer input (so only grid_sample's own error is measured).

    Returns: coord_err_{max,mean}_px (grid codes), kernel_err_max_px, out_err_{max,mean}_lsb,
    psnr_db (peak = qmax - qmin), nearest_changed_share (NEAREST; NaN for BILINEAR), halo.
    """
    h, w = x_codes.shape[-2:]
    halo = required_halo(w // k, variant.dtype, weight_frac_bits) if k > 1 else 0
    pos = fixed_positions(grid, h, w, k, align_corners, variant, weight_frac_bits, halo)
    out = split_grid_sample(
        x_codes,
        1.0,
        x_dtype,
        grid,
        k,
        halo,
        mode,
        Padding.ZEROS,
        align_corners,
        variant.coord,
        variant.dtype,
        weight_frac_bits=weight_frac_bits,
    )
    ref = F.grid_sample(
        x_codes.to(torch.float64),
        grid.to(torch.float64),
        mode=mode.value,
        padding_mode="zeros",
        align_corners=align_corners,
    )
    err = (out.to(torch.float64) - ref).abs()
    mse = float((err**2).mean())
    peak = x_dtype.qmax - x_dtype.qmin
    cerr = (pos.grid_x - pos.float_x).abs()
    kerr = (pos.kernel_x - pos.float_x).abs()
    changed = float("nan")
    if mode is SampleMode.NEAREST:
        fx, fy = torch.round(pos.float_x), torch.round(pos.float_y)
        changed = float(((pos.nearest_x != fx) | (pos.nearest_y != fy)).to(torch.float64).mean())
    return {
        "halo": halo,
        "coord_err_max_px": float(cerr.max()),
        "coord_err_mean_px": float(cerr.mean()),
        "kernel_err_max_px": float(kerr.max()),
        "out_err_max_lsb": float(err.max()),
        "out_err_mean_lsb": float(err.mean()),
        "psnr_db": math.inf if mse == 0 else 10 * math.log10(peak**2 / mse),
        "nearest_changed_share": changed,
    }


def fold_pages(
    image: Tensor, grid: Tensor, n: int, multiple: int, rows: int
) -> tuple[Tensor, Tensor]:
    """Fold ``n`` copies of a page side by side into one W, as models fold cameras or maps
    into W before grid_sample.

    ``image`` [1, C, H, W0]; ``grid`` [1, H, W0, 2] normalized with align_corners=True over W0.
    Each page is zero-padded on the right to a multiple of ``multiple`` columns (Wp), page t
    occupies columns [t*Wp, t*Wp + W0). Only ``rows`` evenly spaced grid rows are kept. Returns
    the folded image [1, C, H, n*Wp] and grid [1, rows, n*W0, 2] (align_corners=True over n*Wp).
    """
    _, _, h, w0 = image.shape
    wp = -(-w0 // multiple) * multiple
    padded = F.pad(image, (0, wp - w0))
    folded = padded.repeat(1, 1, 1, n)
    sel = torch.linspace(0, grid.shape[1] - 1, min(rows, grid.shape[1])).round().long()
    g = grid[:, sel].to(torch.float64)
    px = unnormalize(g[..., 0], w0, True)
    tiles = [normalize(px + t * wp, n * wp, True) for t in range(n)]
    gx = torch.cat(tiles, dim=-1)
    gy = g[..., 1].repeat(1, 1, n)
    return folded, torch.stack([gx, gy], -1).to(torch.float32)


def unwarp_psnr(
    image: Tensor,
    grid: Tensor,
    k: int,
    variant: GridVariant,
    image_dtype: DType = DType.INT8,
    rows: int = 64,
    weight_frac_bits: int = 8,
) -> dict:
    """PSNR (dB, peak 1) of a fixed-point unwarp against float grid_sample of the same
    quantized image; ``image`` [1, C, H, W] in [0, 1], ``grid`` [1, Ho, Wo, 2] normalized
    (align_corners=True, as UVDoc). Only ``rows`` evenly spaced output rows are computed (the
    others are the same computation). The image is quantized with scale 1/qmax (symmetric)."""
    ho = grid.shape[1]
    sel = torch.linspace(0, ho - 1, min(rows, ho)).round().long()
    g = grid[:, sel]
    scale = 1.0 / image_dtype.qmax
    codes = torch.round(image / scale).clamp(image_dtype.qmin, image_dtype.qmax)
    codes = codes.to(image_dtype.torch_dtype)
    w = image.shape[-1]
    halo = required_halo(w // k, variant.dtype, weight_frac_bits) if k > 1 else 0
    out = split_grid_sample(
        codes,
        scale,
        image_dtype,
        g,
        k,
        halo,
        SampleMode.BILINEAR,
        Padding.ZEROS,
        True,
        variant.coord,
        variant.dtype,
        weight_frac_bits=weight_frac_bits,
    )
    ref = F.grid_sample(codes.to(torch.float64) * scale, g.to(torch.float64), align_corners=True)
    mse = float(((out.to(torch.float64) * scale - ref) ** 2).mean())
    return {
        "halo": halo,
        "psnr_db": math.inf if mse == 0 else 10 * math.log10(1.0 / mse),
        "max_abs_err": float((out.to(torch.float64) * scale - ref).abs().max()),
    }
