"""Where a runtime's quantize loop computes its last elements by another rule than the rest.

LiteRT's own QUANTIZE of codes wider than 8 bits (its int16 kernel; 8-bit codes go to
XNNPACK) runs a vector loop over whole blocks of ``VECTOR_BLOCK`` elements in memory order,
rne(fl32(x * fl32(1 / s))), and a scalar loop over the rest, the float64 quotient rounded half
away from zero (measured against LiteRT: ``tests/runtime/test_quantize_cast.py``).
``PlatformConfig.quantize_codes`` quantizes every element by the profile's rule
(``quantize.quantize``) and then recomputes that tail (``quantize_scalar_tail``).
"""

from __future__ import annotations

import enum
import math

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import int32_cast
from quantlab.numerics.rounding import Round, round_float
from quantlab.numerics.scales import check_scale

VECTOR_BLOCK = 8  # elements per pass of the vector loop SCALAR_FLOAT64_HALF_AWAY follows


class QuantizeTail(enum.Enum):
    """Elements a runtime's quantize loop computes by another rule than the rest.

    NONE:                      every element by the profile's quantize rule.
    SCALAR_FLOAT64_HALF_AWAY:  codes wider than 8 bits: the last (n mod 8) elements in the
                               runtime's memory order (4-d tensors channels last, NHWC; others
                               as stored) by int32(round_half_away(fl64(x) / fl64(s))), then
                               ``INT32_CAST``'s zero point and clamp (LiteRT's own QUANTIZE: a
                               vector loop over blocks of 8 and a scalar loop for the rest).
    """

    NONE = "none"
    SCALAR_FLOAT64_HALF_AWAY = "scalar_float64_half_away"


def tail_positions(shape: tuple[int, ...], channels_last: bool) -> list[tuple[int, ...]]:
    """Indices (into a tensor of ``shape``) of the last (n mod 8) elements in memory order, the
    order of the runtime's copy: channels last (N, H, W, C) for a 4-d NCHW tensor when
    ``channels_last``, else row-major; in that order."""
    n = math.prod(shape)
    order = (shape[0], shape[2], shape[3], shape[1]) if channels_last else tuple(shape)
    out = []
    for flat in range(n - n % VECTOR_BLOCK, n):
        idx = []
        for size in reversed(order):
            idx.append(flat % size)
            flat //= size
        idx.reverse()
        out.append((idx[0], idx[3], idx[1], idx[2]) if channels_last else tuple(idx))
    return out


def quantize_scalar_tail(
    codes: Tensor, x: Tensor, scale: Tensor | float, dtype: DType, zero_point: int = 0
) -> Tensor:
    """``codes`` (per-tensor codes of float ``x``, modified in place and returned) with the
    tail of ``QuantizeTail.SCALAR_FLOAT64_HALF_AWAY`` recomputed when ``dtype`` is wider than 8
    bits: r = round_half_away(fl64(x) / fl64(scale)), x as float32, the quotient rounded once
    to double (IEEE division) and its tie test exact; int32(r) with -2**31 for NaN and r outside
    [-2**31, 2**31), + ``zero_point`` wrapping in int32, clamped to the code range."""
    if dtype.bits <= 8 or codes.numel() % VECTOR_BLOCK == 0:
        return codes
    s = float(check_scale(scale, "scale").reshape(()))
    positions = tail_positions(tuple(x.shape), channels_last=x.dim() == 4)
    rows = tuple(torch.tensor(axis) for axis in zip(*positions))
    q = x[rows].to(torch.float32).to(torch.float64) / s
    r = round_float(q, Round.HALF_AWAY)
    codes[rows] = int32_cast(r, dtype.qmin, dtype.qmax, zero_point).to(codes.dtype)
    return codes
