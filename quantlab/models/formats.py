"""Input formats: how an image becomes a model input (size, resize rule, normalisation).

A model's registry entry names its format; the data registry applies it, so every image dataset
can feed every image model with the preprocessing that model was trained with.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


class Resize(enum.Enum):
    """SHORT_SIDE_CROP: resize the short side to ``round(size * crop_ratio)`` (bilinear, with
    antialiasing), then centre-crop ``height`` x ``width`` (the torchvision ImageNet recipe).
    STRETCH: resize to exactly ``height`` x ``width`` (bilinear, antialiasing).
    KEEP: keep the image size (``height`` and ``width`` are ignored)."""

    SHORT_SIDE_CROP = "short_side_crop"
    STRETCH = "stretch"
    KEEP = "keep"


class ChannelOrder(enum.Enum):
    """Channels of the model input: RGB, BGR (OpenCV-style models, e.g. PaddleOCR), or GRAY:
    one luma channel 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601's weights, PIL's
    ``convert("L")`` and OpenCV's ``COLOR_RGB2GRAY``; here on float pixels, unrounded)."""

    RGB = "rgb"
    BGR = "bgr"
    GRAY = "gray"

    @property
    def count(self) -> int:
        """Channels of an image in this order."""
        return 1 if self is ChannelOrder.GRAY else 3


LUMA_WEIGHTS = (0.299, 0.587, 0.114)


@dataclass(frozen=True)
class ImageFormat:
    """(x - mean) / std of pixels x in [0, 1] after resizing, channels in ``channels`` order
    (``mean`` and ``std`` in that order too, one value per channel); float32 (B, 3, H, W), or
    (B, 1, H, W) for GRAY."""

    height: int
    width: int
    resize: Resize
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    crop_ratio: float = 256 / 224
    channels: ChannelOrder = ChannelOrder.RGB

    def __post_init__(self) -> None:
        n = self.channels.count
        if len(self.mean) != n or len(self.std) != n:
            raise ValueError(
                f"an image format with channels {self.channels.name} takes {n} mean and std "
                f"value(s), one per channel; got mean {list(self.mean)}, std {list(self.std)}"
            )

    def apply(self, image: Tensor) -> Tensor:
        """``image``: RGB (3, H, W) or (B, 3, H, W) float in [0, 1] -> (B, C, height, width)."""
        x = image if image.dim() == 4 else image.unsqueeze(0)
        x = x.to(torch.float32)
        if self.resize is Resize.SHORT_SIDE_CROP:
            h, w = x.shape[2:]
            s = round(min(self.height, self.width) * self.crop_ratio) / min(h, w)
            nh, nw = max(self.height, round(h * s)), max(self.width, round(w * s))
            x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True)
            top, left = (nh - self.height) // 2, (nw - self.width) // 2
            x = x[:, :, top : top + self.height, left : left + self.width]
        elif self.resize is Resize.STRETCH:
            x = F.interpolate(x, size=(self.height, self.width), mode="bilinear", antialias=True)
        if self.channels is ChannelOrder.BGR:
            x = x.flip(1)
        elif self.channels is ChannelOrder.GRAY:
            luma = torch.tensor(LUMA_WEIGHTS, dtype=torch.float32).view(1, 3, 1, 1)
            x = (x * luma).sum(1, keepdim=True)
        n = self.channels.count
        mean = torch.tensor(self.mean, dtype=torch.float32).view(1, n, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(1, n, 1, 1)
        return ((x - mean) / std).contiguous()


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

IMAGENET = ImageFormat(224, 224, Resize.SHORT_SIDE_CROP, IMAGENET_MEAN, IMAGENET_STD)
"""torchvision ImageNet preprocessing: short side 256, centre crop 224, ImageNet mean/std."""

TOY_32 = ImageFormat(32, 32, Resize.SHORT_SIDE_CROP, IMAGENET_MEAN, IMAGENET_STD)
"""Toy CNN inputs: short side 37, centre crop 32x32, ImageNet mean/std."""

SIGNED_UNIT = ImageFormat(224, 224, Resize.SHORT_SIDE_CROP, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
"""EfficientNet-Lite preprocessing: short side 256, centre crop 224, pixels scaled to [-1, 1]."""

MTCNN_MEAN = (127.5 / 255, 127.5 / 255, 127.5 / 255)
MTCNN_STD = (128 / 255, 128 / 255, 128 / 255)
MTCNN_48 = ImageFormat(48, 48, Resize.STRETCH, MTCNN_MEAN, MTCNN_STD)
"""MTCNN ONet: 48x48 crop, (255 x - 127.5) / 128."""
MTCNN_24 = ImageFormat(24, 24, Resize.STRETCH, MTCNN_MEAN, MTCNN_STD)
"""MTCNN RNet: 24x24 crop, (255 x - 127.5) / 128."""

UVDOC = ImageFormat(712, 488, Resize.STRETCH)
"""UVDoc: the page photo stretched to 488 wide x 712 high, pixels in [0, 1]."""

UNIT = ImageFormat(0, 0, Resize.KEEP)
"""Pixels in [0, 1] at the image's own size."""
