"""Fast in-place forms of two numerics steps, bit-identical to the reference functions.

``requant_mul_shift_half_up_`` equals ``quantlab.numerics.requant.requantize`` for the MUL_SHIFT
scheme with HALF_UP rounding (the J6 profiles) whenever the encoded right shift n is >= 1
(every real multiplier below 1 has n >= mult_bits): it computes
``floor((acc * q + 2**(n-1)) / 2**n)`` in place on one int64 buffer (``n = mult_bits - shift``),
which is round-half-up of ``acc * q / 2**n`` exactly (integer arithmetic; |acc * q| < 2**62).
It returns None when a multiplier needs a left shift; callers then use ``requantize``.
``tests/simulate/test_fastpath.py`` checks bit equality on random and edge accumulators.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics import gemm
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import Requant, RequantParams, make_requant, requant_scale
from quantlab.numerics.rounding import Round

INT32_LIMIT = 1 << 31


def applies(platform) -> bool:
    """Whether the platform's requantization is the one the fast path reproduces."""
    return platform.requant is Requant.MUL_SHIFT and platform.requant_round is Round.HALF_UP


def _along(v: Tensor, like: Tensor, axis: int | None) -> Tensor:
    if v.dim() == 0 or axis is None:
        return v
    shape = [1] * like.dim()
    shape[axis % like.dim()] = -1
    return v.reshape(shape)


def requant_mul_shift_half_up_(
    acc: Tensor, params: RequantParams, out: DType, axis: int | None = None
) -> Tensor | None:
    """Codes of ``out`` = saturate(round_half_up(acc * q / 2**n)); ``acc`` (int64, values in
    int32) is overwritten. None when some n < 1 (a left shift: use ``requantize``)."""
    if params.scheme is not Requant.MUL_SHIFT or acc.dtype != torch.int64:
        raise ValueError("requant_mul_shift_half_up_ takes MUL_SHIFT params and an int64 acc")
    n = params.mult_bits - params.shift
    if bool((n < 1).any()):
        return None
    q = _along(params.multiplier, acc, axis)
    n = _along(n, acc, axis)
    half = torch.bitwise_left_shift(torch.ones_like(n), n - 1)
    acc.mul_(q).add_(half).bitwise_right_shift_(n).clamp_(out.qmin, out.qmax)
    return acc.to(out.torch_dtype)


def finish_gemm_fast(
    acc: Tensor,
    x_scale: Tensor,
    w_scale: Tensor,
    bias: Tensor | None,
    out_scale: Tensor,
    out: DType,
    platform,
    channel_axis: int,
    bound: int,
) -> Tensor | None:
    """``gemm.finish_gemm`` for INT8/INT16 outputs on a MUL_SHIFT/HALF_UP platform, in place on
    the int64 exact sums ``acc``; ``bound`` >= max |sum| (the accumulator contract is skipped
    when bound + max|bias| < 2**31, where it cannot change anything). None: not applicable."""
    if not applies(platform) or not out.is_int or out is DType.INT32:
        return None
    if bias is not None:
        b = gemm.quantize_bias(bias, x_scale, w_scale)
        acc.add_(_along(b, acc, channel_axis))
        bound += int(b.abs().max()) if b.numel() else 0
    if bound >= INT32_LIMIT:
        acc, _ = gemm.accumulate(acc, platform.accumulator, platform.accumulator_overflow)
    real = requant_scale(x_scale, w_scale, out_scale, Requant.MUL_SHIFT)
    params = make_requant(real, Requant.MUL_SHIFT, platform.requant_mult_bits)
    return requant_mul_shift_half_up_(acc, params, out, channel_axis)
