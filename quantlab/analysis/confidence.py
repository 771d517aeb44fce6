"""Confidence intervals for task metrics over an evaluation set.

A task metric (quantlab.models.tasks) maps the float outputs, the tested outputs and the labels
of N evaluation items to one number. Its 95% interval comes from resampling the N items with
replacement ``resamples`` times, recomputing the metric on each resample, and taking the 2.5%
and 97.5% order statistics (percentile bootstrap; no interpolation, so +-inf values such as an
identical run's SQNR stay well defined). Items are rows along dim 0 of every output and label
tensor.

A metric that is a share of items (``proportion``: top-1 agreement, accuracy) takes the Wilson
score interval of its k of N instead: a bootstrap of k = N never draws a failure and reports
"1 to 1", where 8 of 8 items bound the share only to [0.68, 1] at 95%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_map

DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95
_GATHER_ELEMENTS = 1 << 22  # float64 values gathered at once by the per-item path (32 MiB)


@dataclass(frozen=True)
class Estimate:
    """A metric over ``n`` items with its bootstrap interval [low, high] at ``level``."""

    value: float
    low: float
    high: float
    n: int
    level: float = DEFAULT_LEVEL

    @property
    def has_interval(self) -> bool:
        """Whether there is an interval (one item has nothing to resample: NaN bounds)."""
        return not (math.isnan(self.low) or math.isnan(self.high))

    def separated_from(self, other: Estimate) -> bool:
        """True when the difference is resolved: the two intervals do not overlap and their
        item counts can resolve one (``too_few_to_resolve``); False when either has no
        interval."""
        return self._apart(other) and not self.too_few_to_resolve(other)

    def too_few_to_resolve(self, other: Estimate) -> bool:
        """Whether ``n`` and ``other.n`` items are too few for any difference to be resolved at
        ``level``: even the most extreme split of the items (every one of one set beyond every
        one of the other) has an exact permutation p-value, 2 / C(n_a + n_b, n_a), above
        1 - level (3 items against 3, or 2 against 7 or fewer, at 95%). Percentile bootstrap
        intervals of so few items can separate all the same."""
        n_a, n_b = self.n, other.n
        if n_a < 1 or n_b < 1:
            return True
        return 2 / math.comb(n_a + n_b, n_a) > 1 - self.level

    def relation(self, other: Estimate) -> str:
        """The two intervals in words: "separate", "overlap", "separate, but ... too few to
        resolve a difference", or that one has no interval."""
        if not (self.has_interval and other.has_interval):
            return f"cannot be compared (n={min(self.n, other.n)}: no interval)"
        if not self._apart(other):
            return "overlap"
        if self.too_few_to_resolve(other):
            return f"separate, but {self.n} and {other.n} items are too few to resolve a difference"
        return "separate"

    def _apart(self, other: Estimate) -> bool:
        return self.high < other.low or other.high < self.low

    def as_columns(self, prefix: str) -> dict[str, float | int]:
        """``{prefix: value, prefix_ci_low, prefix_ci_high, prefix_n}`` for a tidy table row."""
        return {
            prefix: self.value,
            f"{prefix}_ci_low": self.low,
            f"{prefix}_ci_high": self.high,
            f"{prefix}_n": self.n,
        }

    @classmethod
    def from_columns(cls, row: Any, prefix: str) -> Estimate:
        """The Estimate ``as_columns(prefix)`` wrote into a table row: a pandas Series or a
        mapping, or a row of ``DataFrame.itertuples`` (read by attribute)."""
        get = (lambda key: getattr(row, key)) if isinstance(row, tuple) else row.__getitem__
        return cls(
            get(prefix), get(f"{prefix}_ci_low"), get(f"{prefix}_ci_high"), int(get(f"{prefix}_n"))
        )

    def __str__(self) -> str:
        return self.format()

    def format_db(self, decimals: int = 2, count: bool = True) -> str:
        """A level in dB: ``value dB (95% CI low to high, n=N)`` at ``decimals`` decimals
        (``count`` False: without ``n=N``); identical outputs (+inf, interval included) read
        ``identical outputs``; without an interval ``value dB (n=N, no interval)``."""
        d, pct = decimals, round(100 * self.level)
        n = f", n={self.n}" if count else ""
        if self.value == math.inf and self.low == math.inf:
            return f"identical outputs (n={self.n})" if count else "identical outputs"
        if not self.has_interval:
            return f"{self.value:.{d}f} dB (n={self.n}, no interval)"
        return f"{self.value:.{d}f} dB ({pct}% CI {self.low:.{d}f} to {self.high:.{d}f}{n})"

    def format(self, digits: int = 4) -> str:
        """``value (95% CI low to high, n=N)`` at ``digits`` significant digits; without an
        interval ``value (n=1, no interval)``."""
        pct, d = round(100 * self.level), digits
        if not self.has_interval:
            return f"{self.value:.{d}g} (n={self.n}, no interval)"
        return f"{self.value:.{d}g} ({pct}% CI {self.low:.{d}g} to {self.high:.{d}g}, n={self.n})"


