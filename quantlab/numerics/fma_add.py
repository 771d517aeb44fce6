"""ONNX Runtime's QLinearAdd arithmetic (CPU, MLAS, x86): the add a QDQ graph's
DequantizeLinear -> Add -> QuantizeLinear is fused into.

MLAS (``qladd.cpp``, ``qladd_avx2.cpp``) forms r_a = fl32(sa/sc), r_b = fl32(sb/sc) and a
constant fixed = fl32(zc - fl32(fl32(r_a * za) + fl32(r_b * zb))), then per element
c = saturate(rne(fma(a, r_a, fma(b, r_b, fixed)))): two fused multiply-adds, each one rounding
(with zero points 0 the inner one is fl32(b * r_b)). quantlab's codes are symmetric
(zero point 0); a runtime holding them as uint8 with zero point z sees a + z, b + z and
returns c + z, which changes ``fixed`` and so the bits. Pure functions on integer tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.rounding import Round, round_float
from quantlab.numerics.scales import check_tensor_scale


def fma_float32(a: Tensor, r: Tensor, c: Tensor) -> Tensor:
    """fl32(a * r + c) with one rounding (IEEE fused multiply-add) for integer-valued float32
    ``a`` with |a| < 2**16 and float32 ``r``, ``c`` (broadcasting).

    Exactness: a * r has at most 16 + 24 significant bits, so it is exact in float64. The
    float64 sum s = fl64(a * r + c) and its exact error t (TwoSum) give the exact value s + t;
    rounding s to float32 equals rounding s + t unless s lies exactly halfway between two
    float32 neighbours and t != 0 (a float32 midpoint has 25 significant bits, so it is a
    float64; a midpoint strictly between s and s + t would be nearer to s + t than s is). In
    that case the result is the neighbour on t's side.
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
    fixed = zc - (ra * za + rb * zb)
    xa, yb = torch.broadcast_tensors(x, y)
    rest = fma_float32(yb.to(torch.float32).add(float(zero_point)), rb, fixed)
    v = fma_float32(xa.to(torch.float32).add(float(zero_point)), ra, rest)
    r = round_float(v, Round.HALF_EVEN) - float(zero_point)
    return r.clamp(out.qmin, out.qmax).to(out.torch_dtype)
