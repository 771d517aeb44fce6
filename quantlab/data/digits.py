"""``digits``: scikit-learn's 1,797 handwritten digits (8x8, 17 grey levels), with labels.

Read from the CSV that scikit-learn ships (no import of scikit-learn itself). Items keep the
file's order. Fixed split: the first ``TRAIN_ITEMS`` (1,200) are the training pool, on which
the lab's digit transformers are trained and from whose start calibration items are taken;
the remaining 597 are the held-out evaluation pool. Inputs are (B, 8, 8) float32 pixels / 16
in [0, 1]; labels one (B,) int64 tensor of classes 0-9 per evaluation batch.
"""

from __future__ import annotations

import functools
import gzip

import numpy as np
import torch

from quantlab.data.dataset import Dataset, batches
from quantlab.data.schema import DataConfig
from quantlab.models import packages
from quantlab.models.inputs import ModelInputs

TRAIN_ITEMS = 1200
ITEMS = 1797
MODELS = ("digits_layernorm", "digits_dyt", "digits_sima")


@functools.lru_cache(maxsize=1)
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """(images (1797, 8, 8) float32 in [0, 1], labels (1797,) int64), in file order."""
    path = packages.package_file(packages.SKLEARN, "datasets/data/digits.csv.gz", "data 'digits'")
    with gzip.open(path, "rt") as f:
        raw = np.loadtxt(f, delimiter=",", dtype=np.int64)
    if raw.shape != (ITEMS, 65):
        raise ValueError(f"{path} holds {raw.shape}, expected ({ITEMS}, 65) (8x8 pixels, label)")
    images = torch.from_numpy(raw[:, :64].astype(np.float32) / 16.0).reshape(ITEMS, 8, 8)
    return images, torch.from_numpy(raw[:, 64].copy())


def train_split() -> tuple[torch.Tensor, torch.Tensor]:
    """The training pool: the first TRAIN_ITEMS images and labels."""
    images, labels = digits()
    return images[:TRAIN_ITEMS], labels[:TRAIN_ITEMS]


def eval_split() -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out evaluation pool: every image after the training pool."""
    images, labels = digits()
    return images[TRAIN_ITEMS:], labels[TRAIN_ITEMS:]


def load(cfg: DataConfig, model: ModelInputs | None = None) -> Dataset:
    if model is not None and model.registry and model.name not in MODELS:
        raise ValueError(
            f"data 'digits' holds 8x8 digit images for models {', '.join(MODELS)} (or your "
            f"own model taking (8, 8) inputs); got model '{model.name}'"
        )
    if model is not None and model.shapes is not None and model.shapes != ((8, 8),):
        shown = ", ".join(str(list(s)) for s in model.shapes)
        raise ValueError(
            f"data 'digits' gives one (8, 8) input per item, but model {model.name} takes "
            f"inputs of shape {shown} (without the batch dimension)"
        )
    (ti, _), (ei, el) = train_split(), eval_split()
    nc, ne = min(cfg.num_calib, len(ti)), min(cfg.num_eval, len(ei))
    bs = cfg.batch_size
    return Dataset(
        name="digits",
        calib=batches(list(ti[:nc]), bs, lambda xs: (torch.stack(xs),)),
        eval=batches(list(ei[:ne]), bs, lambda xs: (torch.stack(xs),)),
        labels=batches(list(el[:ne]), bs, torch.stack),
        description=f"scikit-learn digits: {nc} calibration images (training pool) + {ne} "
        "held-out evaluation images, 8x8, pixels / 16",
        calib_ids=[f"digit{i}" for i in range(nc)],
        eval_ids=[f"digit{TRAIN_ITEMS + i}" for i in range(ne)],
    )
