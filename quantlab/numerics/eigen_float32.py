"""Eigen's vectorized float32 log (the rational (3, 3) form ``plog_float``), as onnxruntime's
Log computes each element of a tensor it processes four at a time (SSE packets, ``pmadd`` a
product and a sum rounded apart: no FMA in that build). What a QDQ graph's
DequantizeLinear -> Log -> QuantizeLinear evaluates on all but the last (n mod 4) elements of a
tensor, which Eigen hands to the C library's logf.

Contract: float32 in, float32 out, every step one IEEE float32 operation: x = m 2**e
(0.5 <= m < 1, frexp; subnormals exact); below sqrt(1/2), m doubled and e - 1; t = m - 1;
p = t (p1 + t (p2 + t p3)), q = 1 + t (q1 + t (q2 + t q3)) by products and sums rounded apart;
log = fl32(fl32(e ln2) + fl32(p / q)); log(0) = -inf, log(inf) = inf, log(x < 0) and log(NaN)
a NaN with every bit set (Eigen ORs an all-ones mask into it). Checked
against onnxruntime on 300k inputs (tests/runtime/test_ort_mlas_float32.py); the Fraction twin
is ``quantlab.numerics.reference.eigen_float32``.
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
