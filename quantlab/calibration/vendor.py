"""The vendor plugin's per-batch observer rules (horizon_plugin_pytorch ``observer_v2``).

Each function takes one calibration batch (the finite values, flat float32) and returns the
(min, max) that batch contributes; ``ema`` then folds the batches the way every one of these
observers does (averaging constant 0.01, the first batch starts it; 1.0 for ClipObserver).
Candidates are compared by the scale ``compute_scale(candidate, dtype, rule)`` gives them and by
fake quantization with the platform's rounding, ``clamp(round(x / s), qmin, qmax) * s``
(``quantlab.numerics.round_float``), so a QMAX or power-of-two platform searches with its own
scales: MSE's 95 candidates by their exact errors (quantlab.calibration.mse_search), MIX's few
by float32 sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from quantlab.calibration.mse_search import BatchValues, best_candidate
from quantlab.numerics import DType, Round, ScaleRule, compute_scale, round_float

EMA_CONSTANT = 0.01  # every observer's default averaging constant
CLIP_EMA_CONSTANT = 1.0  # ClipObserver's default: each batch replaces the last
MSE_STEPS = 95  # MSEObserver: candidates amax * (1 - 0.01 i), i = 0..94
MSE_STEP = 0.01
PERCENTILE_BINS = 2048  # PercentileObserver and MixObserver histograms of |x|
MIX_PERCENTILES = (99.9, 99.95, 99.99, 99.993, 99.995, 99.997, 99.999, 99.9995, 99.9999)
CLIPSTD_SCALE = 3.0  # ClipStdObserver's default std_scale
CANDIDATE_CHUNK = 16  # candidates fake-quantized at once (memory: chunk x batch values)

Range = tuple[float, float]


def ema(ranges: Sequence[Range], constant: float = EMA_CONSTANT) -> Range:
    """The moving average of per-batch (min, max): m = m + constant * (cur - m), min and max
    separately, started by the first batch (float64)."""
    if not ranges:
        raise ValueError("ema needs at least one batch")
    lo, hi = ranges[0]
    for cur_lo, cur_hi in ranges[1:]:
        lo += constant * (cur_lo - lo)
        hi += constant * (cur_hi - hi)
    return lo, hi


def range_amax(r: Range) -> float:
    """max(-min, max, 0): the absolute maximum a symmetric scale must cover."""
    return max(-r[0], r[1], 0.0)


def l2_errors(x: Tensor, amaxes: Tensor, dtype: DType, rule: ScaleRule, rounding: Round) -> Tensor:
    """Sum of squared fake-quant errors of the values ``x`` at each candidate amax (float32 sums;
    exact zeros are left out since they cost nothing at any scale)."""
    x = x[x != 0].reshape(1, -1)
    scales = compute_scale(amaxes, dtype, rule).reshape(-1, 1)
    out = []
    for i in range(0, scales.shape[0], CANDIDATE_CHUNK):
        s = scales[i : i + CANDIDATE_CHUNK]
        q = round_float(x / s, rounding).clamp_(dtype.qmin, dtype.qmax)
        out.append(q.mul_(s).sub_(x).square_().sum(1))
    return torch.cat(out) if out else x.new_zeros(0)


def mse_batch(
    x: Tensor, dtype: DType, rule: ScaleRule, rounding: Round, values: BatchValues | None = None
) -> Range:
    """MSEObserver on one batch: (min, max) * (1 - 0.01 i) for the i in 0..94 whose scale gives
    the lowest L2 error over the batch (ties: the larger i, as the plugin's serial search); the
    error of every candidate in exact arithmetic (quantlab.calibration.mse_search).
    ``values``: ``BatchValues(x)``, kept by a caller that searches ``x`` at several dtypes."""
    lo, hi = (float(v) for v in torch.aminmax(x))
    a = max(-lo, hi, 0.0)
    if a == 0.0:
        return lo, hi
    factors = 1.0 - MSE_STEP * torch.arange(MSE_STEPS, dtype=torch.float64)
    best, _ = best_candidate(x, a * factors, dtype, rule, rounding, values)
    f = float(factors[best])
    return lo * f, hi * f


def abs_histogram(x: Tensor, bins: int = PERCENTILE_BINS) -> tuple[Tensor, float]:
    """(histc of |x| in ``bins`` bins over [0, max(-min, max)], that range) of one batch."""
    lo, hi = (float(v) for v in torch.aminmax(x))
    r = max(-lo, hi)
    return torch.histc(x.abs(), bins, 0.0, r), r


def percentile_clips(x: Tensor, percentiles: Sequence[float]) -> list[float]:
    """PercentileObserver's clip per percentile: (i + 0.5) * r / 2048, i the first bin where
    the cumulative count reaches percentile/100 * numel (searchsorted, left)."""
    hist, r = abs_histogram(x)
    cum = torch.cumsum(hist, 0)
    targets = torch.tensor([p / 100.0 * x.numel() for p in percentiles], dtype=cum.dtype)
    idx = torch.searchsorted(cum, targets)
    return [(int(i) + 0.5) * (r / PERCENTILE_BINS) for i in idx]


def clipped(x_range: Range, clip: float) -> Range:
    """(max(min, -clip), min(max, clip))."""
    return max(x_range[0], -clip), min(x_range[1], clip)


def percentile_batch(x: Tensor, percentile: float) -> Range:
    """PercentileObserver on one batch (before the EMA)."""
    lo, hi = (float(v) for v in torch.aminmax(x))
    return clipped((lo, hi), percentile_clips(x, [percentile])[0])


def mix_batch(x: Tensor, dtype: DType, rule: ScaleRule, rounding: Round) -> Range:
    """MixObserver on one batch: the distinct clips at MIX_PERCENTILES (increasing), keeping the
    first with the lowest L2 error over the batch."""
    lo, hi = (float(v) for v in torch.aminmax(x))
    clips = sorted(set(percentile_clips(x, MIX_PERCENTILES)))
    ranges = [clipped((lo, hi), c) for c in clips]
    amaxes = torch.tensor([range_amax(r) for r in ranges], dtype=torch.float64)
    errs = l2_errors(x, amaxes, dtype, rule, rounding)
    return ranges[int(torch.argmin(errs))]


def clip_range(ranges: Sequence[Range], bounds: Range) -> Range:
    """ClipObserver: each batch's (min, max) averaged with constant 1.0 (so the last batch),
    clamped to ``bounds`` = (xmin, xmax) after every update."""
    lo, hi = max(ranges[0][0], bounds[0]), min(ranges[0][1], bounds[1])
    for cur_lo, cur_hi in ranges[1:]:
        lo = max(lo + CLIP_EMA_CONSTANT * (cur_lo - lo), bounds[0])
        hi = min(hi + CLIP_EMA_CONSTANT * (cur_hi - hi), bounds[1])
    return lo, hi


def clipstd_batch(lo: float, hi: float, mean: float, std: float) -> Range:
    """ClipStdObserver on one batch: (max(min, mean - 3 std), min(max, mean + 3 std))."""
    return max(lo, mean - CLIPSTD_SCALE * std), min(hi, mean + CLIPSTD_SCALE * std)
