"""Slow twin of ``quantlab.numerics.eigen_float32``: Eigen's float32 log one element at a time,
every float32 operation an exact rational (Fraction) rounded once to float32."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from quantlab.numerics import eigen_float32 as E
from quantlab.numerics.reference.arrays import as_numpy
from quantlab.numerics.reference.mlas_float32 import to_float32


def _r(v: Fraction) -> Fraction:
    return Fraction(to_float32(v))


def _c(t) -> Fraction:
    return Fraction(float(t))


def _madd(a: Fraction, b: Fraction, c: Fraction) -> Fraction:
    return _r(_r(a * b) + c)


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
    below = mf < _c(E.SQRT_HALF)
    t = _r(_r(mf - 1) + (mf if below else 0))
    ef = ef - (1 if below else 0)
    p = _r(t * _madd(t, _madd(t, _c(E.LOG_P[2]), _c(E.LOG_P[1])), _c(E.LOG_P[0])))
    q = _madd(t, _madd(t, _madd(t, _c(E.LOG_Q[2]), _c(E.LOG_Q[1])), _c(E.LOG_Q[0])), 1)
    return to_float32(_madd(ef, _c(E.LN2), _r(p / q)))


def eigen_log(x) -> np.ndarray:
    """float32 log of float32 ``x``, element by element."""
    xs = as_numpy(x).astype(np.float32)
    out = [eigen_log_value(float(v)) for v in xs.ravel()]
    return np.array(out, dtype=np.float32).reshape(xs.shape)
