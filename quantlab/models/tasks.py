"""Task metrics: what a user of each model cares about, comparing a test run with the float run.

A metric is called with the float model's outputs and the tested model's outputs, one entry per
evaluation batch (as returned by ``model(*batch)``), and the dataset's labels where it needs them.
It returns one float64 number; ``higher_is_better`` says which way is good.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def _cat(outputs: list) -> Tensor:
    if not outputs:
        raise ValueError("a task metric needs at least one output batch, got an empty list")
    return torch.cat([o.detach().to(torch.float64) for o in outputs], 0)


@dataclass(frozen=True)
class TaskMetric(ABC):
    """Base: ``name``, ``higher_is_better`` and ``__call__(ref_outputs, test_outputs, labels)``."""

    name: str
    higher_is_better: bool

    @abstractmethod
    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        """The metric of ``test_outputs`` against ``ref_outputs`` (lists of per-batch outputs)."""


@dataclass(frozen=True)
class Top1Agreement(TaskMetric):
    """Share of samples whose arg-max class equals the float model's (logits (B, C)); in [0, 1]."""

    name: str = "top1_agreement"
    higher_is_better: bool = True

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        r, t = _cat(ref_outputs), _cat(test_outputs)
        return float((r.argmax(-1) == t.argmax(-1)).to(torch.float64).mean())


@dataclass(frozen=True)
class Top1Accuracy(TaskMetric):
    """Share of samples whose arg-max class is the label (logits (B, C), labels one (B,) int64
    tensor per batch); in [0, 1]. Without labels, the float model's arg-max serves as the
    label (agreement)."""

    name: str = "top1_accuracy"
    higher_is_better: bool = True

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        t = _cat(test_outputs).argmax(-1)
        if labels is None:
            y = _cat(ref_outputs).argmax(-1)
        else:
            y = torch.cat([torch.as_tensor(lab).reshape(-1) for lab in labels]).to(torch.int64)
        if y.numel() != t.numel():
            raise ValueError(f"labels hold {y.numel()} samples, outputs {t.numel()}")
        return float((t == y).to(torch.float64).mean())


@dataclass(frozen=True)
class SoftmaxKL(TaskMetric):
    """Mean KL(softmax(ref) || softmax(test)) in nats over samples (logits (B, C)); >= 0."""

    name: str = "kl_nats"
    higher_is_better: bool = False

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        r, t = _cat(ref_outputs), _cat(test_outputs)
        lp, lq = F.log_softmax(r, -1), F.log_softmax(t, -1)
        return float((lp.exp() * (lp - lq)).sum(-1).mean())


@dataclass(frozen=True)
class FaceAccuracy(TaskMetric):
    """Face / non-face accuracy of the tested model: outputs are probabilities (B, 2) with
    column 1 = face, decided at ``threshold``; labels are one 0/1 tensor per batch (1 = face).
    Without labels, the float model's decisions serve as labels (agreement)."""

    name: str = "face_accuracy"
    higher_is_better: bool = True
    threshold: float = 0.5

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        t = _cat(test_outputs)[:, 1] > self.threshold
        if labels is None:
            y = _cat(ref_outputs)[:, 1] > self.threshold
        else:
            y = torch.cat([torch.as_tensor(lab).reshape(-1) for lab in labels]).to(torch.bool)
        if y.numel() != t.numel():
            raise ValueError(f"labels hold {y.numel()} samples, outputs {t.numel()}")
        return float((t == y).to(torch.float64).mean())


@dataclass(frozen=True)
class UnwarpPSNR(TaskMetric):
    """PSNR (dB, peak 1.0) of the page unwarped with the tested grid against the page unwarped
    with the float grid, at full image resolution (quantlab.models.uvdoc.unwarp).

    Outputs are UVDoc grids (B, 2, 45, 31); labels are one full-resolution image (B, 3, H, W) in
    [0, 1] per batch. Identical unwarped pages give +inf.
    """

    name: str = "unwarp_psnr_db"
    higher_is_better: bool = True

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
class EmbeddingCosine(TaskMetric):
    """Mean cosine similarity between tested and float embeddings (B, D), row by row; in [-1, 1]."""

    name: str = "embedding_cosine"
    higher_is_better: bool = True

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        r, t = _cat(ref_outputs), _cat(test_outputs)
        return float(F.cosine_similarity(r, t, dim=-1).mean())


@dataclass(frozen=True)
class BoxL1(TaskMetric):
    """Mean absolute difference between tested and float boxes (any shape, e.g. (B, Q, 4))."""

    name: str = "box_l1"
    higher_is_better: bool = False

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        return float((_cat(ref_outputs) - _cat(test_outputs)).abs().mean())


@dataclass(frozen=True)
class OutputSQNR(TaskMetric):
    """SQNR in dB of the tested outputs against the float outputs (any shape):
    10 log10(sum ref^2 / sum (ref - test)^2); +inf when identical."""

    name: str = "output_sqnr_db"
    higher_is_better: bool = True

    def __call__(self, ref_outputs: list, test_outputs: list, labels: Any = None) -> float:
        r, t = _cat(ref_outputs), _cat(test_outputs)
        noise = float(((r - t) ** 2).sum())
        return math.inf if noise == 0 else 10 * math.log10(float((r**2).sum()) / noise)
