"""Slow references of average pooling over integer codes: each window's sum and the count
torch divides it by, by loops over output positions in Python integers (the tests of
``numerics.pool_windows`` and of the pools' fixed-mode kernels)."""

from __future__ import annotations

import itertools

import torch


def slow_avg_pool(codes, k, s, p, ceil_mode, include_pad, divisor):
    """(sums int64 (N, C, Ho, Wo), counts int64 (Ho, Wo)) of ``avg_pool2d`` over integer codes
    (N, C, H, W) by a loop over output positions in Python integers (torch's window rule)."""
    n, c, h, w = codes.shape

    def out_size(size, kk, ss, pp):
        num = size + 2 * pp - kk
        o = (-(-num // ss) if ceil_mode else num // ss) + 1
        if ceil_mode and (o - 1) * ss >= size + pp:
            o -= 1
        return o

    ho, wo = out_size(h, k[0], s[0], p[0]), out_size(w, k[1], s[1], p[1])
    sums = torch.zeros(n, c, ho, wo, dtype=torch.int64)
    counts = torch.zeros(ho, wo, dtype=torch.int64)
    vals = codes.tolist()
    for i, j in itertools.product(range(ho), range(wo)):
        h0, w0 = i * s[0] - p[0], j * s[1] - p[1]
        h1, w1 = min(h0 + k[0], h + p[0]), min(w0 + k[1], w + p[1])
        padded = (h1 - h0) * (w1 - w0)
        r0, r1, c0, c1 = max(h0, 0), min(h1, h), max(w0, 0), min(w1, w)
        counts[i, j] = divisor or (padded if include_pad else (r1 - r0) * (c1 - c0))
        for b, ch in itertools.product(range(n), range(c)):
            sums[b, ch, i, j] = sum(vals[b][ch][r][q] for r in range(r0, r1) for q in range(c0, c1))
    return sums, counts


def slow_adaptive(codes, oh, ow):
    """(sums, counts) of adaptive average pooling to (oh, ow), the same loop."""
    n, c, h, w = codes.shape
    sums = torch.zeros(n, c, oh, ow, dtype=torch.int64)
    counts = torch.zeros(oh, ow, dtype=torch.int64)
    vals = codes.tolist()
    for i, j in itertools.product(range(oh), range(ow)):
        r0, r1 = (i * h) // oh, -(-((i + 1) * h) // oh)
        c0, c1 = (j * w) // ow, -(-((j + 1) * w) // ow)
        counts[i, j] = (r1 - r0) * (c1 - c0)
        for b, ch in itertools.product(range(n), range(c)):
            sums[b, ch, i, j] = sum(vals[b][ch][r][q] for r in range(r0, r1) for q in range(c0, c1))
    return sums, counts
