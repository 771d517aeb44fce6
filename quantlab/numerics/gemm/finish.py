"""Exact GEMM sums -> outputs: bias, the accumulator contract, requantization, saturation.

``finish_gemm`` is the one implementation the quantized ops and the simulator use. Its
constants (the encoded multipliers, the int32 bias codes, the rounding offsets) depend only on
the scales, the bias, the contract and the output dtype; they are computed once per distinct
value of those (a plan-time cache keyed by value, never by object identity).

Its forms, each giving the bits of the general one (tests): the fast form of MUL_SHIFT with
HALF_UP (``shift_form``: one C pass, float64 or int64 passes); FLOAT_RESCALE in float32 where
provably the same (``rescale32``; one C pass, ``requant_native``, for HALF_EVEN); and the
general form, int64 sums through ``requantize``, which also counts what was forced (``stats``).
Both C passes write the codes' float32 values too on request (``with_values``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from quantlab.numerics.accumulator import accumulate
from quantlab.numerics.contract import GemmContract
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import requant_native, rescale32
from quantlab.numerics.gemm.float64_form import float_form, float_window
from quantlab.numerics.gemm.shift_form import finish_shift
from quantlab.numerics.quantize import QuantStats, dequantize
from quantlab.numerics.requant import (
    Requant,
    RequantParams,
    make_requant,
    requant_scale,
    requantize,
)
from quantlab.numerics.rounding import (
    Round,
    half_up_offset,
    round_float,
)
from quantlab.numerics.scales import check_scale
from quantlab.numerics.shapes import along_param

CACHE_LIMIT = 1024  # finish constants kept (one entry per distinct scales/bias/contract)


@dataclass
class GemmStats:
    """What a quantized GEMM had to force: accumulator overflow, bias and output saturation."""

    outputs: int = 0
    acc_overflow: int = 0  # accumulator values outside int32 (saturated or wrapped)
    bias_saturated: int = 0  # integer bias values clamped to int32
    saturated: int = 0  # output codes clamped to the output dtype

    def add(self, other: GemmStats) -> None:
        self.outputs += other.outputs
        self.acc_overflow += other.acc_overflow
        self.bias_saturated += other.bias_saturated
        self.saturated += other.saturated


def acc_scale(x_scale: Tensor | float, w_scale: Tensor | float) -> Tensor:
    """Scale of the integer accumulator: float32 product fl32(x_scale * w_scale) (ONNX)."""
    s = check_scale(x_scale, "x_scale") * check_scale(w_scale, "w_scale")
    return check_scale(s, "x_scale * w_scale")


def quantize_bias(
    bias: Tensor,
    x_scale: Tensor | float,
    w_scale: Tensor | float,
    stats: GemmStats | None = None,
    dtype: DType = DType.INT32,
) -> Tensor:
    """Bias codes = round_half_even(fl32(bias / fl32(x_scale * w_scale))) as int64.

    The ONNX Runtime quantizer's rule (numpy float32 division, ``round`` half to even); values
    beyond ``dtype`` (INT32, or INT64 for TFLite's 16x8 kernels) saturate (counted in
    ``stats.bias_saturated``). j6-numerics s.6: the J6 bias reaches the compiler as float32;
    this integer handling is assumed for every platform. An integer ``bias`` is taken as codes
    already (checked against ``dtype``'s range).
    """
    lo, hi = dtype.qmin, dtype.qmax
    if not bias.is_floating_point():
        if bias.dtype == torch.bool or (
            bias.numel() and (int(bias.min()) < lo or int(bias.max()) > hi)
        ):
            raise ValueError(f"integer bias codes must lie in the {dtype.name} range")
        return bias.to(torch.int64)
    if not bool(torch.isfinite(bias).all()):
        raise ValueError("bias must be finite (no NaN or inf)")
    q = round_float(bias.to(torch.float32) / acc_scale(x_scale, w_scale), Round.HALF_EVEN)
    if stats is not None:
        stats.bias_saturated += int(((q < lo) | (q > hi)).sum())
    if dtype is DType.INT64:  # the largest float64 below 2**63 is 2**63 - 1024
        return q.to(torch.float64).clamp(-(2.0**63), 2.0**63 - 1024).to(torch.int64)
    # clamp in float64 (int32 bounds are exact there), then convert: float32 cannot hold 2**31-1
    return q.to(torch.float64).clamp(lo, hi).to(torch.int64)


@dataclass(frozen=True)
class _FinishConstants:
    """What ``finish_gemm`` derives from the scales, bias, contract and output dtype."""

    params: RequantParams | None  # None for INT32 / FLOAT32 outputs
    bias: Tensor | None  # int64 bias codes (0-d or 1-d)
    bias_max: int
    fast: bool  # the MUL_SHIFT / HALF_UP fast form applies
    shift: Tensor | None  # fast form: right shift n (int64, 0-d or 1-d)
    offset: Tensor | None  # fast form: 2**(n-1)
    offset_with_bias: Tensor | None  # fast form: 2**(n-1) + bias * multiplier
    float_step: Tensor | None  # fast form in float64: q * 2**-n (exact)
    float_offset: Tensor | None  # fast form in float64: offset_with_bias * 2**-n (exact)
    float_limit: int  # fast form in float64: max|acc| must not exceed this (-1: never)
    # FLOAT_RESCALE in float32 (``_finish_rescale32``): the float32 M and, with a bias, its
    # codes as float32 (None when some bias code is not a float32: then the form is off)
    rescale32: bool = False
    bias_f32: Tensor | None = None
    # fast form in float64 when the offset itself is too wide for float64 (large bias codes):
    # the integer part I of offset / 2**n, added after the floor (``float_form``); else None
    float_carry: Tensor | None = None
    # fast form in float64 for any exact acc when max(-lo, hi + 1) <= this (``float_window``;
    # -1: never)
    float_window: int = -1
    # the float64 step and offset reshaped per (rank, axis, channels) of the accumulators
    shaped: dict = field(default_factory=dict, compare=False, repr=False)


_CONSTANTS: dict[tuple, _FinishConstants] = {}


def _value_key(v) -> tuple | None:
    """A hashable key of a scale or bias by value (shape, dtype and bytes of a tensor)."""
    if v is None:
        return None
    if isinstance(v, Tensor):
        t = v.detach()
        return (tuple(t.shape), str(t.dtype), t.contiguous().cpu().numpy().tobytes())
    return ("scalar", float(v))


def finish_constants(
    x_scale, w_scale, bias, out_scale, out_dtype: DType, contract: GemmContract
) -> _FinishConstants:
    """What ``finish_gemm`` derives from its scales, bias, output dtype and contract (encoded
    multipliers, int32 bias codes, rounding offsets), for a caller that keeps it per op and
    passes it back as ``finish_gemm(constants=)`` while those stay the same."""
    return _constants(x_scale, w_scale, bias, out_scale, out_dtype, contract)


def _constants(x_scale, w_scale, bias, out_scale, out_dtype, contract) -> _FinishConstants:
    key = (
        _value_key(x_scale),
        _value_key(w_scale),
        _value_key(bias),
        _value_key(out_scale),
        out_dtype,
        contract,
    )
    hit = _CONSTANTS.get(key)
    if hit is not None:
        return hit
    b = (
        quantize_bias(bias, x_scale, w_scale, dtype=contract.bias_dtype)
        if bias is not None
        else None
    )
    bmax = int(b.abs().max()) if b is not None and b.numel() else 0
    params = shift = offset = offset_b = None
    step_f = offset_f = carry_f = None
    limit_f = window_f = -1
    fast = False
    if out_dtype in (DType.INT8, DType.UINT8, DType.INT16):
        if out_scale is None:
            raise ValueError(f"out_scale is needed for a requantized {out_dtype.name} output")
        real = requant_scale(x_scale, w_scale, out_scale, contract.requant)
        params = make_requant(real, contract.requant, contract.requant_mult_bits)
        n = params.mult_bits - params.shift
        fast = (
            contract.requant is Requant.MUL_SHIFT
            and contract.requant_round is Round.HALF_UP
            and bool((n >= 1).all())
        )
        if fast:
            shift, offset = n, half_up_offset(n)
            offset_b = offset if b is None else offset + b * params.multiplier
            step_f, offset_f, limit_f, carry_f = float_form(params.multiplier, n, offset_b)
            if limit_f >= 0 and carry_f is None:
                window_f = float_window(n, offset_b)
    elif out_dtype in (DType.INT32, DType.FLOAT32):
        acc_scale(x_scale, w_scale)  # validates the scales
    else:
        raise ValueError(
            f"out_dtype must be INT8, UINT8, INT16, INT32 or FLOAT32 for a quantized GEMM, "
            f"got {out_dtype.name}"
        )
    rescale32, bias_f32 = False, None
    if params is not None and contract.requant is Requant.FLOAT_RESCALE:
        bias_f32 = b.to(torch.float32) if b is not None else None
        # every bias code must be a float32 (then fl32(acc) + fl32(b) rounds once, see below)
        rescale32 = b is None or bool((bias_f32.to(torch.int64) == b).all())
    value = _FinishConstants(
        params,
        b,
        bmax,
        fast,
        shift,
        offset,
        offset_b,
        step_f,
        offset_f,
        limit_f,
        rescale32,
        bias_f32 if rescale32 else None,
        carry_f,
        window_f,
    )
    if len(_CONSTANTS) >= CACHE_LIMIT:
        _CONSTANTS.clear()
    _CONSTANTS[key] = value
    return value


def finish_gemm(
    acc: Tensor,
    x_scale: Tensor | float,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    contract: GemmContract,
    channel_axis: int,
    stats: GemmStats | None = None,
    clamp_codes: tuple[int, int] | None = None,
    sum_bound: int | None = None,
    reuse_acc: bool = False,
    out_zero_point: int = 0,
    constants: _FinishConstants | None = None,
    with_values: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Exact sums -> outputs: + bias, accumulator contract, then requant or wide output.

    acc: the exact sums (int64, or a float32/float64 tensor holding exact integers), already
    centred on the input's zero point (sum w * (x - zx); ``qconv2d`` and the others do it).
    Order: bias (``quantize_bias`` to the contract's ``bias_dtype``, or integer codes as given)
    is added to the exact sum, then the contract's accumulator (``accumulator``,
    ``accumulator_overflow``) applies once.
    out_dtype INT8/UINT8/INT16: ``requantize`` with the contract's ``requant``,
      ``requant_round``, ``requant_mult_bits``, M = requant_scale(x_scale, w_scale, out_scale)
      and ``out_zero_point``; then the optional ``clamp_codes`` (lo, hi) (a fused relu6:
      ``clamp_min(lo)`` then ``clamp_max(hi)``, codes including the zero point).
    out_dtype INT32 (high-precision output): the int32 accumulator (torch.int32), whose scale
      is ``acc_scale(x_scale, w_scale)``.
    out_dtype FLOAT32 (high-precision float output): fl32(fl32(acc) * acc_scale).
    Per-channel ``w_scale`` (1-d) and bias apply along ``channel_axis`` of the output.
    ``stats``: counts of what was forced (added to it). ``sum_bound``: a known bound on |acc|
    (e.g. K * max|x| * max|w|; measured when None). ``reuse_acc``: acc may be overwritten.
    Scales: finite and > 0 (ValueError naming them). ``constants``: ``finish_constants`` of
    these same arguments, kept by the caller (else looked up by value).
    ``with_values`` (INT8/UINT8/INT16 codes, one ``out_scale``): (codes, values) with values
    = fl32((code - out_zero_point) * fl32(out_scale)) in float32, what the codes stand for;
    the one C passes (``requant_native``) write both.
    """
    vs = _value_scale(out_scale, out_dtype) if with_values else None
    k = constants
    if k is None:
        k = _constants(x_scale, w_scale, bias, out_scale, out_dtype, contract)
    if k.fast and stats is None and not out_zero_point:
        out = finish_shift(
            acc, k, out_dtype, contract, channel_axis, clamp_codes, sum_bound, reuse_acc, vs
        )
        return _with_values(out, vs, out_zero_point)
    if k.rescale32 and stats is None:
        out = _finish_rescale32(
            acc,
            k,
            out_dtype,
            contract,
            channel_axis,
            clamp_codes,
            sum_bound,
            reuse_acc,
            out_zero_point,
            vs,
        )
        if out is not None:  # else its bounds failed: the general form
            return _with_values(out, vs, out_zero_point)
    st = stats if stats is not None else GemmStats()
    st.outputs += acc.numel()
    a = acc.to(torch.int64)
    if bias is not None:
        b = k.bias
        if stats is not None:  # counted
            b = quantize_bias(bias, x_scale, w_scale, st, contract.bias_dtype)
        a = a + along_param(b, a, channel_axis, "bias")
    acc32, over = accumulate(a, contract.accumulator, contract.accumulator_overflow)
    st.acc_overflow += over
    if out_dtype is DType.INT32:
        return acc32.to(torch.int32)
    if out_dtype is DType.FLOAT32:
        s = acc_scale(x_scale, w_scale)
        return acc32.to(torch.float32) * along_param(s, acc32, channel_axis, "w_scale")
    q = QuantStats() if stats is not None else None  # counting costs passes: only on request
    codes = requantize(
        acc32,
        k.params,
        out_dtype,
        contract.requant_round,
        axis=channel_axis,
        stats=q,
        zero_point=out_zero_point,
    )
    if q is not None:
        st.saturated += q.saturated
    if clamp_codes is not None:
        codes = codes.clamp_min(clamp_codes[0]).clamp_max(clamp_codes[1])
    return _with_values(codes, vs, out_zero_point)


def _value_scale(out_scale, out_dtype: DType) -> Tensor:
    """``finish_gemm(with_values=True)``'s float32 scale (0-d), after checking it applies."""
    if out_dtype not in (DType.INT8, DType.UINT8, DType.INT16):
        raise ValueError(f"with_values takes INT8, UINT8 or INT16 codes, got {out_dtype.name}")
    s = torch.as_tensor(out_scale, dtype=torch.float32)
    if s.numel() != 1:
        raise ValueError(f"with_values takes one out_scale, got {s.numel()}")
    return s.reshape(())


def _with_values(out, s: Tensor | None, zero_point: int):
    """``out`` as ``finish_gemm`` returns it: the codes, or with ``s`` (codes, values), the
    values being emit's product (``fixed_common.emit``) unless a C pass wrote them already."""
    if s is None or isinstance(out, tuple):
        return out
    if zero_point:
        return out, dequantize(out, s, zero_point=zero_point)
    return out, out.to(torch.float32).mul_(s)


def _finish_rescale32(
    acc,
    k,
    out_dtype,
    contract,
    channel_axis,
    clamp_codes,
    sum_bound,
    reuse_acc,
    zero_point,
    value_scale=None,
):
    """FLOAT_RESCALE requantization in float32 (``rescale32``): one C pass for HALF_EVEN
    (``requant_native``; with ``value_scale``, (codes, values)), else float32 torch passes;
    None when the bounds it relies on fail (then the general form runs). The fused
    ``clamp_codes`` joins the saturation bounds as in ``shift_form.finish_shift``."""
    lo, hi = out_dtype.qmin, out_dtype.qmax
    if clamp_codes is not None:
        lo, hi = max(lo, clamp_codes[0]), min(hi, clamp_codes[1])
        lo = min(lo, hi)
    bound = rescale32.exact_bound(acc, k.bias_max, sum_bound)
    if bound is None:
        return None
    ax = channel_axis % acc.dim() if acc.dim() else 0
    if contract.requant_round is Round.HALF_EVEN and acc.dim():
        key = ("rescale_native", ax, acc.shape[ax])
        if key not in k.shaped:
            k.shaped[key] = requant_native.rescale_constants(
                k.params.real.to(torch.float32), k.bias_f32, acc.shape[ax]
            )
        if k.shaped[key] is not None:
            s = None if value_scale is None else float(value_scale)  # a float32: exact in C
            done = requant_native.requantize_rescale(
                acc, k.shaped[key], ax, lo, hi, int(zero_point), out_dtype.torch_dtype, s
            )
            if done is not None:
                return done
    m, b = _rescale32_constants(k, acc, ax)
    return rescale32.rescale_codes(
        acc, m, b, out_dtype, contract.requant_round, lo, hi, int(zero_point), reuse_acc
    )


def _rescale32_constants(k: _FinishConstants, acc: Tensor, ax: int):
    """``k``'s float32 M and bias codes shaped to broadcast along axis ``ax`` of ``acc``."""
    key = ("rescale32", acc.dim(), ax, acc.shape[ax] if acc.dim() else 0)
    hit = k.shaped.get(key)
    if hit is None:
        m = k.params.real.to(torch.float32)
        hit = (
            along_param(m, acc, ax, "w_scale"),
            along_param(k.bias_f32, acc, ax, "bias") if k.bias_f32 is not None else None,
        )
        k.shaped[key] = hit
    return hit
