"""ONNX Runtime's QLinearAdd arithmetic (CPU, MLAS, x86): the add a QDQ graph's
DequantizeLinear -> Add -> QuantizeLinear is fused into.

MLAS (``qladd.cpp``, ``qladd_avx2.cpp``) forms r_a = fl32(sa/sc), r_b = fl32(sb/sc) and a
constant fixed = fl32(zc - fma(r_a, za, fl32(r_b * zb))) (the compiler fuses the scalar
expression ``ScaleRatio_AC * ZeroPointA + ScaleRatio_BC * ZeroPointB`` into one fused
multiply-add; with zero points 0 or 128 every product is exact and it makes no difference),
then per element
c = saturate(rne(fma(a, r_a, fma(b, r_b, fixed)))): two fused multiply-adds, each one rounding
(with zero points 0 the inner one is fl32(b * r_b)). quantlab's codes are symmetric
(zero point 0); a runtime holding them as uint8 with zero point z sees a + z, b + z and
returns c + z, which changes ``fixed`` and so the bits. Pure functions on integer tensors.

Fast form: every exact value the two fused multiply-adds round is a multiple of 2**L, with L
the lowest bit of r_a, r_b and ``fixed`` (a float32 rounding of a multiple of 2**L is one
too). When the largest possible magnitude of each is below 2**(L + 53) (``float64_exact``,
decided from the scalars and the code ranges), float64 holds each exactly, so each fused
multiply-add is one float64 product and sum, rounded once to float32.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import torch
from torch import Tensor

from quantlab.numerics import fma, pair_table
from quantlab.numerics.dtypes import DType
from quantlab.numerics.fma import fma_float32
from quantlab.numerics.quantize import centred_code_max
from quantlab.numerics.rounding import Round, round_float
from quantlab.numerics.scales import check_tensor_scale


def qlinear_add(
    x: Tensor,
    x_scale: Tensor | float,
    y: Tensor,
    y_scale: Tensor | float,
    out_scale: Tensor | float,
    out: DType,
    zero_point: int = 0,
    zero_points: tuple[int, int, int] = (0, 0, 0),
) -> Tensor:
    """Output codes (``out``'s torch dtype) of ONNX Runtime's QLinearAdd on codes ``x``, ``y``
    (integer tensors, broadcasting) with zero points ``zero_points`` = (x's, y's, output's),
    held by the runtime shifted by ``zero_point`` (0: int8; 128: symmetric codes as uint8), so
    the runtime sees x + zero_point with zero point zx + zero_point, and so on: the MLAS
    formula of the module doc, every step one IEEE float32 operation or fused multiply-add,
    ties to even, saturated to ``out``."""
    if x.is_floating_point() or y.is_floating_point():
        raise TypeError(f"x and y must hold integer codes, got {x.dtype} and {y.dtype}")
    sc = check_tensor_scale(out_scale, "out_scale")
    ra = check_tensor_scale(x_scale, "x_scale") / sc
    rb = check_tensor_scale(y_scale, "y_scale") / sc
    za, zb, zc = (torch.tensor(float(v + zero_point), dtype=torch.float32) for v in zero_points)
    fixed = zc - fma.fma_float32(ra, za, rb * zb)  # a 0-d constant (the per-element fma below)
    scalars = (float(ra), float(rb), float(fixed))
    return _PAIR_TABLES.apply(
        (*scalars, zero_point, out), x, y, lambda a, b: _add_codes(a, b, *scalars, zero_point, out)
    )


def _add_codes(
    x: Tensor, y: Tensor, ra: float, rb: float, fixed: float, zero_point: int, out: DType
) -> Tensor:
    """``qlinear_add``'s formula on each pair of codes (the fast form where proven)."""
    xa, yb = torch.broadcast_tensors(x, y)
    zp = float(zero_point)
    exact = float64_exact(ra, rb, fixed, _code_bound(x, zero_point), _code_bound(y, zero_point))
    if not exact and _dtype_bounded(x, y):  # the dtype's bound may be loose: measure the codes
        exact = float64_exact(ra, rb, fixed, _measured(x, zero_point), _measured(y, zero_point))
    if exact:
        # each sum below is exact in float64 (module doc): one rounding to float32 per fma
        inner = yb.to(torch.float64)
        if zero_point:
            inner.add_(zp)
        rest = inner.mul_(rb).add_(fixed).to(torch.float32)
        outer = xa.to(torch.float64)
        if zero_point:
            outer.add_(zp)
        v = outer.mul_(ra).add_(rest).to(torch.float32).round_()
    else:
        rb_t, fixed_t, ra_t = (torch.tensor(v, dtype=torch.float32) for v in (rb, fixed, ra))
        rest = fma_float32(yb.to(torch.float32).add(zp), rb_t, fixed_t)
        v = round_float(fma_float32(xa.to(torch.float32).add(zp), ra_t, rest), Round.HALF_EVEN)
    if zero_point:
        v.sub_(zp)
    return v.clamp_(out.qmin, out.qmax).to(out.torch_dtype)


# (ra, rb, fixed, zero_point, out, x dtype, y dtype) -> ``_add_codes`` of every pair of codes
_PAIR_TABLES = pair_table.PairTables()


SMALL_CODES = (torch.int8, torch.uint8, torch.int16)


def _code_bound(codes: Tensor, zero_point: int) -> int:
    """max|code + zero_point|: from the dtype for 8- and 16-bit codes, else measured."""
    if codes.dtype in SMALL_CODES:
        return centred_code_max(codes, -zero_point)
    return _measured(codes, zero_point)


def _dtype_bounded(*codes: Tensor) -> bool:
    return any(c.dtype in SMALL_CODES for c in codes)


def _measured(codes: Tensor, zero_point: int) -> int:
    """max|code + zero_point| over the codes (one pass, before any broadcast)."""
    if codes.numel() == 0:
        return 0
    lo, hi = torch.aminmax(codes)
    return max(abs(int(lo) + zero_point), abs(int(hi) + zero_point))


NO_BIT = 1 << 30  # the lowest bit of 0: no constraint


def _lowest_bit(v: float) -> int:
    """An exponent L with the float32 ``v`` an integer multiple of 2**L."""
    if v == 0:
        return NO_BIT
    return math.frexp(v)[1] - 24  # |v| = m * 2**e, 0.5 <= m < 1, m a 24-bit fraction


@functools.lru_cache(maxsize=256)
def float64_exact(ra: float, rb: float, fixed: float, a_max: int, b_max: int) -> bool:
    """Whether float64 holds ``b * rb + fixed`` and ``a * ra + fl32(b * rb + fixed)`` exactly
    for every integer |a| <= ``a_max``, |b| <= ``b_max`` (float32 ``ra``, ``rb``, ``fixed``):
    both are multiples of 2**L (L the lowest bit of the three) of magnitude below 2**(L + 53).
    A float32 rounding moves a value by at most 2**-24 of it or 2**-150 (subnormals), so
    |fl32(u)| <= u (1 + 2**-23) + 2**-149."""
    # a term that is always 0 (codes bounded by 0) puts no bit in the sums
    low = min(
        _lowest_bit(ra) if a_max else NO_BIT,
        _lowest_bit(rb) if b_max else NO_BIT,
        _lowest_bit(fixed),
    )
    limit = Fraction(2) ** (low + 53)
    inner = b_max * abs(Fraction(rb)) + abs(Fraction(fixed))
    rest = inner * (1 + Fraction(1, 1 << 23)) + Fraction(2) ** -149
    outer = a_max * abs(Fraction(ra)) + rest
    return inner < limit and outer < limit
