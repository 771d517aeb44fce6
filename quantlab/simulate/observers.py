"""Calibration observers: activation statistics gathered in float mode, turned into scales.

Scales follow j6-numerics s.1 through ``quantlab.numerics.quantize.compute_scale`` with the
platform's ``scale_rule``; the observer only decides ``amax``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import compute_scale
from quantlab.numerics.rounding import Round, round_float
from quantlab.qconfig import ObserverKind

EMA_MOMENTUM = 0.01  # MinMax observer: new = old + 0.01 * (cur - old)  (j6-numerics s.1)
MSE_CANDIDATES = 95  # MSE observer: amax * (1 - 0.01 i), i = 0..94      (j6-numerics s.1)
SAMPLE_CAP = 1 << 15  # values kept per batch for the MSE / percentile search
TOTAL_CAP = 1 << 17  # values kept across batches (thinned by 2 when exceeded, extremes kept)
SEARCH_CAP = 1 << 14  # values the MSE search evaluates (strided subsample, extremes kept)


class ActivationObserver:
    """Statistics of one activation tensor (per-tensor) across calibration batches.

    Keeps the EMA min/max (MinMax), the running min/max, and a deterministic strided subsample
    of at most ``SAMPLE_CAP`` values per batch (plus the batch extremes) for MSE and percentile;
    past ``TOTAL_CAP`` kept values the pool is thinned by two (every batch's extremes stay).
    """

    def __init__(self) -> None:
        self.ema_min: float | None = None
        self.ema_max: float | None = None
        self.run_min = float("inf")
        self.run_max = float("-inf")
        self.samples: list[Tensor] = []
        self.extremes: list[Tensor] = []
        self.batches = 0

    def update(self, x: Tensor) -> None:
        x = x.detach().reshape(-1)
        if x.numel() == 0:
            return
        mn, mx = torch.aminmax(x)
        lo, hi = float(mn), float(mx)
        if not (math.isfinite(lo) and math.isfinite(hi)):  # rare: drop non-finite values
            x = x[torch.isfinite(x)]
            if x.numel() == 0:
                return
            mn, mx = torch.aminmax(x)
            lo, hi = float(mn), float(mx)
        finite = x
        if self.ema_min is None:
            self.ema_min, self.ema_max = lo, hi
        else:
            self.ema_min += EMA_MOMENTUM * (lo - self.ema_min)
            self.ema_max += EMA_MOMENTUM * (hi - self.ema_max)
        self.run_min, self.run_max = min(self.run_min, lo), max(self.run_max, hi)
        step = max(1, finite.numel() // SAMPLE_CAP)
        sample = finite[::step].float()
        self.samples.append(torch.cat([sample, sample.new_tensor([lo, hi])]))
        self.extremes.append(sample.new_tensor([lo, hi]))
        if sum(t.numel() for t in self.samples) > TOTAL_CAP:
            pool = torch.cat(self.samples)[::2]
            self.samples = [torch.cat([pool, *self.extremes])]
        self.batches += 1

    def amax(self, kind: ObserverKind, dtype: DType, rounding: Round, percentile: float) -> float:
        """The calibrated absolute maximum for ``kind`` (FIXED is handled by the caller)."""
        if self.ema_min is None:
            raise ValueError("observer saw no finite values")
        if kind is ObserverKind.MINMAX:
            return max(-self.ema_min, self.ema_max, 0.0)
        data = torch.cat(self.samples)
        if kind is ObserverKind.PERCENTILE:
            return float(torch.quantile(data.abs().double(), percentile / 100.0))
        if kind is ObserverKind.MSE:
            return mse_amax(data, dtype, rounding)
        raise ValueError(f"observer {kind} has no amax; allowed: MINMAX, MSE, PERCENTILE")


def mse_amax(data: Tensor, dtype: DType, rounding: Round) -> float:
    """The candidate ``amax * (1 - 0.01 i)`` (i = 0..94) with the lowest L2 fake-quant error.

    The search runs on at most ``SEARCH_CAP`` values (a strided subsample that keeps both
    extremes), all candidates at once.
    """
    data = data.reshape(-1).float()
    amax = float(data.abs().max())
    if amax == 0.0:
        return 0.0
    if data.numel() > SEARCH_CAP:
        step = data.numel() // SEARCH_CAP + 1
        data = torch.cat([data[::step], data.new_tensor([float(data.min()), float(data.max())])])
    cands = amax * (1 - 0.01 * torch.arange(MSE_CANDIDATES, dtype=torch.float64))
    scales = compute_scale(cands, dtype).reshape(-1, 1)
    q = round_float(data.reshape(1, -1) / scales, rounding).clamp_(dtype.qmin, dtype.qmax)
    err = q.mul_(scales).sub_(data.reshape(1, -1)).square_().sum(dim=1)
    return float(cands[int(torch.argmin(err))])


def weight_amax(w: Tensor, per_channel: bool) -> Tensor:
    """Per-channel (axis 0) or per-tensor MinMax absolute maximum of a weight, float32."""
    w = w.detach().float()
    if per_channel and w.dim() > 1:
        return w.abs().reshape(w.shape[0], -1).amax(dim=1)
    return w.abs().max().reshape(1) if per_channel else w.abs().max()
