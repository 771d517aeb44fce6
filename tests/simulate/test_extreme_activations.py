"""Activation points a transformer's code makes that hold nothing to calibrate: an empty tensor
(a key / value cache's first part of a cat), or values near float32's limits (an additive mask
of float32's lowest value)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from quantlab.calibration.kinds import ObserverKind
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import ScaleRule
from quantlab.numerics.rounding import Round
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.observers import ActivationObserver

LOWEST = torch.finfo(torch.float32).min


class _CachedAttention(nn.Module):
    """Keys appended to an empty cache, scores masked causally by adding float32's lowest."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)
        self.register_buffer("cache", torch.zeros(1, 0, 8))

    def forward(self, x):
        keys = torch.cat([self.cache, self.k(x)], dim=1)
        scores = self.q(x) @ keys.transpose(1, 2)
        mask = torch.full(scores.shape[-2:], LOWEST).triu(1)
        return torch.softmax(scores + mask, -1) @ keys


@pytest.mark.parametrize("observer", ["MSE", "MINMAX", "HISTOGRAM", "KL"])
def test_a_model_with_an_empty_cache_and_a_lowest_value_mask_calibrates_and_runs(observer):
    torch.manual_seed(0)
    sim = Simulator(_CachedAttention().eval(), "j6m", QConfigSpec(OpQConfig(observer=observer)))
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(1, 5, 8, generator=g),) for _ in range(2)], progress=False)
    x = torch.randn(1, 5, 8, generator=g)
    ref = sim.run(x, mode=Mode.FLOAT)
    for mode in (Mode.FAKE, Mode.FIXED):
        got = sim.run(x, mode=mode)
        assert got.shape == ref.shape and torch.isfinite(got).all()


def test_an_observer_of_empty_tensors_has_a_zero_range_and_one_of_non_finite_values_none():
    rq = SimpleNamespace(observer=ObserverKind.MINMAX)
    args = (DType.INT8, ScaleRule.QMAX, Round.HALF_EVEN)
    empty = ActivationObserver()
    empty.update(torch.zeros(1, 0, 8))
    assert empty._compute_amax(rq, *args) == 0.0 and empty.min_max(rq) == (0.0, 0.0)
    infinite = ActivationObserver()
    infinite.update(torch.full((3,), -torch.inf))
    with pytest.raises(ValueError, match="no finite values"):
        infinite._compute_amax(rq, *args)
