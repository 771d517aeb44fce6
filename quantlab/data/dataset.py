"""The ``Dataset`` a loader returns and the fixed-split batching every loader shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class Dataset:
    """Calibration and evaluation batches for one model.

    A batch is a tuple passed as ``model(*batch)``. ``labels`` (None when the data have none)
    holds one entry per evaluation batch (e.g. a 0/1 tensor for faces, the full-resolution page
    image for UVDoc). ``calib_ids`` / ``eval_ids`` name the items, in batch order.
    """

    name: str
    calib: list[tuple[Tensor, ...]]
    eval: list[tuple[Tensor, ...]]
    labels: Any | None
    description: str
    calib_ids: list[str] = field(default_factory=list)
    eval_ids: list[str] = field(default_factory=list)


def take(pool: Sequence[Any], n: int) -> list[Any]:
    """The first ``n`` items of a fixed, ordered pool (all of it when the pool is smaller)."""
    return list(pool[:n])


def batches(items: Sequence[Any], batch_size: int, collate: Callable[[list[Any]], Any]) -> list:
    """Consecutive groups of ``batch_size`` items (the last may be smaller), each collated."""
    return [collate(list(items[i : i + batch_size])) for i in range(0, len(items), batch_size)]


def stack_images(images: list[Tensor]) -> tuple[Tensor]:
    """Collate (1, C, H, W) images into one (B, C, H, W) batch tuple."""
    return (torch.cat(images, 0),)
