"""The fast requantization floor((acc * q + offset) / 2**n) in float64 passes, and the bounds
that prove those passes give its integers (``finish.finish_gemm``'s fast form).

``q * 2**-n`` is exact in float64 (an integer below 2**31 scaled by a power of two;
1 <= n <= 62), and so is ``offset * 2**-n`` while |offset| <= 2**53. Two proofs say when
``floor(acc * (q * 2**-n) + offset * 2**-n)``, clamped to [lo, hi], equals the shift:
- ``float_form``: a bound on max|acc| under which every product and sum is an exact integer
  multiple of 2**-n below 2**53 of them (the offset split into an integer carry and a
  remainder when it is itself too wide);
- ``float_window``: without a carry, a bound on the output clamp under which every value that
  lands inside [lo, hi] is computed exactly and every other one lands outside it, whatever
  max|acc|.
``float64_values`` / ``float64_codes`` are the passes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.dtypes import FLOAT64_EXACT
from quantlab.numerics.rounding import half_up_offset


def float_form(q: Tensor, n: Tensor, offset: Tensor):
    """float64 constants of the fast form, the largest max|acc| for which they are exact, and
    the carry (None, or the integers added after the floor).

    ``q * 2**-n`` is exact (an integer below 2**31 scaled by a power of two; 1 <= n <= 62).
    When every |offset| <= 2**53 the offset is one exact float64 too: with |acc| <= limit,
    ``|acc * q| + |offset| <= limit * max q + max|offset| <= 2**53``, so the product, the sum
    and the scaling are exact and ``floor`` equals the arithmetic shift (carry None).
    Otherwise (bias codes times q past 2**53) the offset splits exactly as I * 2**n + R with I
    the nearest integer to offset / 2**n and |R| <= 2**(n-1) (n <= 54: R is one float64):
    ``floor((acc * q + R) / 2**n)``
    is exact under ``limit * max q + max|R| <= 2**53``, and adding the integer I after the
    floor gives ``floor((acc * q + offset) / 2**n)`` (the carry I). (None, None, -1, None)
    when no acc qualifies.
    """
    q_max, n_max = int(q.max()), int(n.max())
    if q_max <= 0 or n_max > 62:
        return None, None, -1, None
    scale = torch.pow(2.0, -n.to(torch.float64))
    step = q.to(torch.float64) * scale
    off_max = int(offset.abs().max())
    if off_max <= FLOAT64_EXACT:
        return step, offset.to(torch.float64) * scale, (FLOAT64_EXACT - off_max) // q_max, None
    if n_max > 54:  # a remainder of up to 2**(n-1) would not be one float64
        return None, None, -1, None
    carry = (offset + half_up_offset(n)) >> n  # nearest integer, ties up (exact in int64)
    if int(carry.abs().max()) > FLOAT64_EXACT >> 1:  # the carry, and the sum, one float64
        return None, None, -1, None
    rest = offset - (carry << n)  # |rest| <= 2**(n-1)
    rest_max = int(rest.abs().max())
    limit = (FLOAT64_EXACT - rest_max) // q_max
    return step, rest.to(torch.float64) * scale, limit, carry.to(torch.float64)


def float_window(n: Tensor, offset: Tensor) -> int:
    """The largest W with W * 2**n + |offset| <= 2**53 on every channel (-1 when none): the
    float64 passes (no carry) are then exact for every exact acc (|acc| < 2**53) and output
    clamp [lo, hi] with max(-lo, hi + 1) <= W.

    With s = q * 2**-n, O = offset * 2**-n and v = acc * s + O (the exact value, whose floor is
    the fast form's result before its clamp): if lo <= v < hi + 1, then |v| <= W, so the
    integers v * 2**n and acc * q = v * 2**n - offset are at most 2**53 in magnitude: fl(acc *
    s) is exact, and so is fl(. + O) = v. If v >= hi + 1, then acc * s >= (hi + 1) - O, a
    float64 (its 2**n multiple is at most 2**53), so by monotone rounding fl(fl(acc * s) + O)
    >= hi + 1 and the clamp gives hi, as for v; if v < lo, likewise fl(fl(acc * s) + O) <= lo
    and the clamp gives lo."""
    w = (FLOAT64_EXACT - offset.abs()) >> n
    return max(int(w.min()), -1)


def float64_codes(acc, step, off, carry, out_dtype, lo, hi, reuse_acc) -> Tensor:
    return float64_values(acc, step, off, carry, lo, hi, reuse_acc).to(out_dtype.torch_dtype)


def float64_values(part, st, of, carry, lo, hi, reuse_acc) -> Tensor:
    """floor(part * st + of) (+ ``carry``, when not None) clamped to [lo, hi], in float64 (the
    floor skipped for lo >= 0 without a carry: the integer conversion's truncation of the
    clamped values is their floor)."""
    if part.dtype == torch.float64 and reuse_acc:
        t = part
    else:
        t = part.to(torch.float64, copy=True)  # exact: integers below 2**53
    # the product and the sum are exact wherever the result counts (``float_form``,
    # ``float_window``), so two in-place passes give the fused value; per-channel broadcasts in
    # mul_/add_ vectorise, addcmul's do not
    t.mul_(st).add_(of)
    if carry is not None:  # integers: the sum after the floor is exact
        t.floor_().add_(carry)
    elif lo < 0:
        t.floor_()
    # clamp commutes with floor (integer bounds)
    return t.clamp_(lo, hi)
