"""Quantization: scales, zero points, quantize, dequantize, fake_quant, fake_cast.

Conventions (j6-numerics s.1): symmetric, zero point 0, full integer range; activations
per-tensor, weights per-channel on ``axis`` (0 for conv/linear weights). Asymmetric
activations (ONNX Runtime, TFLite) carry one integer zero point per tensor:
codes = clamp(round(x / s) + zero_point), x = (codes - zero_point) * s.

x / scale is formed one of two ways (``Divide``): deployed quantization divides (ONNX
QuantizeLinear), QAT's fake-quant kernels multiply by the float32 reciprocal; the two differ
only where x / s lies within an ulp of a rounding tie (part of the fake-vs-fixed gap).

Non-finite inputs (counted in ``QuantStats``): +inf -> qmax, -inf -> qmin (saturation, like
any out-of-range value); NaN -> the zero point. ``QuantizeCast`` names the other conversions
runtimes make (onnxruntime's NaN -> qmin, TFLite's int32 cast); ``fake_quant`` with
``Divide.BY_RECIPROCAL`` keeps NaN, as torch's fake-quant kernels do not define it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.float16 import round_to_float16
from quantlab.numerics.rounding import Round, round_float, round_float_, round_scalar
from quantlab.numerics.scales import check_scale
from quantlab.numerics.shapes import along_axis

FLOAT32_EPS = float(torch.finfo(torch.float32).eps)
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
_CACHE_LIMIT = 4096  # per-tensor reciprocal constants kept (a plan-time cache, keyed by value)


class ScaleRule(enum.Enum):
    """How a scale is derived from an observed absolute maximum ``amax``.

    HALF_RANGE: amax / ((qmax - qmin) / 2), i.e. amax/127.5 (int8), amax/32767.5 (int16): J6 (s.1).
    QMAX:       amax / qmax, the common convention (TFLite, torch.ao symmetric).
    POT:        the smallest power of two >= amax / qmax (older BPU architectures; option).
    """

    HALF_RANGE = "half_range"
    QMAX = "qmax"
    POT = "pot"


class Divide(enum.Enum):
    """How ``x / scale`` is formed before rounding (float32 either way).

    BY_SCALE:      fl32(x / s), IEEE division (ONNX QuantizeLinear, torch.ao quantize ops).
    BY_RECIPROCAL: fl32(x * fl32(1 / s)) (torch.fake_quantize_per_tensor_affine and
                   ..._per_channel_affine: what QAT frameworks compute).
    """

    BY_SCALE = "by_scale"
    BY_RECIPROCAL = "by_reciprocal"


class QuantizeCast(enum.Enum):
    """How a rounded quotient r = round(x / s) becomes a code when no code holds it (NaN, or
    beyond [qmin, qmax]); every other r gives clamp(r + zero_point, qmin, qmax) under each.

    NAN_TO_ZERO_POINT: saturate; NaN -> the zero point (the code of 0.0).
    NAN_TO_LOWEST:     saturate; NaN -> qmin (onnxruntime's QuantizeLinear: MLAS clamps with
                       max(r, qmin), which returns qmin for a NaN).
    NAN_TO_HIGHEST:    8-bit codes: saturate, NaN -> qmax (XNNPACK's float -> 8-bit convert);
                       wider codes: INT32_CAST (LiteRT runs them in its own kernels).
    INT32_CAST:        the x86 float -> int32 conversion first (TFLite's kernels): NaN and any
                       r outside [-2**31, 2**31) become -2**31, so +inf and huge values give
                       qmin; then + zero_point in int32, wrapping; then clamp.
    """

    NAN_TO_ZERO_POINT = "nan_to_zero_point"
    NAN_TO_LOWEST = "nan_to_lowest"
    NAN_TO_HIGHEST = "nan_to_highest"
    INT32_CAST = "int32_cast"

    def for_bits(self, bits: int) -> QuantizeCast:
        """The conversion codes of ``bits`` bits take (NAN_TO_HIGHEST is 8-bit only)."""
        if self is QuantizeCast.NAN_TO_HIGHEST and bits > 8:
            return QuantizeCast.INT32_CAST
        return self


INT32_LIMIT = 2**31


@dataclass
class QuantStats:
    """Counts of what quantization had to force: NaN codes, infinities, saturated values."""

    total: int = 0
    nan: int = 0
    inf: int = 0
    saturated: int = 0  # finite values outside [qmin, qmax] after rounding

    def add(self, other: QuantStats) -> None:
        self.total += other.total
        self.nan += other.nan
        self.inf += other.inf
        self.saturated += other.saturated


def compute_scale(
    amax: Tensor | float,
    dtype: DType,
    rule: ScaleRule = ScaleRule.HALF_RANGE,
    narrow_range: bool = False,
) -> Tensor:
    """Scale (float32) for symmetric integer ``dtype`` from ``amax`` >= 0 (per-tensor or channel).

    HALF_RANGE: amax / ((qmax - qmin) / 2); QMAX: amax / qmax (qmax = qmax for narrow ranges too);
    POT: 2**ceil(log2(amax / qmax)). The result is floored at float32 eps so it is never 0.
    The division is done in float64 and rounded once to float32. ValueError when amax is NaN or
    infinite, or so large that the scale exceeds float32 (amax > ~4e40 for int8).
    """
    if not dtype.is_int:
        raise ValueError(f"compute_scale needs an integer dtype, got {dtype.name}")
    a = torch.as_tensor(amax, dtype=torch.float64).clamp_min(0)
    if not bool(torch.isfinite(a).all()):
        raise ValueError(f"compute_scale: amax must be finite, got {_values(a)}")
    if rule is ScaleRule.HALF_RANGE and not narrow_range:
        s = a / ((dtype.qmax - dtype.qmin) / 2)
    elif rule in (ScaleRule.QMAX, ScaleRule.HALF_RANGE):
        s = a / dtype.qmax
    elif rule is ScaleRule.POT:
        s = torch.exp2(torch.ceil(torch.log2((a / dtype.qmax).clamp_min(FLOAT32_EPS))))
    else:
        raise ValueError(f"unknown scale rule {rule!r}; allowed: {[r.name for r in ScaleRule]}")
    s32 = s.to(torch.float32)
    if not bool(torch.isfinite(s32).all()):
        raise ValueError(
            f"compute_scale: amax {_values(a)} gives a scale beyond the float32 range "
            f"(max {FLOAT32_MAX:.4g}) for {dtype.name}"
        )
    return s32.clamp_min(FLOAT32_EPS)


def _values(t: Tensor) -> str:
    v = t.flatten()[:4].tolist()
    return str(v[0]) if t.numel() == 1 else str(v)


def _broadcast_scale(scale: Tensor | float, x: Tensor, axis: int | None, name: str) -> Tensor:
    s = check_scale(scale, name)
    if axis is None:
        if s.numel() != 1:
            raise ValueError(
                f"per-tensor quantization needs one scale, got {s.numel()}; pass axis= for "
                "per-channel scales"
            )
        return s.reshape(())
    return along_axis(s.reshape(-1), x, axis, "per-channel scale")


def code_range(dtype: DType, qmin: int | None = None, qmax: int | None = None) -> tuple[int, int]:
    """[qmin, qmax] (defaults: the full range of integer ``dtype``); ValueError when a bound
    lies outside the dtype or qmin > qmax."""
    if not dtype.is_int:
        raise ValueError(f"code range needs an integer dtype, got {dtype.name}")
    dmin, dmax = dtype.qmin, dtype.qmax
    if qmin is None and qmax is None:
        return dmin, dmax
    lo = dmin if qmin is None else int(qmin)
    hi = dmax if qmax is None else int(qmax)
    if not dmin <= lo <= dmax:
        raise ValueError(f"qmin={lo} lies outside the {dtype.name} range [{dmin}, {dmax}]")
    if not dmin <= hi <= dmax:
        raise ValueError(f"qmax={hi} lies outside the {dtype.name} range [{dmin}, {dmax}]")
    if lo > hi:
        raise ValueError(f"qmin={lo} > qmax={hi}: the code range is empty")
    return lo, hi


def _scaled(xf: Tensor, s: Tensor, divide: Divide) -> Tensor:
    """x / s in float32 as ``divide`` forms it."""
    if divide is Divide.BY_SCALE:
        return xf / s
    if divide is Divide.BY_RECIPROCAL:
        return xf * (torch.ones((), dtype=torch.float32) / s)
    raise ValueError(f"unknown divide {divide!r}; allowed: {[d.name for d in Divide]}")


def quantize(
    x: Tensor,
    scale: Tensor | float,
    dtype: DType,
    rounding: Round = Round.HALF_EVEN,
    axis: int | None = None,
    qmin: int | None = None,
    qmax: int | None = None,
    stats: QuantStats | None = None,
    divide: Divide = Divide.BY_SCALE,
    zero_point: int = 0,
    cast: QuantizeCast = QuantizeCast.NAN_TO_ZERO_POINT,
) -> Tensor:
    """codes = clamp(round(x / scale) + zero_point, qmin, qmax) in ``dtype``'s torch dtype.

    Rounding: ``rounding`` applied once to x / scale formed in float32 by ``divide`` (x is cast
    to float32 first; BY_SCALE is the IEEE division, like torch.ao and ONNX QuantizeLinear).
    Saturation: clamps to [qmin, qmax] (defaults: the full range of ``dtype``; a bound outside
    the dtype or qmin > qmax raises); INT32 clamps exactly (in float64).
    Non-finite and beyond the code range: by ``cast`` (``QuantizeCast``; by default +inf ->
    qmax, -inf -> qmin, NaN -> zero_point); NaN, infinities and saturations are counted into
    ``stats``. Scale: finite and > 0 (per tensor, or 1-d along ``axis``), else ValueError.
    ``zero_point``: an integer inside the code range (``check_zero_point``), added exactly
    after rounding (per tensor).
    """
    if not dtype.is_int:
        raise ValueError(f"quantize needs an integer dtype, got {dtype.name}; use fake_cast")
    if not x.is_floating_point():
        raise TypeError(f"quantize expects a float tensor, got {x.dtype}")
    lo, hi = code_range(dtype, qmin, qmax)
    zp = check_zero_point(zero_point, dtype)
    lo, hi = lo - zp, hi - zp  # clamp(r + zp, lo, hi) - zp = clamp(r, lo - zp, hi - zp)
    xf = x.to(torch.float32)
    s = _broadcast_scale(scale, xf, axis, "scale")
    cast = cast.for_bits(dtype.bits)
    nan_code = {  # NaN's code, less the zero point (inside [lo, hi])
        QuantizeCast.NAN_TO_ZERO_POINT: 0,
        QuantizeCast.NAN_TO_LOWEST: lo,
        QuantizeCast.NAN_TO_HIGHEST: hi,
        QuantizeCast.INT32_CAST: None,
    }[cast]
    if stats is None and dtype is not DType.INT32 and lo <= 0 <= hi and nan_code is not None:
        # in place on the fresh quotient: clamp keeps NaN and maps +-inf to the bounds, and
        # NaN's code lies inside [lo, hi], so clamp-then-NaN equals NaN-then-clamp
        r = round_float_(_scaled(xf, s, divide), rounding).clamp_(lo, hi)
        r = r.nan_to_num_(nan=float(nan_code))
        if zp:
            r.add_(zp)  # exact: integers below 2**24
        return r.to(dtype.torch_dtype)
    r = round_float(_scaled(xf, s, divide), rounding)
    if dtype is DType.INT32:
        r = r.to(torch.float64)  # float32 cannot hold 2**31 - 1: compare and clamp exactly
    nan = torch.isnan(r)
    if stats is not None:
        stats.total += r.numel()
        stats.nan += int(nan.sum())
        stats.inf += int(torch.isinf(xf).sum())
        stats.saturated += int((((r < lo) | (r > hi)) & torch.isfinite(xf)).sum())
    if nan_code is None:
        return int32_cast(r, lo + zp, hi + zp, zp).to(dtype.torch_dtype)
    r = torch.where(nan, torch.full((), nan_code, dtype=r.dtype), r).clamp(lo, hi)
    if zp:
        r = r + zp  # exact: integers below 2**24 (2**53 for INT32)
    return r.to(dtype.torch_dtype)


def int32_cast(r: Tensor, lo: int, hi: int, zp: int) -> Tensor:
    """``QuantizeCast.INT32_CAST`` of rounded quotients ``r`` (float): int32(r), -2**31 for NaN
    and r outside [-2**31, 2**31); + ``zp`` wrapping in int32; clamped to [lo, hi] (int64)."""
    r = r.to(torch.float64)
    inside = (r >= -INT32_LIMIT) & (r < INT32_LIMIT)  # False for NaN
    i = torch.where(inside, r, torch.full((), -INT32_LIMIT, dtype=r.dtype)).to(torch.int64)
    i = (i + zp + INT32_LIMIT).remainder(2 * INT32_LIMIT) - INT32_LIMIT  # int32 wraps
    return i.clamp(lo, hi)


def centred_code_max(codes: Tensor, zero_point: int = 0) -> int:
    """max|code - zero_point| over the integer dtype of ``codes`` (a bound from the dtype, no
    pass over the data)."""
    info = torch.iinfo(codes.dtype)
    return max(abs(info.min - zero_point), abs(info.max - zero_point))


def check_zero_point(zero_point: int, dtype: DType) -> int:
    """An activation zero point: an integer inside ``dtype``'s code range (ValueError else)."""
    if isinstance(zero_point, bool) or not isinstance(zero_point, int):
        try:
            zp = int(zero_point)
        except (TypeError, ValueError):
            raise ValueError(f"zero_point must be an integer, got {zero_point!r}") from None
        if zp != zero_point:
            raise ValueError(f"zero_point must be an integer, got {zero_point!r}")
    else:
        zp = zero_point
    if zp and not dtype.is_int:
        raise ValueError(f"a zero point needs an integer dtype, got {dtype.name}")
    if zp and not dtype.qmin <= zp <= dtype.qmax:
        raise ValueError(
            f"zero_point={zp} lies outside the {dtype.name} range [{dtype.qmin}, {dtype.qmax}]"
        )
    return zp


def compute_zero_point_scale(
    lo: float, hi: float, dtype: DType, rounding: Round = Round.HALF_EVEN
) -> tuple[Tensor, int]:
    """Asymmetric per-tensor (scale, zero point) for the observed range [lo, hi].

    The range is widened to contain 0; scale = fl32((hi - lo) / (qmax - qmin)) (float64
    division, rounded once; floored at float32 eps); zero_point = qmin - round(lo / scale)
    (``rounding``, float64), clamped to the code range (ONNX Runtime's and TFLite's
    quantizers' rule).
    """
    if not dtype.is_int or dtype.bits > 16:
        raise ValueError(f"asymmetric quantization needs INT8, UINT8 or INT16, got {dtype.name}")
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"the observed range must be finite, got [{lo}, {hi}]")
    s = check_scale(
        max((hi - lo) / (dtype.qmax - dtype.qmin), FLOAT32_EPS), "asymmetric scale"
    ).reshape(())
    zp = dtype.qmin - round_scalar(lo / float(s), rounding)
    return s, int(min(max(zp, dtype.qmin), dtype.qmax))


def dequantize(
    codes: Tensor, scale: Tensor | float, axis: int | None = None, zero_point: int = 0
) -> Tensor:
    """x = (codes - zero_point) * scale in float32 (exact: |codes - zero_point| < 2**24 and
    one float32 product)."""
    if not zero_point and not codes.is_floating_point():  # one pass, the cast inside the product
        return torch.mul(codes, _broadcast_scale(scale, codes, axis, "scale"))
    c = codes.to(torch.float32)
    if zero_point:
        c = c.sub_(zero_point) if c is not codes else c - zero_point
    s = _broadcast_scale(scale, c, axis, "scale")
    return c.mul_(s) if c is not codes else c * s  # in place on a fresh float32 copy


def fake_cast(x: Tensor, dtype: DType, saturate: bool = True) -> Tensor:
    """Round float values to ``dtype`` (FLOAT16 or FLOAT32) and back to float32.

    Rounding: IEEE round to nearest even, once (float64 inputs are rounded straight to float16,
    not through float32, which would round twice). Saturation: with ``saturate`` finite
    values beyond +-65504 clamp to +-65504 (instead of becoming inf); inf and NaN pass through.
    """
    if dtype is DType.FLOAT32:
        return x.to(torch.float32)
    if dtype is not DType.FLOAT16:
        raise ValueError(f"fake_cast takes FLOAT16 or FLOAT32, got {dtype.name}")
    xf = x if x.dtype == torch.float64 else x.to(torch.float32)
    if saturate:
        m = DType.FLOAT16.max_finite
        xf = torch.where(torch.isfinite(xf), xf.clamp(-m, m), xf)
    return round_to_float16(xf).to(torch.float32)


def fake_quant(
    x: Tensor,
    scale: Tensor | float | None,
    dtype: DType,
    rounding: Round = Round.HALF_EVEN,
    axis: int | None = None,
    stats: QuantStats | None = None,
    saturate_float: bool = True,
    divide: Divide = Divide.BY_SCALE,
    qmin: int | None = None,
    qmax: int | None = None,
    bounds: tuple[float | None, float | None] | None = None,
    zero_point: int = 0,
) -> Tensor:
    """QAT numerics: dequantize(quantize(x)) for integer dtypes, fake_cast for float dtypes.

    Returns float32 (``codes * scale``, one product; a code -0 gives +0). For FLOAT16/FLOAT32
    ``scale`` is ignored (may be None). ``bounds`` = (lo, hi) fake-quantizes
    ``clamp(x, lo, hi)`` (a fused relu6) in the same pass. ``divide``: BY_SCALE follows
    ``quantize`` (NaN -> 0); BY_RECIPROCAL is torch's fake-quant kernel bit for bit (NaN stays
    NaN). Per tensor, BY_RECIPROCAL takes its constants (fl32(1/s), the code bounds of
    ``bounds``) from a cache keyed by the scale's value; a clamp commutes with the monotone
    ``fl32(. * r)`` and the rounding, so ``bounds`` become code bounds
    ``[round(fl32(lo) * r), round(fl32(hi) * r)]``. ``zero_point`` (per tensor): the same
    as the symmetric fake quant with the code range shifted by -zero_point.
    """
    if dtype.is_float:
        return fake_cast(x, dtype, saturate=saturate_float)
    if scale is None:
        raise ValueError(f"fake_quant to {dtype.name} needs a scale")
    lo, hi = code_range(dtype, qmin, qmax)
    zp = check_zero_point(zero_point, dtype)
    if divide is Divide.BY_RECIPROCAL:
        return _fake_quant_reciprocal(x, scale, rounding, axis, lo - zp, hi - zp, bounds, stats)
    if bounds is not None:
        x = torch.clamp(x, bounds[0], bounds[1])
    if axis is None and stats is None and dtype.bits <= 16 and x.is_floating_point():
        return fake_quant_by_scale(
            x, check_scale(scale, "scale").reshape(()), lo - zp, hi - zp, rounding
        )
    codes = quantize(
        x, scale, dtype, rounding, axis=axis, qmin=lo, qmax=hi, stats=stats, zero_point=zp
    )
    return dequantize(codes, scale, axis=axis, zero_point=zp)


def fake_quant_by_scale(
    x: Tensor,
    s: Tensor,
    lo: int,
    hi: int,
    rounding: Round,
    sf: float | None = None,
    *,
    inplace: bool = False,
    keep_nan: bool = False,
) -> Tensor:
    """Per-tensor ``Divide.BY_SCALE`` fake quant of ``x`` at the checked 0-d float32 scale
    ``s``, code range [lo, hi] already shifted by -zero_point, in place on one fresh float32
    tensor without gradient (like the codes): round(fl32(x / s)), NaN -> 0, clamp, + 0.0
    (code -0 -> +0), * s. The same float32 values as ``quantize`` then ``dequantize``
    (integer codes below 2**16 are exact in float32; their round trip only turns -0 into +0).
    ``sf``: ``s`` as a Python float, when the caller holds it (no host read per call).
    ``inplace``: a float32 ``x`` without gradient that the caller owns is that tensor (the same
    values, one allocation fewer). ``keep_nan``: a NaN stays NaN instead of becoming code 0
    (one pass fewer), for a caller that checks its result for NaN and then computes again
    without it; every other value is the same.
    """
    xf = x.detach()
    if inplace and xf.dtype == torch.float32 and not x.requires_grad:
        q = xf.div_(s)
    else:
        q = torch.div(xf.to(torch.float32), s)
    if lo <= 0 <= hi:
        # five passes, not six: a clamp to integer bounds commutes with the monotone rounding, and a
        # NaN (which both keep) becomes the code 0 inside [lo, hi] either before or after
        q = round_float_(q.clamp_(lo, hi), rounding)
        if not keep_nan:
            q = q.nan_to_num_(nan=0.0)
        return times_scale_(q, s.item() if sf is None else sf)
    q = round_float_(q, rounding)
    if not keep_nan:
        q = q.nan_to_num_(nan=0.0, posinf=math.inf, neginf=-math.inf)
    return q.clamp_(lo, hi).add_(0.0).mul_(s)


_ZERO = torch.zeros(())


def times_scale_(q: Tensor, sf: float) -> Tensor:
    """``(q + 0.0) * sf`` in place on float32 integer codes ``q``, in one pass (+0.0 turns a
    code -0 into +0): ``torch.add(0, q, alpha=sf)`` is ``fl32(sf * q) + 0`` whether or not the
    kernel fuses the multiply-add (fma(sf, q, 0) rounds the same exact product once); both
    equal ``(q + 0.0) * sf`` bit for bit, as a nonzero integer code times a scale > 0 cannot
    round to zero, and a zero product + 0.0 is +0."""
    return torch.add(_ZERO, q, alpha=sf, out=q)


def _one_float32(scale) -> float | None:
    """The value of a one-element float32 scale tensor (the hot per-tensor case), else None."""
    if isinstance(scale, Tensor) and scale.dtype == torch.float32 and scale.numel() == 1:
        return scale.item()
    return None


def _fake_quant_reciprocal(x, scale, rounding, axis, lo, hi, bounds, stats) -> Tensor:
    xf = x.detach().to(torch.float32)
    v = _one_float32(scale) if axis is None and stats is None else None
    if v is not None and v > 0 and v != math.inf:  # per tensor, valid: cached constants
        lo, hi, rf, sf = _reciprocal_constants(v, lo, hi, bounds, rounding)
        q = round_float_(torch.mul(xf, rf), rounding)
        return times_scale_(q.clamp_(lo, hi), sf)  # code -0 -> +0, as torch
    s = check_scale(scale, "scale")
    if bounds is not None:
        xf = torch.clamp(xf, bounds[0], bounds[1])
    sb = _broadcast_scale(s, xf, axis, "scale")
    q = round_float_(_scaled(xf, sb, Divide.BY_RECIPROCAL), rounding)
    if stats is not None:
        stats.total += q.numel()
        stats.nan += int(torch.isnan(q).sum())
        stats.inf += int(torch.isinf(xf).sum())
        stats.saturated += int((((q < lo) | (q > hi)) & torch.isfinite(xf)).sum())
    return q.clamp_(lo, hi).add_(0.0).mul_(sb)


_RECIPROCAL_CONSTANTS: dict[tuple, tuple[int, int, float, float]] = {}


def _reciprocal_constants(
    s: float, lo: int, hi: int, bounds, rounding: Round
) -> tuple[int, int, float, float]:
    """(code lo, code hi, fl32(1/s), s) for one float32 scale value and optional clamp bounds;
    cached by value (the scale's float value, the code range, the bounds, the rounding)."""
    key = (s, lo, hi, bounds, rounding)
    hit = _RECIPROCAL_CONSTANTS.get(key)
    if hit is not None:
        return hit
    r = torch.ones((), dtype=torch.float32) / torch.tensor(s, dtype=torch.float32)
    if bounds is not None:
        for i, b in enumerate(bounds):
            if b is None:
                continue
            code = round_float(torch.tensor(b, dtype=torch.float32) * r, rounding)
            if i == 0:
                lo = max(lo, int(code))
            else:
                hi = min(hi, int(code))
    value = (lo, hi, float(r), s)
    if len(_RECIPROCAL_CONSTANTS) >= _CACHE_LIMIT:
        _RECIPROCAL_CONSTANTS.clear()
    _RECIPROCAL_CONSTANTS[key] = value
    return value
