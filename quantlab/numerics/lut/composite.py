"""Ops the vendor builds from several LUTs: softmax, and inverse_sigmoid from reciprocal + log.

Intermediate requantizations (the sum in softmax, the products) multiply an exact int64 value
by a float64 scale ratio and round HALF_UP, then saturate **(assumed)**: the compiler's integer
requantization is not public (j6-numerics s.7); quantlab's requant kernels model it per platform.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.fake_quant_plan import native_constants
from quantlab.numerics.lut import softmax_native
from quantlab.numerics.lut.formats import J6_FORMAT, LutFormat
from quantlab.numerics.lut.functions import INVERSE_SIGMOID_EPS, default_spec
from quantlab.numerics.lut.spec import LutSpec
from quantlab.numerics.lut.strategies import Strategy
from quantlab.numerics.lut.table import build_lut
from quantlab.numerics.quantize import Divide, fake_quant
from quantlab.numerics.rounding import Round, round_float, round_scalar
from quantlab.numerics.scales import check_scale_float

SOFTMAX_EXP_RANGE = (-12.0, 0.0)  # vendor: exp(-12) already fake-quantizes to 0 (s.1.5)
SOFTMAX_EXP_SCALE = 2.0 / 65535  # vendor comment: exp output scale 2/65535 (int16)
SOFTMAX_RECIP_SCALE = 1.0 / 32767  # the reciprocal's int16 scale: 1 / S <= 1 (assumed)
RECIPROCAL_CLIP_CODES_INT16 = 32  # QAT clips |x| >= 32 s_in for int16 reciprocal inputs (s.1.5)


def reciprocal_clip_codes(in_dtype: DType) -> int:
    """The vendor QAT reciprocal's input clip, in codes of its input: |x| >= 1 code (int8),
    32 codes (int16) (horizon-plugin s.1.5)."""
    return RECIPROCAL_CLIP_CODES_INT16 if DType.parse(in_dtype) is DType.INT16 else 1


def qat_reciprocal(x: Tensor, in_scale: Tensor | float, in_dtype: DType) -> Tensor:
    """1 / x as the vendor's QAT reciprocal computes it, in float32: |x| clipped below at
    ``reciprocal_clip_codes(in_dtype) * in_scale``, the sign kept (x = 0 taken as positive,
    as the reciprocal table's code 0 is). Differentiable (the clip passes no gradient)."""
    floor = reciprocal_clip_codes(in_dtype) * float(in_scale)  # times 2**k: exact in float32
    r = torch.reciprocal(x.abs().clamp_min(floor))
    return torch.where(x < 0, -r, r)


def softmax_exp_spec(in_scale: float | None = None) -> LutSpec:
    """The exp table inside softmax: curvature on [-12, 0], flat left tail (gradient 0). Where
    one input code spans more than that range (``in_scale`` > 12: scores calibrated over an
    additive mask of huge values), on [-in_scale, 0], the codes 0 and -1: exp(0) = 1 at the
    row's maximum, exp(-in_scale) (0 at the exp scale) for every code below it."""
    lo, hi = SOFTMAX_EXP_RANGE
    if in_scale is not None and in_scale > hi - lo:
        lo = -float(in_scale)
    return LutSpec(Strategy.CURVATURE, input_range=(lo, hi), gradients=(0.0, None))


def requant_half_up(v: Tensor, ratio: float, dtype: DType) -> Tensor:
    """saturate(round_half_up(v * ratio)) for int64 ``v``; float64 multiply (exact for |v| <
    2**53, one rounding of the product), HALF_UP, saturated to ``dtype`` (int64 result)."""
    r = round_float(v.to(torch.float64) * float(ratio), Round.HALF_UP)
    return r.clamp(dtype.qmin, dtype.qmax).to(torch.int64)


def _product_half_up_codes(
    e: Tensor, r: Tensor, ratio: float, dtype: DType, nonnegative: bool = False
) -> Tensor:
    """``requant_half_up(e * r, ratio, dtype)`` in ``dtype``'s torch dtype, for int16 codes
    ``e`` and ``r`` (broadcastable). |e * r| <= 2**30 is exact in float64 (no integer pass);
    p = fl64(e * r * ratio) is the same one rounding. Half up as ``round_float`` takes it:
    floor(p), plus 1 where p - floor(p) >= 1/2 (that difference is exact; floor(p + 1/2) is
    not: p = 0.5 - 2**-54 gives p + 1/2 = 1 in float64). ``nonnegative``: the caller knows
    every e and r is >= 0 (ratio > 0), so p >= 0; clamping p at qmax (an integer) first keeps
    the rounded code within qmax, and no lower clamp is needed (the same codes)."""
    p = e.to(torch.float64).mul_(r.to(torch.float64))
    p.mul_(float(ratio))
    low = not (nonnegative and ratio > 0)
    if not low:
        p.clamp_max_(dtype.qmax)
    f = torch.floor(p)
    p = f.add_(p.sub_(f).ge_(0.5))
    if low:
        p.clamp_(dtype.qmin, dtype.qmax)
    return p.to(dtype.torch_dtype)


def lut_softmax(
    codes: Tensor,
    in_scale: float,
    in_dtype: DType = DType.INT16,
    dim: int = -1,
    out_scale: float | None = None,
    out_dtype: DType = DType.INT16,
    fmt: LutFormat = J6_FORMAT,
    exp_scale: float = SOFTMAX_EXP_SCALE,
    sum_scale: float | None = None,
    recip_scale: float | None = None,
) -> Tensor:
    """Softmax the vendor way (j6-numerics s.3), on input codes; returns ``out_dtype`` codes.

    1. d = x - max(x) in int16 codes (scale in_scale), saturated at -32768;
    2. e = exp LUT (int16 -> int16, scale ``exp_scale``) on [-12, 0] with a flat left tail;
    3. S = sum(e) exact in int64, requantized to int16 with ``sum_scale``, saturating (the
       Simulator passes the scale calibrated at ``<op>/sum``, as the plugin calibrates its
       sum; default n * exp_scale, which cannot saturate);
    4. r = reciprocal LUT (int16 -> int16, default spec, scale ``recip_scale``, default 1/32767);
    5. out = requant(e * r, exp_scale * recip_scale / out_scale) (default out_scale 1/qmax).
    Requantizations: float64 ratio, HALF_UP, saturation (assumed, module docstring).
    Widths: x - max(x) and e * r (|e|, |r| <= 2**15, so |e * r| <= 2**30) are exact in int32,
    the sum in int64. Over the last axis of contiguous codes, every step runs in one C pass
    per row (``softmax_native``: the same operations, so the same codes).
    """
    in_dtype = DType.parse(in_dtype)
    out_dtype = DType.parse(out_dtype)
    if codes.dtype != in_dtype.torch_dtype:
        raise ValueError(f"lut_softmax expects {in_dtype.name} codes, got {codes.dtype}")
    n = codes.shape[dim]
    in_scale = check_scale_float(in_scale, "in_scale")
    out_scale = (
        1.0 / out_dtype.qmax if out_scale is None else check_scale_float(out_scale, "out_scale")
    )
    sum_scale = n * exp_scale if sum_scale is None else float(sum_scale)
    recip_scale = SOFTMAX_RECIP_SCALE if recip_scale is None else float(recip_scale)
    exp_lut = build_lut(
        "exp", DType.INT16, in_scale, DType.INT16, exp_scale, softmax_exp_spec(in_scale), fmt
    )
    last = dim in (-1, codes.dim() - 1)  # over the last axis: the C passes (softmax_native)
    recip = build_lut("reciprocal", DType.INT16, sum_scale, DType.INT16, recip_scale, None, fmt)
    # e >= 0 when the exp table's outputs are; s >= 0 (a sum of those, ratio > 0, HALF_UP),
    # so r >= 0 when the reciprocal's outputs on codes >= 0 are
    nonnegative = exp_lut.min_output() >= 0 and recip.min_output(0) >= 0
    ratio = exp_scale * recip_scale / out_scale
    if last:  # every step in one C pass per row
        lo, hi, dt = out_dtype.qmin, out_dtype.qmax, out_dtype.torch_dtype
        emap, rmap = exp_lut.signed_code_map(), recip.code_map()
        out = softmax_native.softmax_rows(
            codes, emap, exp_scale / sum_scale, rmap, ratio, lo, hi, dt, nonnegative
        )
        if out is not None:
            return out
    made = softmax_native.exp_rows(codes, exp_lut.signed_code_map()) if last else None
    if made is not None:
        e, total = made
    else:
        # d - qmin = x - max(x) + 32768, at least 0 (d saturates at -32768): the index of d in
        # the exp table's signed code map, formed in int32 with no int16 round trip
        top = codes.amax(dim=dim, keepdim=True).to(torch.int32) + DType.INT16.qmin
        index = codes.to(torch.int32, copy=True).sub_(top).clamp_min_(0)
        e = exp_lut.signed_code_map().index_select(0, index.reshape(-1)).reshape(codes.shape)
        total = e.sum(dim=dim, keepdim=True, dtype=torch.int64)
    s = requant_half_up(total, exp_scale / sum_scale, DType.INT16)
    r = recip.evaluate(s.to(torch.int16))
    if last:
        lo, hi, dt = out_dtype.qmin, out_dtype.qmax, out_dtype.torch_dtype
        out = softmax_native.product_rows(e, r, ratio, lo, hi, dt, nonnegative)
        if out is not None:
            return out
    return _product_half_up_codes(e, r, ratio, out_dtype, nonnegative)


QAT_SOFTMAX_MAX_ROW = 16384  # rows up to this length sum exactly in double (qat_softmax)


def qat_softmax(
    x: Tensor,
    dim: int,
    in_scale: Tensor | float,
    rounding: Round = Round.HALF_EVEN,
    divide: Divide = Divide.BY_RECIPROCAL,
    exp_scale: float = SOFTMAX_EXP_SCALE,
    sum_scale: float | None = None,
    recip_scale: float = SOFTMAX_RECIP_SCALE,
    out_quant: Callable[..., Tensor] | None = None,
) -> Tensor:
    """Softmax as the vendor's QAT ``SegmentLUTSoftmax`` computes it, at ``lut_softmax``'s
    scales; float32 ``x`` (the input's fake-quantized values); returns the float32 product
    e * r, or ``out_quant(e * r)`` (the op's output fake quant, a ``fake_quant_fn`` form
    that takes ``inplace``). Every fake quant is
    ``fake_quant(., scale, INT16, rounding, divide=divide)`` (scales taken as float32), every
    function a float32 operation:

    1. d = fq(x - max(x), in_scale): x - max(x) in codes, saturated at -32768;
    2. e = fq(exp(d), exp_scale), exp as torch's vectorized kernel gives it on d's value
       (``qat_softmax_exp_values``, one entry per code of d);
    3. S = fq(sum(e), sum_scale) (the Simulator's: calibrated at ``<op>/sum``; default
       n * exp_scale): the float32 row sum, taken exactly and rounded once (torch's float32
       sum rounds along the way and may differ in its last bit). Exact in double in any
       order: every e is a float32 multiple of the unit in the last place of exp_scale's
       binade or 0, below 2, so rows of at most ``QAT_SOFTMAX_MAX_ROW`` values sum to a
       multiple of it below 2**15;
    4. r = fq(qat_reciprocal(S), recip_scale): S clipped below at 32 codes of ``sum_scale``;
    5. e * r, then ``out_quant``.

    So FIXED (``lut_softmax``) differs from it by its two tables and its HALF_UP integer
    requantizations only. Over the last axis of contiguous values with HALF_EVEN by the
    reciprocal (torch's fake quant) every step runs in one C pass per row
    (``softmax_native.qat_rows``, the same float32 operations), ``out_quant`` in its last
    loop where it is a per-tensor HALF_EVEN one by the reciprocal (``native_constants``).
    No gradient (the caller gives one).
    """
    n = x.shape[dim]
    if n > QAT_SOFTMAX_MAX_ROW:
        raise ValueError(f"qat_softmax takes rows of at most {QAT_SOFTMAX_MAX_ROW}, got {n}")
    total_scale = n * exp_scale if sum_scale is None else float(sum_scale)
    f32, inv = _qat_softmax_constants(float(in_scale), exp_scale, total_scale, recip_scale)
    s_in, s_exp, s_sum, s_recip = f32
    values = qat_softmax_exp_values(s_in, s_exp, rounding, divide)
    x = x.detach()
    out = None
    if rounding is Round.HALF_EVEN and divide is Divide.BY_RECIPROCAL and dim in (-1, x.dim() - 1):
        floor = RECIPROCAL_CLIP_CODES_INT16 * s_sum  # times 2**5: exact in float32
        fused = None if out_quant is None else native_constants(out_quant)
        out = softmax_native.qat_rows(
            x, values, inv[0], inv[2], s_sum, floor, inv[3], s_recip, fused
        )
        if out is not None and fused is not None:
            return out  # out_quant ran in the pass
    if out is None:
        out = _qat_softmax_torch(x, dim, values, f32, rounding, divide)
    return out if out_quant is None else out_quant(out, inplace=True)


@lru_cache(maxsize=256)
def _qat_softmax_constants(*scales: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(each scale rounded to float32, as a scale tensor holds it; fl32(1 / that), what
    torch's fake quant multiplies by)."""
    f32 = torch.tensor(scales, dtype=torch.float32)
    return tuple(f32.tolist()), tuple((torch.ones_like(f32) / f32).tolist())


def _qat_softmax_torch(x, dim, values, f32, rounding, divide) -> Tensor:
    """``qat_softmax`` in torch passes: any dim, rounding and divide (the C pass's
    reference)."""
    s_in, _, s_sum, s_recip = f32

    def fq(v: Tensor, scale: float) -> Tensor:
        return fake_quant(v, scale, DType.INT16, rounding, divide=divide)

    with torch.no_grad():
        d = fq(x - x.amax(dim=dim, keepdim=True), s_in)
        nan = torch.isnan(d)
        # d is a code times s_in, fl32(q s_in) with |q| <= 2**15: q is d / s_in rounded (at a
        # scale so large that -32768 s_in overflows to -inf in float32, clamped to that code)
        q = torch.round(d.to(torch.float64) / s_in).masked_fill_(nan, 0).clamp_(min=-32768)
        e = values.index_select(0, q.neg_().to(torch.int64).reshape(-1)).reshape(d.shape)
        e = e.masked_fill_(nan, float("nan"))
        total = e.to(torch.float64).sum(dim=dim, keepdim=True).to(torch.float32)
        r = fq(qat_reciprocal(fq(total, s_sum), s_sum, DType.INT16), s_recip)
        return e.mul_(r)


@lru_cache(maxsize=64)
def qat_softmax_exp_values(
    in_scale: float, exp_scale: float, rounding: Round, divide: Divide
) -> Tensor:
    """The QAT softmax's e = fq(exp(d), exp_scale) for every code of d = -k, k = 0 .. 32768,
    at k (float32): d's value fl32(-k * in_scale) as its fake quant gives it, exp by torch's
    vectorized kernel (the tensor is padded to a multiple of 64 values, so no value takes the
    scalar tail loop), the fake quant INT16. Read-only."""
    k = torch.arange(0, 32832, dtype=torch.float32)
    d = fake_quant(-k * in_scale, in_scale, DType.INT16, rounding, divide=divide)
    e = fake_quant(torch.exp(d), exp_scale, DType.INT16, rounding, divide=divide)[:32769]
    # the premise of the exact row sum: every value a multiple of the unit in the last place
    # of the smallest positive value's binade, and below 2, so that a row's sum (below
    # 2 * QAT_SOFTMAX_MAX_ROW) is a multiple of the unit below 2**53 units
    e64 = e.to(torch.float64)
    unit = 2.0 ** (math.frexp(float(e64[e64 > 0].min()))[1] - 1 - 23)
    exact = torch.equal(torch.round(e64 / unit) * unit, e64) and float(e64.max()) < 2.0
    if not (exact and 2.0 * QAT_SOFTMAX_MAX_ROW <= 2.0**53 * unit):
        raise ValueError(
            f"exp_scale {exp_scale}: the QAT softmax's exp values would not sum exactly in "
            "double (exp_scale must be at least about 2**-15)"
        )
    return e.contiguous()


def inverse_sigmoid_composite(
    codes: Tensor,
    in_scale: float,
    out_scale: float,
    in_dtype: DType = DType.INT16,
    out_dtype: DType = DType.INT16,
    eps: float = INVERSE_SIGMOID_EPS,
    fmt: LutFormat = J6_FORMAT,
    recip_clip_codes: int = RECIPROCAL_CLIP_CODES_INT16,
) -> Tensor:
    """inverse_sigmoid as vendor ops build it: log(clamp(x, eps) * reciprocal(clamp(1 - x, eps))).

    Codes q (scale in_scale, x in [0, 1]):
    1. one_minus = saturate(round_half_even(1 / in_scale) - q) (same scale), clamped below at
       max(round(eps / in_scale), recip_clip_codes) (the QAT reciprocal input clip, 32 codes for
       int16: it caps 1/(1-x) at 1 / (32 in_scale));
    2. r = reciprocal LUT (default spec) to int16 with scale r_max / 32767, r_max that cap;
    3. p = requant(max(q, round(eps / in_scale)) * r) to int16 with the same scale as r;
    4. out = log LUT (default spec: symmetric, curvature, floor -10) to ``out_dtype``.
    The result is bounded below by -10 (log floor) and above by log(r_max): asymmetric, unlike
    the float op's +-ln((1 - eps)/eps). Requantizations: float64 ratio, HALF_UP (assumed).
    """
    in_dtype = DType.parse(in_dtype)
    out_dtype = DType.parse(out_dtype)
    if codes.dtype != in_dtype.torch_dtype:
        raise ValueError(
            f"inverse_sigmoid_composite expects {in_dtype.name} codes, got {codes.dtype}"
        )
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if recip_clip_codes < 1:
        raise ValueError(f"recip_clip_codes must be >= 1, got {recip_clip_codes}")
    in_scale = check_scale_float(in_scale, "in_scale")
    out_scale = check_scale_float(out_scale, "out_scale")
    q = codes.to(torch.int64)
    one = round_scalar(1.0 / in_scale)
    eps_code = round_scalar(eps / in_scale)
    lower = max(eps_code, recip_clip_codes)
    one_minus = (one - q).clamp(lower, in_dtype.qmax)
    r_max = 1.0 / (lower * in_scale)
    r_scale = r_max / DType.INT16.qmax
    recip = build_lut("reciprocal", in_dtype, in_scale, DType.INT16, r_scale, None, fmt)
    r = recip.evaluate(one_minus.to(in_dtype.torch_dtype)).to(torch.int64)
    x1 = q.clamp_min(max(eps_code, 0))
    p = requant_half_up(x1 * r, in_scale, DType.INT16)  # (x1 s_in)(r r_scale) / r_scale
    log_lut = build_lut("log", DType.INT16, r_scale, out_dtype, out_scale, default_spec("log"), fmt)
    return log_lut.evaluate(p.to(torch.int16))
