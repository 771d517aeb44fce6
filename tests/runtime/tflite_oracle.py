"""LiteRT reference kernels (``OpResolverType.BUILTIN_REF``) restated in numpy int64.

Sources (tflite/kernels in LiteRT; tensorflow/lite/kernels in TensorFlow):
``internal/reference/integer_ops/{conv,depthwise_conv,fully_connected,add}.h``,
``internal/common.{h,cc}`` (MultiplyByQuantizedMultiplier; double rounding: the x86 wheel is
built without TFLITE_SINGLE_ROUNDING, as the tests measure),
``internal/quantization_util.cc`` (QuantizeMultiplier), ``kernel_util.cc`` (per-channel
multipliers, CalculateActivationRangeQuantized) and
``{conv,depthwise_conv,fully_connected,add}.cc`` (which kernel and accumulator type runs).

Rules, per op family (x, y activations with zero points zx, zy; int16 activations have
zero point 0; weights symmetric):
- CONV_2D / DEPTHWISE_CONV_2D int8: acc = int32 sum w*(x - zx) + bias (int32); per channel
  M = double(sx) * double(sw) / double(sy) -> (q, shift) by QuantizeMultiplier;
  y = clamp(MBQM32(acc, q, shift) + zy, act_min, act_max).
- CONV_2D 16x8, int64 bias (and DEPTHWISE 16x8, int64 bias only): int64 acc, MBQM64.
- CONV_2D 16x8, int32 bias: int32 acc (wraps), MBQM32.
- FULLY_CONNECTED (int8, and 16x8 with either bias): acc int32 (int8, 16x8 int32 bias) or
  int64 (16x8 int64 bias or none); y = clamp(round_half_away(double(acc) * M) + zy, ...) with
  M = double(sx) * double(sw) / double(sy) (per tensor or per channel): no integer multiplier.
- ADD (int8: left_shift 20, int16 general scales: left_shift 15): see ``add``.
Fused activations: act_min = max(qmin, zy) (RELU, RELU6); RELU6 act_max = min(qmax,
zy + roundf(6.0f / sy)) with the division in float32 and ties away from zero.
"""

from __future__ import annotations

import numpy as np
from litert_models import Activation, AddCase, ConvCase, FullyConnectedCase
from oracle_ops import (
    INT32_MAX,
    INT32_MIN,
    c_div,
    conv_acc,
    fc_acc,
    round_half_away,
    wrap_int32,
)


def quantize_multiplier(m: float) -> tuple[int, int]:
    """QuantizeMultiplier: m = q * 2**(shift - 31); q = round_half_away(frexp fraction * 2**31),
    q == 2**31 -> 2**30 with shift + 1; shift < -31 flushes to (0, 0); m == 0 -> (0, 0)."""
    if m == 0.0:
        return 0, 0
    frac, shift = np.frexp(np.float64(m))
    q = int(round_half_away(frac * float(1 << 31)))
    shift = int(shift)
    if q == 1 << 31:
        q //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return q, shift


def srdhm(a: np.ndarray, b: int) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul, literally: (a*b + nudge) / 2**31 with C
    division; nudge 2**30 (a*b >= 0) or 1 - 2**30; a = b = INT32_MIN gives INT32_MAX.
    Net effect: round(a*b / 2**31) with ties toward +inf."""
    a = np.asarray(a, np.int64)
    ab = a * np.int64(b)
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    out = c_div(ab + nudge, 1 << 31)
    return np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, out)


def rounding_divide_by_pot(x: np.ndarray, exponent: int) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT, literally: (x >> e) + (remainder > threshold), threshold
    = mask/2 (+1 for negative x): x / 2**e rounded to nearest, ties away from zero."""
    x = np.asarray(x, np.int64)
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def mbqm32(acc: np.ndarray, q, shift) -> np.ndarray:
    """MultiplyByQuantizedMultiplier(int32 x, ...), double rounding: SRDHM(wrap32(x *
    2**max(shift, 0)), q) then RoundingDivideByPOT by max(-shift, 0). q, shift per element."""
    acc = np.asarray(acc, np.int64)
    q = np.broadcast_to(np.asarray(q, np.int64), acc.shape)
    shift = np.broadcast_to(np.asarray(shift, np.int64), acc.shape)
    out = np.empty_like(acc)
    for qv, sv in set(zip(q.ravel().tolist(), shift.ravel().tolist())):
        sel = (q == qv) & (shift == sv)
        x = wrap_int32(acc[sel] << max(sv, 0))
        out[sel] = rounding_divide_by_pot(srdhm(x, qv), max(-sv, 0))
    return out


