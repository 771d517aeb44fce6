"""Slow twin of ``gemm.pair_saturation``: MLAS's uint8 x int8 sums on x86 without VNNI, one
output at a time in Python ints (no vectorised arithmetic)."""

from __future__ import annotations

import numpy as np


def _saturated_pairs(xs: list[int], ws: list[int]) -> int:
    """Σ over k = 0, 2, 4, ... of clamp(xs[k] ws[k] + xs[k+1] ws[k+1], -32768, 32767)."""
    if len(xs) % 2:
        xs, ws = [*xs, 0], [*ws, 0]
    total = 0
    for k in range(0, len(xs), 2):
        total += min(max(xs[k] * ws[k] + xs[k + 1] * ws[k + 1], -32768), 32767)
    return total


def pair_saturated_matmul(x, w, zx: int) -> np.ndarray:
    """x (M, K) raw uint8 codes, w (K, N) int8 codes: int64 (M, N) of
    Σ' x w - zx Σ w (``gemm.pair_saturation``)."""
    x, w = np.asarray(x).astype(np.int64), np.asarray(w).astype(np.int64)
    m, k = x.shape
    n = w.shape[1]
    out = np.zeros((m, n), np.int64)
    for i in range(m):
        for j in range(n):
            col = [int(w[t, j]) for t in range(k)]
            out[i, j] = _saturated_pairs([int(v) for v in x[i]], col) - int(zx) * sum(col)
    return out


def pair_saturated_conv2d(x, w, zx: int, stride, padding, dilation, groups: int) -> np.ndarray:
    """x (N, C, H, W) raw uint8 codes, w (O, C / groups, KH, KW) int8: int64 (N, O, OH, OW).
    K runs over (kernel row, kernel column, channel) of the group, taps outside the input read
    ``zx``; a depthwise convolution (groups = C = O) sums exactly."""
    x, w = np.asarray(x).astype(np.int64), np.asarray(w).astype(np.int64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    depthwise = groups == c == o
    out = np.zeros((n, o, oh, ow), np.int64)
    for b in range(n):
        for oc in range(o):
            g = oc // og
            for y in range(oh):
                for xo in range(ow):
                    xs, ws = [], []
                    for i in range(kh):
                        for j in range(kw):
                            for ci in range(cg):
                                r, s = y * sh + i * dh - ph, xo * sw + j * dw - pw
                                inside = 0 <= r < h and 0 <= s < wd
                                xs.append(int(x[b, g * cg + ci, r, s]) if inside else int(zx))
                                ws.append(int(w[oc, ci, i, j]))
                    if depthwise:
                        out[b, oc, y, xo] = sum((a - int(zx)) * v for a, v in zip(xs, ws))
                    else:
                        out[b, oc, y, xo] = _saturated_pairs(xs, ws) - int(zx) * sum(ws)
    return out
