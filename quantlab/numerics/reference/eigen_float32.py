"""Slow twin of ``quantlab.numerics.eigen_float32``: Eigen's float32 log, sin and cos one
element at a time, every float32 operation an exact rational (Fraction) rounded once to float32;
the large-argument sin / cos reduction on Python integers."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from quantlab.numerics import eigen_float32 as E
from quantlab.numerics.reference.arrays import as_numpy
from quantlab.numerics.reference.mlas_float32 import exact, fl32, to_float32


def _madd(a: Fraction, b: Fraction, c: Fraction) -> Fraction:
    return fl32(fl32(a * b) + c)


def eigen_log_value(v: float) -> float:
    """log of one float32 value ``v`` as Eigen's ``plog_float`` computes it."""
    if math.isnan(v) or v < 0:
        return -math.nan  # Eigen's invalid result has its sign bit set
    if v == 0:
        return -math.inf
    if math.isinf(v):
        return math.inf
    m, e = math.frexp(v)  # exact: v = m 2**e, 0.5 <= m < 1
    mf, ef = Fraction(m), Fraction(e)
    below = mf < exact(E.SQRT_HALF)
    t = fl32(fl32(mf - 1) + (mf if below else 0))
    ef = ef - (1 if below else 0)
    p = fl32(t * _madd(t, _madd(t, exact(E.LOG_P[2]), exact(E.LOG_P[1])), exact(E.LOG_P[0])))
    q = _madd(t, _madd(t, _madd(t, exact(E.LOG_Q[2]), exact(E.LOG_Q[1])), exact(E.LOG_Q[0])), 1)
    return to_float32(_madd(ef, exact(E.LN2), fl32(p / q)))


def eigen_log(x) -> np.ndarray:
    """float32 log of float32 ``x``, element by element."""
    xs = as_numpy(x).astype(np.float32)
    out = [eigen_log_value(float(v)) for v in xs.ravel()]
    return np.array(out, dtype=np.float32).reshape(xs.shape)


def _huge(v: float) -> tuple[Fraction, int]:
    """Eigen's Payne-Hanek reduction of |v| >= 2**14 on Python integers: the significand times
    the 96 bits of 2/pi its exponent selects, kept modulo 2**64 (2.62-bit fixed point)."""
    m, e2 = math.frexp(v)  # v = m 2**e2, the significand an integer of 24 bits
    sig = int(m * (1 << 24))
    e = (e2 - 1 + 127) - 118  # the biased exponent less 118, as the float's bits give it
    xi = (sig << (e & 7)) % (1 << 32)
    i = e >> 3
    t1, t2, t3 = (E._TWO_OVER_PI_BITS[i + d] for d in (-1, 3, 7))
    p = ((xi * t1) % (1 << 32) << 32) + xi * t2 + ((xi * t3) >> 32)
    p %= 1 << 64
    q = ((p + (1 << 61)) % (1 << 64)) >> 62
    p = (p - (q << 62)) % (1 << 64)
    frac = p - (1 << 64) if p >> 63 else p
    r = Fraction(frac) * Fraction(3.4061215800865545e-19)  # a float64 product, then float32
    return Fraction(to_float32(Fraction(float(r)))), q


def eigen_sincos_value(v: float, sine: bool) -> float:
    """sin (``sine``) or cos of one finite float32 value ``v`` as Eigen computes it."""
    a = abs(Fraction(v))
    y_round = fl32(fl32(a * exact(E._TWO_OVER_PI)) + exact(E._ROUNDING))
    y = y_round - exact(E._ROUNDING)  # exact: an integer below 2**22
    k = int(y)
    r = a
    for c in E._PIO2_PARTS:
        r = _madd(y, exact(c), r)
    if abs(v) >= (E.HUGE_SIN if sine else E.HUGE_COS):
        r, k = _huge(abs(v))
    r2 = fl32(r * r)
    cos_p = exact(E._COS_POLY[0])
    for c in E._COS_POLY[1:]:
        cos_p = _madd(cos_p, r2, exact(c))
    sin_p = _madd(
        _madd(exact(E._SIN_POLY[0]), r2, exact(E._SIN_POLY[1])), r2, exact(E._SIN_POLY[2])
    )
    sin_p = _madd(fl32(sin_p * r2), r, r)
    even = k % 2 == 0
    val = float((sin_p if even else cos_p) if sine else (cos_p if even else sin_p))
    negative = ((k >> 1) & 1) ^ (math.copysign(1.0, v) < 0) if sine else ((k + 1) >> 1) & 1
    if val == 0:  # the sign bit flips a zero too
        val = 0.0
    return -val if negative else val


def eigen_sincos(x, sine: bool) -> np.ndarray:
    """float32 sin (``sine``) or cos of float32 ``x``, element by element."""
    xs = as_numpy(x).astype(np.float32)
    out = [eigen_sincos_value(float(v), sine) for v in xs.ravel()]
    return np.array(out, dtype=np.float32).reshape(xs.shape)


def eigen_exp_value(v: float) -> float:
    """exp of one finite float32 value ``v`` as Eigen's ``pexp_float`` computes it."""
    if v < float(E.EXP_LO):
        return 0.0
    x = min(Fraction(v), exact(E.EXP_HI))
    m = math.floor(_madd(x, exact(E.LOG2E), exact(E.HALF)))
    r = _madd(Fraction(m), exact(E.EXP_C2), _madd(Fraction(m), exact(E.EXP_C1), x))
    r2 = fl32(r * r)
    p2, p3, p4, p5, p6 = (exact(c) for c in E.EXP_P)
    p_even = _madd(r2, _madd(r2, p6, p4), p2)
    p_odd = _madd(r2, p5, p3)
    y = _madd(r2, _madd(r, p_odd, p_even), fl32(r + 1))
    e = max(-E.LDEXP_MAX, min(E.LDEXP_MAX, m))  # pldexp: four products by powers of two
    b = e // 4
    out = float(y)
    for k in (b, b, b, e - 3 * b):
        out = to_float32(Fraction(out) * Fraction(2) ** k)
        if math.isinf(out):
            break
    return max(out, v)


def eigen_log1p_value(v: float) -> float:
    """log(1 + v) of one finite float32 value ``v`` > -1 as Eigen's ``generic_plog1p``."""
    u = to_float32(Fraction(v) + 1)
    if u == 1.0 or math.isinf(u):
        return v
    log_u = eigen_log_value(u)
    return to_float32(Fraction(v) * fl32(Fraction(log_u) / fl32(Fraction(u) - 1)))


def eigen_exp(x) -> np.ndarray:
    """float32 exp of float32 ``x``, element by element."""
    xs = as_numpy(x).astype(np.float32)
    return np.array([eigen_exp_value(float(v)) for v in xs.ravel()], np.float32).reshape(xs.shape)


def eigen_log1p(x) -> np.ndarray:
    """float32 log1p of float32 ``x`` > -1, element by element."""
    xs = as_numpy(x).astype(np.float32)
    out = [eigen_log1p_value(float(v)) for v in xs.ravel()]
    return np.array(out, dtype=np.float32).reshape(xs.shape)
