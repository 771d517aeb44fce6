"""Metrics against hand-computed values and their edge cases."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from quantlab.analysis.metrics import all_metrics, cosine, flat, kl, sqnr_db


def test_known_values():
    x = torch.tensor([1.0, -2.0, 3.0, 0.5])
    y = torch.tensor([1.5, -2.0, 2.0, 0.5])
    m = all_metrics(x, y)
    assert m["l1"] == pytest.approx((0.5 + 0 + 1 + 0) / 4)
    assert m["mse"] == pytest.approx((0.25 + 1) / 4)
    assert m["max_abs"] == 1.0
    n = math.sqrt(1 + 4 + 9 + 0.25)
    assert m["sqnr_db"] == pytest.approx(20 * math.log10(n / math.sqrt(1.25)))
    dot = 1.5 + 4 + 6 + 0.25
    assert m["cosine"] == pytest.approx(dot / (n * math.sqrt(2.25 + 4 + 4 + 0.25)))


def test_edges():
    z = torch.zeros(5)
    x = torch.arange(5.0)
    assert sqnr_db(x, x) == math.inf
    assert sqnr_db(z, x) == -math.inf
    assert cosine(z, z) == 1.0 and cosine(z, x) == 0.0
    assert cosine(x, -x) == pytest.approx(-1.0)  # signed
    assert all_metrics(torch.zeros(0), torch.zeros(0))["l1"] == 0.0
    with pytest.raises(ValueError, match="equal shapes"):
        all_metrics(torch.zeros(2), torch.zeros(3))


def test_kl_matches_torch_on_dim1():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 10, generator=g), torch.randn(4, 10, generator=g)
    want = F.kl_div(
        F.log_softmax(y.double(), 1),
        F.log_softmax(x.double(), 1),
        log_target=True,
        reduction="batchmean",
    )
    assert kl(x, y) == pytest.approx(float(want))
    assert kl(x, x) == pytest.approx(0.0, abs=1e-15)


def test_flat_collects_float_leaves():
    out = (torch.ones(2, 2), {"a": torch.zeros(3), "b": torch.arange(3)}, 5)
    assert flat(out).tolist() == [1.0] * 4 + [0.0] * 3


def test_rtol_is_the_vendors_max_relative_error_and_ranks_descending():
    from quantlab.analysis.metrics import Metric, lower_is_worse, output_metrics, rtol

    x = torch.tensor([1.0, -2.0, 4.0, 0.0])
    y = torch.tensor([1.5, -2.0, 3.0, 0.0])
    assert rtol(x, y) == 0.5  # |1.5 - 1| / 1 beats |3 - 4| / 4; 0/0 counts 0
    assert rtol(torch.zeros(0), torch.zeros(0)) == 0.0
    assert (
        rtol(torch.tensor([0.0, 1.0]), torch.tensor([1e-9, 1.0])) == torch.finfo(torch.float64).max
    )
    out = output_metrics([x[None]], [y[None]], [Metric.RTOL, Metric.MAX_ABS])
    assert out[Metric.RTOL] == 0.5 and out[Metric.MAX_ABS] == 1.0
    assert not lower_is_worse(Metric.RTOL)  # larger = more sensitive, like Atol (MAX_ABS)
