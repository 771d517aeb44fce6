import math

import pytest
import torch

from quantlab.analysis.confidence import Estimate, bootstrap, wilson_interval
from quantlab.models.tasks import OutputSQNR, Top1Agreement


def _logits_with_agreement(n: int, agree: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 3) logits: the first ``agree`` rows pick the same class in both, the rest differ."""
    ref = torch.zeros(n, 3)
    ref[:, 0] = 1.0
    test = ref.clone()
    test[agree:, 0] = 0.0
    test[agree:, 1] = 1.0
    return ref, test


def test_value_is_the_metric_on_all_items_and_count_is_the_items():
    ref, test = _logits_with_agreement(40, 30)
    est = bootstrap(Top1Agreement(), [ref[:25], ref[25:]], [test[:25], test[25:]])
    assert est.value == 0.75
    assert est.n == 40
    assert est.low <= est.value <= est.high


def test_interval_of_a_proportion_matches_the_normal_approximation():
    # a share of n items ~ p +- 1.96 sqrt(p (1 - p) / n) (Wald), for large n
    n, agree = 400, 300
    ref, test = _logits_with_agreement(n, agree)
    est = bootstrap(Top1Agreement(), [ref], [test], resamples=2000, seed=1)
    p = agree / n
    half = 1.959964 * math.sqrt(p * (1 - p) / n)
    assert est.low == pytest.approx(p - half, abs=0.01)
    assert est.high == pytest.approx(p + half, abs=0.01)


def test_wilson_interval_matches_scipy_and_is_exact_at_the_ends():
    """The Wilson score interval against scipy's, for every k of n up to 40 at three levels;
    0 of n starts at exactly 0 and n of n ends at exactly 1."""
    binomtest = pytest.importorskip("scipy.stats").binomtest
    for level in (0.8, 0.95, 0.99):
        for n in range(1, 41):
            for k in range(n + 1):
                low, high = wilson_interval(k, n, level)
                ci = binomtest(k, n).proportion_ci(level, method="wilson")
                assert low == pytest.approx(float(ci.low), abs=1e-12)
                assert high == pytest.approx(float(ci.high), abs=1e-12)
                assert (low == 0.0) == (k == 0) and (high == 1.0) == (k == n)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(9, 8)


def test_a_share_of_items_takes_the_wilson_interval_and_never_a_point_interval():
    """8 of 8 agreeing items bound the share to [0.68, 1], not the bootstrap's [1, 1]; the
    interval is the Wilson interval of k of N, for every metric that is a share."""
    from quantlab.models import tasks

    ref, test = _logits_with_agreement(8, 8)
    est = bootstrap(Top1Agreement(), [ref], [test])
    assert (est.value, est.high, est.n) == (1.0, 1.0, 8)
    assert est.low == pytest.approx(0.6756, abs=1e-4)
    ref, test = _logits_with_agreement(30, 21)
    labels = [ref.argmax(-1)]
    for metric in (tasks.Top1Agreement(), tasks.Top1Accuracy()):
        est = bootstrap(metric, [ref], [test], labels if metric.uses_labels else None)
        assert (est.value, est.n) == (0.7, 30)
        assert (est.low, est.high) == wilson_interval(21, 30)
    probs = torch.stack([1 - test[:, 0], test[:, 0]], 1)  # column 1: 21 faces of 30
    est = bootstrap(tasks.FaceAccuracy(), [probs], [probs], [torch.ones(30)])
    assert (est.value, est.low, est.high) == (0.7, *wilson_interval(21, 30))


def test_a_share_whose_items_are_not_0_or_1_is_an_error():
    from quantlab.models.tasks import ProportionMetric

    class HalfCounts(ProportionMetric):
        name: str = "half_counts"
        higher_is_better: bool = True

        def item_values(self, ref_outputs, test_outputs, labels=None):
            return torch.full((ref_outputs[0].shape[0],), 0.5, dtype=torch.float64)

    with pytest.raises(ValueError, match="half_counts.*0 or 1"):
        bootstrap(HalfCounts("half_counts", True), [torch.zeros(4, 2)], [torch.zeros(4, 2)])


def test_identical_items_give_a_point_interval_and_inf_is_kept():
    ref = torch.ones(10, 4)
    est = bootstrap(Top1Agreement(), [ref], [ref.clone()])  # a share: 10 of 10, Wilson
    assert (est.value, est.low, est.high) == (1.0, wilson_interval(10, 10)[0], 1.0)
    sq = bootstrap(OutputSQNR(), [ref], [ref.clone()])
    assert sq.value == math.inf and sq.low == math.inf and sq.high == math.inf


def test_reproducible_with_a_seed_and_tuple_outputs_split_by_item():
    ref, test = _logits_with_agreement(30, 20)

    def first_top1(r, t, labels=None):
        return Top1Agreement()([x[0] for x in r], [x[0] for x in t])

    a = bootstrap(first_top1, [(ref, ref)], [(test, test)], seed=3)
    b = bootstrap(first_top1, [(ref, ref)], [(test, test)], seed=3)
    assert a == b


def test_mismatched_item_counts_and_bad_level_are_errors():
    with pytest.raises(ValueError, match="item count"):
        bootstrap(Top1Agreement(), [torch.zeros(4, 3)], [torch.zeros(5, 3)])
    with pytest.raises(ValueError, match="level"):
        bootstrap(Top1Agreement(), [torch.zeros(4, 3)], [torch.zeros(4, 3)], level=1.5)


def test_separation_of_intervals():
    a, b = Estimate(0.9, 0.85, 0.95, 50), Estimate(0.7, 0.6, 0.8, 50)
    c = Estimate(0.82, 0.75, 0.9, 50)
    assert a.separated_from(b) and b.separated_from(a)
    assert not a.separated_from(c)
    assert a.as_columns("top1") == {
        "top1": 0.9,
        "top1_ci_low": 0.85,
        "top1_ci_high": 0.95,
        "top1_n": 50,
    }
    assert "95% CI" in str(a)


def test_estimates_give_labels_only_to_metrics_that_read_them():
    from quantlab.analysis.confidence import estimate_metrics
    from quantlab.models.tasks import EmbeddingCosine, Top1Accuracy

    ref, test = _logits_with_agreement(6, 4)
    pair_labels = [torch.tensor([1, 0, 1])]  # one label per pair of items: not per item
    est = estimate_metrics([EmbeddingCosine()], [ref], [test], pair_labels)
    assert est["embedding_cosine"].n == 6
    labels = [torch.zeros(6, dtype=torch.int64)]  # every item is class 0
    acc = estimate_metrics([Top1Accuracy()], [ref], [test], labels)["top1_accuracy"]
    assert acc.value == 4 / 6 and acc.n == 6 and acc.low <= acc.value <= acc.high
    single = estimate_metrics([Top1Agreement()], [ref[:1]], [test[:1]])["top1_agreement"]
    assert single.n == 1 and (single.low, single.high) == wilson_interval(1, 1)
    one = estimate_metrics([EmbeddingCosine()], [ref[:1]], [test[:1]])["embedding_cosine"]
    assert one.n == 1 and math.isnan(one.low) and math.isnan(one.high)


@pytest.mark.parametrize(
    "metric_name",
    [
        "kl_nats",
        "embedding_cosine",
        "box_l1",
        "output_cosine",
    ],
)
def test_per_item_means_resampled_at_once_equal_the_metric_recomputed_per_resample(metric_name):
    from quantlab.models import tasks

    metric = {
        m.name: m
        for m in [
            tasks.SoftmaxKL(),
            tasks.EmbeddingCosine(),
            tasks.BoxL1(),
            tasks.OutputCosine(),
        ]
    }[metric_name]
    gen = torch.Generator().manual_seed(5)
    ref = [torch.randn(23, 2, generator=gen), torch.randn(14, 2, generator=gen)]
    test = [r + 0.7 * torch.randn(r.shape, generator=gen) for r in ref]
    labels = [torch.randint(0, 2, (r.shape[0],), generator=gen) for r in ref]
    if not metric.uses_labels:
        labels = None

    def recomputed(r, t, lab=None):  # no item_values: the per-resample path
        return metric(r, t, lab)

    fast = bootstrap(metric, ref, test, labels, resamples=100, seed=11)
    loop = bootstrap(recomputed, ref, test, labels, resamples=100, seed=11)
    assert fast == loop
    assert fast.low < fast.high  # the items differ, so the resamples do


def test_sqnr_from_item_sums_equals_the_metric_recomputed_per_resample():
    """OutputSQNR's bootstrap sums per-item (signal, noise) terms: the same draws as
    recomputing the metric on each resample, up to float64 rounding of the sums' order; on
    tuple outputs (every float leaf counts) and with items whose outputs are identical."""
    metric = OutputSQNR()
    gen = torch.Generator().manual_seed(7)
    ref = [
        (torch.randn(9, 3, 4, generator=gen), torch.randn(9, 5, generator=gen)) for _ in range(3)
    ]
    test = []
    for a, b in ref:
        noisy = (a + 0.1 * torch.randn(a.shape, generator=gen), b.clone())
        noisy[0][:4] = a[:4]  # four items of each batch identical in the first output too
        test.append(noisy)

    def recomputed(r, t, lab=None):  # no item_terms: the per-resample path
        return metric(r, t, lab)

    fast = bootstrap(metric, ref, test, resamples=200, seed=2)
    loop = bootstrap(recomputed, ref, test, resamples=200, seed=2)
    assert fast.value == loop.value and fast.n == loop.n == 27
    assert fast.low == pytest.approx(loop.low, rel=1e-12)
    assert fast.high == pytest.approx(loop.high, rel=1e-12)
    assert fast.low < fast.value < fast.high
    # a resample of identical items only has no noise: +inf, as the metric says
    same = [(a[:4], b[:4]) for a, b in ref]
    tests_same = [(t[0][:4], t[1][:4]) for t in test]
    est = bootstrap(metric, same, tests_same, resamples=20)
    assert (est.value, est.low, est.high) == (math.inf, math.inf, math.inf)


def test_distinct_digits_print_separated_intervals_as_separated():
    from quantlab.analysis.confidence import distinct_digits

    fake = Estimate(0.99971, 0.999701, 0.999719, 6)
    fixed = Estimate(0.99968, 0.999671, 0.999689, 6)
    assert fake.separated_from(fixed)
    assert str(fake).startswith("0.9997 (95% CI 0.9997 to 0.9997")  # 4 digits hide it
    d = distinct_digits(fake, fixed)
    assert d == 5  # fixed's high 0.99969 < fake's low 0.9997
    assert fake.format(d) == "0.99971 (95% CI 0.9997 to 0.99972, n=6)"
    assert fixed.format(d).startswith("0.99968 (95% CI 0.99967 to 0.99969")
    # overlapping intervals, or values 4 digits tell apart, keep 4 digits
    assert distinct_digits(Estimate(0.91, 0.8, 0.95, 9), Estimate(0.9, 0.85, 0.97, 9)) == 4
    assert distinct_digits(fake, fake) == 4


def test_one_item_has_no_interval_and_separates_from_nothing():
    """n=1 has nothing to resample: printed as having no interval (not "CI nan to nan"), and no
    comparison calls a difference resolved from it."""
    one = Estimate(0.5, math.nan, math.nan, 1)
    other = Estimate(0.9, 0.85, 0.95, 40)
    assert not one.has_interval and other.has_interval
    assert str(one) == "0.5 (n=1, no interval)"
    assert not one.separated_from(other) and not other.separated_from(one)


def test_too_few_items_resolve_no_difference_however_the_intervals_lie():
    """Percentile bootstrap intervals of 2 or 3 items can lie apart, but no split of so few
    items is unlikely enough to resolve a difference at 95% (an exact permutation test's
    smallest p-value 2 / C(n_a + n_b, n_a): 0.1 for 3 against 3, 0.029 for 4 against 4, 0.044
    for 2 against 8); the relation says so instead of calling them overlapping."""
    lo = [Estimate(0.2, 0.1, 0.3, n) for n in (2, 3, 4, 8)]
    hi = [Estimate(0.9, 0.8, 1.0, n) for n in (2, 3, 4, 8)]
    assert not lo[0].separated_from(hi[0]) and not lo[1].separated_from(hi[1])
    assert lo[1].relation(hi[1]).startswith("separate, but 3 and 3 items are too few")
    assert lo[2].separated_from(hi[2]) and lo[2].relation(hi[2]) == "separate"
    assert lo[0].too_few_to_resolve(hi[2]) and not lo[0].too_few_to_resolve(hi[3])
    assert lo[0].separated_from(hi[3])  # 2 against 8
    near = Estimate(0.25, 0.15, 0.35, 3)
    assert lo[1].relation(near) == "overlap"
    one = Estimate(0.5, math.nan, math.nan, 1)
    assert one.relation(hi[3]) == "cannot be compared (n=1: no interval)"


def test_task_findings_make_no_claim_from_one_item():
    import pandas as pd

    from experiments.sensitivity import _task_finding
    from quantlab.analysis.consistency_words import task_findings

    task = pd.DataFrame(
        {
            "metric": ["kl"] * 2,
            "compared": ["FAKE", "FIXED"],
            "value": [0.1, 0.3],
            "ci_low": [math.nan] * 2,
            "ci_high": [math.nan] * 2,
            "items": [1, 1],
        }
    )
    (said,) = task_findings(task)
    assert "no interval" in said and "not resolved" in said and "nan" not in said

    class Task:
        name, higher_is_better = "top1", True

    rows = pd.DataFrame(
        {
            "metric": ["TASK"] * 3,
            "sensitive_type": ["activation"] * 3,
            "op_name": ["a", "b", "c"],
            "value": [1.0, 1.0, 1.0],
            "ci_low": [math.nan] * 3,
            "ci_high": [math.nan] * 3,
            "items": [1] * 3,
        }
    )
    assert "every op gives top1 1 (n=1)" in _task_finding(rows, Task)
    rows["value"] = [0.0, 1.0, 1.0]
    said = _task_finding(rows, Task)
    assert "with 1 item(s) there are no intervals" in said and "separates" not in said


def test_sensitivity_counts_ops_whose_interval_separates_from_the_least_affected_ops():
    """7 of 8 agreeing items (Wilson 0.53 to 0.98) lie below the value 1 but overlap the least
    affected op's 8 of 8 (0.68 to 1): no op is counted as moving the metric; 1 of 8 is."""
    import pandas as pd

    from experiments.sensitivity import _task_finding

    class Task:
        name, higher_is_better = "top1", True

    shares = [1, 7, 8]
    bounds = [wilson_interval(k, 8) for k in shares]
    rows = pd.DataFrame(
        {
            "metric": ["TASK"] * 3,
            "sensitive_type": ["weight"] * 3,
            "op_name": ["a", "b", "c"],
            "value": [k / 8 for k in shares],
            "ci_low": [b[0] for b in bounds],
            "ci_high": [b[1] for b in bounds],
            "items": [8] * 3,
        }
    )
    said = _task_finding(rows, Task)
    assert "for 1 of 3 ops the interval separates from the least affected op's (c: 1 " in said
    rows = rows.iloc[1:]
    assert "for 0 of 2 ops" in _task_finding(rows, Task)


