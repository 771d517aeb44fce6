"""MTCNN RNet and ONet face/non-face CNNs with the weights bundled by ``facenet-pytorch``.

The module definitions follow facenet_pytorch/models/mtcnn.py (MIT) with the same parameter
names, written here because importing facenet_pytorch imports torchvision. ``forward`` returns the
face-classification probabilities (B, 2) (column 1 = face); the bounding-box (and, for ONet,
landmark) regression heads keep their weights but are evaluated by ``forward_all`` only.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from quantlab.models import packages


class RNet(nn.Module):
    """MTCNN refinement net: (B, 3, 24, 24) with (255 x - 127.5) / 128 -> p (B, 2)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 28, 3)
        self.prelu1 = nn.PReLU(28)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(28, 48, 3)
        self.prelu2 = nn.PReLU(48)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(48, 64, 2)
        self.prelu3 = nn.PReLU(64)
        self.dense4 = nn.Linear(576, 128)
        self.prelu4 = nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.softmax5_1 = nn.Softmax(dim=1)
        self.dense5_2 = nn.Linear(128, 4)

    def features(self, x: Tensor) -> Tensor:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu3(self.conv3(x)).permute(0, 3, 2, 1).contiguous()
        return self.prelu4(self.dense4(x.reshape(x.shape[0], -1)))

    def forward(self, x: Tensor) -> Tensor:
        return self.softmax5_1(self.dense5_1(self.features(x)))

    def forward_all(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(box regression (B, 4), p (B, 2)), as facenet-pytorch returns them."""
        h = self.features(x)
        return self.dense5_2(h), self.softmax5_1(self.dense5_1(h))


class ONet(nn.Module):
    """MTCNN output net: (B, 3, 48, 48) with (255 x - 127.5) / 128 -> p (B, 2)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3)
        self.prelu1 = nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.prelu2 = nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(64, 64, 3)
        self.prelu3 = nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4 = nn.Conv2d(64, 128, 2)
        self.prelu4 = nn.PReLU(128)
        self.dense5 = nn.Linear(1152, 256)
        self.prelu5 = nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.softmax6_1 = nn.Softmax(dim=1)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def features(self, x: Tensor) -> Tensor:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x)).permute(0, 3, 2, 1).contiguous()
        return self.prelu5(self.dense5(x.reshape(x.shape[0], -1)))

    def forward(self, x: Tensor) -> Tensor:
        return self.softmax6_1(self.dense6_1(self.features(x)))

    def forward_all(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(box regression (B, 4), landmarks (B, 10), p (B, 2)), as facenet-pytorch returns them."""
        h = self.features(x)
        return self.dense6_2(h), self.dense6_3(h), self.softmax6_1(self.dense6_1(h))


def _load(net: nn.Module, file: str, what: str) -> nn.Module:
    path = packages.package_file(packages.FACENET, f"data/{file}", what)
    net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return net


def onet(pretrained: bool = True) -> ONet:
    """ONet with facenet-pytorch's ``data/onet.pt`` weights."""
    net = ONet()
    return (_load(net, "onet.pt", "model mtcnn_onet") if pretrained else net).eval()


def rnet(pretrained: bool = True) -> RNet:
    """RNet with facenet-pytorch's ``data/rnet.pt`` weights."""
    net = RNet()
    return (_load(net, "rnet.pt", "model mtcnn_rnet") if pretrained else net).eval()
