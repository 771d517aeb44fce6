"""Simulator observers: every rule through ``act_scale`` with the platform's scale rule, the
statistics each point keeps, shared points, and the histogram accessor."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from calibration_oracle import amax_of, ema, kl_threshold, scale, sse, sse_at
from torch import nn

from quantlab.calibration.kinds import HistogramMethod, ObserverKind
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import ScaleRule, compute_scale
from quantlab.numerics.rounding import Round
from quantlab.platforms import PlatformConfig
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.observers import (
    MSE_CANDIDATES,
    TOTAL_CAP,
    ActivationObserver,
    BatchRules,
    mse_amax,
)


class _Scale(nn.Module):
    """One captured op (a linear layer) whose input point sees exactly the calibration data."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(1, 1, bias=False)
        nn.init.ones_(self.fc.weight)

    def forward(self, x):
        return self.fc(x)


def _data(seed: int = 6, batches: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.randn(3000, generator=g), torch.randn(30, generator=g) * 6])
    return [c.reshape(-1, 1) for c in x.chunk(batches)]


def _scale_of(platform, observer: ObserverKind, data, **fields) -> float:
    spec = QConfigSpec(global_=OpQConfig(observer=observer, **fields))
    sim = Simulator(_Scale(), platform, spec)
    sim.calibrate([(x,) for x in data])
    name = "fc:linear#0"
    return float(sim.act_scale(name, "in0", DType.INT8, sim.qconfig_of(name)))


PLATFORMS = {
    "qmax": PlatformConfig(name="qmax", scale_rule=ScaleRule.QMAX, fake_round=Round.HALF_AWAY),
    "pot": PlatformConfig(name="pot", scale_rule=ScaleRule.POT),
}


@pytest.mark.parametrize("rule", ["qmax", "pot"])
def test_mse_searches_use_the_platform_scale_rule(rule):
    """Every MSE-style search compares candidates by the platform's own scales (on QMAX and
    power-of-two platforms the half-range search picks another scale for this data)."""
    platform = PLATFORMS[rule]
    mode = "half_away" if rule == "qmax" else "half_even"
    data = _data()
    x = torch.cat(data).reshape(-1).double().numpy()
    # MSE_POOLED: one search over the pooled values (all of them here, plus each batch's extremes)
    pool = np.concatenate([np.r_[d.reshape(-1).numpy(), d.min(), d.max()] for d in data])
    a = np.abs(pool).max()
    cands = [a * (1 - 0.01 * i) for i in range(95)]
    errs = [sse(pool, c, rule, mode=mode) for c in cands]
    best = scale(cands[int(np.argmin(errs))], rule)
    half = [sse(pool, c, "half_range", mode=mode) for c in cands]
    assert scale(cands[int(np.argmin(half))], rule) != best  # the data tells the rules apart
    assert _scale_of(platform, ObserverKind.MSE_POOLED, data) == pytest.approx(best, rel=1e-6)
    # MSE (the vendor's, per batch then EMA)
    ranges = []
    for d in data:
        v = d.reshape(-1).double().numpy()
        lo, hi = v.min(), v.max()
        e = [sse(v, max(-lo, hi) * (1 - 0.01 * i), rule, mode=mode) for i in range(95)]
        i = max(i for i, err in enumerate(e) if err == min(e))
        ranges.append((lo * (1 - 0.01 * i), hi * (1 - 0.01 * i)))
    want = scale(amax_of(ema(ranges)), rule)
    assert _scale_of(platform, ObserverKind.MSE, data) == pytest.approx(want, rel=1e-6)
    # HISTOGRAM / MSE: its scale costs the data at most 2% more than the best candidate's
    got = _scale_of(platform, ObserverKind.HISTOGRAM, data, histogram_method="MSE")
    top = np.abs(x).max()
    data_best = min(sse(x, top * k / 512, rule, mode=mode) for k in range(1, 513, 2))
    assert sse_at(x, got, mode=mode) <= data_best * 1.02


def test_every_observer_scale_is_the_platform_rule_of_its_amax():
    data = _data(seed=3)
    kinds = [k for k in ObserverKind if k is not ObserverKind.FIXED]
    for rule, platform in PLATFORMS.items():
        for kind in kinds:
            spec = QConfigSpec(global_=OpQConfig(observer=kind, clip_range=(-2.0, 3.0)))
            sim = Simulator(_Scale(), platform, spec)
            sim.calibrate([(x,) for x in data])
            rq = sim.qconfig_of("fc:linear#0")
            obs = sim._obs.get("fc:linear#0/in0")
            amax = obs.amax(rq, DType.INT8, platform.scale_rule, platform.fake_round)
            s = float(sim.act_scale("fc:linear#0", "in0", DType.INT8, rq))
            assert s == pytest.approx(scale(amax, rule), rel=1e-6), (rule, kind)


