"""FLOAT_RESCALE requantization of exact GEMM sums in float32 passes, where provably the
general form's bits.

The general form (``finish.finish_gemm``, ``requant.requantize``) computes the exact int64
sum plus bias codes, applies the int32 accumulator, then ``fl32(fl32(acc + b) * M)``, rounds
it by ``requant_round``, adds the output zero point and saturates. When
``max|acc| + max|b| < 2**31`` the int32 accumulator changes nothing. When acc is float32
(exact integers) or ``max|acc| <= 2**24`` (its float32 conversion is exact) and every bias code
is a float32, ``fl32(acc) + fl32(b)`` is one IEEE addition of exact operands: the exact sum
rounded once to nearest even, ``fl32(acc + b)``. Then one float32 product by M, the same
rounding, and ``clamp(r + z, lo, hi) = clamp(r, lo - z, hi - z) + z`` (small exact integers)
give the same codes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.dtypes import FLOAT32_EXACT, DType
from quantlab.numerics.gemm.shift_form import INT32_LIMIT
from quantlab.numerics.rounding import Round, round_float_


def exact_bound(acc: Tensor, bias_max: int, sum_bound: int | None) -> int | None:
    """A bound on max|acc| under which the float32 form is exact (module docstring), from
    ``sum_bound`` or, when that is missing or too loose, measured; None when none holds."""
    f32 = acc.dtype == torch.float32
    if (
        sum_bound is None
        or sum_bound + bias_max >= INT32_LIMIT
        or (not f32 and sum_bound > FLOAT32_EXACT)
    ):
        if not acc.numel():
            return None
        a_lo, a_hi = torch.aminmax(acc)
        sum_bound = int(max(-float(a_lo), float(a_hi)))
    if sum_bound + bias_max >= INT32_LIMIT or (not f32 and sum_bound > FLOAT32_EXACT):
        return None
    return sum_bound


def rescale_codes(
    acc: Tensor,
    m: Tensor,
    b: Tensor | None,
    out_dtype: DType,
    rounding: Round,
    lo: int,
    hi: int,
    zero_point: int,
    reuse_acc: bool,
) -> Tensor:
    """Codes ``clamp(round(fl32(fl32(acc + b) * m)) + zero_point, lo, hi)`` in
    ``out_dtype``'s torch dtype, in float32 passes (in place on a float32 ``acc`` when
    ``reuse_acc``). Only within ``exact_bound``; ``m``, ``b``: float32, broadcastable."""
    if acc.dtype == torch.float32 and reuse_acc:
        t = acc
    else:
        t = acc.to(torch.float32, copy=True)
    if b is not None:
        t.add_(b)
    t.mul_(m)
    t = round_float_(t, rounding)
    t.clamp_(lo - zero_point, hi - zero_point)
    if zero_point:
        t.add_(zero_point)
    return t.to(out_dtype.torch_dtype)
