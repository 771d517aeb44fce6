"""J6 int16 GEMM operands (j6-numerics s.6): an int16 operand is two int8 halves, so its usable
codes end below 32767, and an int16 matmul operand's scale is coarsened so that a K-term
int16 x int16 sum cannot overflow int32. The platform supplies ``operand_max`` (its
``int16_operand_max``) and decides whether to coarsen (``int16_matmul_coarsen``)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import QuantStats
from quantlab.numerics.scales import check_scale


def _check_operand_max(operand_max: int) -> int:
    if not 0 < operand_max <= DType.INT16.qmax:
        raise ValueError(f"int16 operand_max must be in [1, 32767], got {operand_max}")
    return int(operand_max)


def int16_operand_range(operand_max: int) -> tuple[int, int]:
    """Usable int16 GEMM operand codes: [-32768, operand_max] (s.6, inferred)."""
    return DType.INT16.qmin, _check_operand_max(operand_max)


def clamp_int16_operand(codes: Tensor, operand_max: int, stats: QuantStats | None = None) -> Tensor:
    """Saturate int16 operand codes to ``int16_operand_range`` (J6: int16 = two int8 halves).

    Returns int16 codes; values above ``operand_max`` are counted as saturated.
    """
    if codes.dtype != torch.int16:
        raise TypeError(f"clamp_int16_operand expects int16 codes, got {codes.dtype}")
    lo, hi = int16_operand_range(operand_max)
    if stats is not None:
        stats.total += codes.numel()
        stats.saturated += int((codes > hi).sum())
    return codes.clamp(lo, hi)


def int16_matmul_scale_factor(k: int, operand_max: int) -> float:
    """max(32767 / operand_max, sqrt(K / 2)): the factor by which the J6 plugin's integer
    matmul coarsens each int16 operand's scale so that a K-term int16 x int16 sum cannot
    overflow int32 (j6-numerics s.6). float64 arithmetic."""
    if k < 1:
        raise ValueError(f"K must be >= 1, got {k}")
    return max(32767.0 / _check_operand_max(operand_max), math.sqrt(k / 2.0))


def coarsen_int16_matmul_scale(scale: Tensor | float, k: int, operand_max: int) -> Tensor:
    """scale * int16_matmul_scale_factor(K, operand_max), one float32 product (the operand's
    new scale)."""
    f = int16_matmul_scale_factor(k, operand_max)
    return check_scale(scale, "scale") * torch.tensor(f, dtype=torch.float32)
