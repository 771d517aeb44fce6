"""Scale searches over a full histogram of calibration values (HISTOGRAM observer methods).

Every method returns ``amax``; candidates are compared through the scale the platform's rule
gives them (``compute_scale(candidate, dtype, rule)``), so a QMAX or power-of-two platform
searches its own scales. Errors come from ``histogram.expected_sq_error`` (each bin uniformly
filled, exact zeros free), over every value the observer saw, on at most 1024 bins spanning the
values (adjacent bins of the full histogram merged).

MSE:        candidates amax * k / 512, k = 1..512; the lowest expected squared error wins (ties:
            the larger candidate, i.e. the least clipping).
SQNR:       AIMET's tf_enhanced search (SqnrEncodingAnalyzer, symmetric): candidates
            amax * k / 100, k = 1..101; noise = rounding error + gamma * clipping error, gamma
            3 (AIMET's default); AIMET takes each bin's midpoint, quantlab the exact integral.
KL:         the KLObserver entropy search (quantlab.calibration.kl) on the |x| histogram, cut
            after its last non-empty bin; zeros enter bin 0 as they would in the plugin.
PERCENTILE: the upper edge of the |x| bin where the cumulative count (zeros included) reaches
            percentile / 100 of all values.
"""

from __future__ import annotations

import torch

from quantlab.calibration.histogram import SignedHistogram, expected_sq_error
from quantlab.calibration.kinds import HistogramMethod
from quantlab.calibration.kl import kl_threshold
from quantlab.numerics import DType, ScaleRule, compute_scale

MSE_CANDIDATES = 512
SQNR_CANDIDATES = 101  # AIMET symmetric_delta_candidates
SQNR_GAMMA = 3.0  # AIMET's weight of the clipping noise
SEARCH_BINS = 1024  # bins the MSE / SQNR searches integrate over (>= 256 between 0 and amax)


def histogram_amax(
    hist: SignedHistogram,
    method: HistogramMethod,
    dtype: DType,
    rule: ScaleRule,
    percentile: float = 100.0,
) -> float:
    """``amax`` of ``method`` for integer ``dtype`` under scale ``rule`` (0.0 if no nonzero value
    was seen)."""
    if hist.counts is None or hist.amax == 0.0:
        return 0.0
    if method is HistogramMethod.MSE:
        return _search(hist, dtype, rule, MSE_CANDIDATES, MSE_CANDIDATES, 1.0)
    if method is HistogramMethod.SQNR:
        return _search(hist, dtype, rule, SQNR_CANDIDATES, SQNR_CANDIDATES - 1, SQNR_GAMMA)
    if method is HistogramMethod.KL:
        counts, width = hist.abs_counts()
        last = int(torch.nonzero(counts).max()) + 1
        counts = counts[:last].clone()
        counts[0] += hist.zeros
        return min(kl_threshold(counts, width, -dtype.qmin), hist.amax)
    if method is HistogramMethod.PERCENTILE:
        counts, width = hist.abs_counts()
        cum = torch.cumsum(counts, 0) + hist.zeros
        target = percentile / 100.0 * float(cum[-1])
        i = int(torch.searchsorted(cum, torch.tensor([target], dtype=cum.dtype)))
        return min((i + 1) * width, hist.amax)
    raise ValueError(f"unknown histogram method {method!r}")


def candidate_errors(
    hist: SignedHistogram, amaxes: torch.Tensor, dtype: DType, rule: ScaleRule, gamma: float
) -> torch.Tensor:
    """rounding + gamma * clipping error of each candidate amax under ``hist`` (float64), on
    at most SEARCH_BINS bins over the occupied span (adjacent bins merged in pairs)."""
    scales = compute_scale(amaxes, dtype, rule)
    counts, edges = coarsened(hist.counts, hist.edges(), SEARCH_BINS)
    rnd, clip = expected_sq_error(counts, edges, scales, dtype.qmin, dtype.qmax)
    return rnd + gamma * clip


def coarsened(counts: torch.Tensor, edges: torch.Tensor, max_bins: int):
    """(counts, edges) of the occupied span (first to last non-empty bin) with adjacent bin pairs
    merged until at most ``max_bins`` bins remain (exact sums of counts)."""
    nz = torch.nonzero(counts).reshape(-1)
    if nz.numel() == 0:
        return counts, edges
    first, last = int(nz[0]), int(nz[-1]) + 1
    c, e = counts[first:last], edges[first : last + 1]
    while c.numel() > max_bins:
        if c.numel() % 2:
            c = torch.cat([c, c.new_zeros(1)])
            e = torch.cat([e, e[-1:] + (e[-1] - e[-2])])
        c = c.reshape(-1, 2).sum(1)
        e = e[::2]
    return c, e


def _search(hist, dtype, rule, count: int, denominator: int, gamma: float) -> float:
    k = torch.arange(1, count + 1, dtype=torch.float64)
    amaxes = hist.amax * k / denominator
    err = candidate_errors(hist, amaxes, dtype, rule, gamma)
    best = int(torch.nonzero(err == err.min()).max())
    return float(amaxes[best])
