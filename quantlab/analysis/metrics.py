"""Error metrics between a reference tensor and a test tensor (float64 arithmetic).

Conventions follow the vendor's sensitivity tools (j6-numerics s.9): L1 = mean |x - y|;
signed cosine similarity; MSE; KL(softmax(x) || softmax(y)) over dim 1 (log-softmax of the
test, softmax of the reference); SQNR = 20 log10(||x|| / ||x - y||) in dB; max |x - y|.
Higher is better for cosine and SQNR, lower for the others. Non-finite values propagate.
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


def kl(x: Tensor, y: Tensor) -> float:
    """KL(softmax(x) || softmax(y)) along dim 1 (dim 0 for 1-d tensors), mean over the rest.

    float64: ``sum p_x * (log_softmax(x) - log_softmax(y))``.
    """
    x, y = x.double(), y.double()
    if x.numel() == 0:
        return 0.0
    dim = 1 if x.dim() >= 2 else 0
    lx, ly = F.log_softmax(x, dim=dim), F.log_softmax(y, dim=dim)
    v = (lx.exp() * (lx - ly)).sum(dim=dim)
    return float(v.mean())


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
    """Output comparison metrics (module docstring); ``lower_is_worse`` gives the sort order."""

    L1 = "l1"
    COSINE = "cosine"
    MSE = "mse"
    KL = "kl"
    SQNR = "sqnr"
    MAX_ABS = "max_abs"
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


def _leaves(out: Any) -> list[Tensor]:
    return [t for t in tree_flatten(out)[0] if isinstance(t, Tensor) and t.is_floating_point()]


def output_metrics(ref: list, test: list, metrics: Sequence[Metric], task=None) -> dict:
    """Each metric of the run outputs ``test`` against ``ref`` (lists of per-batch outputs)."""
    xs = [t.detach().to(torch.float64) for o in ref for t in _leaves(o)]
    ys = [t.detach().to(torch.float64) for o in test for t in _leaves(o)]
    if not xs or len(xs) != len(ys):
        raise ValueError("the model returned no float tensor to compare")
    x = torch.cat([t.reshape(-1) for t in xs])
    y = torch.cat([t.reshape(-1) for t in ys])
    d = x - y
    res: dict = {}
    for m in metrics:
        if m is Metric.L1:
            res[m] = float(d.abs().mean())
        elif m is Metric.MSE:
            res[m] = float((d * d).mean())
        elif m is Metric.MAX_ABS:
            res[m] = float(d.abs().max())
        elif m is Metric.COSINE:
            nx, ny = float(x.norm()), float(y.norm())
            res[m] = 1.0 if nx == 0 and ny == 0 else float(x @ y) / max(nx * ny, 1e-300)
        elif m is Metric.SQNR:
            nd = float(d.norm())
            res[m] = math.inf if nd == 0 else 20 * math.log10(max(float(x.norm()), 1e-300) / nd)
        elif m is Metric.KL:
            kls = []
            for a, b in zip(xs, ys):
                dim = 1 if a.ndim >= 2 else 0
                lp, lq = a.log_softmax(dim), b.log_softmax(dim)
                kls.append((lp.exp() * (lp - lq)).sum(dim).reshape(-1))
            res[m] = float(torch.cat(kls).mean())
        elif m is Metric.TASK:
            if task is None:
                raise ValueError("metric TASK needs a model with a task metric (ModelBundle.task)")
            res[m] = float(task(ref, test))
    return res
