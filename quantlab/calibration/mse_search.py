"""The MSEObserver's choice on one batch, exactly and without fake-quantizing the batch once per
candidate.

The rule (``vendor.mse_batch``): candidate absolute maxima ``a_i``, scales ``s_i`` =
``compute_scale(a_i)`` (float32), and the error of candidate i, in exact arithmetic,

    E_i = sum over the batch of (x - s_i * clamp(round(x / s_i), qmin, qmax)) ** 2;

the lowest E_i wins, ties to the larger i. Exact zeros cost nothing at any scale and are left out.

Exactness facts used below (x and s_i float32, so every cell edge (k - 0.5) s_i, k <= 2**15,
is exact in float64 with at most 41 significant bits):

* ``fl64(x / s)`` lies on the same side of every half-integer as x / s, and equals one exactly
  only on a true tie (a non-tie is at least 2**-42 relative away from it), so rounding it in
  float64 gives the exact cell, ties included.
* the residual ``x - q s`` is exact in float64 (at most 46 significant bits), so a candidate's
  error evaluated directly (``direct_errors``) carries only the rounding of its squares and
  their sum: relative error below (N + 1) 2**-53 over N values.

Two exact ways to get every E_i:

``bucket_errors`` (few cells, many values: int8): the edges of all candidates' cells split the
line into elementary intervals (and the edges themselves); inside one, every candidate rounds
every value to the same cell. Per interval b the batch is reduced once to its count n_b and the
moments A_b = sum (x - m_b)**2, B_b = sum (x - m_b) about a point m_b of it; a candidate's error
is then sum_b A_b + 2 d_b B_b + n_b d_b**2 with d_b = m_b - k_b s_i, one term per occupied
interval instead of one per value, with a rounding bound (``bound``) from the standard
floating-point summation bounds and |B_b| <= sqrt(n_b A_b).

``pruned_errors`` (many cells: int16): the clipping part C_i (values beyond the extreme cells'
outer edges) is summed exactly from the tails; the rest costs between 0 and s_i**2 / 4 per
value. C_i never decreases with i, so the candidates whose C_i exceeds the best upper bound are
dropped without evaluation; the others are evaluated directly.

A small batch (candidates x values <= DIRECT_ELEMENTS) is evaluated directly for every
candidate at once. Otherwise the candidates that the bounds cannot separate from the best are
evaluated directly and the lowest wins (ties: the larger i). The result is the exact rule's
choice whenever the exact best error is separated from the next by more than the direct
evaluation's rounding.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from quantlab.calibration.sort_native import sort_float64
from quantlab.numerics import DType, Round, ScaleRule, compute_scale, round_float
from quantlab.numerics.rounding import round_float_

UNIT = 2.0**-53  # float64 unit roundoff
BUCKET_RATIO = 4  # intervals pay off from this many values per cell edge of all candidates
CHUNK = 16  # candidates evaluated at once over the occupied intervals
DIRECT_ELEMENTS = 1 << 21  # candidates x values evaluated directly in one block


class BatchValues:
    """One batch's nonzero values as float64 in their order (``x64``: direct sums run in it)
    and, sorted on first use and then kept, in ascending order (``ascending()``): a batch
    searched at several dtypes selects and sorts its values once. float32 values on the CPU
    are sorted as they are, by ``sort_native``'s radix sort (the float64 conversion keeps
    their order, so the array is ``sorted_values(x64)``)."""

    def __init__(self, x: Tensor) -> None:
        self._narrow = _nonzero_numpy(x)
        if self._narrow is None:
            self.x64 = nonzero_float64(x)
        else:
            self.x64 = torch.from_numpy(self._narrow.astype(np.float64))
        self._ascending: Tensor | None = None

    def ascending(self) -> Tensor:
        if self._ascending is None:
            fast = None if self._narrow is None else sort_float64(self._narrow)
            self._ascending = sorted_values(self.x64) if fast is None else torch.from_numpy(fast)
        return self._ascending


def best_candidate(
    x: Tensor,
    amaxes: Tensor,
    dtype: DType,
    rule: ScaleRule,
    rounding: Round,
    values: BatchValues | None = None,
) -> tuple[int, Tensor]:
    """(index of the candidate amax with the lowest exact error, ties to the larger index;
    the errors the choice was made from, float64, +inf where a candidate was pruned).

    ``x``: the batch's finite values (any float dtype, flat); ``amaxes``: candidates (K,);
    ``values``: ``BatchValues(x)`` where the caller keeps it for another search of ``x``.
    """
    values = values if values is not None else BatchValues(x)
    x64 = values.x64
    scales = compute_scale(amaxes, dtype, rule).to(torch.float64)
    k = scales.numel()
    if x64.numel() == 0:
        return k - 1, torch.zeros(k, dtype=torch.float64)
    if k * x64.numel() <= DIRECT_ELEMENTS:  # small batch: every candidate at once
        errs = direct_errors(x64, scales, list(range(k)), dtype, rounding)
    elif BUCKET_RATIO * k * (dtype.qmax - dtype.qmin) <= x64.numel():
        errs, bound = bucket_errors(x64, scales, dtype, rounding, values.ascending())
        contenders = torch.nonzero(errs - bound <= (errs + bound).min()).reshape(-1)
        if contenders.numel() > 1:
            direct = direct_errors(x64, scales, contenders.tolist(), dtype, rounding)
            errs = torch.full_like(errs, float("inf"))
            errs[contenders] = direct
    else:
        errs = pruned_errors(x64, scales, dtype, rounding, values.ascending())
    best = int(torch.nonzero(errs == errs.min()).max())
    return best, errs


def direct_errors(
    x64: Tensor, scales: Tensor, indices: list[int], dtype: DType, rounding: Round
) -> Tensor:
    """E_i of the candidates ``indices``, over the float64 values (exact cells and residuals;
    float64 squares and sum), as many candidates at once as DIRECT_ELEMENTS allows."""
    per = max(1, DIRECT_ELEMENTS // max(1, x64.numel()))
    row = x64.reshape(1, -1)
    out = []
    for start in range(0, len(indices), per):
        s = scales[indices[start : start + per]].reshape(-1, 1)
        r = round_float_(row / s, rounding).clamp_(dtype.qmin, dtype.qmax).mul_(s).sub_(row)
        out.append(r.square_().sum(1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def _intervals(scales: Tensor, dtype: DType) -> Tensor:
    """Every candidate's inner cell edges (k - 0.5) s, k = qmin + 1 .. qmax, sorted, unique
    (``torch.unique``'s values, through numpy's faster sort)."""
    half = torch.arange(dtype.qmin + 1, dtype.qmax + 1, dtype=torch.float64) - 0.5
    edges = np.sort((scales.reshape(-1, 1) * half.reshape(1, -1)).reshape(-1).cpu().numpy())
    return torch.from_numpy(edges[np.concatenate(([True], edges[1:] != edges[:-1]))])


def bucket_errors(
    x64: Tensor, scales: Tensor, dtype: DType, rounding: Round, ascending: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(E_i of every candidate from the elementary intervals of all cell edges, a bound on the
    rounding error of each), float64 (K,). ``ascending``: ``x64`` sorted, where known."""
    edges = _intervals(scales, dtype)
    n_edges = edges.numel()
    # the values in ascending order split at the edges: bucket 2j is the open interval below
    # edges[j] (above edges[j - 1]), bucket 2j + 1 the edge itself, bucket 2 n_edges the rest
    xs = (sorted_values(x64) if ascending is None else ascending).cpu().numpy()
    e = edges.numpy()
    cuts = np.empty(2 * n_edges + 2, dtype=np.int64)
    cuts[0], cuts[-1] = 0, xs.size
    cuts[1:-1:2] = np.searchsorted(xs, e, side="left")  # values below edges[j]
    cuts[2:-1:2] = np.searchsorted(xs, e, side="right")  # values up to edges[j]
    counts = np.diff(cuts)
    rep = torch.empty(2 * n_edges + 1, dtype=torch.float64)
    rep[1::2] = edges
    rep[2:-1:2] = (edges[:-1] + edges[1:]) / 2
    rep[0], rep[-1] = 2 * edges[0], 2 * edges[-1]  # edges[0] < 0 < edges[-1]
    ref = rep.clone()
    ref[0], ref[-1] = edges[0], edges[-1]
    dx = xs - np.repeat(ref.numpy(), counts)
    occupied = counts > 0
    starts = cuts[:-1][occupied]  # each occupied bucket runs up to the next one's start
    n = torch.from_numpy(counts[occupied].astype(np.float64))
    b_mom = torch.from_numpy(np.add.reduceat(dx, starts))
    a_mom = torch.from_numpy(np.add.reduceat(dx * dx, starts))
    mask = torch.from_numpy(occupied)
    rep, ref = rep[mask].reshape(1, -1), ref[mask].reshape(1, -1)
    a_total, two_root_an = float(a_mom.sum()), 2.0 * (a_mom * n).sqrt()
    errs, sizes = [], []
    for i in range(0, scales.numel(), CHUNK):
        s = scales[i : i + CHUNK].reshape(-1, 1)
        cell = round_float(rep / s, rounding).clamp_(dtype.qmin, dtype.qmax)
        d = ref - cell * s
        dd = d * d
        # sum_b A_b + 2 d_b B_b + n_b d_b**2 as three sums over the intervals (products of a
        # matrix and a vector); its magnitude sum_b (sqrt(A_b) + |d_b| sqrt(n_b))**2 likewise
        errs.append(a_total + 2.0 * (d @ b_mom) + dd @ n)
        sizes.append(a_total + d.abs() @ two_root_an + dd @ n)
    # summation bounds: moments over at most max(n) values, terms of a few roundings each,
    # then three sums over the occupied intervals, each of magnitude at most ``sizes``
    # (|B_b| <= sqrt(n_b A_b)); all relative to those magnitudes
    bound = 4.0 * (float(n.max()) + n.numel() + 8) * UNIT * torch.cat(sizes)
    return torch.cat(errs), bound


