"""Reference of ONNX Runtime's QLinearAdd (``quantlab.numerics.fma_add``): the float32 steps
MLAS takes in numpy float32 scalars, each fused multiply-add as an exact rational rounded once
to float32, rounding with Fractions, element by element."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.reference.arrays import as_numpy
from quantlab.numerics.reference.rounding import round_fraction
from quantlab.numerics.rounding import Round

F32 = np.float32


def round_to_float32(v: Fraction) -> float:
    """The float32 nearest to the exact rational ``v`` (ties to the even significand), found by
    checking the neighbours of a float64 guess exactly (finite results only)."""
    guess = F32(float(v))
    cands = {guess, np.nextafter(guess, F32(np.inf)), np.nextafter(guess, F32(-np.inf))}
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - v), int(c.view(np.uint32)) & 1))
    return float(best)


def qlinear_add(
    x, x_scale, y, y_scale, out_scale, out: DType, zero_point: int = 0, zero_points=(0, 0, 0)
) -> np.ndarray:
    """int64 output codes of MLAS QLinearAdd on codes with ``zero_points`` (x's, y's, output's),
    held shifted by ``zero_point``."""
    sc = F32(out_scale)
    ra, rb = F32(F32(x_scale) / sc), F32(F32(y_scale) / sc)
    za, zb, zc = (F32(v + zero_point) for v in zero_points)
    # the compiler's fused multiply-add: fl32(ra * za + fl32(rb * zb)), one rounding
    fused = round_to_float32(Fraction(float(ra)) * Fraction(float(za)) + Fraction(float(rb * zb)))
    fixed = F32(zc - F32(fused))
    xa, ya = np.broadcast_arrays(as_numpy(x).astype(np.int64), as_numpy(y).astype(np.int64))
    res = []
    for a, b in zip(xa.ravel(), ya.ravel()):
        inner = Fraction(int(b) + zero_point) * Fraction(float(rb)) + Fraction(float(fixed))
        rest = round_to_float32(inner)
        exact = Fraction(int(a) + zero_point) * Fraction(float(ra)) + Fraction(rest)
        c = round_fraction(Fraction(round_to_float32(exact)), Round.HALF_EVEN) - zero_point
        res.append(min(max(c, out.qmin), out.qmax))
    return np.array(res, dtype=np.int64).reshape(xa.shape)
