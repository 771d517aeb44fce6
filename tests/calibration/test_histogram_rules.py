"""Full-histogram rules (HISTOGRAM methods, KL) against independent computations on known data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from calibration_oracle import bin_integral, hist_objective, kl_threshold, scale, sse

from quantlab.calibration.histogram import AbsHistogram, SignedHistogram, expected_sq_error
from quantlab.calibration.kinds import HistogramMethod
from quantlab.calibration.kl import kl_threshold as lib_kl_threshold
from quantlab.calibration.search import candidate_errors, histogram_amax
from quantlab.numerics import DType, ScaleRule


def _hist(values: torch.Tensor, bins: int = 256) -> SignedHistogram:
    h = SignedHistogram(bins)
    for chunk in values.split(max(1, values.numel() // 3)):
        h.update(chunk.float())
    return h


def test_signed_histogram_grows_by_exact_doubling_and_counts_zeros_apart():
    x = torch.tensor([0.3, -0.2, 0.0, 0.0, 0.9])
    h = SignedHistogram(8)
    h.update(x)
    assert h.limit == 1.0 and h.zeros == 2 and float(h.counts.sum()) == 3
    h.update(torch.tensor([-3.5, 0.0]))  # beyond the range: doubles twice to [-4, 4]
    assert h.limit == 4.0 and h.zeros == 3
    edges = h.edges().numpy()
    want, _ = np.histogram([0.3, -0.2, 0.9, -3.5], bins=edges)
    assert h.counts.tolist() == want.tolist()
    edges, counts = h.edges(), h.counts_with_zeros()
    assert float(counts.sum()) == 7 and counts[4] == 2 + 3  # [0, 1) holds 0.3, 0.9 and 3 zeros


def test_histograms_take_values_up_to_float32s_largest():
    """An additive mask of float32's lowest value (a transformer's eager attention mask): the
    signed range rounds up to 2**128, which float32 cannot hold, and float32's histc would
    overflow scaling such values to bins; both histograms bin them in float64."""
    lowest = torch.finfo(torch.float32).min
    first, x = torch.tensor([1.5, -2.0]), torch.tensor([lowest, 0.0, 1.5, -2.0, lowest, 3.0e38])
    h = SignedHistogram(8)
    h.update(first)
    h.update(x)
    assert h.limit == 2.0**128
    counts = h.counts_with_zeros().tolist()
    # the small values land in the two bins around 0 (histc scales each value to its bin in
    # the histogram's float dtype, so a small negative one may round into the bin from 0)
    assert counts[0] == 2 and counts[-1] == 1 and counts[3] + counts[4] == 5 and sum(counts) == 8
    k = AbsHistogram(4)
    k.update(x)
    n = k.counts.numel()
    want, _ = np.histogram(x.abs().double().numpy(), bins=n, range=(0.0, n * k.width))
    assert k.counts.tolist() == want.tolist() == [3, 0, 0, 3]


def test_expected_error_is_the_integral_of_the_fake_quant_error_over_each_bin():
    counts = torch.tensor([0.0, 3.0, 5.0, 0.0, 2.0, 7.0, 1.0, 4.0], dtype=torch.float64)
    edges = torch.linspace(-4.0, 4.0, 9, dtype=torch.float64)
    scales = torch.tensor([0.011, 0.02, 0.0313], dtype=torch.float64)  # the last clips hard
    rnd, clip = expected_sq_error(counts, edges, scales, -128, 127)
    for k, s in enumerate(scales.tolist()):
        r_want = c_want = 0.0
        for n, a, b in zip(counts.tolist(), edges[:-1].tolist(), edges[1:].tolist()):
            r, c = bin_integral(a, b, s, -128, 127, points=100001)
            r_want += n * r / (b - a)
            c_want += n * c / (b - a)
        assert float(rnd[k]) == pytest.approx(r_want, rel=1e-3)
        assert float(clip[k]) == pytest.approx(c_want, rel=1e-3, abs=1e-9)
    assert float(clip[0]) > float(clip[1]) > float(clip[2]) > 0.0  # larger scales clip less


def test_histogram_mse_matches_the_data_mse_of_a_finely_binned_distribution():
    g = torch.Generator().manual_seed(7)
    x = torch.cat([torch.randn(15000, generator=g), 8 * torch.randn(10, generator=g)])
    h = _hist(x, 8192)
    got = histogram_amax(h, HistogramMethod.MSE, DType.INT8, ScaleRule.HALF_RANGE)
    xn = x.double().numpy()
    cands = [h.amax * k / 512 for k in range(1, 513, 3)]
    data_err = np.array([sse(xn, c, "half_range") for c in cands])
    # the histogram's choice costs at most 1% more real error than the data's own best
    assert sse(xn, got, "half_range") <= data_err.min() * 1.01
    assert got < h.amax  # the outliers are clipped


@pytest.mark.parametrize("rule", [ScaleRule.HALF_RANGE, ScaleRule.QMAX, ScaleRule.POT])
def test_histogram_mse_and_sqnr_are_argmins_of_their_objectives_under_the_rule(rule):
    g = torch.Generator().manual_seed(8)
    x = torch.cat([torch.randn(20000, generator=g).clamp_min(0), 6 * torch.rand(30, generator=g)])
    h = _hist(x, 512)
    name = {ScaleRule.HALF_RANGE: "half_range", ScaleRule.QMAX: "qmax", ScaleRule.POT: "pot"}[rule]
    counts, edges = h.counts.numpy(), h.edges().numpy()
    methods = ((HistogramMethod.MSE, 512, 512, 1.0), (HistogramMethod.SQNR, 101, 100, 3.0))
    for method, n, denom, gamma in methods:
        got = histogram_amax(h, method, DType.INT8, rule)
        cands = [h.amax * k / denom for k in range(1, n + 1)]
        objective = [
            hist_objective(counts, edges, scale(c, name), gamma, points=401)
            for c in cands[:: max(1, n // 40)] + [got]
        ]
        assert objective[-1] <= min(objective[:-1]) * (1 + 1e-3)
        lib = candidate_errors(h, torch.tensor(cands, dtype=torch.float64), DType.INT8, rule, gamma)
        assert float(lib[cands.index(got)]) == pytest.approx(float(lib.min()))


def test_sqnr_clips_less_than_mse_on_heavy_tails():
    g = torch.Generator().manual_seed(9)
    # Student's t with 2 degrees of freedom: z / sqrt(chi2_2 / 2), chi2_2 = -2 log(u)
    z, u = torch.randn(20000, generator=g), torch.rand(20000, generator=g).clamp_min(1e-12)
    x = z / torch.sqrt(-torch.log(u))
    h = _hist(x, 4096)
    mse = histogram_amax(h, HistogramMethod.MSE, DType.INT8, ScaleRule.HALF_RANGE)
    sqnr = histogram_amax(h, HistogramMethod.SQNR, DType.INT8, ScaleRule.HALF_RANGE)
    assert mse < sqnr < h.amax


def test_histogram_percentile_is_the_upper_edge_of_the_bin_holding_the_percentile():
    g = torch.Generator().manual_seed(10)
    x = torch.cat([torch.randn(30000, generator=g), torch.zeros(5000)])
    h = _hist(x, 2048)
    for p in (50.0, 99.0, 99.99):
        got = histogram_amax(h, HistogramMethod.PERCENTILE, DType.INT8, ScaleRule.HALF_RANGE, p)
        a = np.sort(np.abs(x.double().numpy()))
        true_q = a[int(np.ceil(p / 100 * a.size)) - 1]
        width = h.limit / 1024
        assert got - width - 1e-12 <= true_q <= got + 1e-12


def test_kl_search_matches_the_loop_transcription_of_the_rule():
    g = torch.Generator().manual_seed(11)
    x = torch.cat([torch.randn(20000, generator=g).abs(), 7 * torch.rand(20, generator=g)])
    counts = torch.histc(x, 300, 0.0, float(x.max())).double()
    width = float(x.max()) / 300
    for levels in (128, 16):
        assert lib_kl_threshold(counts, width, levels) == pytest.approx(
            kl_threshold(counts.numpy(), width, levels), rel=1e-12
        )


def test_kl_observer_histogram_keeps_the_first_batch_width_and_appends_bins():
    h = AbsHistogram(first_bins=4)
    h.update(torch.tensor([0.5, -1.5, 4.0, 0.0]))  # width 1: [0,1) [1,2) [2,3) [3,4]
    assert h.width == 1.0 and h.counts.tolist() == [2, 1, 0, 1]
    h.update(torch.tensor([-5.5, 2.5]))  # 6 bins of width 1
    assert h.counts.tolist() == [2, 1, 1, 1, 0, 1]


def test_histogram_kl_method_uses_the_kl_rule_on_folded_counts():
    g = torch.Generator().manual_seed(12)
    x = torch.cat([torch.randn(40000, generator=g), 9 * torch.randn(10, generator=g)])
    h = _hist(x, 1024)
    got = histogram_amax(h, HistogramMethod.KL, DType.INT8, ScaleRule.HALF_RANGE)
    folded, width = h.abs_counts()
    last = int(torch.nonzero(folded).max()) + 1
    want = kl_threshold(folded[:last].numpy(), width, 128)
    assert got == pytest.approx(min(want, h.amax))
    assert 2.0 < got < h.amax