def nonzero_float64(x: Tensor) -> Tensor:
    """The nonzero values of ``x`` in order, flat, as float64 (on the CPU through numpy, whose
    boolean selection is several times faster than torch's)."""
    a = _nonzero_numpy(x)
    if a is None:
        flat = x.detach().reshape(-1)
        return flat[flat != 0].to(torch.float64)
    return torch.from_numpy(a.astype(np.float64))


def _nonzero_numpy(x: Tensor) -> np.ndarray | None:
    """The nonzero values of a CPU float tensor in order, flat, as a numpy array of its dtype
    (None for other tensors)."""
    flat = x.detach().reshape(-1)
    if flat.device.type != "cpu" or flat.dtype not in _NUMPY_FLOATS:
        return None
    a = flat.numpy()
    return a[a != 0]


_NUMPY_FLOATS = (torch.float16, torch.float32, torch.float64)


def sorted_values(x: Tensor) -> Tensor:
    """The values of a flat tensor in ascending order (for finite values, no zeros of both signs,
    the same tensor as ``torch.sort(x).values``). On the CPU this is numpy's sort, many times
    faster than torch's (``benchmarks/bench_calibrate.py`` times the calibration either way)."""
    if x.device.type != "cpu":
        return torch.sort(x).values
    return torch.from_numpy(np.sort(x.detach().numpy()))


