"""The fast form of a GEMM's requantization in ``finish.finish_gemm``.

Fast form (MUL_SHIFT with HALF_UP, every right shift n >= 1, no statistics requested): when
the exact sums and the bias cannot leave int32 (``sum_bound + max|bias| < 2**31``) the
accumulator contract changes nothing and the bias joins the rounding offset,
``(acc + b) * q + 2**(n-1) = acc * q + (b * q + 2**(n-1))`` (exact integers), so
requantization is a few in-place passes over channel chunks of at most ``CHUNK_ELEMENTS``
values. The passes run in float64 when every ``acc * q + offset`` is an integer below 2**53
in magnitude (``(max|acc| + max|bias|) * max q + 2**(max n - 1) <= 2**53``, checked against
``sum_bound`` and, if that is too loose, the measured ``max|acc|``): then ``acc * (q * 2**-n)``
and ``offset * 2**-n`` are exact dyadic values whose sum is exact, and ``floor`` of it is
``(acc * q + offset) >> n``. An offset wider than float64 (large bias codes) is split into an
integer carry, added after the floor, and a remainder below 2**(n-1). Without a carry they
also run in float64 whatever max|acc| when the output clamp [lo, hi] is narrow enough: every
value that lands inside it is computed exactly and every other one lands outside it, so no
bound is measured (both proofs: ``float64_form``). Otherwise they run in int64 (shift and
add). Where a C compiler is found, the form runs instead as one C pass in int64
(``requant_native``), which also writes the codes' float32 values on request. All give the bits
of the general form (tests).
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.accumulator import accumulate
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import requant_native
from quantlab.numerics.gemm.float64_form import float64_codes, float64_values
from quantlab.numerics.rounding import rshift_round_half_up_
from quantlab.numerics.shapes import along_param

INT32_LIMIT = 1 << 31
CHUNK_ELEMENTS = 1 << 18  # requantize this many accumulators at a time (bounds int64 memory)


def _channel_chunks(acc: Tensor, ax: int):
    """(first channel, channel count) of chunks of at most ~``CHUNK_ELEMENTS`` values."""
    channels = acc.shape[ax]
    step = max(1, CHUNK_ELEMENTS // max(1, acc.numel() // max(channels, 1)))
    for c0 in range(0, channels, step):
        yield c0, min(step, channels - c0)


def _narrow(t: Tensor, ax: int, c0: int, cn: int) -> Tensor:
    return t.narrow(ax, c0, cn) if t.dim() > 0 and t.shape[ax] > 1 else t


def finish_shift(
    acc, k, out_dtype, contract, channel_axis, clamp_codes, sum_bound, reuse_acc, value_scale
):
    """The fast form's codes, or (codes, values) where the one C pass wrote values too."""
    lo, hi = out_dtype.qmin, out_dtype.qmax
    if clamp_codes is not None:  # the fused clamp: clamp_min(lo) then clamp_max(hi)
        lo, hi = max(lo, clamp_codes[0]), min(hi, clamp_codes[1])
        lo = min(lo, hi)
    if sum_bound is None:
        sum_bound = 0
        if acc.numel():
            a_lo, a_hi = torch.aminmax(acc)
            sum_bound = int(max(-float(a_lo), float(a_hi)))
    offset = k.offset_with_bias
    wide = sum_bound + k.bias_max >= INT32_LIMIT
    if wide:  # the accumulator contract may act
        acc = acc.to(torch.int64, copy=not reuse_acc)
        if k.bias is not None:
            acc.add_(along_param(k.bias, acc, channel_axis, "bias"))
        acc, _ = accumulate(acc, contract.accumulator, contract.accumulator_overflow)
        offset, reuse_acc = k.offset, True
    if acc.numel() and acc.dim():
        done = _finish_native(acc, k, wide, channel_axis, lo, hi, out_dtype, value_scale)
        if done is not None:
            return done
    if not wide and k.float_limit >= 0 and acc.numel():
        if max(-lo, hi + 1) <= k.float_window:  # exact for any acc (float_window)
            return _finish_float64(acc, k, out_dtype, channel_axis, lo, hi, reuse_acc)
        if sum_bound > k.float_limit:  # the stated bound is too loose: measure
            a_lo, a_hi = torch.aminmax(acc)
            sum_bound = int(max(-float(a_lo), float(a_hi)))
        if sum_bound <= k.float_limit:
            return _finish_float64(acc, k, out_dtype, channel_axis, lo, hi, reuse_acc)
    ax = channel_axis % acc.dim()
    q = along_param(k.params.multiplier, acc, ax, "w_scale")
    n = along_param(k.shift, acc, ax, "w_scale")
    off = along_param(offset, acc, ax, "bias")
    codes = torch.empty(acc.shape, dtype=out_dtype.torch_dtype, device=acc.device)
    for c0, cn in _channel_chunks(acc, ax):
        part = acc.narrow(ax, c0, cn)
        if part.dtype != torch.int64:
            part = part.to(torch.int64)
        elif not reuse_acc:
            part = part.clone()
        part.mul_(_narrow(q, ax, c0, cn))
        rshift_round_half_up_(part, _narrow(n, ax, c0, cn), _narrow(off, ax, c0, cn))
        codes.narrow(ax, c0, cn).copy_(part.clamp_(lo, hi))
    return codes


