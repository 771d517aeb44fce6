"""The int15 MatMul split ``A (B_hi + B_lo)`` of two activations (seed recipe, j6-numerics s.6).

The second operand B of a MatMul, held by the toolchain as int16 codes ``c`` at scale ``s_B``,
is written as the part that int8 at its own int8 scale represents plus the remainder, each an
int8 tensor: ``B ~ s (B_hi + B_lo / 2**k)`` with ``s`` the int8 scale of the same range
(``split_hi_scale``). ``A B`` becomes two int8 x int8 MatMuls whose int32 accumulators combine
as ``acc_hi + acc_lo / 2**k`` (``split.combine_split``): about 15 bits of B (k = 7: 127.5 * 2**7
steps either side of 0) on an int8 MAC array.

The numerics are the Conv/Linear weight split's (``split.split_weight`` per tensor, the same
rounding, clipping and exactness argument) applied to B's value ``c * s_B`` (float32, one IEEE
product, the value the int16 operand carries); only the operand's origin differs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.accumulator import Overflow
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import dequantize
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round
from quantlab.numerics.scales import check_scale
from quantlab.numerics.split import (
    SplitCombine,
    check_split_k,
    combine_split,
    exact_matmul,
    int32_accumulate,
    split_fake_weight,
    split_weight,
)

SPLIT_OPERAND_DTYPE = DType.INT16
"""Dtype the split operand reaches the MatMul in (the toolchain holds it as int16)."""


def split_hi_scale(b_scale: Tensor | float, b_dtype: DType = SPLIT_OPERAND_DTYPE) -> Tensor:
    """Int8 scale of the range a ``b_dtype`` operand at ``b_scale`` covers: the scale rule
    amax / ((qmax - qmin) / 2) at int8 for the same amax, i.e. s_B * (qmax - qmin) / 255
    (257 s_B for int16). Computed in float64, rounded once to float32 (a scale, not a code)."""
    if not b_dtype.is_int or b_dtype.bits > 16:
        raise ValueError(f"split operand dtype must be INT8 or INT16, got {b_dtype.name}")
    s = check_scale(b_scale, "b_scale", torch.float64).reshape(())
    return (s * ((b_dtype.qmax - b_dtype.qmin) / 255.0)).to(torch.float32)


def split_operand(
    b_codes: Tensor, b_scale: Tensor | float, k: int, rounding: Round = Round.HALF_EVEN
) -> tuple[Tensor, Tensor, Tensor]:
    """(b_hi, b_lo, s): int8 halves of an int16 operand and the hi scale, with
    value(B) = fl32(c * s_B) ~ s (b_hi + b_lo / 2**k). ``split_weight`` per tensor: both halves
    round by ``rounding`` and clamp to int8. The int16 range maps onto [-127.5 s, 127.5 s], so
    for k <= 7 nothing clips and |value - s (b_hi + b_lo / 2**k)| <= s / 2**(k+1)."""
    check_split_k(k)
    if b_codes.is_floating_point():
        raise TypeError(f"split_operand expects integer codes, got {b_codes.dtype}")
    s_b = check_scale(b_scale, "b_scale").reshape(())
    s = split_hi_scale(s_b)
    hi, lo = split_weight(dequantize(b_codes, s_b), s, k, axis=None, rounding=rounding)
    return hi, lo, s


def split_operand_fake(
    b_value: Tensor, b_scale: Tensor | float, k: int, rounding: Round = Round.HALF_EVEN
) -> Tensor:
    """QAT value of a split operand: s (b_hi + b_lo / 2**k) as float32 (``split_fake_weight``
    per tensor) of the int16 operand's value ``b_value`` at ``b_scale``."""
    s = split_hi_scale(b_scale)
    return split_fake_weight(b_value.to(torch.float32), s, k, axis=None, rounding=rounding)


def split_int15_matmul(
    a_codes: Tensor,
    b_codes: Tensor,
    a_scale: float,
    b_scale: float,
    k: int,
    out_scale: float,
    out: DType,
    combine: SplitCombine,
    rounding: Round = Round.HALF_UP,
    operand_rounding: Round = Round.HALF_EVEN,
    scheme: Requant = Requant.MUL_SHIFT,
    overflow: Overflow = Overflow.SATURATE,
) -> Tensor:
    """a @ B with B split into int8 halves (``split_operand``): output codes in ``out``.

    acc_hi = a @ b_hi and acc_lo = a @ b_lo, exact sums held as int32 accumulators
    (``overflow``), combined by ``combine_split`` with real scale s_a * s / s_out (matmul
    broadcasting). For a float ``out`` (FLOAT16/FLOAT32) pass out_scale=1.0: floats come back.
    ``a_codes``: int8 (or int16 where the platform takes one int16 operand) codes.
    """
    b_hi, b_lo, s = split_operand(b_codes, b_scale, k, operand_rounding)
    acc_hi = int32_accumulate(exact_matmul(a_codes, b_hi), overflow)
    acc_lo = int32_accumulate(exact_matmul(a_codes, b_lo), overflow)
    sa = float(check_scale(a_scale, "a_scale", torch.float64))
    so = float(check_scale(out_scale, "out_scale", torch.float64))
    real = sa * float(s) / so
    return combine_split(acc_hi, acc_lo, k, real, out, combine, rounding=rounding, scheme=scheme)
