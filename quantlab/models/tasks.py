"""Task metrics: what a user of each model cares about, comparing a test run with the float run.

A metric is called with the float model's outputs and the tested model's outputs, one entry per
evaluation batch (as returned by ``model(*batch)``), and the dataset's labels where it needs them.
It returns one float64 number; ``higher_is_better`` says which way is good.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._pytree import tree_flatten


def _leaves(outputs: list) -> list[Tensor]:
    """Each float tensor of the outputs (any nesting), concatenated over batches, float64."""
    if not outputs:
        raise ValueError("a task metric needs at least one output batch, got an empty list")
    per_batch = [
        [t for t in tree_flatten(o)[0] if isinstance(t, Tensor) and t.is_floating_point()]
        for o in outputs
    ]
    return [torch.cat([t.detach().to(torch.float64) for t in ts], 0) for ts in zip(*per_batch)]


def _cat(outputs: list) -> Tensor:
    if not outputs:
        raise ValueError("a task metric needs at least one output batch, got an empty list")
    return torch.cat([o.detach().to(torch.float64) for o in outputs], 0)


@dataclass(frozen=True)
class TaskMetric(ABC):
    """Base: ``name``, ``higher_is_better`` and ``__call__(ref_outputs, test_outputs, labels)``;
    ``uses_labels``: whether the metric reads the dataset's labels (their items then line up
    with the outputs' items, e.g. for a bootstrap over items)."""

    name: str
    higher_is_better: bool
    uses_labels: ClassVar[bool] = False

    @abstractmethod
    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        """The metric of ``test_outputs`` against ``ref_outputs`` (lists of per-batch outputs)."""


