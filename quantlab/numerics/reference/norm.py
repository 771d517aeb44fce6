"""Slow, obviously-correct twin of ``norm_integer.norm_fixed``, for tests only.

Sums are Python ints row by row; every requantization, the add rule and the gamma / beta
quantization go through the element-by-element references of ``quantlab.numerics.reference``
(Python ints and Fractions); the rsqrt table is evaluated by its own slow twin
(``SegmentLut.evaluate_reference``). Returns numpy int64 arrays.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import (
    J6_NORM,
    EpsMode,
    NormAxes,
    NormContract,
    NormLayout,
    NormScales,
    rsqrt_lut,
)
from quantlab.numerics.reference.requant import quantize, requantize
from quantlab.numerics.reference.rounding import round_fraction
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _real(num: tuple[float, ...], den: float, count: int, scheme: Requant) -> float:
    """The contract's multiplier: numpy float32 left to right (FLOAT_RESCALE) or float64."""
    if scheme is Requant.FLOAT_RESCALE:
        v = np.float32(num[0])
        for s in num[1:]:
            v = np.float32(v * np.float32(s))
        return float(np.float32(v / np.float32(np.float32(den) * np.float32(count))))
    p = 1.0
    for s in num:
        p *= float(np.float32(s))
    return p / (float(np.float32(den)) * count)


def _requant(acc: np.ndarray, real: float, out: DType, c: NormContract) -> np.ndarray:
    return requantize(acc, real, c.requant, out, c.requant_round, None, c.requant_mult_bits)


def _add(x: np.ndarray, sx, y: np.ndarray, sy, so, out: DType, c: NormContract) -> np.ndarray:
    """J6 add rule: inter = max(sx, sy) / 2**shift in float32, mx, my = round_half_even of the
    float32 ratios, x*mx + y*my saturated to int32, then the reference requantization."""
    sx, sy, so = np.float32(sx), np.float32(sy), np.float32(so)
    inter = np.float32(max(sx, sy) / np.float32(1 << c.add_inter_shift))
    mx = int(np.rint(np.float32(sx / inter)))
    my = int(np.rint(np.float32(sy / inter)))
    xa, ya = np.broadcast_arrays(x, y)
    acc = np.empty(xa.shape, dtype=np.int64)
    for idx in np.ndindex(xa.shape):
        acc[idx] = min(max(int(xa[idx]) * mx + int(ya[idx]) * my, INT32_MIN), INT32_MAX)
    if c.requant is Requant.FLOAT_RESCALE:
        real = float(np.float32(inter / so))
    else:
        real = float(np.float64(inter) / np.float64(so))
    return _requant(acc, real, out, c)


def _row_sums(a: np.ndarray) -> np.ndarray:
    return np.array([[sum(int(v) for v in row)] for row in a], dtype=np.int64)


def _affine(p: np.ndarray, layout: NormLayout, shape: tuple[int, ...]) -> np.ndarray:
    if layout.axes is NormAxes.LAST:
        return p
    return p.reshape((-1,) + (1,) * (len(shape) - 2))


def norm_fixed(
    codes,
    in_scale: float,
    layout: NormLayout,
    weight,
    bias,
    eps: float,
    scales: NormScales,
    out_scale: float,
    out_dtype: DType,
    contract: NormContract = J6_NORM,
) -> np.ndarray:
    """Reference of ``norm_integer.norm_fixed`` (same arguments; numpy int64 result)."""
    c, s, dt = contract, scales, contract.inter_dtype
    out_dtype = DType.parse(out_dtype)
    x = np.asarray(codes.numpy() if hasattr(codes, "numpy") else codes).astype(np.int64)
    shape = x.shape
    if layout.axes is NormAxes.LAST:
        rows = x.reshape(-1, math.prod(layout.normalized_shape))
    else:
        groups = layout.num_groups if layout.axes is NormAxes.GROUPS else shape[1]
        rows = x.reshape(shape[0] * groups, -1)
    n = rows.shape[1]
    mu = _requant(_row_sums(rows), _real((in_scale,), s.mean, n, c.requant), dt, c)
    d = _add(rows, in_scale, -mu, s.mean, s.diff, dt, c)
    sq = _requant(d * d, _real((s.diff, s.diff), s.square, 1, c.requant), dt, c)
    v = _requant(_row_sums(sq), _real((s.square,), s.var, n, c.requant), dt, c)
    if c.eps_mode is EpsMode.ADD_CODES:
        e = round_fraction(Fraction(float(eps)) / Fraction(s.var), Round.HALF_EVEN)
        v = np.minimum(v + e, dt.qmax)
    lut = rsqrt_lut(s, eps, c)
    r = lut.evaluate_reference(torch.from_numpy(v).to(dt.torch_dtype)).numpy().astype(np.int64)
    last = weight is None and bias is None
    n_dt, s_n = (out_dtype, out_scale) if last else (dt, s.normed)
    y = _requant(d * r, _real((s.diff, s.rsqrt), s_n, 1, c.requant), n_dt, c).reshape(shape)
    if weight is not None:
        g = _affine(quantize(weight, s.gamma, c.affine_dtype, c.affine_round), layout, shape)
        w_dt, s_w = (out_dtype, out_scale) if bias is None else (dt, s.scaled)
        y = _requant(y * g, _real((s_n, s.gamma), s_w, 1, c.requant), w_dt, c)
        s_n = s_w
    if bias is not None:
        b = _affine(quantize(bias, s.beta, c.affine_dtype, c.affine_round), layout, shape)
        y = _add(y, s_n, b, s.beta, out_scale, out_dtype, c)
    return y
