"""Toy vision models with seeded random weights: small CNN, conv-only, control flow, BEV warp.

Each model is an ordinary eager ``nn.Module`` written the way model authors write them, so op
capture sees real-world call patterns (``F.conv2d`` through ``nn.Conv2d``, ``x.mean``, Python
branches, ``F.grid_sample`` on a computed grid). Weights are random unless trained elsewhere; the
registry seeds them (quantlab.models.build_model).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SmallCNN(nn.Module):
    """conv-relu-maxpool, conv-relu-avgpool, global mean, linear: (B, 3, H, W) -> (B, classes).

    H and W must be multiples of 4; the global mean makes any such size work (32x32 by default,
    224x224 photos too).
    """

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.avg_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.mean((2, 3)))


class ConvOnly(nn.Module):
    """Three convolutions with ReLU, nothing else: (B, 3, H, W) -> (B, 4, ceil(H/2), ceil(W/2)).

    Every op has a one-to-one ONNX integer counterpart (QLinearConv with a fused ReLU), which makes
    it the network for runtime-equivalence checks.
    """

    def __init__(self, channels: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(channels, 4, 1)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.conv3(x)


class ControlFlow(nn.Module):
    """Data-dependent Python control flow: (B, 3, H, W) -> (B, classes).

    The number of times the shared residual block runs is ``1 + int(mean(x^2) * 4) % max_steps``
    (a Python int read from a tensor), and a branch on the sign of the pooled mean picks one of two
    heads. Tracing-based tools cannot capture this model; eager op capture must.
    """

    def __init__(self, num_classes: int = 10, width: int = 8, max_steps: int = 3):
        super().__init__()
        self.max_steps = max_steps
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.block = nn.Conv2d(width, width, 3, padding=1)
        self.head_pos = nn.Linear(width, num_classes)
        self.head_neg = nn.Linear(width, num_classes)

    def steps(self, x: Tensor) -> int:
        """How many block iterations ``forward`` runs for input ``x``."""
        return 1 + int((x * x).mean().item() * 4) % self.max_steps

    def forward(self, x: Tensor) -> Tensor:
        n = self.steps(x)
        h = torch.relu(self.stem(x))
        for _ in range(n):
            h = h + torch.relu(self.block(h))
        pooled = h.mean((2, 3))
        if pooled.mean().item() > 0.25:
            return self.head_pos(pooled)
        return self.head_neg(pooled) * 0.5


def ipm_homography(height: int, width: int, bev: int) -> Tensor:
    """A fixed ground-plane homography (float64, 3x3) mapping BEV cells (u, v, 1), u, v in
    [0, bev), to homogeneous image pixels (x, y, w) of a forward camera ``width`` x ``height``.

    Row v = 0 is far (a quarter of the image width, just below the horizon at 40% of the height),
    row v = bev - 1 is near (the full image width, at the bottom row): w = 4 - 3 v / (bev - 1), so
    the sampling grid reaches across the whole (wide) image row.
    """
    s = 1.0 / (bev - 1)
    cx = (width - 1) / 2
    horizon, bottom = 0.4 * (height - 1), float(height - 1)
    return torch.tensor(
        [
            [width * s, -3 * cx * s, 4 * cx - 0.5 * width],
            [0.0, -3 * horizon * s, 4 * horizon + (bottom - horizon)],
            [0.0, -3 * s, 4.0],
        ],
        dtype=torch.float64,
    )


class BevWarp(nn.Module):
    """A BEV-style warp: conv stem, ``F.grid_sample`` through a ground-plane homography, conv head.

    (B, 3, H, W) image -> (B, channels, bev, bev). The sampling grid is computed inside
    ``forward`` from a fixed homography (matmul, divide, normalise), so the grid chain is part of
    the captured graph; it spans the full image width. The example inputs are 64x1024, the widest
    input the J6 grid_sample limits allow; the module runs on any size (an int16 normalised-grid
    LSB is about W/65534 pixels, and inputs wider than 1024 exceed the J6 limits).
    """

    def __init__(self, channels: int = 8, bev: int = 64, height: int = 64, width: int = 1024):
        super().__init__()
        self.bev = bev
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.head = nn.Conv2d(channels, channels, 3, padding=1)
        v, u = torch.meshgrid(torch.arange(bev), torch.arange(bev), indexing="ij")
        cells = torch.stack([u, v, torch.ones_like(u)], -1).reshape(-1, 3).to(torch.float32)
        self.register_buffer("cells", cells)  # (bev*bev, 3) homogeneous BEV cells
        self.register_buffer("homography", ipm_homography(height, width, bev).to(torch.float32))
        self.register_buffer("image_size", torch.tensor([float(width), float(height)]))

    def grid(self, height: int, width: int) -> Tensor:
        """The (1, bev, bev, 2) grid_sample grid for an input of ``height`` x ``width`` pixels,
        normalised for ``align_corners=False``; the homography was built for ``image_size`` and is
        rescaled to the actual input size."""
        p = self.cells @ self.homography.t()
        xy = p[:, :2] / p[:, 2:3]
        scale = torch.tensor([width, height], dtype=xy.dtype) / self.image_size
        g = (xy * scale + 0.5) / torch.tensor([width, height], dtype=xy.dtype) * 2 - 1
        return g.reshape(1, self.bev, self.bev, 2)

    def forward(self, x: Tensor) -> Tensor:
        f = torch.relu(self.stem(x))
        g = self.grid(x.shape[2], x.shape[3]).expand(x.shape[0], -1, -1, -1)
        w = F.grid_sample(f, g, mode="bilinear", padding_mode="zeros", align_corners=False)
        return self.head(w)