def mbqm64(acc: np.ndarray, q, shift) -> np.ndarray:
    """MultiplyByQuantizedMultiplier(int64 x, ...): reduced multiplier r = (q + 2**15) >> 16
    (0x7FFF if q >= 0x7FFF0000), total = 15 - shift, (x*r + 2**(total-1)) >> total (one
    rounding, ties toward +inf), then truncated to int32 (wraps)."""
    acc = np.asarray(acc, np.int64)
    q = np.broadcast_to(np.asarray(q, np.int64), acc.shape)
    shift = np.broadcast_to(np.asarray(shift, np.int64), acc.shape)
    red = np.where(q < 0x7FFF0000, (q + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - shift
    return wrap_int32((acc * red + (np.int64(1) << (total - 1))) >> total)


def activation_range(act: Activation, scale: np.float32, zp: int, dtype) -> tuple[int, int]:
    """CalculateActivationRangeQuantized: Quantize(f) = zp + roundf(f / scale) (float32
    division, ties away); RELU: [max(qmin, zp), qmax]; RELU6: also min(qmax, Quantize(6))."""
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)

    def quantize(f: float) -> int:
        return zp + int(round_half_away(np.float32(f) / np.float32(scale)))

    if act is Activation.NONE:
        return lo, hi
    lo = max(lo, quantize(0.0))
    if act is Activation.RELU6:
        hi = min(hi, quantize(6.0))
    return lo, hi


def per_channel_multipliers(sx, w_scale, sy, out_ch) -> tuple[np.ndarray, np.ndarray]:
    """(q, shift) per output channel of M = double(sx) * double(sw) / double(sy)."""
    sw = np.broadcast_to(np.asarray(w_scale, np.float32), (out_ch,))
    qs = [quantize_multiplier(float(np.float64(sx) * np.float64(s) / np.float64(sy))) for s in sw]
    return np.array([q for q, _ in qs], np.int64), np.array([e for _, e in qs], np.int64)


def wide_accumulator(act_dtype, bias) -> bool:
    """16x8 kernels accumulate in int64 unless the bias is int32 (options' quantized_bias_type
    INT32); int8 kernels in int32."""
    return np.dtype(act_dtype) == np.int16 and (bias is None or bias.dtype == np.int64)


def conv(c: ConvCase) -> np.ndarray:
    """Output codes of LiteRT's reference CONV_2D / DEPTHWISE_CONV_2D for a ConvCase."""
    acc = conv_acc(c)
    q, e = per_channel_multipliers(c.xq.scale, c.w_scale, c.yq.scale, acc.shape[-1])
    v = mbqm64(acc, q, e) if wide_accumulator(c.x.dtype, c.bias) else mbqm32(wrap_int32(acc), q, e)
    return finish(v, c.yq, c.activation, c.x.dtype)


def fully_connected(c: FullyConnectedCase) -> np.ndarray:
    """Output codes of LiteRT's reference FULLY_CONNECTED (double-precision rescale)."""
    acc = fc_acc(c)
    if not wide_accumulator(c.x.dtype, c.bias):
        acc = wrap_int32(acc)
    sw = np.broadcast_to(np.asarray(c.w_scale, np.float32), (c.w.shape[0],)).astype(np.float64)
    m = np.float64(c.xq.scale) * sw / np.float64(c.yq.scale)
    v = round_half_away(acc.astype(np.float64) * m).astype(np.int64)
    return finish(v, c.yq, c.activation, c.x.dtype)


def add(c: AddCase) -> np.ndarray:
    """Output codes of LiteRT's reference ADD (int8, or int16 with general scales).

    left_shift = 20 (int8) or 15 (int16); twice_max = 2 * max(sa, sb) (float32);
    ma = double(sa) / twice_max, mb likewise, mo = twice_max / double(fl32(2**left_shift * sy)),
    each QuantizeMultiplier'd (all < 1). a' = (a - za) * 2**left_shift, scaled by
    MBQM32(a', qa, ea); same for b; y = MBQM32(a' + b', qo, eo) + zy, clamped.
    """
    left = 15 if c.a.dtype == np.int16 else 20
    sa, sb, sy = (np.float32(q.scale) for q in (c.aq, c.bq, c.yq))
    twice_max = np.float64(np.float32(2) * max(sa, sb))
    qa, ea = quantize_multiplier(float(np.float64(sa) / twice_max))
    qb, eb = quantize_multiplier(float(np.float64(sb) / twice_max))
    qo, eo = quantize_multiplier(float(twice_max / np.float64(np.float32(1 << left) * sy)))
    a = wrap_int32((c.a.astype(np.int64) - c.aq.zero_point) << left)
    b = wrap_int32((c.b.astype(np.int64) - c.bq.zero_point) << left)
    s = wrap_int32(mbqm32(a, qa, ea) + mbqm32(b, qb, eb))
    return finish(mbqm32(s, qo, eo), c.yq, c.activation, c.a.dtype)


def finish(v: np.ndarray, yq, act: Activation, dtype, bounds=activation_range) -> np.ndarray:
    """+ zy (int32), then clamp to the activation range ``bounds(act, sy, zy, dtype)``."""
    lo, hi = bounds(act, yq.scale, yq.zero_point, dtype)
    return np.clip(wrap_int32(v + yq.zero_point), lo, hi).astype(dtype)