def pruned_errors(
    x64: Tensor, scales: Tensor, dtype: DType, rounding: Round, ascending: Tensor | None = None
) -> Tensor:
    """E_i of the candidates that may be the best (direct evaluation), +inf for the others
    (``ascending``: ``x64`` sorted, where known).

    For candidate i, the clipping part C_i sums (x - qmax s)**2 over x > (qmax + 0.5) s and
    (x - qmin s)**2 over x < (qmin - 0.5) s; every other value costs at most s**2 / 4, so
    C_i <= E_i <= C_i + (rest) s**2 / 4. C_i does not decrease with i (smaller scales clip
    more, and further), so the scan stops at the first C_i above the best upper bound.
    """
    xs = sorted_values(x64) if ascending is None else ascending
    n_all = xs.numel()
    lo_cut = torch.searchsorted(xs, (dtype.qmin - 0.5) * scales)  # values below the lower edge
    hi_cut = torch.searchsorted(xs, (dtype.qmax + 0.5) * scales, right=True)
    lower, upper = [], []
    best_upper = float("inf")
    for s, lo, hi in zip(scales.tolist(), lo_cut.tolist(), hi_cut.tolist()):
        below, above = xs[:lo] - dtype.qmin * s, xs[hi:] - dtype.qmax * s
        clip = float(torch.dot(below, below) + torch.dot(above, above))
        clip_low = clip * (1.0 - (n_all + 1) * UNIT)  # its own rounding
        if clip_low > best_upper:  # C_j >= C_i for every later j: none can be the best
            break
        lower.append(clip_low)
        up = (clip + (hi - lo) * s * s / 4.0) * (1.0 + (n_all + 4) * UNIT)
        upper.append(up)
        best_upper = min(best_upper, up)
    keep = [i for i, low in enumerate(lower) if low <= best_upper]
    errs = torch.full((scales.numel(),), float("inf"), dtype=torch.float64)
    errs[keep] = direct_errors(x64, scales, keep, dtype, rounding)
    return errs
