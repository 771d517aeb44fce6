"""Requantization and quantization references: Python ints and ``fractions.Fraction`` element
by element, following the published C code line by line where a runtime defines the bits
(gemmlowp, TFLite); float32 steps a runtime performs in float32 use numpy float32 scalars."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import Divide, QuantizeCast
from quantlab.numerics.quantize_tail import QuantizeTail
from quantlab.numerics.reference.arrays import as_numpy
from quantlab.numerics.reference.rounding import round_fraction
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def quantize_multiplier(m: float, mult_bits: int = 31) -> tuple[int, int]:
    """TFLite QuantizeMultiplier with Python ints: (q, shift), M ~= q * 2**(shift - mult_bits)."""
    if m == 0:
        return 0, 0
    f, e = math.frexp(m)
    q = round_fraction(Fraction(f) * (1 << mult_bits), Round.HALF_AWAY)
    if q == 1 << mult_bits:
        q //= 2
        e += 1
    if e < -31:
        return 0, 0
    if e > 30:  # TFLite (single-rounding build): the shift saturates at 30
        return (1 << mult_bits) - 1, 30
    return q, e


def _c_div_trunc(n: int, d: int) -> int:
    q = abs(n) // abs(d)
    return q if (n >= 0) == (d > 0) else -q


def srdhm(a: int, b: int) -> int:
    """gemmlowp SaturatingRoundingDoublingHighMul, line by line (int32 a, b)."""
    if a == INT32_MIN and b == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    return _c_div_trunc(ab + nudge, 1 << 31)


def rounding_divide_by_pot(x: int, e: int) -> int:
    """gemmlowp RoundingDivideByPOT (ties away from zero), line by line."""
    mask = (1 << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> e) + (1 if remainder > threshold else 0)


def _saturate32(v: int) -> int:
    return min(max(v, INT32_MIN), INT32_MAX)


def requantize_value(acc: int, m: float, q: int, e: int, scheme, mode: Round, mult_bits=31) -> int:
    """One accumulator through one scheme (unsaturated result)."""
    if scheme is Requant.FLOAT_RESCALE:
        v = np.float32(acc) * np.float32(m)  # one float32 product, as ONNX Runtime
        return round_fraction(Fraction(float(v)), mode)
    if scheme is Requant.FLOAT64_RESCALE:
        v = float(acc) * float(m)  # one float64 product (Python floats are IEEE doubles)
        return round_fraction(Fraction(v), mode)
    if scheme is Requant.MUL_SHIFT:
        return round_fraction(Fraction(acc * q) / Fraction(2) ** (mult_bits - e), mode)
    if scheme is Requant.MUL_SHIFT_DOUBLE:
        left, right = max(e, 0), max(-e, 0)
        h = srdhm(_saturate32(acc * (1 << left)), q)  # saturating left shift
        if mode is Round.HALF_AWAY:
            return rounding_divide_by_pot(h, right)
        return round_fraction(Fraction(h, 1 << right), mode)
    if scheme is Requant.MUL_SHIFT_INT64:
        reduced = ((q + (1 << 15)) >> 16) if q < 0x7FFF0000 else 0x7FFF
        total = 15 - e
        if mode is Round.HALF_UP and total >= 1:
            return (acc * reduced + (1 << (total - 1))) >> total  # TFLite, line by line
        return round_fraction(Fraction(acc * reduced) / Fraction(2) ** total, mode)
    raise ValueError(f"unknown scheme {scheme!r}")


def requantize(
    acc, real, scheme, out: DType, mode: Round, axis=None, mult_bits=31, zero_point: int = 0
) -> np.ndarray:
    """Reference ``requantize``: ``real`` is M (scalar or per channel along ``axis``); the
    output's ``zero_point`` is added before saturation."""
    a = as_numpy(acc).astype(np.int64)
    reals = np.atleast_1d(as_numpy(real)).astype(np.float64)
    enc = [quantize_multiplier(float(r), mult_bits) for r in reals]
    out_arr = np.empty(a.shape, dtype=np.int64)
    for idx in np.ndindex(a.shape):
        c = 0 if reals.size == 1 else idx[axis % a.ndim]
        q, e = enc[c]
        v = requantize_value(int(a[idx]), float(reals[c]), q, e, scheme, mode, mult_bits)
        out_arr[idx] = min(max(v + zero_point, out.qmin), out.qmax)
    return out_arr


def quantize_bias(bias, x_scale, w_scale) -> np.ndarray:
    """round_half_even(fl32(bias / fl32(sx * sw))) saturated to int32, numpy float32."""
    b = as_numpy(bias).astype(np.float32)
    s = np.float32(x_scale) * as_numpy(w_scale).astype(np.float32)
    v = (b / s).astype(np.float32)
    out = [round_fraction(Fraction(float(t)), Round.HALF_EVEN) for t in v.ravel()]
    out = [min(max(t, INT32_MIN), INT32_MAX) for t in out]
    return np.array(out, dtype=np.int64).reshape(v.shape)


