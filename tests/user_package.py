"""A user's own package written to a temporary folder (a small module, a factory, a metric) and
a folder of real images from scikit-image, for the tests of ``model=custom`` / ``data=images``."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from quantlab.models import packages

PACKAGE = "userpkg_quantlab_test"

NETS = '''
import torch
from torch import nn


class Tiny(nn.Module):
    """conv-bn-relu, strided conv-relu, global mean, linear: a small classifier."""

    def __init__(self, width=8, classes=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=2, padding=1)
        self.head = nn.Linear(width, classes)
        with torch.no_grad():  # an inference BatchNorm that is not the identity
            self.bn1.running_mean.uniform_(-0.2, 0.2)
            self.bn1.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.head(x.mean((2, 3)))


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 4)
        self.b = nn.Linear(3, 4)

    def forward(self, x, y):
        z = self.a(x) * torch.sigmoid(self.b(y))
        return z, z.sum(1)


class Masked(nn.Module):
    """Causal self-attention by masked_fill of -inf (a mask quantization cannot hold)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        n = x.shape[1]
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = (q @ k.transpose(-2, -1)).masked_fill(future, float("-inf"))
        return torch.softmax(scores, -1) @ v


def build(width=8, classes=5):
    return Tiny(width, classes)


def masked():
    return Masked()


def two_inputs():
    return TwoInputs()


class Tokens(nn.Module):
    """Token ids through an embedding table, then positions by indexing a table, a 0/1 mask
    and a mean over tokens: a small text classifier."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(50, 16)
        self.places = nn.Parameter(torch.randn(12, 16))
        self.head = nn.Linear(16, 3)

    def forward(self, ids, places, mask):
        h = (self.words(ids) + self.places[places]) * mask.unsqueeze(-1).float()
        return self.head(h.sum(1) / mask.sum(1, keepdim=True).clamp(min=1))


def tokens():
    return Tokens()


def not_a_module():
    return {"weights": 1}


def agreement(ref, test, labels):
    """Share of items whose arg-max matches float (a user's own top-1)."""
    r, t = torch.cat(ref).argmax(1), torch.cat(test).argmax(1)
    return float((r == t).double().mean())


def label_accuracy(ref, test, labels):
    """Accuracy of the tested run against the data's labels."""
    t = torch.cat(test).argmax(1)
    return float((t == torch.cat(labels)).double().mean())


def not_a_number(ref, test, labels):
    return "high"
'''

SKIMAGE_IMAGES = ("astronaut.png", "camera.png", "chelsea.png", "coffee.png", "rocket.jpg")
SKIMAGE_IMAGES += ("coins.png", "page.png", "text.png")


def write_package(root: Path) -> str:
    """Write the package under ``root`` (put ``root`` on sys.path); returns its import name."""
    pkg = root / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(textwrap.dedent(NETS))
    return PACKAGE


def image_folder(folder: Path, names: tuple[str, ...] = SKIMAGE_IMAGES) -> Path:
    """Copy real images shipped by scikit-image into ``folder`` (sorted order = ``names`` order
    is not assumed)."""
    folder.mkdir(parents=True, exist_ok=True)
    src = packages.package_dir(packages.SKIMAGE, "test images") / "data"
    for name in names:
        shutil.copy(src / name, folder / name)
    return folder
