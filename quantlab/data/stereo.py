"""``stereo``: scikit-image's Middlebury 2014 motorcycle pair with ground-truth disparity.

``motorcycle_left.png`` / ``motorcycle_right.png`` (500x741 RGB) and ``motorcycle_disp.npz``
(float32 disparity in pixels, 7.2..59.9, left view: the left pixel (y, x) shows the right pixel
(y, x - d)). Invalid pixels are ``inf`` in the file and NaN here. Only one pair exists, so the
fixed split is: evaluation = the pair; calibration = the same scene mirrored (both images flipped
left-right and swapped, again a valid rectified pair). Without a model a batch is
(left, right), each (1, 3, 500, 741) in [0, 1] and ``labels`` = [disparity (500, 741)] for the
evaluation batch; with an image model a batch is one view in that model's format (calibration:
the mirrored views, evaluation: left then right) and ``labels`` is None (the disparity is
``pair()[2]``).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

from quantlab.data.dataset import Dataset, batches, stack_images, take
from quantlab.data.formats import image_format
from quantlab.data.images import read_image
from quantlab.data.schema import DataConfig
from quantlab.models import formats, packages
from quantlab.models.inputs import ModelInputs


@functools.lru_cache(maxsize=1)
def _pair() -> tuple[Tensor, Tensor, Tensor]:
    what = "data 'stereo'"
    left = read_image(packages.package_file(packages.SKIMAGE, "data/motorcycle_left.png", what))
    right = read_image(packages.package_file(packages.SKIMAGE, "data/motorcycle_right.png", what))
    with np.load(packages.package_file(packages.SKIMAGE, "data/motorcycle_disp.npz", what)) as z:
        disp = torch.from_numpy(z["arr_0"].astype(np.float32))
    disp = torch.where(torch.isfinite(disp), disp, torch.full_like(disp, float("nan")))
    return left, right, disp


def pair() -> tuple[Tensor, Tensor, Tensor]:
    """(left (3, H, W), right (3, H, W)) in [0, 1] and disparity (H, W) float32, NaN invalid."""
    left, right, disp = _pair()
    return left.clone(), right.clone(), disp.clone()


def load(cfg: DataConfig, model: ModelInputs | None = None) -> Dataset:
    left, right, disp = pair()
    m_left, m_right = right.flip(-1), left.flip(-1)  # mirrored scene: a rectified pair again
    if model is None:
        return Dataset(
            name="stereo",
            calib=[(m_left[None], m_right[None])],
            eval=[(left[None], right[None])],
            labels=[disp],
            description="Middlebury motorcycle stereo pair (500x741) with GT disparity",
            calib_ids=["mirrored_pair"],
            eval_ids=["pair"],
        )
    fmt = image_format("stereo", model, formats.UNIT, cfg)
    calib = take([("mirrored_left", m_left), ("mirrored_right", m_right)], cfg.num_calib)
    evals = take([("left", left), ("right", right)], cfg.num_eval)
    return Dataset(
        name="stereo",
        calib=batches([fmt.apply(x) for _, x in calib], cfg.batch_size, stack_images),
        eval=batches([fmt.apply(x) for _, x in evals], cfg.batch_size, stack_images),
        labels=None,
        description="Middlebury motorcycle stereo views, one image per item, GT disparity",
        calib_ids=[n for n, _ in calib],
        eval_ids=[n for n, _ in evals],
    )
