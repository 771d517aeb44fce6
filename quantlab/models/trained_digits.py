"""The digit transformers trained in the lab: seeded, deterministic, seconds on a CPU.

``train`` fits a ``DigitTransformer`` on the digits training pool (quantlab.data.digits) with
AdamW, cross-entropy and a cosine learning-rate decay (375 steps by default); shuffling uses
its own ``torch.Generator``, so the caller's global RNG is neither read nor changed. It runs on
the caller's intra-op threads: torch splits large float32 reductions by thread count, so the
weights it fits depend on that count. The registry's trained weights (``build``) therefore come
from a child interpreter started with one intra-op thread (``OMP_NUM_THREADS=1``, read by torch
at start-up): the same bits on every machine, and this process's thread count is never changed.
They are kept per (variant, seed) for the life of the process, and on disk in
``CACHE_DIR`` (relative to the working directory, like the experiments' ``.quantlab_cache``)
under a key that hashes the variant, seed, recipe, torch version and the source of the modules
that decide the weights (``cache_key``): a later process loads them (``weights_only=True``)
instead of training again, and a change to any of those trains anew.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


def train(model: nn.Module, seed: int = 0, recipe: TrainRecipe = TrainRecipe()) -> list[float]:
    """Fit ``model`` on the digits training pool; returns the mean loss of every epoch and
    leaves the model in eval mode. Deterministic for a given initial state, seed and intra-op
    thread count (the caller's, left as it is)."""
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


def train_state(variant: str, seed: int) -> dict[str, torch.Tensor]:
    """The state dict of ``variant`` initialised from ``seed`` and trained by ``train`` in this
    process, on its intra-op threads."""
    norm, attention = VARIANTS[variant]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DigitTransformer(norm, attention)
    train(model, seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


_CHILD = """
import io, sys, torch
from quantlab.models.trained_digits import train_state
buf = io.BytesIO()
torch.save(train_state(sys.argv[1], int(sys.argv[2])), buf)
sys.stdout.buffer.write(buf.getvalue())
"""


CACHE_DIR = Path(".quantlab_cache") / "trained_digits"
_SOURCES = ("models/digit_transformer.py", "models/trained_digits.py", "data/digits.py")


def cache_key(variant: str, seed: int, recipe: TrainRecipe = TrainRecipe()) -> str:
    """SHA-256 (hex) of what decides the trained weights: variant, seed, recipe, torch version
    and the source text of the model, training and data modules."""
    h = hashlib.sha256(f"{variant}\n{seed}\n{recipe!r}\n{torch.__version__}\n".encode())
    root = Path(__file__).resolve().parents[1]
    for rel in _SOURCES:
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=8)
def _trained_state(variant: str, seed: int) -> dict[str, torch.Tensor]:
    """The trained state: from the disk cache when its key matches, else trained in a child
    interpreter (``_train_in_child``) and stored there atomically."""
    from quantlab.report.io import atomic_write_bytes

    path = CACHE_DIR / f"{variant}-seed{seed}-{cache_key(variant, seed)[:32]}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # a truncated or foreign file: train again and replace it
            pass
    data = _train_in_child(variant, seed)
    try:
        atomic_write_bytes(path, data)
    except OSError:  # a read-only working directory: keep the weights for this process only
        pass
    return torch.load(io.BytesIO(data), weights_only=True)


def _train_in_child(variant: str, seed: int) -> bytes:
    """``train_state`` run in a child interpreter with one intra-op thread (module docstring);
    its tensors come back as ``torch.save`` bytes (read with ``weights_only=True``)."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding this quantlab
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=path)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, variant, str(seed)], env=env, capture_output=True
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"training {variant} (seed {seed}) in a one-thread child interpreter failed "
            f"(exit code {done.returncode}):\n{done.stderr.decode(errors='replace')[-2000:]}"
        )
    return done.stdout


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
