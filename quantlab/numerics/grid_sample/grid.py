"""The grid of a fixed-point grid_sample: how the device holds coordinates (j6-numerics s.4;
bit-exact-emulation s.5).

The grid is held as integers, either NORMALIZED (the [-1, 1] grid per axis with the fixed scale
``(2/W + 1)/qmax``, ``(2/(W-1) + 1)/qmax`` with align_corners) or ABSOLUTE (pixel positions in
Q(b-1-F).F, ``F = clamp(b - 1 - ceil(log2(D + 1)), 0, 8)``, D the largest side). Layout as
``torch.nn.functional.grid_sample``: grid [N, Ho, Wo, 2] (x, y).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import dequantize, quantize
from quantlab.numerics.rounding import Round, round_float

ABS_MAX_FRAC_BITS = 8  # cap on F of the absolute format (bit-exact-emulation s.5.2)


class GridCoord(enum.Enum):
    """How grid_sample coordinates are held in fixed point.

    NORMALIZED: the [-1, 1] grid as int16 with scale (2/W + 1)/32767 per axis (j6-numerics s.4).
    ABSOLUTE:   absolute pixel positions in Q(15-F).F, F = clamp(15 - ceil(log2(D+1)), 0, 8)
                (bit-exact-emulation s.5.2).
    """

    NORMALIZED = "normalized"
    ABSOLUTE = "absolute"


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
    check_size("size", size)
    margin = 2.0 / (max(size - 1, 1) if align_corners else size)
    return float(np.float32((margin + 1.0) / dtype.qmax))


def absolute_frac_bits(max_side: int, dtype: DType) -> int:
    """F = clamp(bits - 1 - ceil(log2(D + 1)), 0, 8) for the absolute Q-format (s.5.2)."""
    check_size("max_side", max_side)
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
    check_size("in_h", in_h)
    check_size("in_w", in_w)
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


def fake_quant_grid(
    grid: Tensor,
    in_h: int,
    in_w: int,
    align_corners: bool,
    coord: GridCoord,
    dtype: DType = DType.INT16,
    rounding: Round = Round.HALF_EVEN,
    on_nan: NanRule = NanRule.ZERO_CODE,
) -> Tensor:
    """QAT numerics of a grid: the float32 normalized grid that ``quantize_grid``'s codes stand
    for. NORMALIZED: codes * scale per axis (one float32 product each); ABSOLUTE: the pixel
    position code / 2**F (exact in float64) normalized back, rounded once to float32."""
    qg = quantize_grid(grid, in_h, in_w, align_corners, coord, dtype, rounding, on_nan)
    if qg.coord is GridCoord.NORMALIZED:
        scale = torch.tensor([qg.scale_x, qg.scale_y], dtype=torch.float32)
        return dequantize(qg.codes, scale, axis=-1)
    pos = qg.codes.to(torch.float64) / (1 << qg.frac_bits)
    gx = normalize(pos[..., 0], in_w, align_corners)
    gy = normalize(pos[..., 1], in_h, align_corners)
    return torch.stack([gx, gy], -1).to(torch.float32)


def check_size(name: str, v: int) -> None:
    """ValueError naming ``name`` unless ``v`` is a positive integer (an image side)."""
    if int(v) != v or v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v}")
