"""A toy model for the recipe's end-to-end tests (``model=custom model.target=recipe_toy:build``):
fc2 feeds sin near 200 rad, so its int8 output wrecks the model output and int16 repairs it."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from quantlab.models.tasks import Top1Agreement


class FragileSin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        with torch.no_grad():
            for m in (self.fc1, self.fc2, self.fc3):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.in_features**0.5)
                m.bias.zero_()
            self.fc2.bias.fill_(200.0)

    def forward(self, x):
        return self.fc3(torch.sin(self.fc2(torch.relu(self.fc1(x)))))


def build() -> nn.Module:
    return FragileSin()


def agreement(ref_outputs, test_outputs, labels=None) -> float:
    """Top-1 agreement with the float model's outputs."""
    return Top1Agreement()(ref_outputs, test_outputs)


def write_inputs(path, items: int = 64) -> None:
    """``items`` calibration and evaluation inputs (one row each) as an .npz tensor file."""
    x = torch.randn(items, 8, generator=torch.Generator().manual_seed(1)).numpy()
    np.savez(path, calib=x, eval=x)
