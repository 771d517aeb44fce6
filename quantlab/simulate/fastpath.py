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
CHUNK_ELEMENTS = 1 << 18  # requantize this many accumulators at a time (bounds int64 memory)


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


def conv_exact_float32(x: Tensor, w32: Tensor, fn, bound: int, **conv) -> Tensor | None:
    """Exact integer conv as one float32 conv of the codes (``w32``: the weight codes as
    float32, cached by the caller) when ``bound`` (>= sum of |products| of any output) is at most
    2**24: every partial sum is then an integer below 2**24, so no rounding happens in any order
    (bit-exact-emulation s.2.1, the argument of ``gemm.plan_gemm``). None when
    the bound does not hold (use ``gemm.int_conv2d``). The result stays float32 (exact
    integers); ``finish_gemm_fast`` widens it chunk by chunk."""
    if bound > gemm.FLOAT32_EXACT:
        return None
    return fn(x.to(torch.float32), w32, **conv)


def _params(x_scale, w_scale, out_scale, bias, platform, axis, like, cache: dict | None):
    key = (id(x_scale), id(w_scale), id(out_scale), id(bias), getattr(bias, "_version", None))
    if cache is not None and cache.get("key") == key:
        return cache["value"]
    real = requant_scale(x_scale, w_scale, out_scale, Requant.MUL_SHIFT)
    params = make_requant(real, Requant.MUL_SHIFT, platform.requant_mult_bits)
    b = gemm.quantize_bias(bias, x_scale, w_scale) if bias is not None else None
    n = params.mult_bits - params.shift
    value = (params, b, n)
    if cache is not None:
        cache.update(key=key, value=value, refs=(x_scale, w_scale, out_scale, bias))
    return value


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
    clamp_codes: tuple[int, int] | None = None,
    cache: dict | None = None,
) -> Tensor | None:
    """``gemm.finish_gemm`` for INT8/INT16 outputs on a MUL_SHIFT/HALF_UP platform on the exact
    sums ``acc`` (int64, or float32 holding exact integers), channel chunk by channel chunk
    (at most ``CHUNK_ELEMENTS`` new int64 values at once; an int64 ``acc`` is overwritten),
    followed by an optional clamp to ``clamp_codes`` (a fused relu6). ``bound`` >= max |sum|.
    When bound + max|bias| < 2**31 the accumulator contract cannot change anything and the bias
    joins the rounding offset:
    ``(acc + b) * q + 2**(n-1) = acc * q + (b * q + 2**(n-1))`` (exact integers), so the whole
    requantization is four in-place passes. ``cache`` (a dict per op) keeps the encoded
    multipliers and bias codes while the scales and bias are the same objects. None: not
    applicable (use ``gemm.finish_gemm``)."""
    if not applies(platform) or not out.is_int or out is DType.INT32:
        return None
    params, b, n = _params(x_scale, w_scale, out_scale, bias, platform, channel_axis, acc, cache)
    if bool((n < 1).any()):
        return None
    lo, hi = out.qmin, out.qmax
    if clamp_codes is not None:
        lo, hi = max(lo, clamp_codes[0]), min(hi, clamp_codes[1])
        if lo > hi:
            return None
    bmax = int(b.abs().max()) if b is not None and b.numel() else 0
    if bound + bmax >= INT32_LIMIT:
        acc = acc.to(torch.int64)
        if b is not None:
            acc.add_(_along(b, acc, channel_axis))
        acc, _ = gemm.accumulate(acc, platform.accumulator, platform.accumulator_overflow)
        b = None
    ax = channel_axis % acc.dim()
    q = _along(params.multiplier, acc, ax)
    nn_ = _along(n, acc, ax)
    offset = torch.bitwise_left_shift(torch.ones_like(nn_), nn_ - 1)
    if b is not None:
        offset = offset + _along(b, acc, ax) * q
    per_channel = q.dim() > 0 and q.numel() > 1
    codes = torch.empty(acc.shape, dtype=out.torch_dtype)
    channels = acc.shape[ax]
    step = max(1, CHUNK_ELEMENTS // max(1, acc.numel() // max(channels, 1)))
    for c0 in range(0, channels, step):
        cn = min(step, channels - c0)
        part = acc.narrow(ax, c0, cn).to(torch.int64)  # int64 acc: a view, changed in place
        qs, ns, os_ = (
            (t.narrow(ax, c0, cn) for t in (q, nn_, offset)) if per_channel else (q, nn_, offset)
        )
        part.mul_(qs).add_(os_).bitwise_right_shift_(ns).clamp_(lo, hi)
        codes.narrow(ax, c0, cn).copy_(part)
    return codes
