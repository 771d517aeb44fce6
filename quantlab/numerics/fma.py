"""IEEE float32 fused multiply-add, fl32(a * r + c) rounded once to nearest even, computed on
the CPU in float64 with an exact correction (the runtimes quantlab emulates use the FMA3
instruction; torch has no float32 fma with that contract). Pure function on tensors."""

from __future__ import annotations

import torch
from torch import Tensor


def fma_float32(a: Tensor, r: Tensor, c: Tensor) -> Tensor:
    """fl32(a * r + c) with one rounding (IEEE fused multiply-add) for float32 ``a``, ``r``,
    ``c`` (broadcasting; float32 result; finite operands whose exact result is finite).

    Exactness: a * r has at most 24 + 24 significant bits, so it is exact in float64 (its
    exponent stays far inside float64's range). The float64 sum s = fl64(a * r + c) and its
    exact error t (TwoSum) give the exact value s + t; rounding s to float32 equals rounding
    s + t unless s lies exactly halfway between two float32 neighbours and t != 0 (a float32
    midpoint has 25 significant bits, so it is a float64; a midpoint strictly between s and
    s + t would be nearer to s + t than s is). In that case the result is the neighbour on t's
    side.
    """
    p = a.to(torch.float64) * r.to(torch.float64)
    c64 = c.to(torch.float64)
    s = p + c64
    bp = s - c64
    t = (p - bp) + (c64 - (s - bp))  # TwoSum: s + t == p + c exactly
    f = s.to(torch.float32)  # nearest float32 to s, ties to even
    f64 = f.to(torch.float64)
    toward = torch.where(s > f64, torch.inf, -torch.inf).to(torch.float32)
    g = torch.nextafter(f, toward)  # the float32 neighbour on s's other side
    g64 = g.to(torch.float64)
    # differences of nearby floats are exact (Sterbenz), so the midpoint test is exact
    mid = (s != f64) & ((s - f64) == (g64 - s))
    to_g = mid & (t != 0) & ((t > 0) == (g64 > s))
    return torch.where(to_g, g, f)
