"""One rounding vocabulary for the whole lab, on floats and on integers, written once here.

``round_float`` rounds real values held in float tensors to integral floats; it is exact for
every finite float32/float64 input (no ``floor(x + 0.5)`` trap: 0.49999997 rounds to 0).
``rshift_round`` divides int64 tensors by a power of two with a named tie rule; it is pure
integer arithmetic and therefore exact by construction. ``rshift_round_np`` and
``rshift_round_int`` are the same contract on numpy int64 arrays and on Python ints (the LUT
evaluation runs in numpy, the float16 exact fallback on Python ints); ``round_scalar`` and
``round_rational`` round one Python float or exact rational (plan-time parameters).
``rshift_round_half_up_`` is the in-place form the requantization fast path uses. The slow
references in ``quantlab.numerics.reference`` keep their own, independent rounding.
"""

from __future__ import annotations

import enum
import math
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

MAX_SHIFT = 63
"""Shifts beyond this give the same result as 63 for |x| < 2**62 (the quotient is below 1/2)."""


class Round(enum.Enum):
    """Rounding to an integer. Ties are the only place the members differ (except FLOOR/TRUNC).

    HALF_EVEN: ties to even (torch.round, numpy.round, Python round, ONNX Runtime).
    HALF_UP:   ties toward +inf, ``floor(x + 0.5)`` in exact arithmetic (the BPU "bpu_round",
               gemmlowp SaturatingRoundingDoublingHighMul, TFLite single rounding).
    HALF_AWAY: ties away from zero (C ``std::round``, TFLite ``TfLiteRound``, RoundingDivideByPOT).
    FLOOR:     toward -inf (an arithmetic right shift).
    TRUNC:     toward zero (C integer division).
    """

    HALF_EVEN = "half_even"
    HALF_UP = "half_up"
    HALF_AWAY = "half_away"
    FLOOR = "floor"
    TRUNC = "trunc"


def _unknown(mode) -> ValueError:
    return ValueError(
        f"unknown rounding mode {mode!r}; allowed: {', '.join(m.name for m in Round)}"
    )


def round_float(x: Tensor, mode: Round) -> Tensor:
    """Round each element of a float tensor to an integral value of the same dtype.

    Exactness: ``x - floor(x)`` is exact in binary floating point (both are within a factor of
    two for |x| >= 1, and x is already integral once |x| >= 2**(p-1)), so the tie test is exact.
    NaN stays NaN and +-inf stay +-inf.
    """
    if not x.is_floating_point():
        raise TypeError(f"round_float expects a float tensor, got {x.dtype}")
    if mode is Round.HALF_EVEN:
        return torch.round(x)
    if mode is Round.FLOOR:
        return torch.floor(x)
    if mode is Round.TRUNC:
        return torch.trunc(x)
    if mode is Round.HALF_UP:
        f = torch.floor(x)
        return torch.where(x - f >= 0.5, f + 1, f)
    if mode is Round.HALF_AWAY:
        t = torch.trunc(x)
        frac = torch.abs(x - t)
        return torch.where(frac >= 0.5, t + torch.sign(x), t)
    raise _unknown(mode)


def round_float_(x: Tensor, mode: Round) -> Tensor:
    """``round_float`` in place on ``x`` (returned): one pass for HALF_EVEN, FLOOR and TRUNC."""
    if mode is Round.HALF_EVEN:
        return x.round_()
    if mode is Round.FLOOR:
        return x.floor_()
    if mode is Round.TRUNC:
        return x.trunc_()
    return x.copy_(round_float(x, mode))


def round_scalar(v: float, mode: Round = Round.HALF_EVEN) -> int:
    """One finite Python float rounded to an int by ``mode`` (exact: see ``round_float``)."""
    if not math.isfinite(v):
        raise ValueError(f"round_scalar needs a finite value, got {v}")
    if mode is Round.HALF_EVEN:
        return round(v)
    f = math.floor(v)
    frac = v - f  # exact
    if mode is Round.FLOOR:
        return f
    if mode is Round.TRUNC:
        return math.trunc(v)
    if mode is Round.HALF_UP:
        return f + 1 if frac >= 0.5 else f
    if mode is Round.HALF_AWAY:
        if frac != 0.5:
            return f + 1 if frac > 0.5 else f
        return f + 1 if v > 0 else f
    raise _unknown(mode)


def round_rational(v: Fraction, mode: Round = Round.HALF_EVEN) -> int:
    """One exact rational rounded to an int by ``mode`` (plan-time constants, exact)."""
    f = v.numerator // v.denominator  # floor
    r = v - f
    if mode is Round.FLOOR:
        return f
    if mode is Round.TRUNC:
        return f + (1 if v < 0 and r else 0)
    if r != Fraction(1, 2):
        return f + (1 if r > Fraction(1, 2) else 0)
    if mode is Round.HALF_UP:
        return f + 1
    if mode is Round.HALF_AWAY:
        return f + (1 if v > 0 else 0)
    if mode is Round.HALF_EVEN:
        return f + (f & 1)
    raise _unknown(mode)


