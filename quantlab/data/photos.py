"""``photos``: real photos bundled by scikit-image, scikit-learn and matplotlib.

Fixed split by source photo (mirror images stay in their photo's split):
calibration pool = astronaut, rocket, flower, hubble_deep_field, coins, brick, ihc, grass, then
the same eight mirrored left-right (16 items); evaluation pool = coffee, chelsea, camera,
motorcycle_left, china, grace_hopper, moon, retina, gravel, page, cell, text, then those twelve
mirrored (24 items). Each image gets the model's preprocessing (ImageNet: short side 256, centre
crop 224, mean/std; EfficientNet-Lite: the same crop in [-1, 1]); without a model, ImageNet.
"""

from __future__ import annotations

import functools

import torch

from quantlab.data.dataset import Dataset, batches, stack_images, take
from quantlab.data.formats import image_format
from quantlab.data.images import photo
from quantlab.data.schema import DataConfig
from quantlab.models import formats
from quantlab.models.inputs import ModelInputs

CALIB_PHOTOS = ("astronaut", "rocket", "flower", "hubble_deep_field", "coins", "brick", "ihc")
CALIB_PHOTOS += ("grass",)
EVAL_PHOTOS = ("coffee", "chelsea", "camera", "motorcycle_left", "china", "grace_hopper")
EVAL_PHOTOS += ("moon", "retina", "gravel", "page", "cell", "text")


def pool(names: tuple[str, ...]) -> list[str]:
    """Item ids of a split: the photos, then the same photos mirrored (``<name>:flip``)."""
    return list(names) + [f"{n}:flip" for n in names]


def item(item_id: str) -> torch.Tensor:
    """(3, H, W) in [0, 1] for an item id of ``pool``."""
    name, _, flip = item_id.partition(":")
    img = photo(name)
    return img.flip(-1) if flip else img


@functools.lru_cache(maxsize=256)
def _prepared(item_id: str, fmt: formats.ImageFormat) -> torch.Tensor:
    return fmt.apply(item(item_id))


def load(cfg: DataConfig, model: ModelInputs | None = None) -> Dataset:
    fmt = image_format("photos", model, formats.IMAGENET, cfg)
    calib_ids = take(pool(CALIB_PHOTOS), cfg.num_calib)
    eval_ids = take(pool(EVAL_PHOTOS), cfg.num_eval)

    def prepared(ids: list[str]) -> list[torch.Tensor]:
        return [_prepared(i, fmt).clone() for i in ids]

    return Dataset(
        name="photos",
        calib=batches(prepared(calib_ids), cfg.batch_size, stack_images),
        eval=batches(prepared(eval_ids), cfg.batch_size, stack_images),
        labels=None,
        description=f"{len(calib_ids)} calibration + {len(eval_ids)} evaluation real photos "
        f"(scikit-image, scikit-learn, matplotlib), {fmt.height}x{fmt.width}",
        calib_ids=calib_ids,
        eval_ids=eval_ids,
    )
