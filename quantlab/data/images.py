"""Real photos bundled by scikit-image, scikit-learn, matplotlib and py-reform, read offline.

Every image is returned as a float32 tensor (3, H, W) in [0, 1] (grey images are repeated on the
three channels, alpha is dropped). Files are located inside the installed packages; nothing is
downloaded.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from quantlab.models import packages

# name -> (package, path inside the package)
PHOTO_FILES: dict[str, tuple[packages.Package, str]] = {
    "astronaut": (packages.SKIMAGE, "data/astronaut.png"),
    "rocket": (packages.SKIMAGE, "data/rocket.jpg"),
    "flower": (packages.SKLEARN, "datasets/images/flower.jpg"),
    "hubble_deep_field": (packages.SKIMAGE, "data/hubble_deep_field.jpg"),
    "coins": (packages.SKIMAGE, "data/coins.png"),
    "brick": (packages.SKIMAGE, "data/brick.png"),
    "ihc": (packages.SKIMAGE, "data/ihc.png"),
    "grass": (packages.SKIMAGE, "data/grass.png"),
    "coffee": (packages.SKIMAGE, "data/coffee.png"),
    "chelsea": (packages.SKIMAGE, "data/chelsea.png"),
    "camera": (packages.SKIMAGE, "data/camera.png"),
    "motorcycle_left": (packages.SKIMAGE, "data/motorcycle_left.png"),
    "china": (packages.SKLEARN, "datasets/images/china.jpg"),
    "grace_hopper": (packages.MATPLOTLIB, "mpl-data/sample_data/grace_hopper.jpg"),
    "moon": (packages.SKIMAGE, "data/moon.png"),
    "retina": (packages.SKIMAGE, "data/retina.jpg"),
    "gravel": (packages.SKIMAGE, "data/gravel.png"),
    "page": (packages.SKIMAGE, "data/page.png"),
    "cell": (packages.SKIMAGE, "data/cell.png"),
    "text": (packages.SKIMAGE, "data/text.png"),
}


def package_image_path(pkg: packages.Package, relpath: str, what: str) -> Path:
    return packages.package_file(pkg, relpath, what)


def to_tensor(array: np.ndarray) -> Tensor:
    """uint8 (H, W), (H, W, 3) or (H, W, 4) -> float32 (3, H, W) in [0, 1] (exact k/255)."""
    a = np.asarray(array)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    a = a[:, :, :3]
    if a.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got {a.dtype}")
    return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1))).to(torch.float32) / 255


@functools.lru_cache(maxsize=64)
def _read(path: str, min_side: int) -> Tensor:
    packages.package_dir(packages.PILLOW, "reading image files")
    from PIL import Image

    with Image.open(path) as im:
        if min_side:
            # JPEG DCT scaling: decode at 1/2, 1/4 or 1/8 size, keeping both sides >= min_side
            im.draft("RGB", (min_side, min_side))
        return to_tensor(np.asarray(im.convert("RGB")))


def read_image(path: Path | str, min_side: int = 0) -> Tensor:
    """An image file as float32 (3, H, W) in [0, 1] (a fresh copy; the decode is cached).

    ``min_side`` > 0 lets a JPEG decode at a reduced size whose sides stay >= ``min_side`` (faster
    for photos that are resized anyway); other files and 0 give the full resolution.
    """
    return _read(str(path), min_side).clone()


def photo(name: str) -> Tensor:
    """A bundled photo by name (keys of PHOTO_FILES): float32 (3, H, W) in [0, 1]."""
    if name not in PHOTO_FILES:
        raise ValueError(f"photo name must be one of {', '.join(PHOTO_FILES)}; got {name!r}")
    pkg, rel = PHOTO_FILES[name]
    return read_image(package_image_path(pkg, rel, f"photo {name!r}"))