def rshift_round(x: Tensor, n: int | Tensor, mode: Round) -> Tensor:
    """x / 2**n rounded to an integer by ``mode``; n >= 0 (an int or a broadcastable tensor).

    Domain: int64 tensors (any integer dtype is widened to int64); |x| < 2**62; any n >= 0
    (shifts above 63 give what 63 gives: FLOOR -1 for x < 0, else 0).
    Saturation: none; |result| <= |x| / 2**n + 1.
    Exactness: integer shifts, adds and masks only.
    """
    if x.is_floating_point():
        raise TypeError(f"rshift_round expects an integer tensor, got {x.dtype}")
    x = x.to(torch.int64)
    if isinstance(n, int):
        if n < 0:
            raise ValueError(f"shift must be >= 0, got {n}")
        if n == 0:
            return x.clone()
        nt = torch.tensor(min(n, MAX_SHIFT), dtype=torch.int64)
    else:
        nt = n.to(torch.int64)
        if bool((nt < 0).any()):
            raise ValueError("shift must be >= 0 everywhere")
        nt = nt.clamp_max(MAX_SHIFT)
    one = torch.ones((), dtype=torch.int64)
    q = torch.bitwise_right_shift(x, nt)  # floor division by 2**n
    if mode is Round.FLOOR:
        return q
    rem = x - torch.bitwise_left_shift(q, nt)  # 0 <= rem < 2**n
    half = torch.where(nt > 0, torch.bitwise_left_shift(one, (nt - 1).clamp_min(0)), 0)
    is_zero_shift = nt == 0
    if mode is Round.TRUNC:
        out = q + ((x < 0) & (rem != 0)).to(torch.int64)
    elif mode is Round.HALF_UP:
        out = q + (rem >= half).to(torch.int64)
    elif mode is Round.HALF_AWAY:
        up = (rem > half) | ((rem == half) & (x >= 0))
        out = q + up.to(torch.int64)
    elif mode is Round.HALF_EVEN:
        up = (rem > half) | ((rem == half) & (torch.bitwise_and(q, 1) == 1))
        out = q + up.to(torch.int64)
    else:
        raise _unknown(mode)
    return torch.where(is_zero_shift, x, out)


def half_up_offset(n: Tensor) -> Tensor:
    """2**(n-1) (int64) for shifts n >= 1: the offset that makes a floor shift round HALF_UP."""
    return torch.bitwise_left_shift(torch.ones_like(n), n - 1)


def rshift_round_half_up_(x: Tensor, n: Tensor, offset: Tensor) -> Tensor:
    """In place on int64 ``x``: floor((x + offset) / 2**n), i.e. round_half_up((x + extra) / 2**n)
    when ``offset = half_up_offset(n) + extra`` (extra: any integer, e.g. a bias folded in).

    Domain: 1 <= n <= 62 and |x + offset| < 2**63. Exactness: one integer add and one
    arithmetic shift (a floor). Returns ``x``.
    """
    return x.add_(offset).bitwise_right_shift_(n)


def rshift_round_np(v: np.ndarray, n: int, mode: Round) -> np.ndarray:
    """``rshift_round`` on numpy int64 arrays (same contract, shifts and masks only)."""
    if n < 0:
        raise ValueError(f"shift must be >= 0, got {n}")
    if n == 0:
        return v.copy()
    n = min(n, MAX_SHIFT)
    half = 1 << (n - 1)
    if mode is Round.HALF_UP:
        return (v + half) >> n  # |v| < 2**62: the sum cannot wrap
    q = v >> n  # floor
    if mode is Round.FLOOR:
        return q
    rem = v - (q << n)
    if mode is Round.HALF_EVEN:
        return q + ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    if mode is Round.HALF_AWAY:
        return q + ((rem > half) | ((rem == half) & (v >= 0)))
    if mode is Round.TRUNC:
        return q + ((rem != 0) & (v < 0))
    raise _unknown(mode)


def rshift_round_int(v: int, n: int, mode: Round) -> int:
    """``rshift_round`` on one Python int (any size; exact)."""
    if n < 0:
        raise ValueError(f"shift must be >= 0, got {n}")
    if n == 0:
        return v
    q = v >> n
    rem = v - (q << n)
    half = 1 << (n - 1)
    if mode is Round.FLOOR:
        return q
    if mode is Round.TRUNC:
        return q + (1 if rem and v < 0 else 0)
    if rem != half:
        return q + (1 if rem > half else 0)
    if mode is Round.HALF_UP:
        return q + 1
    if mode is Round.HALF_AWAY:
        return q + (1 if v >= 0 else 0)
    if mode is Round.HALF_EVEN:
        return q + (q & 1)
    raise _unknown(mode)


def saturate(x: Tensor, lo: int, hi: int) -> Tensor:
    """Clamp integer or float values to [lo, hi] (the only saturation primitive)."""
    return torch.clamp(x, lo, hi)
