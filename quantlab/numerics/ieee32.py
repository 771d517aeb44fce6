"""Correctly rounded float32 operations that torch does not give on every build.

* ``sqrt32``: the IEEE square root. torch's float32 ``sqrt`` is not correctly rounded on every
  build (off by one ulp on about 15% of random values on an AVX-512 CPU; its float64 ``sqrt``
  on about 1%), numpy's is (the CPU's square root instruction).
* ``fma32``: fl32(a * b + c) with one rounding (a fused multiply-add). The product of two
  float32 values is exact in float64; the sum is formed exactly (TwoSum) and rounded to float64
  by round-to-odd, from which rounding to float32 gives the correctly rounded result (float64
  has at least 2 * 24 + 2 significand bits).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def _round_to_odd_sum(a: Tensor, b: Tensor) -> Tensor:
    """float64 a + b rounded to odd (TwoSum gives the exact error; where it is not 0 and the
    rounded sum's last bit is even, step one ulp toward the exact value)."""
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    even = (s.view(torch.int64) & 1) == 0
    inexact = err != 0
    toward = torch.where(err > 0, torch.full_like(s, math.inf), torch.full_like(s, -math.inf))
    return torch.where(inexact & even, torch.nextafter(s, toward), s)


def sqrt32(v: Tensor) -> Tensor:
    """The correctly rounded square root of float32 ``v`` (numpy's); NaN below 0, as torch's,
    without numpy's warning."""
    with np.errstate(invalid="ignore"):
        return torch.from_numpy(np.sqrt(v.detach().contiguous().numpy()))


def fma32(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """fl32(a * b + c) with one rounding, for float32 ``a``, ``b``, ``c`` (broadcast)."""
    p = a.to(torch.float64) * b.to(torch.float64)  # exact: 24 + 24 significant bits
    return _round_to_odd_sum(p, c.to(torch.float64).expand_as(p)).to(torch.float32)
