"""Slow, obviously-correct twins of the fast numerics, for tests only.

Integer sums are numpy int64 (no BLAS, no floats); requantization and rounding use Python ints
and ``fractions.Fraction`` element by element, following the published C code line by line
where a runtime defines the bits (gemmlowp, TFLite). Float32 steps a runtime performs in float32
are done with numpy float32 scalars. Every function takes tensors or arrays and returns a numpy
array (int64 for integers) so tests compare it with ``assert_bits_equal``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.rounding import Round

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def _np(t) -> np.ndarray:
    if hasattr(t, "detach"):
        return t.detach().cpu().numpy()
    return np.asarray(t)


def _pair(v, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(i) for i in v)
    if len(v) != n:
        raise ValueError(f"expected {n} values, got {v}")
    return v


def round_fraction(v: Fraction, mode: Round) -> int:
    """Round an exact rational to an integer by ``mode`` (the definition of each tie rule)."""
    f = math.floor(v)
    r = v - f
    if mode is Round.FLOOR:
        return f
    if mode is Round.TRUNC:
        return f if (v >= 0 or r == 0) else f + 1
    if r > Fraction(1, 2):
        return f + 1
    if r < Fraction(1, 2):
        return f
    if mode is Round.HALF_UP:
        return f + 1
    if mode is Round.HALF_AWAY:
        return f + 1 if v > 0 else f
    if mode is Round.HALF_EVEN:
        return f if f % 2 == 0 else f + 1
    raise ValueError(f"unknown rounding mode {mode!r}")


# --------------------------------------------------------------------------- integer GEMM


def int_matmul(a, b) -> np.ndarray:
    """a @ b in numpy int64 (numpy's integer matmul is a plain loop, exact below 2**63)."""
    return np.matmul(_np(a).astype(np.int64), _np(b).astype(np.int64))


def int_linear(x, w) -> np.ndarray:
    """x @ w.T in numpy int64."""
    return int_matmul(x, _np(w).T)


def int_conv2d(x, w, stride=1, padding=0, dilation=1, groups: int = 1) -> np.ndarray:
    """Zero-padded conv2d in numpy int64: a loop over groups and kernel taps, each tap an
    int64 einsum of a strided input slice with one weight column."""
    return _conv2d_loops(
        _np(x).astype(np.int64), _np(w).astype(np.int64), stride, padding, dilation, groups
    )


def _conv2d_loops(x, w, stride, padding, dilation, groups):
    """The tap loop on arrays of any exact dtype (int64, or object holding Python ints)."""
    squeeze = x.ndim == 3
    if squeeze:
        x = x[None]
    sh, sw = _pair(stride, 2)
    ph, pw = _pair(padding, 2)
    dh, dw = _pair(dilation, 2)
    n, cin, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    cout_g = cout // groups
    xp = np.zeros((n, cin, h + 2 * ph, wd + 2 * pw), dtype=x.dtype)
    xp[:, :, ph : ph + h, pw : pw + wd] = x
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, cout, ho, wo), dtype=x.dtype)
    for g in range(groups):
        xs = xp[:, g * cin_g : (g + 1) * cin_g]
        wg = w[g * cout_g : (g + 1) * cout_g]
        for i in range(kh):
            for j in range(kw):
                tap = xs[
                    :,
                    :,
                    i * dh : i * dh + sh * (ho - 1) + 1 : sh,
                    j * dw : j * dw + sw * (wo - 1) + 1 : sw,
                ]
                out[:, g * cout_g : (g + 1) * cout_g] += np.einsum(
                    "nchw,oc->nohw", tap, wg[:, :, i, j]
                )
    return out[0] if squeeze else out


def int_conv1d(x, w, stride=1, padding=0, dilation=1, groups: int = 1) -> np.ndarray:
    """conv1d as conv2d over a height-1 image (numpy int64)."""
    x = _np(x)
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
    out = int_conv2d(
        x[:, :, None, :],
        _np(w)[:, :, None, :],
        (1, _pair(stride, 1)[0]),
        (0, _pair(padding, 1)[0]),
        (1, _pair(dilation, 1)[0]),
        groups,
    )[:, :, 0, :]
    return out[0] if squeeze else out


def accumulate(acc, dtype: DType = DType.INT32, saturate: bool = True) -> tuple[np.ndarray, int]:
    """Saturate or two's-complement wrap Python ints to ``dtype``; count those outside."""
    lo, hi = dtype.qmin, dtype.qmax
    vals = [int(v) for v in _np(acc).ravel()]
    count = sum(1 for v in vals if v < lo or v > hi)
    if saturate:
        out = [min(max(v, lo), hi) for v in vals]
    else:
        out = [((v - lo) % (1 << dtype.bits)) + lo for v in vals]
    return np.array(out, dtype=np.int64).reshape(_np(acc).shape), count


