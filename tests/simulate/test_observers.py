"""Calibration observers: MinMax EMA, MSE shrink search, percentile, bounded samples."""

from __future__ import annotations

import pytest
import torch

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import compute_scale, fake_quant
from quantlab.numerics.rounding import Round
from quantlab.qconfig import ObserverKind
from quantlab.simulate.observers import (
    MSE_CANDIDATES,
    TOTAL_CAP,
    ActivationObserver,
    mse_amax,
)


def test_minmax_is_an_ema_of_batch_extremes():
    obs = ActivationObserver()
    obs.update(torch.tensor([-1.0, 2.0]))
    obs.update(torch.tensor([-3.0, 4.0]))
    obs.update(torch.tensor([float("nan"), 0.5, float("inf")]))  # non-finite values dropped
    lo = -1.0 + 0.01 * (-3.0 + 1.0)
    hi = 2.0 + 0.01 * (4.0 - 2.0)
    lo, hi = lo + 0.01 * (0.5 - lo), hi + 0.01 * (0.5 - hi)
    assert obs.amax(ObserverKind.MINMAX, DType.INT8, Round.HALF_EVEN, 99.9) == pytest.approx(hi)
    assert obs.ema_min == pytest.approx(lo)


def test_mse_search_is_the_best_of_95_candidates():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(5000, generator=g), torch.tensor([40.0])])  # one outlier
    best = mse_amax(x, DType.INT8, Round.HALF_EVEN)
    amax = float(x.abs().max())
    cands = [amax * (1 - 0.01 * i) for i in range(MSE_CANDIDATES)]
    errs = [
        float(((fake_quant(x, compute_scale(c, DType.INT8), DType.INT8) - x) ** 2).sum())
        for c in cands
    ]
    assert best == pytest.approx(cands[errs.index(min(errs))])
    assert best < amax


def test_percentile_and_bounded_samples():
    obs = ActivationObserver()
    g = torch.Generator().manual_seed(1)
    for _ in range(12):
        obs.update(torch.rand(100000, generator=g) * 2 - 1)
    obs.update(torch.tensor([5.0]))
    assert sum(t.numel() for t in obs.samples) <= TOTAL_CAP + 64
    assert float(torch.cat(obs.samples).max()) == 5.0  # extremes survive thinning
    p = obs.amax(ObserverKind.PERCENTILE, DType.INT8, Round.HALF_EVEN, 50.0)
    assert p == pytest.approx(0.5, abs=0.02)
