"""float16 references: correctly rounded results of exact rationals (Fractions, Python ints)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from quantlab.numerics.reference.arrays import as_numpy
from quantlab.numerics.reference.gemm import _conv2d_loops

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
    aa, bb = np.broadcast_arrays(as_numpy(a).astype(np.float16), as_numpy(b).astype(np.float16))
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
    a = as_numpy(t).astype(np.float64)
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