def test_observer_kinds_against_their_rules_on_known_data():
    data = _data(seed=4, batches=3)
    vals = [d.reshape(-1).double().numpy() for d in data]
    ranges = [(v.min(), v.max()) for v in vals]
    sim = Simulator(_Scale(), "j6m")
    sim.calibrate([(x,) for x in data], observers=list(ObserverKind))
    s = {}
    for k in ObserverKind:  # every rule from one calibration
        sim.set_qconfig(QConfigSpec(global_=OpQConfig(observer=k, clip_range=(-1.5, 2.5))))
        rq = sim.qconfig_of("fc:linear#0")
        s[k] = float(sim.act_scale("fc:linear#0", "in0", DType.INT8, rq))
    assert s[ObserverKind.MINMAX] == pytest.approx(scale(amax_of(ema(ranges)), "half_range"))
    top = max(max(-lo, hi) for lo, hi in ranges)
    assert s[ObserverKind.GLOBAL_MINMAX] == pytest.approx(scale(top, "half_range"))
    clip = (max(ranges[-1][0], -1.5), min(ranges[-1][1], 2.5))
    assert s[ObserverKind.CLIP] == pytest.approx(scale(amax_of(clip), "half_range"))
    std = [
        (max(v.min(), v.mean() - 3 * v.std(ddof=1)), min(v.max(), v.mean() + 3 * v.std(ddof=1)))
        for v in vals
    ]
    assert s[ObserverKind.CLIPSTD] == pytest.approx(scale(amax_of(ema(std)), "half_range"), 1e-5)
    assert s[ObserverKind.FIXED] == 1.0
    # KL: one |x| histogram, width = first batch's max / 512, the entropy search, int8 levels
    width = np.abs(vals[0]).max() / 512
    n = int(np.ceil(max(np.abs(v).max() for v in vals) / width))
    counts = sum(np.histogram(np.abs(v), bins=n, range=(0, n * width))[0] for v in vals)
    kl = kl_threshold(counts.astype(np.float64), width, 128)
    assert s[ObserverKind.KL] == pytest.approx(scale(kl, "half_range"), rel=1e-4)
    assert s[ObserverKind.KL] < s[ObserverKind.GLOBAL_MINMAX]


def test_set_qconfig_switches_histogram_methods_without_a_new_calibration():
    data = _data(seed=5)
    spec = QConfigSpec(global_=OpQConfig(observer=ObserverKind.HISTOGRAM))
    sim = Simulator(_Scale(), "j6m", spec)
    sim.calibrate([(x,) for x in data])
    name = "fc:linear#0"
    scales = {}
    for method in HistogramMethod:
        rule = OpQConfig(observer="HISTOGRAM", histogram_method=method, percentile=99.0)
        sim.set_qconfig(QConfigSpec(global_=rule))
        scales[method] = float(sim.act_scale(name, "in0", DType.INT8, sim.qconfig_of(name)))
    assert len(set(scales.values())) == len(scales)  # four methods, four scales
    sim.set_qconfig(QConfigSpec(global_=OpQConfig(observer="MIX")))  # per batch, not gathered
    with pytest.raises(ValueError, match="MIX at INT8 needs statistics gathered"):
        sim.act_scale(name, "in0", DType.INT8, sim.qconfig_of(name))


def test_calibrate_observers_gathers_per_batch_rules_for_later_qconfigs():
    data = _data(seed=5)
    sim = Simulator(_Scale(), "j6m")
    sim.calibrate([(x,) for x in data], observers=[ObserverKind.MSE, ObserverKind.MIX])
    name = "fc:linear#0"
    for kind in ("MSE", "MIX"):
        sim.set_qconfig(QConfigSpec(global_=OpQConfig(observer=kind)))
        for dt in (DType.INT8, DType.INT16):  # the platform's sensitive dtype too
            assert float(sim.act_scale(name, "in0", dt, sim.qconfig_of(name))) > 0


def test_mse_pooled_is_the_best_of_95_candidates():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(5000, generator=g), torch.tensor([40.0])])  # one outlier
    best = mse_amax(x, DType.INT8, Round.HALF_EVEN)
    amax = float(x.abs().max())
    cands = [amax * (1 - 0.01 * i) for i in range(MSE_CANDIDATES)]
    errs = [sse(x.double().numpy(), c, "half_range") for c in cands]
    assert best == pytest.approx(cands[errs.index(min(errs))])
    assert best < amax


def test_pool_stays_bounded_and_keeps_extremes():
    obs = ActivationObserver(BatchRules())
    g = torch.Generator().manual_seed(1)
    for _ in range(12):
        obs.update(torch.rand(100000, generator=g) * 2 - 1)
    obs.update(torch.tensor([5.0]))
    assert sum(t.numel() for t in obs.samples) <= TOTAL_CAP + 64
    assert float(torch.cat(obs.samples).max()) == 5.0  # extremes survive thinning
    assert obs.hist.amax == 5.0 and obs.hist.total == 12 * 100000 + 1


