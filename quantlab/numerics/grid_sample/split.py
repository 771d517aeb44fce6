"""Splitting a grid_sample along W (bit-exact-emulation s.5.4): each part gets its own
re-normalized grid, so a NORMALIZED grid's step shrinks with the part's width."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample.grid import GridCoord, normalize, quantize_grid, unnormalize
from quantlab.numerics.grid_sample.sampling import Padding, SampleMode, grid_sample_fixed
from quantlab.numerics.rounding import Round, round_float


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
    part = round_float(xs / pw, Round.FLOOR).clamp(0, k - 1).to(torch.int64)
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