# --------------------------------------------------------------------------- requantization


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


def _wrap32(v: int) -> int:
    return ((v - INT32_MIN) % (1 << 32)) + INT32_MIN


def requantize_value(acc: int, m: float, q: int, e: int, scheme, mode: Round, mult_bits=31) -> int:
    """One accumulator through one scheme (unsaturated result)."""
    from quantlab.numerics.requant import Requant

    if scheme is Requant.FLOAT_RESCALE:
        v = np.float32(acc) * np.float32(m)  # one float32 product, as ONNX Runtime
        return round_fraction(Fraction(float(v)), mode)
    if scheme is Requant.MUL_SHIFT:
        return round_fraction(Fraction(acc * q) / Fraction(2) ** (mult_bits - e), mode)
    if scheme is Requant.MUL_SHIFT_DOUBLE:
        left, right = max(e, 0), max(-e, 0)
        h = srdhm(_wrap32(acc * (1 << left)), q)
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


def requantize(acc, real, scheme, out: DType, mode: Round, axis=None, mult_bits=31) -> np.ndarray:
    """Reference ``requantize``: ``real`` is M (scalar or per channel along ``axis``)."""
    a = _np(acc).astype(np.int64)
    reals = np.atleast_1d(_np(real)).astype(np.float64)
    enc = [quantize_multiplier(float(r), mult_bits) for r in reals]
    out_arr = np.empty(a.shape, dtype=np.int64)
    for idx in np.ndindex(a.shape):
        c = 0 if reals.size == 1 else idx[axis % a.ndim]
        q, e = enc[c]
        v = requantize_value(int(a[idx]), float(reals[c]), q, e, scheme, mode, mult_bits)
        out_arr[idx] = min(max(v, out.qmin), out.qmax)
    return out_arr


def quantize_bias(bias, x_scale, w_scale) -> np.ndarray:
    """round_half_even(fl32(bias / fl32(sx * sw))) saturated to int32, numpy float32."""
    b = _np(bias).astype(np.float32)
    s = np.float32(x_scale) * _np(w_scale).astype(np.float32)
    v = (b / s).astype(np.float32)
    out = [round_fraction(Fraction(float(t)), Round.HALF_EVEN) for t in v.ravel()]
    out = [min(max(t, INT32_MIN), INT32_MAX) for t in out]
    return np.array(out, dtype=np.int64).reshape(v.shape)


def add_inter_scale(
    x, x_scale, y, y_scale, out_scale, out: DType, scheme, mode: Round, inter_shift=14
) -> np.ndarray:
    """J6 add rule with numpy float32 scales and Python-int sums, then reference requantize."""
    from quantlab.numerics.requant import Requant

    sx, sy, so = np.float32(x_scale), np.float32(y_scale), np.float32(out_scale)
    inter = np.float32(max(sx, sy) / np.float32(1 << inter_shift))
    mx = int(np.rint(np.float32(sx / inter)))
    my = int(np.rint(np.float32(sy / inter)))
    xa, ya = np.broadcast_arrays(_np(x).astype(np.int64), _np(y).astype(np.int64))
    acc = np.array(
        [
            min(max(int(a) * mx + int(b) * my, INT32_MIN), INT32_MAX)
            for a, b in zip(xa.ravel(), ya.ravel())
        ],
        dtype=np.int64,
    ).reshape(xa.shape)
    if scheme is Requant.FLOAT_RESCALE:
        real = float(np.float32(inter / so))
    else:
        real = float(np.float64(inter) / np.float64(so))
    return requantize(acc, real, scheme, out, mode)


def add_float_rescale(x, x_scale, y, y_scale, out_scale, out: DType, mode=Round.HALF_EVEN):
    """ONNX Runtime QLinearAdd scalar formula in numpy float32, rounded with Fractions."""
    so = np.float32(out_scale)
    rx, ry = np.float32(np.float32(x_scale) / so), np.float32(np.float32(y_scale) / so)
    xa, ya = np.broadcast_arrays(_np(x).astype(np.float32), _np(y).astype(np.float32))
    v = (xa * rx).astype(np.float32) + (ya * ry).astype(np.float32)
    r = [round_fraction(Fraction(float(t)), mode) for t in v.astype(np.float32).ravel()]
    return np.clip(np.array(r, dtype=np.int64), out.qmin, out.qmax).reshape(xa.shape)