def test_an_estimate_reads_back_from_the_columns_it_wrote():
    """``Estimate.from_columns`` inverts ``as_columns`` on a pandas row, an itertuples row and
    a plain mapping."""
    import pandas as pd

    est = Estimate(12.5, 11.0, 14.25, 24)
    table = pd.DataFrame([{"model": "m", **est.as_columns("sqnr")}])
    (row,) = table.itertuples()
    for r in (table.iloc[0], row, est.as_columns("sqnr")):
        assert Estimate.from_columns(r, "sqnr") == est


def test_a_level_in_db_reads_with_its_interval_and_count():
    from quantlab.analysis.confidence import Estimate

    e = Estimate(16.624, 14.931, 18.349, 8)
    assert e.format_db() == "16.62 dB (95% CI 14.93 to 18.35, n=8)"
    assert e.format_db(1, count=False) == "16.6 dB (95% CI 14.9 to 18.3)"
    assert Estimate(math.inf, math.inf, math.inf, 12).format_db() == "identical outputs (n=12)"
    assert Estimate(20.0, math.nan, math.nan, 1).format_db() == "20.00 dB (n=1, no interval)"


def test_sqnr_estimate_is_the_output_sqnr_over_every_value_with_its_interval():
    from quantlab.analysis.confidence import sqnr_estimate

    g = torch.Generator().manual_seed(0)
    ref = [torch.randn(3, 5, generator=g) for _ in range(2)]
    test = [r + 0.1 * torch.randn(r.shape, generator=g) for r in ref]
    e = sqnr_estimate(ref, test)
    r, t = torch.cat(ref).double(), torch.cat(test).double()
    want = 10 * math.log10(float((r**2).sum()) / float(((r - t) ** 2).sum()))
    assert e.n == 6 and math.isclose(e.value, want, rel_tol=1e-12)
    assert e.low <= e.value <= e.high
    assert sqnr_estimate(ref, ref).format_db() == "identical outputs (n=6)"
