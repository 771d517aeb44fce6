"""The vendor's per-batch observer rules against independent numpy computations of each rule.

Each rule runs on seeded known distributions (Gaussian bulk with rare large outliers, ReLU-like
data with exact zeros), over several batches so that the EMA matters; the oracle
(tests/calibration_oracle.py) recomputes every candidate's error in float64 numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from calibration_oracle import amax_of, ema, rnd, scale, sse

from quantlab.calibration import vendor
from quantlab.numerics import DType, Round, ScaleRule

RULES = {"half_range": ScaleRule.HALF_RANGE, "qmax": ScaleRule.QMAX, "pot": ScaleRule.POT}
ROUNDS = {"half_even": Round.HALF_EVEN, "half_away": Round.HALF_AWAY}


def _flat(ranges) -> list[float]:
    return [v for r in ranges for v in r]


def _batches(seed: int, n: int = 3, size: int = 4000, relu: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for b in range(n):
        x = torch.randn(size, generator=g) * (1.0 + 0.3 * b)
        x[:8] = torch.randn(8, generator=g) * 9.0  # rare outliers
        out.append(x.clamp_min(0.0) if relu else x)
    return out


@pytest.mark.parametrize(
    ("rule", "mode", "relu"),
    [("half_range", "half_even", False), ("qmax", "half_away", True), ("pot", "half_even", False)],
)
def test_mse_is_the_per_batch_best_of_95_then_ema(rule, mode, relu):
    batches = _batches(1, relu=relu)
    got = [vendor.mse_batch(x, DType.INT8, RULES[rule], ROUNDS[mode]) for x in batches]
    want = []
    for x in batches:
        xn = x.double().numpy()
        lo, hi = float(xn.min()), float(xn.max())
        a = max(-lo, hi)
        errs = [sse(xn, a * (1 - 0.01 * i), rule, mode=mode) for i in range(95)]
        i_best = max(i for i, e in enumerate(errs) if e <= min(errs) * (1 + 1e-6))
        want.append((lo * (1 - 0.01 * i_best), hi * (1 - 0.01 * i_best)))
        # the library's choice is an argmin of the oracle's errors (float32 sums vs float64)
        f = got[len(want) - 1][1] / hi if hi else 1.0
        assert sse(xn, a * f, rule, mode=mode) <= min(errs) * (1 + 1e-6)
    assert _flat(got) == pytest.approx(_flat(want), rel=1e-9)
    assert amax_of(vendor.ema(got)) == pytest.approx(amax_of(ema(want)), rel=1e-9)
    assert amax_of(vendor.ema(got)) < max(float(x.abs().max()) for x in batches)  # it clipped


def test_percentile_clip_is_the_bin_centre_of_the_percentile_then_ema():
    batches = _batches(2)
    for p in (99.0, 99.99):
        got = [vendor.percentile_batch(x, p) for x in batches]
        want = []
        for x in batches:
            xn = x.double().numpy()
            lo, hi = xn.min(), xn.max()
            r = max(-lo, hi)
            hist, _ = np.histogram(np.abs(xn), bins=2048, range=(0.0, r))
            i = int(np.searchsorted(np.cumsum(hist), p / 100 * xn.size, side="left"))
            clip = (i + 0.5) * r / 2048
            want.append((max(lo, -clip), min(hi, clip)))
        assert _flat(got) == pytest.approx(_flat(want), rel=1e-6)
        assert amax_of(vendor.ema(got)) == pytest.approx(amax_of(ema(want)), rel=1e-6)


def test_mix_keeps_the_percentile_clip_with_the_lowest_l2_error():
    for x in _batches(3, relu=True) + _batches(4):
        lo, hi = vendor.mix_batch(x, DType.INT8, ScaleRule.HALF_RANGE, Round.HALF_EVEN)
        xn = x.double().numpy()
        r = max(-xn.min(), xn.max())
        hist, _ = np.histogram(np.abs(xn), bins=2048, range=(0.0, r))
        cum = np.cumsum(hist)
        clips = sorted(
            {
                (int(np.searchsorted(cum, p / 100 * xn.size)) + 0.5) * r / 2048
                for p in (99.9, 99.95, 99.99, 99.993, 99.995, 99.997, 99.999, 99.9995, 99.9999)
            }
        )
        errs = [sse(xn, min(c, r), "half_range") for c in clips]
        best = clips[int(np.argmin(errs))]
        assert max(-lo, hi) == pytest.approx(min(best, r), rel=1e-6)


def test_clip_is_the_last_batch_clamped_to_its_range():
    batches = _batches(5)
    ranges = [(float(x.min()), float(x.max())) for x in batches]
    assert vendor.clip_range(ranges, (-1.5, 2.0)) == (
        max(ranges[-1][0], -1.5),
        min(ranges[-1][1], 2.0),
    )
    assert vendor.clip_range(ranges, (-100.0, 100.0)) == ranges[-1]


def test_clipstd_clips_each_batch_at_mean_plus_minus_three_std_then_ema():
    batches = _batches(6)
    got, want = [], []
    for x in batches:
        xn = x.double().numpy()
        m, s = xn.mean(), xn.std(ddof=1)
        want.append((max(xn.min(), m - 3 * s), min(xn.max(), m + 3 * s)))
        got.append(
            vendor.clipstd_batch(float(x.min()), float(x.max()), float(x.mean()), float(x.std()))
        )
    assert amax_of(vendor.ema(got)) == pytest.approx(amax_of(ema(want)), rel=1e-5)


def test_rounding_modes_of_the_oracle_differ_only_on_ties():
    t = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 1.2, -1.7])
    assert list(rnd(t, "half_even")) == [-2, -2, -0, 0, 2, 2, 1, -2]
    assert list(rnd(t, "half_away")) == [-3, -2, -1, 1, 2, 3, 1, -2]
    assert scale(127.5, "half_range") == 1.0 and scale(127.0, "qmax") == 1.0
    assert scale(100.0, "pot") == 1.0 and scale(128.0, "pot") == 2.0
