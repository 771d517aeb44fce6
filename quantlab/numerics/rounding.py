"""One rounding vocabulary for the whole lab, on floats and on integers.

``round_float`` rounds real values held in float tensors to integral floats; it is exact for
every finite float32/float64 input (no ``floor(x + 0.5)`` trap: 0.49999997 rounds to 0).
``rshift_round`` divides int64 tensors by a power of two with a named tie rule; it is pure
integer arithmetic and therefore exact by construction.
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor


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
    raise ValueError(f"unknown rounding mode {mode!r}; allowed: {', '.join(m.name for m in Round)}")


def rshift_round(x: Tensor, n: int | Tensor, mode: Round) -> Tensor:
    """x / 2**n rounded to an integer by ``mode``; n >= 0 (an int or a broadcastable tensor).

    Domain: int64 tensors (any integer dtype is widened to int64); |x| < 2**62.
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
        nt = torch.tensor(n, dtype=torch.int64)
    else:
        nt = n.to(torch.int64)
        if bool((nt < 0).any()):
            raise ValueError("shift must be >= 0 everywhere")
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
        raise ValueError(
            f"unknown rounding mode {mode!r}; allowed: {', '.join(m.name for m in Round)}"
        )
    return torch.where(is_zero_shift, x, out)


def saturate(x: Tensor, lo: int, hi: int) -> Tensor:
    """Clamp integer or float values to [lo, hi] (the only saturation primitive)."""
    return torch.clamp(x, lo, hi)
