"""The KL (entropy) threshold search of the vendor's KLObserver, on a histogram of |x|.

Rule (horizon_plugin_pytorch ``observer_v2._compute_amax_entropy``, TensorRT's calibration in
the same shape), for |x| counts ``h`` in B bins of width w:

1. ``h[0] = h[1]`` (the spike of exact zeros is replaced by its neighbour).
2. For every candidate i = 128 .. B (the first i bins kept): the reference distribution P is
   h[:i] with all counts beyond added to its last bin; Q spreads h[:i] over ``num_quant_bins``
   levels (-qmin: 128 for int8): bin j belongs to level floor(j * levels / i), each level's total
   is shared equally among its non-empty bins, empty bins get 0. Both are normalised, 1e-10 is
   added to Q, and KL_i = sum P log(P / Q).
3. The divergences are smoothed by a window of 9 (sums over i .. i + 8, windows that start
   before the last 10); the window with the lowest sum wins (ties: the larger i), and the
   threshold is the edge of bin ``i + 4``, i.e. (i + 4) * w.

Vectorised over all candidates; a level's total is a difference of cumulative sums because a
level holds consecutive bins, and when every level holds a bin (levels <= 128, int8) the sum over
bins folds into a sum over levels. Fewer than 138 bins (nothing to search): the top edge B * w.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

START_BIN = 128
SMOOTH = 9
ROWS = 256  # candidates evaluated at once (memory: ROWS x bins float64)


def kl_divergences(counts: Tensor, num_quant_bins: int, start_bin: int = START_BIN) -> Tensor:
    """KL_i for i = start_bin .. len(counts) (step 2 of the module docstring), float64."""
    h = counts.to(torch.float64).clone()
    if h.numel() > 1:
        h[0] = h[1]
    if h.numel() < start_bin:
        return h.new_zeros(0)
    if num_quant_bins <= start_bin:
        return _by_levels(h, num_quant_bins, start_bin)
    return _by_bins(h, num_quant_bins, start_bin)


def _cumsum0(v: Tensor) -> Tensor:
    return torch.cat([v.new_zeros(1), torch.cumsum(v, 0)])  # out[j] = sum v[:j]


def _by_levels(h: Tensor, levels: int, start_bin: int) -> Tensor:
    """Every candidate has at least one bin per level: sum P log P over bins plus, per level,
    log Q (one value for all its non-empty bins) times the level's mass; O(candidates x levels)."""
    b = h.numel()
    total = float(h.sum())
    nonempty = (h != 0).to(torch.float64)
    ch, cm = _cumsum0(h), _cumsum0(nonempty)
    chlogh = _cumsum0(torch.where(h > 0, h * torch.log(h.clamp_min(1e-300)), 0.0))
    i = torch.arange(start_bin, b + 1, dtype=torch.int64).reshape(-1, 1)
    k = torch.arange(levels + 1, dtype=torch.int64).reshape(1, -1)
    edge = -((-k * i) // levels)  # ceil(k * i / levels): first bin of level k, (L, levels + 1)
    lo, hi = edge[:, :-1], edge[:, 1:]
    level_sum, level_num = ch[hi] - ch[lo], cm[hi] - cm[lo]
    z = ch[i.reshape(-1)]  # sum of Q before normalisation: every count below i
    q = torch.where(level_num > 0, level_sum / level_num.clamp_min(1.0), 0.0) / z.reshape(-1, 1)
    log_q = torch.log(q + 1e-10)
    last = i.reshape(-1) - 1  # bin i - 1 is the last level's last bin
    mass = level_sum.clone()  # the level's counts in bins below i - 1
    mass[:, -1] -= h[last]
    body = (chlogh[last] - ch[last] * math.log(total) - (mass * log_q).sum(1)) / total
    p_last = (total - ch[last]) / total  # bin i - 1 with every count beyond it
    log_q_last = torch.where(nonempty[last] > 0, log_q[:, -1], math.log(1e-10))
    safe = p_last.clamp_min(1e-300)
    return body + torch.where(p_last > 0, p_last * (torch.log(safe) - log_q_last), 0.0)


def _by_bins(h: Tensor, levels: int, start_bin: int) -> Tensor:
    """Direct form over (candidate, bin) matrices (levels may hold no bin when i < levels)."""
    b = h.numel()
    total = float(h.sum())
    nonempty = (h != 0).to(torch.float64)
    ch, cm, plain = _cumsum0(h * nonempty), _cumsum0(nonempty), _cumsum0(h)
    j = torch.arange(b, dtype=torch.int64).reshape(1, -1)
    out = []
    for first in range(start_bin, b + 1, ROWS):
        i = torch.arange(first, min(first + ROWS, b + 1), dtype=torch.int64).reshape(-1, 1)
        inside = j < i
        level = (j * levels) // i
        lo = (-((-level * i) // levels)).clamp(0, b)  # ceil(level * i / levels): level's first bin
        hi = torch.minimum(-((-(level + 1) * i) // levels), i).clamp(0, b)  # one past its last
        q = (ch[hi] - ch[lo]) / (cm[hi] - cm[lo]).clamp_min(1.0) * nonempty.reshape(1, -1)
        q = torch.where(inside, q, 0.0)
        p = torch.where(inside, h.reshape(1, -1), 0.0)
        p[torch.arange(p.shape[0]), i.reshape(-1) - 1] += total - plain[i.reshape(-1)]
        p = p / p.sum(1, keepdim=True)
        q = q / q.sum(1, keepdim=True).clamp_min(1e-300) + 1e-10
        out.append(torch.where(p > 0, p * torch.log(p.clamp_min(1e-300) / q), 0.0).sum(1))
    return torch.cat(out)


def kl_threshold(counts: Tensor, width: float, num_quant_bins: int) -> float:
    """The KLObserver threshold (an |x| value) for |x| ``counts`` of bin ``width``."""
    b = counts.numel()
    if b < START_BIN + SMOOTH + 1 or float(counts.sum()) == 0.0:
        return b * width
    d = kl_divergences(counts, num_quant_bins)
    n = d.numel() - SMOOTH - 1
    windows = d.unfold(0, SMOOTH, 1)[:n].sum(1)
    best = n - 1 - int(torch.argmin(windows.flip(0)))  # the last window with the lowest sum
    return (best + START_BIN + SMOOTH // 2) * width