def distinct_digits(a: Estimate, b: Estimate, least: int = 4, most: int = 12) -> int:
    """The fewest significant digits (from ``least``, at most ``most``) at which two estimates
    read as they compare: different values print differently, and intervals that do not
    overlap print as not overlapping (0.9997 to 0.9997 against 0.9997 to 0.9997 would not)."""

    def shown(v: float, d: int) -> float:
        return float(f"{v:.{d}g}")

    for d in range(least, most + 1):
        values_ok = a.value == b.value or shown(a.value, d) != shown(b.value, d)
        sep_ok = not a._apart(b) or (
            shown(a.high, d) < shown(b.low, d) or shown(b.high, d) < shown(a.low, d)
        )
        if values_ok and sep_ok:
            return d
    return most


def wilson_interval(successes: int, n: int, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """The Wilson score interval [low, high] of a share ``successes`` / ``n`` at two-sided
    ``level`` (float64; exactly 0 and 1 at the ends: 0 of n has low 0, n of n high 1)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    z = NormalDist().inv_cdf(1.0 - (1.0 - level) / 2.0)
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def _share_estimate(metric, ref: Any, test: Any, lab: Any, n: int, level: float) -> Estimate:
    """A proportion metric's value with its Wilson score interval (its item values are 0 or 1)."""
    values = metric.item_values([ref], [test], None if lab is None else [lab])
    values = values.detach().to(torch.float64)
    if not bool(((values == 0) | (values == 1)).all()):
        raise ValueError(f"{metric.name}: a proportion metric's item values must be 0 or 1")
    k = int(values.sum())  # the metric is their mean (ItemMeanMetric)
    return Estimate(float(np.mean(values.numpy())), *wilson_interval(k, n, level), n, level)


def concat_items(batches: list) -> Any:
    """Per-batch outputs or labels (tensors, or nests of tensors with items on dim 0) as one
    batch (tensors concatenated along dim 0)."""
    if not batches:
        raise ValueError("a confidence interval needs at least one evaluation batch")
    first = batches[0]
    if isinstance(first, Tensor):
        return torch.cat([b.detach() for b in batches], 0)
    if isinstance(first, (tuple, list)):
        return type(first)(concat_items([b[i] for b in batches]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: concat_items([b[k] for b in batches]) for k in first}
    raise TypeError(f"cannot split items out of a {type(first).__name__} output")


def _count_items(batch: Any) -> int:
    sizes = set()
    tree_map(lambda t: sizes.add(t.shape[0]) if isinstance(t, Tensor) else None, batch)
    if len(sizes) != 1:
        raise ValueError(f"outputs and labels disagree on the item count: {sorted(sizes)}")
    return sizes.pop()


def _take(batch: Any, index: Tensor) -> Any:
    if isinstance(batch, Tensor):
        return batch.index_select(0, index)
    return tree_map(lambda t: t.index_select(0, index) if isinstance(t, Tensor) else t, batch)


def _resampled_means(values: Tensor, indices: Tensor) -> np.ndarray:
    """The mean of the per-item ``values`` (N,) over each row of ``indices`` (R, N), as numpy's
    row-wise mean: the same pairwise summation as the metric's own mean of one resample."""
    v = values.detach().to(torch.float64).numpy()
    if v.shape != (indices.shape[1],):
        raise ValueError(f"item_values gave shape {tuple(v.shape)}, expected ({indices.shape[1]},)")
    return _per_resample(v, indices, lambda drawn: np.mean(drawn, axis=1))


def _per_resample(v: np.ndarray, indices: Tensor, reduce) -> np.ndarray:
    """``reduce`` of the rows of ``v`` each row of ``indices`` (R, N) draws ((r, N, ...) ->
    (r, ...)), for every resample, gathered a block of resamples at a time (bounded memory:
    at most ``_GATHER_ELEMENTS`` float64 values per gather)."""
    idx = indices.numpy()
    per_resample = max(1, idx.shape[1] * (v[0].size if v.ndim > 1 and len(v) else 1))
    rows = max(1, _GATHER_ELEMENTS // per_resample)
    return np.concatenate([reduce(v[idx[i : i + rows]]) for i in range(0, len(idx), rows)])


def _resampled_sums(terms: Tensor, indices: Tensor, from_sums) -> np.ndarray:
    """``from_sums`` of the per-item ``terms`` (N, k) summed over each row of ``indices``
    (R, N): an ``ItemSumsMetric`` on every resample, from its terms computed once."""
    t = terms.detach().to(torch.float64).numpy()
    if t.ndim != 2 or t.shape[0] != indices.shape[1]:
        raise ValueError(
            f"item_terms gave shape {tuple(t.shape)}, expected ({indices.shape[1]}, k)"
        )
    sums = _per_resample(t, indices, lambda drawn: drawn.sum(axis=1))
    return np.asarray(from_sums(sums), dtype=np.float64)


def _resampled_metric(metric, ref: Any, test: Any, lab: Any, indices: Tensor) -> np.ndarray:
    """``metric`` recomputed on each resample (a row of ``indices``): the general path for a
    metric that is not a mean of per-item values."""
    draws = np.empty(indices.shape[0], dtype=np.float64)
    for i, idx in enumerate(indices):
        sub_lab = None if lab is None else [_take(lab, idx)]
        draws[i] = float(metric([_take(ref, idx)], [_take(test, idx)], sub_lab))
    return draws


def bootstrap(
    metric,
    ref_outputs: list,
    test_outputs: list,
    labels: list | None = None,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    level: float = DEFAULT_LEVEL,
    seed: int = 0,
) -> Estimate:
    """``metric(ref_outputs, test_outputs, labels)`` with its percentile-bootstrap interval, or
    for a share of items (``metric.proportion``) its Wilson score interval (nothing resampled).

    The value is the metric on all items (unchanged); the interval resamples items (dim 0 of the
    concatenated batches) with a generator seeded by ``seed``, so it is reproducible. A metric
    that is a mean of per-item values (it has ``item_values``, quantlab.models.tasks.
    ItemMeanMetric) has them computed once and each resample's mean taken in one numpy gather;
    so has a function of sums over items (``item_terms``, ``ItemSumsMetric``: each resample
    sums the terms it draws); any other metric is recomputed on every resample.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    ref, test = concat_items(ref_outputs), concat_items(test_outputs)
    lab = concat_items(labels) if labels is not None else None
    n = _count_items((ref, test) if lab is None else (ref, test, lab))
    if getattr(metric, "proportion", False):
        return _share_estimate(metric, ref, test, lab, n, level)
    value = float(metric([ref], [test], None if lab is None else [lab]))
    gen = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, n, (resamples, n), generator=gen)
    item_values = getattr(metric, "item_values", None)
    item_terms = getattr(metric, "item_terms", None)
    labs = None if lab is None else [lab]
    if item_values is not None:
        draws = _resampled_means(item_values([ref], [test], labs), indices)
    elif item_terms is not None:
        draws = _resampled_sums(item_terms([ref], [test], labs), indices, metric.from_sums)
    else:
        draws = _resampled_metric(metric, ref, test, lab, indices)
    draws = draws[~np.isnan(draws)]
    if draws.size == 0:
        return Estimate(value, math.nan, math.nan, n, level)
    tail = (1.0 - level) / 2.0
    low = float(np.quantile(draws, tail, method="inverted_cdf"))
    high = float(np.quantile(draws, 1.0 - tail, method="inverted_cdf"))
    return Estimate(value, low, high, n, level)


def sqnr_estimate(ref_outputs: list, test_outputs: list, seed: int = 0) -> Estimate:
    """Output SQNR in dB of ``test_outputs`` against ``ref_outputs`` (lists of per-batch outputs;
    every float tensor, float64: ``tasks.OutputSQNR``) with its 95% percentile-bootstrap interval
    over the items (``estimate_metrics``)."""
    from quantlab.models.tasks import OutputSQNR

    metric = OutputSQNR()
    return estimate_metrics([metric], ref_outputs, test_outputs, seed=seed)[metric.name]


def estimate_metrics(
    metrics, ref_outputs: list, test_outputs: list, labels: list | None = None, seed: int = 0
) -> dict[str, Estimate]:
    """``bootstrap`` of each task metric (``metric.name`` -> Estimate), at the default level
    and resamples; ``labels`` go to the metrics that read them (``uses_labels``). With a single
    item there is nothing to resample: the value comes with a NaN interval (n=1), but for a
    share of items (its Wilson interval)."""
    ref = concat_items(ref_outputs)
    n = _count_items(ref)
    out = {}
    for metric in metrics:
        lab = labels if getattr(metric, "uses_labels", False) else None
        if n < 2 and not getattr(metric, "proportion", False):
            value = float(metric(ref_outputs, test_outputs, lab))
            out[metric.name] = Estimate(value, math.nan, math.nan, n)
        else:
            out[metric.name] = bootstrap(metric, ref_outputs, test_outputs, lab, seed=seed)
    return out
