"""Exact integer GEMM (conv1d/conv2d, linear, batched matmul) for int8/int16 operands."""

from __future__ import annotations

import enum


class Overflow(enum.Enum):
    """What an int32 accumulator does past its range: SATURATE clamps, WRAP is two's complement."""

    SATURATE = "saturate"
    WRAP = "wrap"
