"""Segment LUT reference: the integer contract of ``quantlab.numerics.lut.segment`` evaluated
one region at a time in numpy int64, with its own rounding (floor division and remainder)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.rounding import Round


def _np_rshift_round(v: np.ndarray, n: int, mode: Round) -> np.ndarray:
    """v / 2**n rounded by ``mode`` (numpy int64, floor division and remainder)."""
    if n == 0:
        return v.copy()
    q, r = np.divmod(v, np.int64(1 << n))
    half = 1 << (n - 1)
    if mode is Round.FLOOR:
        return q
    if mode is Round.HALF_UP:
        return q + (r >= half)
    if mode is Round.HALF_EVEN:
        return q + ((r > half) | ((r == half) & (q % 2 == 1)))
    if mode is Round.HALF_AWAY:
        return q + ((r > half) | ((r == half) & (v >= 0)))
    if mode is Round.TRUNC:
        return q + ((r != 0) & (v < 0))
    raise ValueError(f"unknown rounding mode {mode!r}")


def evaluate_lut(lut, codes: Tensor) -> Tensor:
    """Slow, obviously-correct numpy-int64 evaluation of a ``SegmentLut`` (the steps of
    ``quantlab.numerics.lut.segment``, one region at a time). Same contract as
    SegmentLut.evaluate."""
    want = lut.in_dtype.torch_dtype
    if codes.dtype != want:
        raise ValueError(f"reference expects input codes of dtype {want}, got {codes.dtype}")
    x = codes.numpy().astype(np.int64).reshape(-1)
    if lut.direct:
        y = np.array([lut.direct_table[int(c) + 128] for c in x], dtype=np.int64)
        return torch.from_numpy(y.reshape(codes.shape)).to(lut.out_dtype.torch_dtype)
    fmt = lut.fmt
    f = fmt.index_frac_bits
    omin, omax = lut.out_dtype.qmin, lut.out_dtype.qmax
    neg = (x < 0) if lut.symmetric else np.zeros(x.shape, dtype=bool)
    a = np.where(neg, np.minimum(-x, lut.in_dtype.qmax), x)
    y = np.full(x.shape, np.iinfo(np.int64).min, dtype=np.int64)
    d = lut.points
    last = len(d) - 2
    for i in range(len(d) - 1):
        upper = (a <= d[i + 1]) if i == last else (a < d[i + 1])
        sel = (a >= d[i]) & upper
        rel = a[sel] - d[i]
        idx = np.minimum((rel * lut.index_mult[i]) >> lut.index_shift[i], (fmt.entries - 1) << f)
        j = idx >> f
        w = idx & ((1 << f) - 1)
        row = np.append(lut.tables[i], lut.tables[i][-1])
        t0, t1 = row[j], row[j + 1]
        y[sel] = _np_rshift_round(t0 * (1 << f) + (t1 - t0) * w, f, fmt.interp_round)
    for tail, sel in ((lut.left, a < d[0]), (lut.right, a > d[-1])):
        v = a[sel] * tail.k + tail.b * (1 << tail.lshift)
        y[sel] = _np_rshift_round(v, tail.rshift, fmt.interp_round)
    assert (y != np.iinfo(np.int64).min).all(), "a code fell in no region"
    y = np.clip(y, omin, omax)
    y = np.where(neg, np.clip(-y, omin, omax), y)
    return torch.from_numpy(y.reshape(codes.shape)).to(lut.out_dtype.torch_dtype)
