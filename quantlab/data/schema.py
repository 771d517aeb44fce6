"""Schema of the ``data`` config group."""

from __future__ import annotations

from dataclasses import dataclass

from quantlab.models.formats import ChannelOrder, Resize

USER_DATA = ("images", "tensors")
"""``data.name`` values that read the user's own files (``data.path``)."""


@dataclass
class DataConfig:
    """Which inputs to use. ``name`` is a key of the data registry (quantlab.data), or the user's
    own files: ``images`` (a folder, ``path``) or ``tensors`` (a .pt or .npz file, ``path``).

    Calibration and evaluation splits are fixed: each dataset has an ordered calibration pool and
    a disjoint ordered evaluation pool; the first ``num_calib`` / ``num_eval`` items of each are
    used (all of a pool when it is smaller; see quantlab.data for each dataset's pools). The
    user's files are split in order: the first ``num_calib`` items calibrate, the next
    ``num_eval`` evaluate.

    Image preprocessing for a model without its own input format (the user's models): resize to
    ``size`` = [height, width] (default: the model's input shape) by ``resize``, put channels in
    ``channel_order`` (GRAY: one luma channel; a model that takes (1, H, W) gets it), then
    (x - mean) / std of pixels x in [0, 1] (``mean``/``std`` one value per channel, in the
    model's channel order; default 0 and 1). Registry image models use their own format.
    """

    name: str = "synthetic"
    num_calib: int = 8
    num_eval: int = 8
    seed: int = 0
    batch_size: int = 1  # items per batch (sentences: pairs per batch)
    path: str | None = None  # images: a folder of png/jpg/bmp files; tensors: a .pt or .npz file
    size: list[int] | None = None  # images: [height, width] the model takes
    resize: Resize = Resize.STRETCH
    mean: list[float] | None = None
    std: list[float] | None = None
    channel_order: ChannelOrder = ChannelOrder.RGB

    def __post_init__(self) -> None:
        for field_name in ("num_calib", "num_eval", "batch_size"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"data.{field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.name in USER_DATA and not self.path:
            what = (
                "a folder of png/jpg/bmp images" if self.name == "images" else "a .pt or .npz file"
            )
            raise ValueError(f"data.path is required with data={self.name}: {what}")
        if self.path and self.name not in USER_DATA:
            raise ValueError(
                f"data.path is only read with data=images or data=tensors, got data={self.name}"
            )
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise ValueError(
                f"data.size must be [height, width] with positive sizes, got {list(self.size)}"
            )
        for field_name in ("mean", "std"):
            v = getattr(self, field_name)
            if v is not None and len(v) not in (1, 3):
                raise ValueError(
                    f"data.{field_name} must hold one value per channel (3, or 1 for a "
                    f"grayscale model), got {v}"
                )
        if self.std is not None and min(self.std) <= 0:
            raise ValueError(f"data.std values must be > 0, got {list(self.std)}")

    @property
    def sets_image_format(self) -> bool:
        """Whether ``size``, ``mean`` or ``std`` are given (they apply to user models only)."""
        return self.size is not None or self.mean is not None or self.std is not None
