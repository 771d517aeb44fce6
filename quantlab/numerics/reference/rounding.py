"""The references' own rounding: exact rationals (``fractions.Fraction``) rounded by the
definition of each rule, independent of ``quantlab.numerics.rounding``."""

from __future__ import annotations

import math
from fractions import Fraction

from quantlab.numerics.rounding import Round


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
