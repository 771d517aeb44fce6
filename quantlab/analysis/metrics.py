"""Error metrics between a reference tensor and a test tensor (float64 arithmetic).

Conventions follow the vendor's sensitivity tools (j6-numerics s.9): L1 = mean |x - y|;
signed cosine similarity; MSE; KL(softmax(x) || softmax(y)) over dim 1 (log-softmax of the
test, softmax of the reference); SQNR = 20 log10(||x|| / ||x - y||) in dB; max |x - y| (the
vendor's Atol); the vendor's Rtol = max |(x - y) / x|. Higher is better for cosine and SQNR,
lower for the others. Non-finite values propagate.
``output_metrics`` applies them to whole model outputs (a ``Metric`` each, or the model's task
metric), as sensitivity rankings and mixed precision compare runs.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._pytree import tree_flatten

METRICS = ("l1", "cosine", "mse", "kl", "sqnr_db", "max_abs")
HIGHER_IS_BETTER = frozenset({"cosine", "sqnr_db"})


def float_leaves(out) -> list[Tensor]:
    """The floating-point tensors in a model/op output (any nesting), in order."""
    return [t for t in tree_flatten(out)[0] if isinstance(t, Tensor) and t.is_floating_point()]


def named_float_leaves(out) -> list[tuple[str, Tensor]]:
    """``float_leaves`` with each one's place in the output (``[0]``, ``['logits']``, ...;
    ``output`` for a lone tensor)."""
    from torch.utils._pytree import keystr, tree_flatten_with_path

    pairs = tree_flatten_with_path(out)[0]
    return [
        (keystr(path) or "output", t)
        for path, t in pairs
        if isinstance(t, Tensor) and t.is_floating_point()
    ]


def flat(out) -> Tensor:
    """All float tensors of ``out`` flattened and concatenated, float64."""
    leaves = float_leaves(out)
    if not leaves:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in leaves])


def l1(x: Tensor, y: Tensor) -> float:
    """mean |x - y|."""
    return float((x.double() - y.double()).abs().mean()) if x.numel() else 0.0


def mse(x: Tensor, y: Tensor) -> float:
    """mean (x - y)**2."""
    return float(((x.double() - y.double()) ** 2).mean()) if x.numel() else 0.0


def max_abs(x: Tensor, y: Tensor) -> float:
    """max |x - y| (0 for empty tensors)."""
    return float((x.double() - y.double()).abs().max()) if x.numel() else 0.0


def rtol(x: Tensor, y: Tensor) -> float:
    """The vendor's Rtol: max |(x - y) / x| over the elements of reference ``x`` (0 for empty
    tensors). As the vendor computes it (``nan_to_num`` of the ratio): an element with x = y = 0
    counts 0 and one with x = 0, y != 0 counts the largest finite float64; float64 arithmetic."""
    if not x.numel():
        return 0.0
    x, y = x.double(), y.double()
    return float(torch.nan_to_num((x - y) / x, nan=0.0).abs().max())


def cosine(x: Tensor, y: Tensor) -> float:
    """Signed cosine similarity <x, y> / (|x| |y|); 1.0 when both are zero, 0.0 when one is."""
    x, y = x.double().reshape(-1), y.double().reshape(-1)
    nx, ny = float(x.norm()), float(y.norm())
    if nx == 0.0 and ny == 0.0:
        return 1.0
    if nx == 0.0 or ny == 0.0:
        return 0.0
    return float((x @ y) / (nx * ny))


def sqnr_db(x: Tensor, y: Tensor) -> float:
    """20 log10(||x|| / ||x - y||) in dB; +inf when y == x, -inf when x is zero and y is not."""
    x, y = x.double().reshape(-1), y.double().reshape(-1)
    noise = float((x - y).norm())
    signal = float(x.norm())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 20.0 * math.log10(signal / noise)


def kl_terms(x: Tensor, y: Tensor) -> Tensor:
    """KL(softmax(x) || softmax(y)) at every position along dim 1 (dim 0 for 1-d tensors).

    float64: ``sum p_x * (log_softmax(x) - log_softmax(y))`` over that dim.
    """
    x, y = x.double(), y.double()
    dim = 1 if x.dim() >= 2 else 0
    lx, ly = F.log_softmax(x, dim=dim), F.log_softmax(y, dim=dim)
    return (lx.exp() * (lx - ly)).sum(dim=dim)


def kl(x: Tensor, y: Tensor) -> float:
    """``kl_terms`` averaged over the positions (0 for empty tensors)."""
    if x.numel() == 0:
        return 0.0
    return float(kl_terms(x, y).mean())


def all_metrics(x: Tensor, y: Tensor) -> dict[str, float]:
    """Every metric of METRICS for reference ``x`` and test ``y`` (same shape)."""
    if x.shape != y.shape:
        raise ValueError(f"metrics need equal shapes, got {tuple(x.shape)} and {tuple(y.shape)}")
    return {
        "l1": l1(x, y),
        "cosine": cosine(x, y),
        "mse": mse(x, y),
        "kl": kl(x, y),
        "sqnr_db": sqnr_db(x, y),
        "max_abs": max_abs(x, y),
    }


class Metric(enum.Enum):
    """A model-output comparison (``output_metrics``): the metrics above (MAX_ABS is the
    vendor's Atol, RTOL its Rtol), or the model's task metric (TASK); ``lower_is_worse`` gives a
    ranking's sort order (RTOL, like MAX_ABS, ranks descending: larger = more sensitive)."""

    L1 = "l1"
    COSINE = "cosine"
    MSE = "mse"
    KL = "kl"
    SQNR = "sqnr"
    MAX_ABS = "max_abs"
    RTOL = "rtol"
    TASK = "task"

    @classmethod
    def parse(cls, value: Metric | str) -> Metric:
        return _parse_enum(cls, value, "metric")


def _parse_enum(cls, value, what: str):
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        for m in cls:
            if value.lower() in (m.name.lower(), m.value):
                return m
    allowed = ", ".join(m.name for m in cls)
    raise ValueError(f"unknown {what} {value!r}; allowed: {allowed}")


def lower_is_worse(metric: Metric, task: Any = None) -> bool:
    """True when a smaller value means a more sensitive op (rank ascending)."""
    if metric is Metric.TASK:
        return bool(task.higher_is_better)
    return metric in (Metric.COSINE, Metric.SQNR)


def output_metrics(ref: list, test: list, metrics: Sequence[Metric], task=None) -> dict:
    """Each metric of the run outputs ``test`` against ``ref`` (lists of per-batch outputs).

    The float tensors of all outputs are flattened and concatenated (float64) and compared by
    the tensor metrics above; KL averages ``kl_terms`` of each output tensor over all positions;
    TASK is ``task(ref, test)``.
    """
    xs = [t.detach().to(torch.float64) for o in ref for t in float_leaves(o)]
    ys = [t.detach().to(torch.float64) for o in test for t in float_leaves(o)]
    if not xs or len(xs) != len(ys):
        raise ValueError("the model returned no float tensor to compare")
    x = torch.cat([t.reshape(-1) for t in xs])
    y = torch.cat([t.reshape(-1) for t in ys])
    res: dict = {}
    for m in metrics:
        if m is Metric.L1:
            res[m] = l1(x, y)
        elif m is Metric.MSE:
            res[m] = mse(x, y)
        elif m is Metric.MAX_ABS:
            res[m] = max_abs(x, y)
        elif m is Metric.RTOL:
            res[m] = rtol(x, y)
        elif m is Metric.COSINE:
            res[m] = cosine(x, y)
        elif m is Metric.SQNR:
            res[m] = sqnr_db(x, y)
        elif m is Metric.KL:
            terms = [kl_terms(a, b).reshape(-1) for a, b in zip(xs, ys)]
            res[m] = float(torch.cat(terms).mean())
        elif m is Metric.TASK:
            if task is None:
                raise ValueError("metric TASK needs a model with a task metric (ModelBundle.task)")
            res[m] = float(task(ref, test))
    return res
