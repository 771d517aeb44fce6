"""Slow twin of ``quantlab.numerics.mlas_float32``: MLAS's tanh, logistic, exp, erf and GELU one
element at a time, every float32 operation and fused multiply-add an exact rational (Fraction)
rounded once to float32. Finite inputs (exp may overflow to inf, as the kernel does)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from quantlab.numerics import mlas_float32 as M
from quantlab.numerics.reference.arrays import as_numpy
from quantlab.numerics.reference.fma_add import round_to_float32


def exact(t) -> Fraction:
    """The exact value of a float (or 0-d tensor) as a Fraction."""
    return Fraction(float(t))


def fl32(v: Fraction) -> Fraction:
    """v rounded to float32, kept as a Fraction (finite results)."""
    return Fraction(round_to_float32(v))


F32_MAX = Fraction(float(np.finfo(np.float32).max))
F32_HALF_ULP_MAX = Fraction(2) ** 103  # half the spacing of float32 at its largest binade


def to_float32(v: Fraction) -> float:
    """v rounded to float32 as a Python float: +-inf beyond the largest float32 (by at least
    half its spacing), as IEEE rounding overflows."""
    if abs(v) >= F32_MAX + F32_HALF_ULP_MAX:
        return math.copysign(math.inf, v)
    return round_to_float32(v)


def _fma(a: Fraction, b: Fraction, c: Fraction) -> Fraction:
    return fl32(a * b + c)


def _horner(coeffs, x: Fraction) -> Fraction:
    p = exact(coeffs[0])
    for c in coeffs[1:]:
        p = _fma(p, x, exact(c))
    return p


def _odd_rational(x: Fraction, alpha, beta) -> Fraction:
    x2 = fl32(x * x)
    return fl32(fl32(x * _horner(alpha, x2)) / _horner(beta, x2))


def _tanh(x: Fraction) -> Fraction:
    x = min(max(x, Fraction(-M.TANH_RANGE)), Fraction(M.TANH_RANGE))
    return _odd_rational(x, M.TANH_ALPHA, M.TANH_BETA)  # a float32 value: exact below


def _logistic(x: Fraction) -> Fraction:
    x = min(max(x, Fraction(-M.LOGISTIC_RANGE)), Fraction(M.LOGISTIC_RANGE))
    return max(fl32(_odd_rational(x, M.LOGISTIC_ALPHA, M.LOGISTIC_BETA) + Fraction(1, 2)), 0)


def _exp(x: Fraction) -> Fraction:
    return _exp_steps(max(x, exact(M.EXP_LOWER)), M.EXP_POLY)


def _exp_steps(x: Fraction, poly) -> Fraction:
    """exp by the kernels' steps with polynomial ``poly``, before vscalefps' one rounding."""
    m = fl32(_fma(x, exact(M.EXP_LOG2E), exact(M.EXP_BIAS)) - exact(M.EXP_BIAS))
    r = _fma(m, exact(M.EXP_LN2_HI), x)
    r = _fma(m, exact(M.EXP_LN2_LO), r)
    p = _horner((*poly, 1.0, 1.0), r)
    assert m.denominator == 1
    return p * Fraction(2) ** int(m)


def _gelu(x: Fraction) -> Fraction:
    e = _erf(fl32(x * exact(M.GELU_INV_SQRT2)))
    return fl32(fl32(exact(M.GELU_HALF) * x) * fl32(e + 1))


def _erf(v: Fraction) -> Fraction:
    a = min(abs(v), exact(M.GELU_ERF_CAP))
    small = _fma(_horner(M.GELU_ERF_SMALL, fl32(a * a)), a, a)
    split = a > exact(M.GELU_ERF_SPLIT)
    b_in = a if split else Fraction(0)
    big = max(exact(M.GELU_EXP_LOWER), -_fma(_horner(M.GELU_ERF_BIG, b_in), b_in, b_in))
    big = fl32(1 - fl32(_exp_steps(big, M.GELU_EXP_POLY)))
    mag = big if split else small
    return -mag if v < 0 else mag


_FUNCS = {"tanh": _tanh, "logistic": _logistic, "exp": _exp, "erf": _erf, "gelu": _gelu}


def mlas_value(func: str, v: float) -> float:
    """``func`` ("tanh", "logistic", "exp", "erf", "gelu") of one finite float32 value ``v``."""
    y = to_float32(_FUNCS[func](Fraction(v)))
    if y == 0 and func in ("tanh", "erf", "gelu"):  # they keep x's sign; a Fraction has none
        y = math.copysign(0.0, v)
    return y


def mlas(func: str, x) -> np.ndarray:
    """float32 values of ``func`` ("tanh", "logistic", "exp", "erf", "gelu") on float32 ``x``,
    element by element."""
    xs = as_numpy(x).astype(np.float32)
    out = [mlas_value(func, float(v)) for v in xs.ravel()]
    return np.array(out, dtype=np.float32).reshape(xs.shape)
