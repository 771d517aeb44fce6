"""UVDoc document unwarping with the weights shipped by ``py-reform``.

Only ``py_reform.models.uvdoc_model`` is imported (its parent packages are stubbed: the
``py_reform`` ``__init__`` imports tqdm, pypdfium2 and deskew). The registry module returns the
predicted 2-D sampling grid; ``unwarp`` applies it to the full-resolution photo with
``F.interpolate`` + ``F.grid_sample``, the real large-W grid_sample case.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantlab.models import packages

GRID_HEIGHT, GRID_WIDTH = 45, 31  # UVDoc's predicted grid: 45 rows x 31 columns
INPUT_HEIGHT, INPUT_WIDTH = 712, 488  # the network's input size (py-reform DEFAULT_IMG_SIZE)


def _uvdoc_module():
    return packages.import_submodule(packages.PY_REFORM, "models.uvdoc_model", "model uvdoc")


class UVDocGrid(nn.Module):
    """UVDoc returning only its 2-D grid: (B, 3, 712, 488) RGB in [0, 1] -> (B, 2, 45, 31),
    x then y sampling positions in [-1, 1] (grid_sample, align_corners=True) across the photo."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)[0]


@functools.lru_cache(maxsize=1)
def _state_dict() -> dict[str, Tensor]:
    path = packages.package_file(packages.PY_REFORM, "models/weights/best_model.pkl", "model uvdoc")
    return torch.load(path, map_location="cpu", weights_only=True)["model_state"]


def uvdoc(pretrained: bool = True) -> UVDocGrid:
    """UVDocNet(num_filter=32, kernel_size=5), py-reform's ``best_model.pkl`` weights."""
    net = _uvdoc_module().UVDocNet(num_filter=32, kernel_size=5)
    if pretrained:
        net.load_state_dict(_state_dict())
    return UVDocGrid(net).eval()


def unwarp(image: Tensor, grid: Tensor) -> Tensor:
    """Unwarp ``image`` (B, 3, H, W) with a UVDoc ``grid`` (B, 2, gh, gw) at full resolution.

    The grid is upsampled to H x W (bilinear, align_corners=True) and applied with
    ``F.grid_sample(bilinear, zeros padding, align_corners=True)``: (B, 3, H, W) in the image's
    dtype. Same computation as py-reform's ``bilinear_unwarping``.
    """
    h, w = image.shape[2:]
    full = F.interpolate(grid, size=(h, w), mode="bilinear", align_corners=True)
    return F.grid_sample(image, full.permute(0, 2, 3, 1), align_corners=True)