def _finish_native(acc, k, wide: bool, channel_axis: int, lo, hi, out_dtype: DType, value_scale):
    """The fast form in one C pass (``requant_native``; with ``value_scale``, (codes, values)),
    or None where it does not apply. Its int64 sum is exact: |acc| + max|bias| < 2**31 with
    the bias in the offset, or (``wide``) |acc| <= 2**31 after the accumulator contract with
    the offset 2**(n-1); q < 2**31."""
    ax = channel_axis % acc.dim()
    key = ("shift", wide, acc.shape[ax])
    if key not in k.shaped:
        off = k.offset if wide else k.offset_with_bias
        k.shaped[key] = requant_native.channel_constants(
            k.params.multiplier, off, k.shift, acc.shape[ax]
        )
    constants = k.shaped[key]
    if constants is None:
        return None
    s = None if value_scale is None else float(value_scale)  # a float32: exact as C's float
    return requant_native.requantize_shift(acc, constants, ax, lo, hi, out_dtype.torch_dtype, s)


def _finish_float64(acc, k, out_dtype, channel_axis, lo, hi, reuse_acc):
    """The fast form in float64 (``float_form`` or ``float_window`` proves it exact here): per
    channel chunk, ``floor(acc * (q * 2**-n) + offset * 2**-n)`` clamped to [lo, hi] (for
    lo >= 0, e.g. a fused relu, clamped then truncated to the integer dtype: the same codes).
    A tensor of at most ``CHUNK_ELEMENTS`` values is one chunk (no views, no extra copy)."""
    ax = channel_axis % acc.dim()
    step, off, carry = _float_constants(k, acc, ax)
    if acc.numel() <= CHUNK_ELEMENTS:
        return float64_codes(acc, step, off, carry, out_dtype, lo, hi, reuse_acc)
    codes = torch.empty(acc.shape, dtype=out_dtype.torch_dtype, device=acc.device)
    for c0, cn in _channel_chunks(acc, ax):
        part = acc.narrow(ax, c0, cn)
        st, of = _narrow(step, ax, c0, cn), _narrow(off, ax, c0, cn)
        ca = None if carry is None else _narrow(carry, ax, c0, cn)
        codes.narrow(ax, c0, cn).copy_(float64_values(part, st, of, ca, lo, hi, reuse_acc))
    return codes


def _float_constants(k, acc: Tensor, ax: int) -> tuple:
    """``k``'s float64 step, offset and carry (or None) shaped to broadcast along axis ``ax``
    of ``acc`` (kept on ``k`` per (rank, axis, channels): no reshaping per call)."""
    key = (acc.dim(), ax, acc.shape[ax] if acc.dim() else 0)
    hit = k.shaped.get(key)
    if hit is None:
        hit = (
            along_param(k.float_step, acc, ax, "w_scale"),
            along_param(k.float_offset, acc, ax, "bias"),
            None if k.float_carry is None else along_param(k.float_carry, acc, ax, "bias"),
        )
        k.shaped[key] = hit
    return hit