def quantize(x, scale, dtype: DType, mode: Round = Round.HALF_EVEN, axis=None) -> np.ndarray:
    """fl32(x / scale) rounded by ``mode`` then clamped; +inf -> qmax, -inf -> qmin, NaN -> 0."""
    xa = _np(x).astype(np.float32)
    s = _np(scale).astype(np.float32)
    if axis is not None:
        shape = [1] * xa.ndim
        shape[axis] = -1
        s = s.reshape(shape)
    with np.errstate(all="ignore"):
        v = (xa / s).astype(np.float32)
    out = []
    for t in v.ravel():
        t = float(t)
        if math.isnan(t):
            out.append(0)
        elif math.isinf(t):
            out.append(dtype.qmax if t > 0 else dtype.qmin)
        else:
            out.append(min(max(round_fraction(Fraction(t), mode), dtype.qmin), dtype.qmax))
    return np.array(out, dtype=np.int64).reshape(v.shape)


# --------------------------------------------------------------------------- float16

_F16_SCALE = 1 << 24  # every float16 value is an integer multiple of 2**-24


def round_to_float16(v: Fraction) -> float:
    """The float16 nearest to the exact rational ``v`` (ties to the even significand; inf at
    or beyond 65520), found by checking the neighbours of a float32 guess exactly."""
    if v == 0:
        return 0.0
    if abs(v) >= 65520:
        return math.inf if v > 0 else -math.inf
    with np.errstate(over="ignore"):
        return _nearest_f16(v)


def _nearest_f16(v: Fraction) -> float:
    guess = np.float16(np.float32(float(v)))
    if np.isinf(guess):
        guess = np.float16(65504.0) if v > 0 else np.float16(-65504.0)
    cands = {
        guess,
        np.nextafter(guess, np.float16(np.inf)),
        np.nextafter(guess, np.float16(-np.inf)),
    }
    cands = [c for c in cands if np.isfinite(c)]
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - v), int(c.view(np.uint16)) & 1))
    return float(best)


def f16_binary(a, b, op: str) -> np.ndarray:
    """Correctly rounded float16 a (op) b for finite a, b, with Fractions and IEEE zero signs."""
    aa, bb = np.broadcast_arrays(_np(a).astype(np.float16), _np(b).astype(np.float16))
    out = np.empty(aa.shape, dtype=np.float16)
    for idx in np.ndindex(aa.shape):
        x, y = float(aa[idx]), float(bb[idx])
        fx, fy = Fraction(x), Fraction(y)
        if op == "add":
            v = fx + fy
        elif op == "sub":
            v = fx - fy
        elif op == "mul":
            v = fx * fy
        elif op == "div":
            v = fx / fy
        else:
            raise ValueError(op)
        r = round_to_float16(v)
        if r == 0:  # the sign of a zero result (exact zero or underflow)
            if v != 0:
                neg = v < 0
            elif op in ("mul", "div"):
                neg = math.copysign(1, x) * math.copysign(1, y) < 0
            else:
                y_eff = -y if op == "sub" else y
                neg = math.copysign(1, x) < 0 and math.copysign(1, y_eff) < 0
            r = -0.0 if neg else 0.0
        out[idx] = r
    return out


def _f16_ints(t) -> np.ndarray:
    a = _np(t).astype(np.float64)
    return np.array([int(v * _F16_SCALE) for v in a.ravel()], dtype=object).reshape(a.shape)


def _ints_to_f16(n: np.ndarray, frac_bits: int) -> np.ndarray:
    out = [round_to_float16(Fraction(int(v), 1 << frac_bits)) for v in n.ravel()]
    return np.array(out, dtype=np.float16).reshape(n.shape)


def f16_matmul(a, b, bias=None) -> np.ndarray:
    """float16 a @ b (+ bias per column) summed exactly with Python ints, rounded once."""
    acc = np.matmul(_f16_ints(a), _f16_ints(b))
    if bias is not None:
        acc = acc + _f16_ints(bias) * _F16_SCALE
    return _ints_to_f16(acc, 48)


def f16_conv2d(x, w, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> np.ndarray:
    """float16 conv2d summed exactly with Python ints (the integer tap loop), rounded once."""
    acc = _conv2d_loops(_f16_ints(x), _f16_ints(w), stride, padding, dilation, groups)
    if bias is not None:
        acc = acc + (_f16_ints(bias) * _F16_SCALE).reshape(1, -1, 1, 1)
    return _ints_to_f16(acc, 48)
