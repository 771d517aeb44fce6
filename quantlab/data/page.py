"""``page``: photographed curved book pages for document unwarping (UVDoc).

Fixed split: evaluation = py-reform's ``examples/data/G38J5.jpg`` (1067x1401 photo of a curved
page); calibration = py-reform's ``sideways.jpg`` (3264x2448, decoded at half size) and
scikit-image's ``page.png`` (191x384, grey). Batches hold the photo in the model's format
(UVDoc: stretched to 488x712, [0, 1]; without a model the UVDoc format). ``labels`` holds, per
evaluation batch, the full-resolution photo (1, 3, H, W) in [0, 1] that the predicted grid
unwarps (quantlab.models.uvdoc.unwarp).
"""

from __future__ import annotations

from torch import Tensor

from quantlab.data.dataset import Dataset, batches, stack_images, take
from quantlab.data.formats import image_format
from quantlab.data.images import read_image
from quantlab.data.schema import DataConfig
from quantlab.models import formats, packages
from quantlab.models.inputs import ModelInputs


def _examples_file(name: str, min_side: int = 0) -> Tensor:
    # py-reform installs a top-level ``examples/data`` folder next to its package folder
    root = packages.package_dir(packages.PY_REFORM, "data 'page'").parent
    path = root / "examples" / "data" / name
    if not path.is_file():
        raise packages.missing(packages.PY_REFORM, f"data 'page' (file examples/data/{name})")
    return read_image(path, min_side)


def page_photo() -> Tensor:
    """The curved page photo (G38J5.jpg): (3, 1401, 1067) float32 in [0, 1]."""
    return _examples_file("G38J5.jpg")


def _calib_photos() -> list[tuple[str, Tensor]]:
    sk = packages.package_file(packages.SKIMAGE, "data/page.png", "data 'page'")
    return [
        ("sideways", _examples_file("sideways.jpg", min_side=720)),
        ("skimage_page", read_image(sk)),
    ]


def load(cfg: DataConfig, model: ModelInputs | None = None) -> Dataset:
    fmt = image_format("page", model, formats.UVDOC, cfg)
    calib = take(_calib_photos(), cfg.num_calib)
    full = page_photo()
    return Dataset(
        name="page",
        calib=batches([fmt.apply(x) for _, x in calib], cfg.batch_size, stack_images),
        eval=[(fmt.apply(full),)],
        labels=[full[None]],
        description=f"curved page photo G38J5.jpg (1067x1401) for evaluation, "
        f"{len(calib)} page photos for calibration, {fmt.height}x{fmt.width}",
        calib_ids=[n for n, _ in calib],
        eval_ids=["G38J5"],
    )
