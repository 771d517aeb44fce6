"""The integer accumulator contract: what an int32 accumulator does with an exact sum."""

from __future__ import annotations

import enum

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType


class Overflow(enum.Enum):
    """What an int32 accumulator does past its range: SATURATE clamps, WRAP is two's complement."""

    SATURATE = "saturate"
    WRAP = "wrap"


def accumulate(
    acc: Tensor, dtype: DType = DType.INT32, overflow: Overflow = Overflow.SATURATE
) -> tuple[Tensor, int]:
    """Apply the accumulator contract to exact sums: (values in ``dtype``'s range, count).

    SATURATE clamps to [dtype.qmin, dtype.qmax]; WRAP is two's complement modulo 2**bits.
    Returns int64 values (so later integer math cannot wrap by accident) and the number of
    elements that were outside the range.
    """
    if acc.is_floating_point():
        raise TypeError(f"accumulate expects exact integer sums, got {acc.dtype}")
    if not dtype.is_int:
        raise ValueError(f"accumulator dtype must be an integer format, got {dtype.name}")
    a = acc.to(torch.int64)
    lo, hi = dtype.qmin, dtype.qmax
    outside = (a < lo) | (a > hi)
    count = int(outside.sum())
    if count == 0:
        return a, 0
    if overflow is Overflow.SATURATE:
        return a.clamp(lo, hi), count
    if overflow is Overflow.WRAP:
        return ((a - lo) % (1 << dtype.bits)) + lo, count
    raise ValueError(f"unknown overflow mode {overflow!r}; allowed: SATURATE, WRAP")