def add_inter_scale(
    x, x_scale, y, y_scale, out_scale, out: DType, scheme, mode: Round, inter_shift=14,
    zero_points=(0, 0, 0),
) -> np.ndarray:  # fmt: skip
    """J6 add rule with numpy float32 scales and Python-int sums on the centred codes, then
    reference requantize (+ the output's zero point); ``zero_points`` = (x's, y's, output's)."""
    zx, zy, zo = zero_points
    sx, sy, so = np.float32(x_scale), np.float32(y_scale), np.float32(out_scale)
    inter = np.float32(max(sx, sy) / np.float32(1 << inter_shift))
    mx = int(np.rint(np.float32(sx / inter)))
    my = int(np.rint(np.float32(sy / inter)))
    xa, ya = np.broadcast_arrays(as_numpy(x).astype(np.int64), as_numpy(y).astype(np.int64))
    acc = np.array(
        [
            min(max((int(a) - zx) * mx + (int(b) - zy) * my, INT32_MIN), INT32_MAX)
            for a, b in zip(xa.ravel(), ya.ravel())
        ],
        dtype=np.int64,
    ).reshape(xa.shape)
    if scheme is Requant.FLOAT_RESCALE:
        real = float(np.float32(inter / so))
    else:
        real = float(np.float64(inter) / np.float64(so))
    return requantize(acc, real, scheme, out, mode, zero_point=zo)


def add_float_rescale(
    x, x_scale, y, y_scale, out_scale, out: DType, mode=Round.HALF_EVEN, zero_points=(0, 0, 0)
):
    """ONNX Runtime QLinearAdd scalar formula in numpy float32, rounded with Fractions;
    ``zero_points`` = (x's, y's, output's)."""
    zx, zy, zo = zero_points
    so = np.float32(out_scale)
    rx, ry = np.float32(np.float32(x_scale) / so), np.float32(np.float32(y_scale) / so)
    xa, ya = np.broadcast_arrays(as_numpy(x).astype(np.int64), as_numpy(y).astype(np.int64))
    xa, ya = (xa - zx).astype(np.float32), (ya - zy).astype(np.float32)
    v = (xa * rx).astype(np.float32) + (ya * ry).astype(np.float32)
    r = [round_fraction(Fraction(float(t)), mode) + zo for t in v.astype(np.float32).ravel()]
    return np.clip(np.array(r, dtype=np.int64), out.qmin, out.qmax).reshape(xa.shape)


def quantize(
    x,
    scale,
    dtype: DType,
    mode: Round = Round.HALF_EVEN,
    axis=None,
    zero_point: int = 0,
    cast: QuantizeCast = QuantizeCast.NAN_TO_ZERO_POINT,
    divide: Divide = Divide.BY_SCALE,
    tail: QuantizeTail = QuantizeTail.NONE,
) -> np.ndarray:
    """fl32(x / scale) (BY_RECIPROCAL: fl32(x * fl32(1 / scale))) rounded by ``mode``, +
    zero_point, then clamped; +inf -> qmax, -inf -> qmin, NaN -> zero_point (NAN_TO_LOWEST:
    qmin; NAN_TO_HIGHEST, 8-bit: qmax; INT32_CAST: int32(r) with -2**31 for NaN and r outside
    [-2**31, 2**31), + zero_point wrapping in int32, clamped). ``tail``
    SCALAR_FLOAT64_HALF_AWAY, codes wider than 8 bits: the last (n mod 8) elements in memory
    order (4-d: NHWC) by the double quotient rounded half away, then as INT32_CAST."""
    cast = cast.for_bits(dtype.bits)
    nan_code = {
        QuantizeCast.NAN_TO_ZERO_POINT: zero_point,
        QuantizeCast.NAN_TO_LOWEST: dtype.qmin,
        QuantizeCast.NAN_TO_HIGHEST: dtype.qmax,
    }.get(cast)
    xa = as_numpy(x).astype(np.float32)
    s = as_numpy(scale).astype(np.float32)
    if axis is not None:
        shape = [1] * xa.ndim
        shape[axis] = -1
        s = s.reshape(shape)
    with np.errstate(all="ignore"):
        if divide is Divide.BY_RECIPROCAL:
            v = (xa * (np.float32(1) / s).astype(np.float32)).astype(np.float32)
        else:
            v = (xa / s).astype(np.float32)
    out = []
    for t in v.ravel():
        t = float(t)
        if cast is QuantizeCast.INT32_CAST:
            r = round_fraction(Fraction(t), mode) if math.isfinite(t) else INT32_MIN
            r = r if INT32_MIN <= r <= INT32_MAX else INT32_MIN  # the x86 conversion
            out.append(min(max(_wrap32(r + zero_point), dtype.qmin), dtype.qmax))
        elif math.isnan(t):
            out.append(nan_code)
        elif math.isinf(t):
            out.append(dtype.qmax if t > 0 else dtype.qmin)
        else:
            r = round_fraction(Fraction(t), mode) + zero_point
            out.append(min(max(r, dtype.qmin), dtype.qmax))
    if tail is QuantizeTail.SCALAR_FLOAT64_HALF_AWAY and dtype.bits > 8:
        ids = np.arange(xa.size).reshape(xa.shape)
        if xa.ndim == 4:
            ids = np.moveaxis(ids, 1, -1)  # element ids in NHWC memory order
        ids = ids.ravel()
        for k in ids[ids.size - ids.size % 8 :]:
            with np.errstate(all="ignore"):
                t = float(np.float64(xa.flat[k]) / np.float64(s.ravel()[0]))  # one double division
            r = round_fraction(Fraction(t), Round.HALF_AWAY) if math.isfinite(t) else INT32_MIN
            r = r if INT32_MIN <= r <= INT32_MAX else INT32_MIN
            out[k] = min(max(_wrap32(r + zero_point), dtype.qmin), dtype.qmax)
    return np.array(out, dtype=np.int64).reshape(v.shape)


