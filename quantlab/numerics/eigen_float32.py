"""Eigen's vectorized float32 log (the rational (3, 3) form ``plog_float``), exp
(``pexp_float``), log1p (``generic_plog1p``) and sin / cos (``psincos_float``), as onnxruntime's
Log / Sin / Cos / Elu / Softplus compute each element of a tensor they process four at a time
(SSE packets, ``pmadd`` a product and a sum rounded apart: no FMA in that build). What a QDQ
graph's DequantizeLinear -> op -> QuantizeLinear evaluates on all but the last (n mod 4)
elements of a tensor, which Eigen hands to the C library.

Contract: float32 in, float32 out, every step one IEEE float32 operation: x = m 2**e
(0.5 <= m < 1, frexp; subnormals exact); below sqrt(1/2), m doubled and e - 1; t = m - 1;
p = t (p1 + t (p2 + t p3)), q = 1 + t (q1 + t (q2 + t q3)) by products and sums rounded apart;
log = fl32(fl32(e ln2) + fl32(p / q)); log(0) = -inf, log(inf) = inf, log(x < 0) and log(NaN)
a NaN with every bit set (Eigen ORs an all-ones mask into it). Checked
against onnxruntime on 300k inputs (tests/runtime/test_ort_mlas_float32.py); the Fraction twin
is ``quantlab.numerics.reference.eigen_float32``.

exp: below -104, 0; x clamped above at 88.723; m = floor(fl32(x log2(e)) + 0.5); r = x + m C1 +
m C2 (C1 + C2 = -ln 2, each a product and a sum rounded apart); the degree-6 polynomial of r
evaluated as two halves in r**2; then y 2**m, the power of two applied as four products by
powers of two (``pldexp``), and max(that, x) (which passes +inf and NaN). log1p(v): u = fl32(v +
1); v itself where u == 1 (or u is infinite); else fl32(v * fl32(log(u) / fl32(u - 1))) (Kahan's
form).

sin / cos: a = |x|; k = the nearest integer to fl32(a * 2/pi) (added to and taken from
1.5 * 2**23); a - k pi/2 by four product-and-sum steps with pi/2 split in four; from
|x| >= 25966 (sin) / 18838 (cos) the Payne-Hanek reduction on integers instead (x's 24-bit
significand times 96 bits of 2/pi); then the sin or the cos polynomial of the reduced r by k's
parity, and the sign by k's second bit (and x's sign for sin).
"""

from __future__ import annotations

import torch
from torch import Tensor

# 1.0000000190281136, 1.0000000190281063, 0.18256296349849254 (p1, p2, p3);
# 1.4999999999999927, 0.59923249590823520, 0.049616247954120038 (q1, q2, q3): float32 values
LOG_P = tuple(torch.tensor(float.fromhex(h)) for h in ("0x1p+0", "0x1p+0", "0x1.75e392p-3"))
LOG_Q = tuple(torch.tensor(float.fromhex(h)) for h in ("0x1.8p+0", "0x1.32ce9ap-1", "0x1.9674dp-5"))
SQRT_HALF = torch.tensor(float.fromhex("0x1.6a09e6p-1"))  # 0.707106781186547524
LN2 = torch.tensor(float.fromhex("0x1.62e43p-1"))  # 0.693147180559945309417232121458
ONE = torch.tensor(1.0)
INVALID = torch.tensor(-1, dtype=torch.int32).view(torch.float32)  # all bits set: a negative NaN


