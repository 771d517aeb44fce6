"""LayerNormalization as onnxruntime's CPU kernel computes it in float32 (x86-64 with AVX2).

A row x of n values (the trailing normalized dims), scale g, bias b:

* n >= 8: MLAS's AVX2 kernel.
  1. mean: four float64 lanes, lane j summing x[j], x[j + 4], ... over the whole blocks of 4,
     reduced as (l0 + l2) + (l1 + l3), the tail added in order, all in float64; then
     mean = fl32(sum / n).
  2. variance: d = fl32(x - mean); eight float32 lanes, lane j accumulating
     v_j = fma(d, d, v_j) over the whole blocks of 8, reduced as r_k = v_k + v_(k+4),
     then (r0 + r2) + (r1 + r3); then the tail in order: a group of 4 (when the tail has
     one) as v = v + fl32(d * d), the rest as v = fma(d, d, v) (the compiled scalar loop
     squares a group of 4 as one vector and fuses the rest).
  3. inv = 1 / sqrt(v / n + eps) (each a float32 operation);
  4. y = fma(fl32(fl32(x - mean) * inv), g, b) with a bias, fl32(fl32(fl32(x - mean) * inv) * g)
     without.
* n < 8: the scalar kernel: Welford's running mean and squared deviation in float32
  (mean += delta / k, m2 += delta * (x - mean)), var = m2 / n, then
  y = fl32(fl32(fl32(x - mean) / sqrt(var + eps)) * g) + b.

fma and the square root are the correctly rounded operations (``numerics.ieee32``). The rules
were read from onnxruntime's source and its MLAS kernel (the tail's rounding from onnxruntime's
outputs) and are checked bit for bit against onnxruntime on random and adversarial rows
(tests/runtime/test_ort_layer_norm.py). torch's ``F.layer_norm`` sums in another order: its
last bit differs now and then, which moves a quantized code.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from quantlab.numerics.ieee32 import fma32, sqrt32
from quantlab.numerics.ort_layer_norm_native import mlas_rows

MLAS_MIN_SIZE = 8  # rows of fewer values take the scalar Welford kernel


def ort_layer_norm(
    x: Tensor,
    normalized_ndim: int,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    native: bool = True,
) -> Tensor:
    """float32 layer norm of float32 ``x`` over its last ``normalized_ndim`` dims, as above;
    ``weight`` None stands for ones (the exporter writes ones), ``bias`` None for no bias.
    ``native``: rows of 8 or more values by the C kernel (``ort_layer_norm_native``, the same
    bits) when it is built; False: by the torch operations below."""
    if x.dtype != torch.float32:
        raise TypeError(f"ort_layer_norm takes float32 values, got {x.dtype}")
    if not 1 <= normalized_ndim <= x.dim():
        raise ValueError(f"normalized_ndim must be in [1, {x.dim()}], got {normalized_ndim}")
    n = math.prod(x.shape[x.dim() - normalized_ndim :])
    rows = x.detach().reshape(-1, n)
    g = torch.ones(n) if weight is None else weight.detach().to(torch.float32).reshape(n)
    b = None if bias is None else bias.detach().to(torch.float32).reshape(n)
    eps32 = torch.tensor(eps, dtype=torch.float32)
    count = torch.tensor(float(n), dtype=torch.float32)
    if n < MLAS_MIN_SIZE:
        y = _welford_rows(rows, g, b, eps32)
    else:
        y = mlas_rows(rows, g, b, eps32) if native else None
        if y is None:
            y = _mlas_rows(rows, g, b, eps32, count)
    return y.reshape(x.shape)


def _welford_rows(rows: Tensor, g: Tensor, b: Tensor | None, eps32: Tensor) -> Tensor:
    mean = torch.zeros(rows.shape[0], dtype=torch.float32)
    m2 = torch.zeros_like(mean)
    for k in range(rows.shape[1]):
        v = rows[:, k]
        delta = v - mean
        mean = mean + delta / torch.tensor(float(k + 1), dtype=torch.float32)
        m2 = m2 + delta * (v - mean)
    n = torch.tensor(float(rows.shape[1]), dtype=torch.float32)
    d = sqrt32(m2 / n + eps32)
    y = (rows - mean[:, None]) / d[:, None] * g
    return y if b is None else y + b


def _mlas_rows(rows: Tensor, g: Tensor, b: Tensor | None, eps32: Tensor, count: Tensor) -> Tensor:
    r, n = rows.shape
    x64 = rows.to(torch.float64)
    q4 = n // 4 * 4
    lanes = x64[:, :q4].reshape(r, q4 // 4, 4).cumsum(1)[:, -1]  # float64, in order per lane
    total = (lanes[:, 0] + lanes[:, 2]) + (lanes[:, 1] + lanes[:, 3])
    for k in range(q4, n):
        total = total + x64[:, k]
    mean = (total / float(n)).to(torch.float32)
    d = rows - mean[:, None]
    q8 = n // 8 * 8
    acc = torch.zeros(r, 8, dtype=torch.float32)
    for i in range(0, q8, 8):
        blk = d[:, i : i + 8]
        acc = fma32(blk, blk, acc)
    half = acc[:, :4] + acc[:, 4:]
    var = (half[:, 0] + half[:, 2]) + (half[:, 1] + half[:, 3])
    t4 = q8 + (n - q8) // 4 * 4
    for k in range(q8, t4):  # the tail's whole group of 4: squares rounded, then added
        var = var + d[:, k] * d[:, k]
    for k in range(t4, n):  # the rest: fused
        var = fma32(d[:, k], d[:, k], var)
    inv = 1.0 / sqrt32(var / count + eps32)
    t = d * inv[:, None]
    if b is None:
        return t * g
    return fma32(t, g.expand_as(t), b.expand_as(t))


def ort_group_norm(
    x: Tensor,
    groups: int,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    native: bool = True,
) -> Tensor:
    """float32 group norm of float32 ``x`` (N, C, *) as its ONNX form (``export``'s group_norm)
    runs in onnxruntime: Reshape to (N, groups, C / groups x the rest), LayerNormalization over
    that last axis with a scale of ones and no bias (``ort_layer_norm``: y = its normalized
    value, times 1 exactly), Reshape back, then Mul by ``weight`` and Add ``bias`` per channel,
    each one rounded float32 operation (None: that node is left out)."""
    if x.dim() < 2 or groups < 1 or x.shape[1] % groups:
        raise ValueError(f"group norm of {groups} groups needs (N, C, ...) with C a multiple")
    y = ort_layer_norm(x.reshape(x.shape[0], groups, -1), 1, None, None, eps, native)
    y = y.reshape(x.shape)
    per_channel = (1, x.shape[1]) + (1,) * (x.dim() - 2)
    if weight is not None:
        y = y * weight.detach().to(torch.float32).reshape(per_channel)
    if bias is not None:
        y = y + bias.detach().to(torch.float32).reshape(per_channel)
    return y