@dataclass(frozen=True)
class ItemMeanMetric(TaskMetric):
    """A task metric that is the mean of one value per evaluation item: ``item_values`` gives
    them (float64, one per item on dim 0, each computed from its own item alone) and the metric
    is their numpy mean (pairwise summation), so a bootstrap can resample the values directly."""

    @abstractmethod
    def item_values(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        """One float64 value per item, shape (N,)."""

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        values = self.item_values(ref_outputs, test_outputs, labels)
        return float(np.mean(values.detach().to(torch.float64).numpy()))


@dataclass(frozen=True)
class ProportionMetric(ItemMeanMetric):
    """A share of items: each item's value is 1 (it counts) or 0, the metric their mean; its
    interval is the Wilson score interval of that k of N (quantlab.analysis.confidence)."""

    proportion: ClassVar[bool] = True


@dataclass(frozen=True)
class Top1Agreement(ProportionMetric):
    """Share of samples whose arg-max class equals the float model's (logits (B, C)); in [0, 1]."""

    name: str = "top1_agreement"
    higher_is_better: bool = True

    def item_values(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        r, t = _cat(ref_outputs), _cat(test_outputs)
        return (r.argmax(-1) == t.argmax(-1)).to(torch.float64)


@dataclass(frozen=True)
class Top1Accuracy(ProportionMetric):
    """Share of samples whose arg-max class is the label (logits (B, C), labels one (B,) int64
    tensor per batch); in [0, 1]. Without labels, the float model's arg-max serves as the
    label (agreement)."""

    name: str = "top1_accuracy"
    higher_is_better: bool = True
    uses_labels: ClassVar[bool] = True

    def item_values(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        t = _cat(test_outputs).argmax(-1)
        if labels is None:
            y = _cat(ref_outputs).argmax(-1)
        else:
            y = torch.cat([torch.as_tensor(lab).reshape(-1) for lab in labels]).to(torch.int64)
        if y.numel() != t.numel():
            raise ValueError(f"labels hold {y.numel()} samples, outputs {t.numel()}")
        return (t == y).to(torch.float64)


@dataclass(frozen=True)
class SoftmaxKL(ItemMeanMetric):
    """Mean KL(softmax(ref) || softmax(test)) in nats over samples (logits (B, C)); >= 0."""

    name: str = "kl_nats"
    higher_is_better: bool = False

    def item_values(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        r, t = _cat(ref_outputs), _cat(test_outputs)
        lp, lq = F.log_softmax(r, -1), F.log_softmax(t, -1)
        return (lp.exp() * (lp - lq)).sum(-1)


PROBABILITY_FLOOR = 1e-6  # a tested probability below this counts as this (an 8-bit code of 0)


@dataclass(frozen=True)
class ProbabilityKL(ItemMeanMetric):
    """Mean KL(ref || test) in nats over samples whose outputs are probability rows (B, C) (a
    softmax the model applies itself): the sum of p * (log max(p, f) - log max(q, f)), f =
    PROBABILITY_FLOOR (a probability quantized to 0 counts as f; 0 for equal rows), float64. A
    softmax of such rows (SoftmaxKL) would be near uniform and read near 0 whatever the rows
    are."""

    name: str = "kl_nats"
    higher_is_better: bool = False

    def item_values(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        p = _cat(ref_outputs).to(torch.float64)
        q = _cat(test_outputs).to(torch.float64)
        floor = PROBABILITY_FLOOR
        return (p * (p.clamp_min(floor).log() - q.clamp_min(floor).log())).sum(-1)


@dataclass(frozen=True)
class FaceAccuracy(ProportionMetric):
    """Face / non-face accuracy of the tested model: outputs are probabilities (B, 2) with
    column 1 = face, decided at ``threshold``; labels are one 0/1 tensor per batch (1 = face).
    Without labels, the float model's decisions serve as labels (agreement)."""

    name: str = "face_accuracy"
    higher_is_better: bool = True
    uses_labels: ClassVar[bool] = True
    threshold: float = 0.5

    def item_values(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        t = _cat(test_outputs)[:, 1] > self.threshold
        if labels is None:
            y = _cat(ref_outputs)[:, 1] > self.threshold
        else:
            y = torch.cat([torch.as_tensor(lab).reshape(-1) for lab in labels]).to(torch.bool)
        if y.numel() != t.numel():
            raise ValueError(f"labels hold {y.numel()} samples, outputs {t.numel()}")
        return (t == y).to(torch.float64)


@dataclass(frozen=True)
class UnwarpPSNR(TaskMetric):
    """PSNR (dB, peak 1.0) of the page unwarped with the tested grid against the page unwarped
    with the float grid, at full image resolution (quantlab.models.uvdoc.unwarp).

    Outputs are UVDoc grids (B, 2, 45, 31); labels are one full-resolution image (B, 3, H, W) in
    [0, 1] per batch. Identical unwarped pages give +inf.
    """

    name: str = "unwarp_psnr_db"
    higher_is_better: bool = True
    uses_labels: ClassVar[bool] = True

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        from quantlab.models.uvdoc import unwarp

        if labels is None:
            raise ValueError("UnwarpPSNR needs labels: the full-resolution page image per batch")
        se, n = 0.0, 0
        for r, t, img in zip(ref_outputs, test_outputs, labels, strict=True):
            a = unwarp(img.to(torch.float32), r.to(torch.float32)).to(torch.float64)
            b = unwarp(img.to(torch.float32), t.to(torch.float32)).to(torch.float64)
            se += float(((a - b) ** 2).sum())
            n += a.numel()
        mse = se / n
        return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


@dataclass(frozen=True)
class EmbeddingCosine(ItemMeanMetric):
    """Mean cosine similarity between tested and float embeddings (B, D), row by row; in [-1, 1]."""

    name: str = "embedding_cosine"
    higher_is_better: bool = True

    def item_values(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        r, t = _cat(ref_outputs), _cat(test_outputs)
        return F.cosine_similarity(r, t, dim=-1)


@dataclass(frozen=True)
class BoxL1(ItemMeanMetric):
    """Mean absolute difference between tested and float boxes (any shape, e.g. (B, Q, 4)): the
    mean over items of each item's mean (every item holds as many numbers)."""

    name: str = "box_l1"
    higher_is_better: bool = False

    def item_values(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        diff = (_cat(ref_outputs) - _cat(test_outputs)).abs()
        return diff.reshape(diff.shape[0], -1).mean(1)


@dataclass(frozen=True)
class ItemSumsMetric(TaskMetric):
    """A task metric that is a function of sums over items of a few per-item terms (a ratio of
    sums, not a mean of ratios): ``item_terms`` gives them (float64, (N, k), each row from its
    own item alone) and ``from_sums`` the metric from their sums over the items ((..., k) ->
    (...)), so a bootstrap sums the rows a resample draws instead of recomputing the metric on
    the resampled outputs. The sums go per item first, then over items: the same float64
    terms, added in another order than ``__call__`` adds them (a difference of float64
    rounding, ~1e-16 relative)."""

    @abstractmethod
    def item_terms(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        """The per-item terms, float64, shape (N, k)."""

    @staticmethod
    @abstractmethod
    def from_sums(sums: np.ndarray) -> np.ndarray:
        """The metric from the terms' sums over items, (..., k) -> (...)."""


@dataclass(frozen=True)
class OutputSQNR(ItemSumsMetric):
    """SQNR in dB of the tested outputs against the float outputs (any shape):
    10 log10(sum ref^2 / sum (ref - test)^2); +inf when identical."""

    name: str = "output_sqnr_db"
    higher_is_better: bool = True

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        pairs = list(zip(_leaves(ref_outputs), _leaves(test_outputs), strict=True))
        noise = sum(float(((r - t) ** 2).sum()) for r, t in pairs)
        signal = sum(float((r**2).sum()) for r, _ in pairs)
        return math.inf if noise == 0 else 10 * math.log10(signal / noise)

    def item_terms(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        """(signal, noise) per item: the sums of ref^2 and of (ref - test)^2 over every float
        output of the item."""
        pairs = list(zip(_leaves(ref_outputs), _leaves(test_outputs), strict=True))
        signal = sum((r**2).reshape(r.shape[0], -1).sum(1) for r, _ in pairs)
        noise = sum(((r - t) ** 2).reshape(r.shape[0], -1).sum(1) for r, t in pairs)
        return torch.stack([signal, noise], 1)

    @staticmethod
    def from_sums(sums: np.ndarray) -> np.ndarray:
        signal, noise = sums[..., 0], sums[..., 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            db = 10 * np.log10(signal / noise)
        return np.where(noise == 0, np.inf, db)


@dataclass(frozen=True)
class OutputCosine(ItemMeanMetric):
    """Mean over items of the cosine similarity between the tested and the float outputs of one
    item (all float outputs of the item flattened together; items on dim 0); in [-1, 1], 1.0
    for an item whose two outputs are both zero."""

    name: str = "output_cosine"
    higher_is_better: bool = True

    def item_values(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> Tensor:
        r = torch.cat([x.reshape(x.shape[0], -1) for x in _leaves(ref_outputs)], 1)
        t = torch.cat([x.reshape(x.shape[0], -1) for x in _leaves(test_outputs)], 1)
        nr, nt = r.norm(dim=1), t.norm(dim=1)
        cos = (r * t).sum(1) / (nr * nt).clamp_min(1e-300)
        cos = torch.where((nr == 0) & (nt == 0), torch.ones_like(cos), cos)
        return cos


@dataclass(frozen=True)
class CustomMetric(TaskMetric):
    """A user's task metric ``fn(ref_outputs, test_outputs, labels) -> float`` (``model.metric``):
    lists of per-batch outputs of the float and the tested run, and the dataset's labels (one
    entry per evaluation batch, or None)."""

    name: str = "custom_metric"
    higher_is_better: bool = True
    uses_labels: ClassVar[bool] = True
    fn: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    target: str = ""  # "package.module:function", for messages

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        value = self.fn(ref_outputs, test_outputs, labels)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"model.metric={self.target!r} returned {type(value).__name__} {value!r}; it "
                "must return one number"
            ) from None