def _madd(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    return a * b + c  # two float32 roundings (Eigen's pmadd without FMA)


def eigen_log(x: Tensor) -> Tensor:
    """Natural log as Eigen's ``plog_float`` computes it (float32; module doc)."""
    if x.dtype != torch.float32:
        raise TypeError(f"eigen_log takes float32 values, got {x.dtype}")
    m, e = torch.frexp(x)
    e = e.to(torch.float32)
    below = m < SQRT_HALF
    t = (m - ONE) + torch.where(below, m, torch.zeros_like(m))
    e = e - below.to(torch.float32)
    p = t * _madd(t, _madd(t, LOG_P[2], LOG_P[1]), LOG_P[0])
    q = _madd(t, _madd(t, _madd(t, LOG_Q[2], LOG_Q[1]), LOG_Q[0]), ONE)
    y = _madd(e, LN2, p / q)
    y = torch.where(x == 0, -torch.inf, y)
    y = torch.where(x == torch.inf, torch.inf, y)
    return torch.where((x < 0) | torch.isnan(x), INVALID, y)


EXP_HI, EXP_LO = torch.tensor(88.723), torch.tensor(-104.0)
LOG2E = torch.tensor(1.44269504088896341)
EXP_C1, EXP_C2 = torch.tensor(-0.693359375), torch.tensor(2.12194440e-4)
# p2 .. p6 of exp(r) ~ 1 + r + p2 r**2 + ... + p6 r**6 on [-ln2 / 2, ln2 / 2]
EXP_P = tuple(
    torch.tensor(v)
    for v in (
        0.49999988079071044921875,
        0.16666518151760101318359375,
        4.166965186595916748046875e-2,
        8.36894474923610687255859375e-3,
        1.37449637986719608306884765625e-3,
    )
)
HALF = torch.tensor(0.5)
LDEXP_MAX = 277  # pldexp clamps the exponent to +-(255 + 22)


def eigen_ldexp(y: Tensor, m: Tensor) -> Tensor:
    """y * 2**m as Eigen's generic ``pldexp`` forms it (float32 y, integer-valued float32 m): m
    clamped to +-277, b = floor(m / 4), then y 2**b 2**b 2**b 2**(m - 3b), four rounded
    products (exact unless a partial product leaves the normal range)."""
    e = m.clamp(-LDEXP_MAX, LDEXP_MAX).to(torch.int32)
    b = torch.div(e, 4, rounding_mode="floor")
    c = ((b + 127) << 23).view(torch.float32)
    c_last = ((e - 3 * b + 127) << 23).view(torch.float32)
    return y * c * c * c * c_last


def eigen_exp(x: Tensor) -> Tensor:
    """exp as Eigen's ``pexp_float`` computes it (float32; module doc)."""
    if x.dtype != torch.float32:
        raise TypeError(f"eigen_exp takes float32 values, got {x.dtype}")
    v = torch.minimum(x, EXP_HI)
    m = torch.floor(_madd(v, LOG2E, HALF))
    r = _madd(m, EXP_C2, _madd(m, EXP_C1, v))
    r2 = r * r
    p2, p3, p4, p5, p6 = EXP_P
    p_even = _madd(r2, _madd(r2, p6, p4), p2)
    p_odd = _madd(r2, p5, p3)
    y = _madd(r2, _madd(r, p_odd, p_even), r + ONE)
    y = torch.maximum(eigen_ldexp(y, m), x)
    return torch.where(x < EXP_LO, torch.zeros_like(y), y)


def eigen_log1p(v: Tensor) -> Tensor:
    """log(1 + v) as Eigen's ``generic_plog1p`` computes it (float32; module doc)."""
    u = v + ONE
    log_u = eigen_log(u)
    large = v * (log_u / (u - ONE))
    return torch.where((u == ONE) | (u == log_u), v, large)


_TWO_OVER_PI, _ROUNDING = (torch.tensor(float.fromhex(h)) for h in ("0x1.45f306p-1", "0x1.8p+23"))
_PIO2_PARTS = tuple(  # -1.5703125, -0.000483989715576171875, 1.62865035235881805e-07, 5.56e-11
    torch.tensor(float.fromhex(h))
    for h in ("-0x1.92p+0", "-0x1.fb8p-12", "0x1.5dcp-23", "0x1.e973dcp-35")
)
_COS_POLY = tuple(  # 2.4372266125e-05, -0.0013886520173, 0.041666619479, -0.5, 1
    torch.tensor(float.fromhex(h))
    for h in ("0x1.98e616p-16", "-0x1.6c06dcp-10", "0x1.55553cp-5", "-0x1p-1", "0x1p+0")
)
_SIN_POLY = tuple(  # -0.00019592341140837, 0.0083326873655617, -0.16666662039823
    torch.tensor(float.fromhex(h)) for h in ("-0x1.9ae194p-13", "0x1.110ba6p-7", "-0x1.55555p-3")
)
HUGE_SIN, HUGE_COS = 25966.0, 18838.0
# 2/pi's bits, eight at a time shifted for aligned reads (Eigen's trig_reduce_huge table)
_TWO_OVER_PI_BITS = (
    0x00000028, 0x000028BE, 0x0028BE60, 0x28BE60DB, 0xBE60DB93, 0x60DB9391, 0xDB939105,
    0x9391054A, 0x91054A7F, 0x054A7F09, 0x4A7F09D5, 0x7F09D5F4, 0x09D5F47D, 0xD5F47D4D,
    0xF47D4D37, 0x7D4D3770, 0x4D377036, 0x377036D8, 0x7036D8A5, 0x36D8A566, 0xD8A5664F,
    0xA5664F10, 0x664F10E4, 0x4F10E410, 0x10E41000, 0xE4100000,
)  # fmt: skip
_M32, _M64 = (1 << 32) - 1, (1 << 64) - 1
_SIGN_BIT = torch.tensor(-(2**31), dtype=torch.int32)


def trig_reduce_huge(v: float) -> tuple[float, int]:
    """(r, k) with |v| = k pi/2 + r for a finite float32 ``v`` >= 2**14: Eigen's Payne-Hanek
    reduction, x's significand times 2/pi in 2.62-bit fixed point (integers wrap as uint32 /
    uint64 do), r = fl32(fl64(fraction * pi/2 * 2**-62))."""
    bits = int(torch.tensor(v, dtype=torch.float32).view(torch.int32)) & _M32
    e = (bits >> 23) - 118
    xi = (((bits & 0x7FFFFF) | 0x800000) << (e & 7)) & _M32
    i = e >> 3
    t1, t2, t3 = (_TWO_OVER_PI_BITS[i + d] for d in (-1, 3, 7))
    p = xi * t3
    p = (xi * t2 + (p >> 32)) & _M64
    p = ((((xi * t1) & _M32) << 32) + p) & _M64
    q = ((p + (1 << 61)) & _M64) >> 62
    p = (p - (q << 62)) & _M64
    frac = p - (1 << 64) if p >> 63 else p  # as int64
    r = float(torch.tensor(frac * 3.4061215800865545e-19, dtype=torch.float64).to(torch.float32))
    return r, q


def _sincos(x: Tensor, sine: bool) -> Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"eigen sin / cos take float32 values, got {x.dtype}")
    a = x.abs()
    y_round = a * _TWO_OVER_PI + _ROUNDING
    k = y_round.view(torch.int32)  # bits 0 and 1: those of the nearest integer
    y = y_round - _ROUNDING
    r = a
    for c in _PIO2_PARTS:
        r = _madd(y, c, r)
    huge = (a >= (HUGE_SIN if sine else HUGE_COS)) & torch.isfinite(a)
    if bool(huge.any()):
        r, k = r.clone(), k.clone()
        for idx in huge.nonzero():
            rr, kk = trig_reduce_huge(float(a[tuple(idx)]))
            r[tuple(idx)], k[tuple(idx)] = rr, kk
    r2 = r * r
    cos_p = _COS_POLY[0]
    for c in _COS_POLY[1:]:
        cos_p = _madd(cos_p, r2, c)
    sin_p = _madd(_madd(_SIN_POLY[0], r2, _SIN_POLY[1]), r2, _SIN_POLY[2])
    sin_p = _madd(sin_p * r2, r, r)
    even = (k & 1) == 0
    if sine:
        v = torch.where(even, sin_p, cos_p)
        sign = x.view(torch.int32) ^ (k << 30)
    else:
        v = torch.where(even, cos_p, sin_p)
        sign = (k + 1) << 30
    return (v.view(torch.int32) ^ (sign & _SIGN_BIT)).view(torch.float32)


def eigen_sin(x: Tensor) -> Tensor:
    """sin as Eigen's ``psin_float`` computes it (float32; module doc)."""
    return _sincos(x, sine=True)


def eigen_cos(x: Tensor) -> Tensor:
    """cos as Eigen's ``pcos_float`` computes it (float32; module doc)."""
    return _sincos(x, sine=False)
