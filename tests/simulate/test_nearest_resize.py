"""Nearest and nearest-exact F.interpolate in fixed mode select the pixels the float model
reads (torch's float32 mapping, ``numerics.torch_nearest``), then requantize to the op's
output: on J6 both modes, on the onnxruntime profiles nearest-exact (their nearest follows
onnxruntime's Resize: tests/runtime/test_ort_resize.py). The sizes are ones where torch's
float64 mapping reads other pixels, and the reference is the float model's own interpolate of
the op's input values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from test_zero_point_ops import _observe, _requant_reference
from torch import nn

from quantlab.simulate import Simulator

CALLS = [  # on a 2 x 2 map, torch's float64 mapping reads other pixels for each of these
    dict(mode="nearest", size=(82, 82)),
    dict(mode="nearest-exact", size=(20, 115)),
    dict(mode="nearest-exact", scale_factor=(40.5, 30.5)),
    dict(mode="nearest", scale_factor=(41.0, 41.0)),
]


class _Upsampled(nn.Module):
    def __init__(self, channels_last: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.channels_last = channels_last

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        if self.channels_last:
            y = y.contiguous(memory_format=torch.channels_last)
        return [F.interpolate(y, **kw).mean((2, 3)) for kw in CALLS]


@pytest.mark.parametrize(
    ("platform", "modes"),
    [("j6m", {"nearest", "nearest-exact"}), ("onnxruntime", {"nearest-exact"})],
)
@pytest.mark.parametrize("channels_last", [False, True])
def test_nearest_selects_the_float_models_pixels(platform, modes, channels_last, monkeypatch):
    torch.manual_seed(0)
    sim = Simulator(_Upsampled(channels_last).eval(), platform)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 2, 2, generator=g),) for _ in range(2)], progress=False)
    inputs = {}

    def record(oc):
        inputs[oc.call.name] = oc.call.args[0]

    trace, seen, fell_back = _observe(sim, torch.randn(2, 3, 2, 2, generator=g), monkeypatch,
                                      record)  # fmt: skip
    assert fell_back == [], fell_back
    names = [n for n in trace.order if n.endswith(tuple(f"interpolate#{k}" for k in range(4)))]
    checked = 0
    for name, kw in zip(names, CALLS, strict=True):
        if kw["mode"] not in modes:
            continue
        x, xi = inputs[name], seen[name][1][0]
        sel = xi.codes_of(F.interpolate(x, **kw)).to(torch.int64) - xi.zero_point
        got = trace.qinfo[name]
        assert_bits_equal(got.codes, _requant_reference(sim.platform, sel, xi.scale, got))
        checked += 1
    assert checked == len(modes) * 2


def test_float64_codes_would_read_other_pixels_here():
    """The premise of the sizes above: on this 2 x 2 map, torch's float64 mapping moves the
    selection of both modes."""
    x = torch.randn(1, 1, 2, 2)
    for kw in CALLS:
        a, b = F.interpolate(x, **kw), F.interpolate(x.double(), **kw)
        assert not torch.equal(a.double(), b), kw
