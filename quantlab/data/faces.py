"""``faces``: scikit-image's labelled ``lfw_subset``: 100 face crops and 100 non-face crops.

The file holds 200 float64 crops of 25x25 in [0, 1], faces first. Items alternate face /
non-face (face 0, non-face 0, face 1, ...). Fixed split: calibration pool = the first 10 faces and
first 10 non-faces (20 items), evaluation pool = the other 90 + 90 (180 items). Labels: one 0/1
int64 tensor per evaluation batch (1 = face). Each crop is quantised to 8 bits (round(255 x)),
repeated on 3 channels and given the model's preprocessing (MTCNN: resize to 48 or 24,
(255 x - 127.5) / 128); without a model, the MTCNN ONet format.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from quantlab.data.dataset import Dataset, batches, stack_images
from quantlab.data.formats import image_format
from quantlab.data.images import to_tensor
from quantlab.data.schema import DataConfig
from quantlab.models import formats, packages
from quantlab.models.inputs import ModelInputs

NUM_CALIB_PER_CLASS = 10


@functools.lru_cache(maxsize=1)
def crops() -> tuple[torch.Tensor, torch.Tensor]:
    """(images (200, 3, 25, 25) float32 in [0, 1] in item order, labels (200,) int64)."""
    path = packages.package_file(packages.SKIMAGE, "data/lfw_subset.npy", "data 'faces'")
    raw = np.load(path)  # (200, 25, 25) float64, 100 faces then 100 non-faces
    u8 = np.clip(np.rint(raw * 255), 0, 255).astype(np.uint8)
    order = np.stack([np.arange(100), np.arange(100, 200)], 1).reshape(-1)
    images = torch.stack([to_tensor(u8[i]) for i in order])
    labels = torch.tensor([1 if i < 100 else 0 for i in order], dtype=torch.int64)
    return images, labels


def load(cfg: DataConfig, model: ModelInputs | None = None) -> Dataset:
    fmt = image_format("faces", model, formats.MTCNN_48, cfg)
    images, labels = crops()
    n_calib = 2 * NUM_CALIB_PER_CLASS
    ci = list(range(min(cfg.num_calib, n_calib)))
    ei = list(range(n_calib, n_calib + min(cfg.num_eval, len(labels) - n_calib)))
    prep = fmt.apply(images)

    def name(i: int) -> str:
        return f"{'face' if labels[i] else 'nonface'}{i // 2}"

    bs = cfg.batch_size
    return Dataset(
        name="faces",
        calib=batches([prep[i : i + 1] for i in ci], bs, stack_images),
        eval=batches([prep[i : i + 1] for i in ei], bs, stack_images),
        labels=batches([labels[i : i + 1] for i in ei], bs, lambda xs: torch.cat(xs)),
        description=f"lfw_subset: {len(ci)} calibration + {len(ei)} evaluation crops "
        f"(half faces), {fmt.height}x{fmt.width}",
        calib_ids=[name(i) for i in ci],
        eval_ids=[name(i) for i in ei],
    )
