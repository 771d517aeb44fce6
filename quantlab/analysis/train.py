"""Brief, seeded training of toy models so experiments study trained weights, not random ones.

``synthetic_boxes`` makes a learnable box-refinement task (DETR-style decoders): queries carry
the offset from an initial reference box to its target box. ``fit`` runs a few hundred Adam
steps on CPU with a fixed seed and returns the loss curve; the same seed gives the same weights
(single-threaded float32 is deterministic on CPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class BoxTask:
    """A seeded box-refinement data set: ``queries`` (N, Q, dim), initial ``ref`` boxes and
    ``target`` boxes (N, Q, 4) as (cx, cy, w, h) in (0, 1)."""

    queries: Tensor
    ref: Tensor
    target: Tensor

    def batches(self, batch: int) -> list[tuple[Tensor, Tensor]]:
        """(queries, ref) input tuples of ``batch`` samples each, in order."""
        n = self.queries.shape[0]
        return [(self.queries[i : i + batch], self.ref[i : i + batch]) for i in range(0, n, batch)]

    def targets(self, batch: int) -> list[Tensor]:
        n = self.target.shape[0]
        return [self.target[i : i + batch] for i in range(0, n, batch)]


def synthetic_boxes(
    n: int,
    queries: int = 16,
    dim: int = 32,
    seed: int = 0,
    task_seed: int = 0,
    min_size: float = 0.004,
    max_size: float = 0.5,
    edge: float = 0.01,
) -> BoxTask:
    """Seeded boxes: centres uniform in [edge, 1 - edge], sizes log-uniform in
    [min_size, max_size] (small boxes put w, h near 0 where inverse_sigmoid is steep).
    The target differs from the initial box by a centre shift of up to 0.1 and a size factor
    in [0.5, 2], both read off a random linear projection of the query vector; the projection
    (the task) comes from ``task_seed``, the samples from ``seed`` (train and test sets share
    ``task_seed``)."""
    g = torch.Generator().manual_seed(seed)

    def boxes() -> Tensor:
        c = edge + (1 - 2 * edge) * torch.rand(n, queries, 2, generator=g)
        lo, hi = math.log(min_size), math.log(max_size)
        s = torch.exp(lo + (hi - lo) * torch.rand(n, queries, 2, generator=g))
        return torch.cat([c, s], -1)

    target = boxes()
    proj = torch.randn(dim, 4, generator=torch.Generator().manual_seed(task_seed)) / math.sqrt(dim)
    q = torch.randn(n, queries, dim, generator=g)
    code = torch.tanh(q @ proj)  # (n, Q, 4) in (-1, 1): what the decoder must read off
    ref = target.clone()
    ref[..., :2] = (target[..., :2] - 0.1 * code[..., :2]).clamp(edge / 2, 1 - edge / 2)
    ref[..., 2:] = (target[..., 2:] * torch.exp(-math.log(2) * code[..., 2:])).clamp(1e-3, 0.99)
    return BoxTask(q, ref, target)


def fit(
    model: nn.Module,
    inputs: list[tuple[Tensor, ...]],
    targets: list[Tensor],
    steps: int,
    lr: float = 3e-3,
    seed: int = 0,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> list[float]:
    """Adam on ``loss_fn(model(*inputs[i]), targets[i])`` (default L1), cycling over the batches
    for ``steps`` steps; returns the loss of every step. The model is left in eval mode.
    Randomness inside (``seed``) comes from a forked RNG: the caller's global state is kept."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if len(inputs) != len(targets) or not inputs:
        raise ValueError(
            f"fit needs as many input batches as targets (>= 1), got "
            f"{len(inputs)} and {len(targets)}"
        )
    loss_fn = loss_fn or (lambda y, t: (y - t).abs().mean())
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    with torch.random.fork_rng(devices=[]):  # seeded inside; the caller's RNG state is kept
        torch.manual_seed(seed)
        for step in range(steps):
            i = step % len(inputs)
            opt.zero_grad()
            loss = loss_fn(model(*inputs[i]), targets[i])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    model.eval()
    return losses