def _wrap32(v: int) -> int:
    return ((v - INT32_MIN) % (1 << 32)) + INT32_MIN


def _mbqm32(x: int, q: int, e: int) -> int:
    """TFLite MultiplyByQuantizedMultiplier (double rounding), line by line."""
    left, right = max(e, 0), max(-e, 0)
    return rounding_divide_by_pot(srdhm(_saturate32(x * (1 << left)), q), right)


def add_left_shift(x, sx, y, sy, so, out: DType, left_shift: int, zero_points=(0, 0, 0)):
    """TFLite reference ADD (add.cc / integer_ops/add.h) with Python ints, element by element."""
    zx, zy, zo = zero_points
    sx, sy, so = np.float32(sx), np.float32(sy), np.float32(so)
    twice_max = float(np.float32(2) * max(sx, sy))
    qx, ex = quantize_multiplier(float(sx) / twice_max)
    qy, ey = quantize_multiplier(float(sy) / twice_max)
    qo, eo = quantize_multiplier(twice_max / float(np.float32(1 << left_shift) * so))
    xa, ya = np.broadcast_arrays(as_numpy(x).astype(np.int64), as_numpy(y).astype(np.int64))
    res = []
    for a, b in zip(xa.ravel().tolist(), ya.ravel().tolist()):
        sa = _mbqm32(_wrap32((a - zx) * (1 << left_shift)), qx, ex)
        sb = _mbqm32(_wrap32((b - zy) * (1 << left_shift)), qy, ey)
        v = _mbqm32(_wrap32(sa + sb), qo, eo) + zo
        res.append(min(max(v, out.qmin), out.qmax))
    return np.array(res, dtype=np.int64).reshape(xa.shape)


def add_shared_shift(x, sx, y, sy, so, out: DType, mult_bits: int = 20, zero_points=(0, 0, 0)):
    """XNNPACK's int8 add (xnn_init_qs8_add_minmax_scalar_params, qs8-vadd scalar) with
    Python ints, element by element: one shared shift, one rounding (ties toward +inf)."""
    zx, zy, zo = zero_points
    rx = np.float32(np.float32(sx) / np.float32(so))
    ry = np.float32(np.float32(sy) / np.float32(so))
    exponent = (int(np.float32(max(rx, ry)).view(np.uint32)) >> 23) - 127
    shift = mult_bits - exponent
    mx = round_fraction(Fraction(float(rx)) * 2**shift, Round.HALF_EVEN)
    my = round_fraction(Fraction(float(ry)) * 2**shift, Round.HALF_EVEN)
    bias = (1 << (shift - 1)) - mx * zx - my * zy
    xa, ya = np.broadcast_arrays(as_numpy(x).astype(np.int64), as_numpy(y).astype(np.int64))
    res = []
    for a, b in zip(xa.ravel().tolist(), ya.ravel().tolist()):
        v = (_wrap32(bias + mx * a + my * b) >> shift) + zo
        res.append(min(max(v, out.qmin), out.qmax))
    return np.array(res, dtype=np.int64).reshape(xa.shape)


def bound_code(f: float, scale, zero_point: int, rule_name: str) -> int:
    """A fused activation bound as an (unclamped) code, by the rule's published formula:
    FLOAT64_HALF_EVEN: zp + round(f / s) (exact rational of the float64 quotient, ties even);
    FLOAT32_HALF_AWAY: zp + roundf(fl32(f / s)); FLOAT32_HALF_EVEN: zp + rne(fl32(f / s));
    FLOAT32_ZERO_POINT_HALF_EVEN: lrintf(fl32(fl32(f / s) + zp))."""
    s = np.float32(scale)
    if rule_name == "FLOAT64_HALF_EVEN":
        return zero_point + round_fraction(Fraction(float(f) / float(s)), Round.HALF_EVEN)
    q = np.float32(np.float32(f) / s)
    if rule_name == "FLOAT32_HALF_AWAY":
        return zero_point + round_fraction(Fraction(float(q)), Round.HALF_AWAY)
    if rule_name == "FLOAT32_HALF_EVEN":
        return zero_point + round_fraction(Fraction(float(q)), Round.HALF_EVEN)
    v = np.float32(q + np.float32(zero_point))
    return round_fraction(Fraction(float(v)), Round.HALF_EVEN)
