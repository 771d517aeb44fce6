"""``images``: every image file in the user's folder ``data.path`` (png, jpg, jpeg, bmp).

Files are taken in sorted name order (the folder itself, not subfolders); the first
``num_calib`` calibrate, the next ``num_eval`` evaluate (fewer when the folder runs out). Each
image is read as RGB in [0, 1] (grey repeated on three channels, alpha dropped) and given the
model's own format, or the one ``data.size`` / ``resize`` / ``channel_order`` / ``mean`` /
``std`` describe (quantlab.data.formats). Item ids are the file names; there are no labels.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from quantlab.data.dataset import Dataset, batches, stack_images
from quantlab.data.formats import image_format
from quantlab.data.schema import DataConfig
from quantlab.models import formats
from quantlab.models.inputs import ModelInputs

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def image_files(folder: str | Path) -> list[Path]:
    """The image files of ``folder`` in sorted name order; ValueError naming the folder when it
    is missing, not a folder, or holds no image file."""
    folder = Path(folder)
    if not folder.exists():
        raise ValueError(f"data.path: folder {folder} does not exist")
    if not folder.is_dir():
        raise ValueError(
            f"data.path: {folder} is a file; data=images reads a folder of images "
            "(use data=tensors for a .pt or .npz file)"
        )
    entries = sorted(folder.iterdir())
    files = [p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        others = [p.name for p in entries][:5]
        raise ValueError(
            f"data.path: folder {folder} holds no image file ({', '.join(IMAGE_SUFFIXES)}); "
            + (
                f"it holds {len(entries)} other entries, e.g. {', '.join(others)}"
                if entries
                else "it is empty"
            )
        )
    return files


def read_file(path: Path) -> Tensor:
    """One image file as float32 (3, H, W) in [0, 1]; ValueError naming an unreadable file."""
    from quantlab.data.images import read_image

    try:
        return read_image(path)
    except Exception as err:  # PIL raises UnidentifiedImageError, OSError, SyntaxError...
        raise ValueError(
            f"data.path: cannot read image {path}: {type(err).__name__}: {err}"
        ) from None


def load(cfg: DataConfig, model: ModelInputs | None = None) -> Dataset:
    files = image_files(cfg.path)
    calib_files = files[: cfg.num_calib]
    eval_files = files[cfg.num_calib : cfg.num_calib + cfg.num_eval]
    if not eval_files:
        raise ValueError(
            f"data.path: folder {cfg.path} holds {len(files)} images and data.num_calib="
            f"{cfg.num_calib} takes them all for calibration, leaving none to evaluate; lower "
            "data.num_calib (the first num_calib files in name order calibrate, the next "
            "num_eval evaluate)"
        )
    fmt = image_format("images", model, formats.UNIT, cfg)

    def prepared(paths: list[Path]) -> list[Tensor]:
        return [fmt.apply(read_file(p)) for p in paths]

    def collate(images: list[Tensor]) -> tuple[Tensor]:
        sizes = {tuple(x.shape[2:]) for x in images}
        if len(sizes) > 1:
            raise ValueError(
                f"data.path: images of {cfg.path} differ in size after preprocessing "
                f"({sorted(sizes)}) and cannot share a batch; set data.size or data.batch_size=1"
            )
        return stack_images(images)

    size = "own size" if fmt.height == 0 else f"{fmt.height}x{fmt.width}"
    return Dataset(
        name="images",
        calib=batches(prepared(calib_files), cfg.batch_size, collate),
        eval=batches(prepared(eval_files), cfg.batch_size, collate),
        labels=None,
        description=f"{len(calib_files)} calibration + {len(eval_files)} evaluation images "
        f"from {cfg.path} ({size}, {fmt.channels.name})",
        calib_ids=[p.name for p in calib_files],
        eval_ids=[p.name for p in eval_files],
    )
