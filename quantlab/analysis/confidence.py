"""Confidence intervals for task metrics over an evaluation set (percentile bootstrap).

A task metric (quantlab.models.tasks) maps the float outputs, the tested outputs and the labels
of N evaluation items to one number. Its 95% interval comes from resampling the N items with
replacement ``resamples`` times, recomputing the metric on each resample, and taking the 2.5%
and 97.5% order statistics (no interpolation, so +-inf values such as an identical run's SQNR
stay well defined). Items are rows along dim 0 of every output and label tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_map

DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A metric over ``n`` items with its bootstrap interval [low, high] at ``level``."""

    value: float
    low: float
    high: float
    n: int
    level: float = DEFAULT_LEVEL

    def separated_from(self, other: Estimate) -> bool:
        """True when the two intervals do not overlap (the difference is resolved)."""
        return self.high < other.low or other.high < self.low

    def as_columns(self, prefix: str) -> dict[str, float | int]:
        """``{prefix: value, prefix_ci_low, prefix_ci_high, prefix_n}`` for a tidy table row."""
        return {
            prefix: self.value,
            f"{prefix}_ci_low": self.low,
            f"{prefix}_ci_high": self.high,
            f"{prefix}_n": self.n,
        }

    def __str__(self) -> str:
        pct = round(100 * self.level)
        return f"{self.value:.4g} ({pct}% CI {self.low:.4g} to {self.high:.4g}, n={self.n})"


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
    """``metric(ref_outputs, test_outputs, labels)`` with its percentile-bootstrap interval.

    The value is the metric on all items (unchanged); the interval resamples items (dim 0 of the
    concatenated batches) with a generator seeded by ``seed``, so it is reproducible.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    ref, test = concat_items(ref_outputs), concat_items(test_outputs)
    lab = concat_items(labels) if labels is not None else None
    n = _count_items((ref, test) if lab is None else (ref, test, lab))
    value = float(metric([ref], [test], None if lab is None else [lab]))
    gen = torch.Generator().manual_seed(seed)
    draws = np.empty(resamples, dtype=np.float64)
    indices = torch.randint(0, n, (resamples, n), generator=gen)
    for i, idx in enumerate(indices):
        sub_lab = None if lab is None else [_take(lab, idx)]
        draws[i] = float(metric([_take(ref, idx)], [_take(test, idx)], sub_lab))
    draws = draws[~np.isnan(draws)]
    if draws.size == 0:
        return Estimate(value, math.nan, math.nan, n, level)
    tail = (1.0 - level) / 2.0
    low = float(np.quantile(draws, tail, method="inverted_cdf"))
    high = float(np.quantile(draws, 1.0 - tail, method="inverted_cdf"))
    return Estimate(value, low, high, n, level)


def estimate_metrics(
    metrics, ref_outputs: list, test_outputs: list, labels: list | None = None, seed: int = 0
) -> dict[str, Estimate]:
    """``bootstrap`` of each task metric (``metric.name`` -> Estimate), at the default level
    and resamples; ``labels`` go to the metrics that read them (``uses_labels``). With a single
    item there is nothing to resample: the value comes with a NaN interval (n=1)."""
    ref = concat_items(ref_outputs)
    n = _count_items(ref)
    out = {}
    for metric in metrics:
        lab = labels if getattr(metric, "uses_labels", False) else None
        if n < 2:
            value = float(metric(ref_outputs, test_outputs, lab))
            out[metric.name] = Estimate(value, math.nan, math.nan, n)
        else:
            out[metric.name] = bootstrap(metric, ref_outputs, test_outputs, lab, seed=seed)
    return out