def test_minmax_is_an_ema_of_batch_extremes():
    obs = ActivationObserver()
    obs.update(torch.tensor([-1.0, 2.0]))
    obs.update(torch.tensor([-3.0, 4.0]))
    obs.update(torch.tensor([float("nan"), 0.5, float("inf")]))  # non-finite values dropped
    lo = -1.0 + 0.01 * (-3.0 + 1.0)
    hi = 2.0 + 0.01 * (4.0 - 2.0)
    lo, hi = lo + 0.01 * (0.5 - lo), hi + 0.01 * (0.5 - hi)
    rq = OpQConfig(observer="MINMAX")
    assert obs.amax(rq, DType.INT8, ScaleRule.HALF_RANGE, Round.HALF_EVEN) == pytest.approx(hi)
    assert obs.ema_min == pytest.approx(lo)


class _Chain(nn.Module):
    def forward(self, x):
        y = torch.sigmoid(x * 2.0)
        return torch.tanh(y)


def test_a_tensor_seen_at_two_points_shares_one_observer_and_the_histogram_accessor():
    sim = Simulator(_Chain(), "j6m")
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(4, 64, generator=g) for _ in range(3)]
    sim.calibrate([(x,) for x in xs])
    names = list(sim.ops["name"])
    sig = next(n for n in names if "sigmoid" in n)
    tanh = next(n for n in names if "tanh" in n)
    assert sim._obs.get(f"{sig}/out") is sim._obs.get(f"{tanh}/in0")
    edges, counts = sim.histogram(tanh, 0)
    assert edges.shape == (counts.numel() + 1,) and counts.dtype == torch.float64
    y = torch.cat([torch.sigmoid(x * 2.0).reshape(-1) for x in xs])
    assert float(counts.sum()) == y.numel()
    want, _ = np.histogram(y.double().numpy(), bins=edges.numpy())
    assert np.abs(counts.numpy() - want).sum() <= 2  # bin-edge ties of float32 vs float64
    assert float(edges[-1]) >= float(y.max()) and float(edges[-1]) < 2 * float(y.max())
    out_edges, _ = sim.histogram(tanh, None)
    assert out_edges.shape == edges.shape
    with pytest.raises(ValueError, match="no calibration statistics"):
        sim.histogram(tanh, 3)


def test_platform_default_observers_and_an_overridden_one():
    from quantlab.simulate.profiles import platform_config

    for name in ("j6e", "j6m", "j6b", "j6h", "j6p"):
        assert platform_config(name).default_observer is ObserverKind.MSE  # the vendor's
    for name in ("tflite", "onnxruntime"):
        assert platform_config(name).default_observer is ObserverKind.GLOBAL_MINMAX
    p = dataclasses.replace(PlatformConfig(name="j6m"), default_observer=ObserverKind.KL)
    sim = Simulator(_Scale(), p)
    sim.calibrate([(x,) for x in _data()])
    assert sim.qconfig_of("fc:linear#0").observer is ObserverKind.KL
    y = sim.run(_data()[0], mode=Mode.FAKE)
    assert torch.isfinite(y).all()
    assert compute_scale(1.0, DType.INT8) > 0


class _InPlaceAfterFloat(nn.Module):
    """An in-place multiply and add whose input arrives in float (from a flip, an op that is not
    modelled), so the ops quantize it at their own input point; or the same out of place."""

    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.in_place = in_place
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        g = self.conv(x).flip(1)
        if self.in_place:
            g.mul_(3.0).add_(1.0)
        else:
            g = g * 3.0 + 1.0
        return g


def test_an_in_place_op_observes_its_input_before_it_writes_it():
    """Calibration observes an op's inputs before the op runs: an in-place op's input point
    sees its input, not its own output, and so takes the scale its out-of-place twin takes."""
    g = torch.Generator().manual_seed(2)
    calib = [(torch.randn(2, 3, 5, 5, generator=g),) for _ in range(2)]
    x = torch.randn(2, 3, 5, 5, generator=g)
    sims = []
    for in_place in (True, False):
        torch.manual_seed(0)
        sim = Simulator(_InPlaceAfterFloat(in_place).eval(), "j6m")
        sim.calibrate(calib, progress=False)
        sims.append(sim)
    for op in (":mul#0", ":add#0"):
        edges, counts = sims[0].histogram(op, 0)
        twin_edges, twin_counts = sims[1].histogram(op, 0)
        assert torch.equal(edges, twin_edges) and torch.equal(counts, twin_counts)
    for mode in (Mode.FAKE, Mode.FIXED):
        assert torch.equal(sims[0].run(x, mode=mode), sims[1].run(x, mode=mode))
