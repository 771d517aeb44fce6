"""The digit transformers trained in the lab: seeded, deterministic, seconds on a CPU.

``train`` fits a ``DigitTransformer`` on the digits training pool (quantlab.data.digits) with
AdamW, cross-entropy and a cosine learning-rate decay (375 steps by default), on one
intra-op thread (float32 sums then do not depend on the machine's thread count); shuffling uses
its own ``torch.Generator``, so the caller's global RNG is neither read nor changed. Trained
weights are kept per (variant, seed) for the life of the process.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from quantlab.models.digit_transformer import Attention, DigitTransformer, TokenNorm


@dataclass(frozen=True)
class TrainRecipe:
    """How a digit transformer is trained (the registry's models use the defaults)."""

    epochs: int = 25
    batch: int = 80
    lr: float = 4e-3
    weight_decay: float = 0.02


VARIANTS: dict[str, tuple[TokenNorm, Attention]] = {
    "digits_layernorm": (TokenNorm.LAYER_NORM, Attention.SOFTMAX),
    "digits_dyt": (TokenNorm.DYT, Attention.SOFTMAX),
    "digits_sima": (TokenNorm.LAYER_NORM, Attention.SIMA),
}


@contextmanager
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def train(model: nn.Module, seed: int = 0, recipe: TrainRecipe = TrainRecipe()) -> list[float]:
    """Fit ``model`` on the digits training pool; returns the mean loss of every epoch and
    leaves the model in eval mode. Deterministic for a given initial state and seed."""
    from quantlab.data.digits import train_split

    images, labels = train_split()
    n = images.shape[0]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    steps = recipe.epochs * math.ceil(n / recipe.batch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, steps) / steps))
    )
    losses = []
    model.train()
    with _one_thread():
        for _ in range(recipe.epochs):
            order = torch.randperm(n, generator=gen)
            total = 0.0
            for i in range(0, n, recipe.batch):
                idx = order[i : i + recipe.batch]
                opt.zero_grad()
                loss = F.cross_entropy(model(images[idx]), labels[idx])
                loss.backward()
                opt.step()
                sched.step()
                total += float(loss.detach()) * len(idx)
            losses.append(total / n)
    model.eval()
    return losses


@functools.lru_cache(maxsize=8)
def _trained_state(variant: str, seed: int) -> dict[str, torch.Tensor]:
    norm, attention = VARIANTS[variant]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DigitTransformer(norm, attention)
    train(model, seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def build(variant: str, pretrained: bool, seed: int = 0) -> DigitTransformer:
    """The ``variant`` (a key of VARIANTS): trained in the lab when ``pretrained`` (cached per
    process), else with the initial weights of the caller's RNG state."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown digit transformer {variant!r}; allowed: {', '.join(VARIANTS)}")
    norm, attention = VARIANTS[variant]
    model = DigitTransformer(norm, attention)
    if pretrained:
        model.load_state_dict(_trained_state(variant, seed))
    return model.eval()
