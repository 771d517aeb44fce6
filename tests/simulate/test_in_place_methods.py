"""An op written as an in-place tensor method (``t.sigmoid_()``, ``t.clamp_(0, 6)``,
``t /= 4``) runs as the op it is: the same kernel, the same bits and the same row of the op
table as its out-of-place form. Before, these names were not known, so the op ran unmodelled in
float on the chip's input codes."""

from __future__ import annotations

import operator

import pytest
import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.simulate import Mode, Simulator

# name -> (in-place form, out-of-place form); each takes a fresh tensor it may write
PAIRS = {
    "sigmoid_": (lambda t: t.sigmoid_(), torch.sigmoid),
    "torch.sigmoid_": (lambda t: torch.sigmoid_(t), torch.sigmoid),
    "tanh_": (lambda t: t.tanh_(), torch.tanh),
    "exp_": (lambda t: t.exp_(), torch.exp),
    "log_": (lambda t: t.mul_(t).add_(0.1).log_(), lambda t: (t * t + 0.1).log()),
    "sqrt_": (lambda t: t.mul_(t).add_(0.1).sqrt_(), lambda t: (t * t + 0.1).sqrt()),
    "rsqrt_": (lambda t: t.mul_(t).add_(0.1).rsqrt_(), lambda t: (t * t + 0.1).rsqrt()),
    "reciprocal_": (
        lambda t: t.mul_(t).add_(0.5).reciprocal_(),
        lambda t: (t * t + 0.5).reciprocal(),
    ),
    "sin_": (lambda t: t.sin_(), torch.sin),
    "cos_": (lambda t: t.cos_(), torch.cos),
    "clamp_": (lambda t: t.clamp_(-0.5, 0.75), lambda t: t.clamp(-0.5, 0.75)),
    "clamp_ keywords": (lambda t: t.clamp_(min=0.0), lambda t: t.clamp(min=0.0)),
    "clip_": (lambda t: t.clip_(-0.25, 0.5), lambda t: t.clip(-0.25, 0.5)),
    "clamp_min_": (lambda t: t.clamp_min_(0.1), lambda t: t.clamp_min(0.1)),
    "clamp_max_": (lambda t: t.clamp_max_(0.2), lambda t: t.clamp_max(0.2)),
    "div_": (lambda t: t.div_(3.0), lambda t: t / 3.0),
    "/=": (lambda t: operator.itruediv(t, 4.0), lambda t: t / 4.0),
    "true_divide_": (lambda t: t.true_divide_(5.0), lambda t: t / 5.0),
    "divide_ by a tensor": (lambda t: t.divide_(t * t + 1), lambda t: t / (t * t + 1)),
    "multiply_": (lambda t: t.multiply_(0.75), lambda t: t * 0.75),
    "subtract_": (lambda t: t.subtract_(0.25), lambda t: t - 0.25),
}


class Net(nn.Module):
    """conv -> the op -> conv, and the op's output as a second result."""

    def __init__(self, op) -> None:
        super().__init__()
        self.op = op
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.head = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        y = self.op(self.conv(x))
        return self.head(y), y


def _twins(models, platform: str):
    """Simulators of the models (built with the same seed, so the same weights), calibrated on
    the same batches, and an input."""
    sims = []
    for make in models:
        torch.manual_seed(0)
        sims.append(Simulator(make().eval(), platform))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)]
    for sim in sims:
        sim.calibrate(batches, progress=False)
    return sims, torch.randn(2, 3, 8, 8, generator=g)


def _sims(name: str, platform: str):
    return _twins([lambda form=form: Net(form) for form in PAIRS[name]], platform)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_in_place_method_runs_as_its_out_of_place_op(name, platform):
    (in_place, twin), x = _sims(name, platform)
    table = in_place.ops.drop(columns=["name", "call_index"])
    assert table.to_dict("records") == twin.ops.drop(columns=["name", "call_index"]).to_dict(
        "records"
    )
    assert not in_place.ops["fixed_kernel"].str.startswith("float (not").any()
    for mode in (Mode.FAKE, Mode.FIXED):
        for p, q in zip(in_place.run(x, mode=mode), twin.run(x, mode=mode), strict=True):
            assert_bits_equal(p, q)


@pytest.mark.parametrize("name", ["clamp_", "clamp_max_", "/=", "sigmoid_", "rsqrt_"])
def test_in_place_method_runs_in_a_program_with_the_captured_runs_bits(name):
    (in_place, _), x = _sims(name, "j6m")
    for mode in (Mode.FAKE, Mode.FIXED):
        prog = in_place.program(x, mode=mode)
        for p, q in zip(prog(x), in_place.run(x, mode=mode), strict=True):
            assert_bits_equal(p, q)
        assert prog.fallbacks == 0


class WritesThroughViews(nn.Module):
    """In-place ops on views: one writes ``y`` through its permutation, which the next op
    reads; one writes a chunk of ``z``, whose other chunk is read unchanged."""

    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.in_place = in_place
        self.conv = nn.Conv2d(3, 6, 1)

    def forward(self, x):
        y = self.conv(x)
        z = torch.sigmoid(x)
        if self.in_place:
            y.permute(0, 1, 3, 2).add_(1.0)
            lo, hi = z.chunk(2, dim=1)
            lo.mul_(0.5)
        else:
            y = y + 1.0
            lo, hi = z.chunk(2, dim=1)
            lo = lo * 0.5
        return torch.tanh(y), hi * 2.0, lo


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_writes_through_views_reach_the_tensors_they_change(platform):
    """Fixed mode reads a tensor's codes from its side-table entry: a write through a view
    retires the entry of the tensor it changed (``y``, whose reader takes the values as
    written) and keeps the others (``hi``): the out-of-place twin's bits. Before, ``tanh`` read
    ``y``'s codes from before the write (0.6 off on average)."""
    models = [lambda: WritesThroughViews(True), lambda: WritesThroughViews(False)]
    sims, x = _twins(models, platform)
    for mode in (Mode.FAKE, Mode.FIXED):
        for p, q in zip(sims[0].run(x, mode=mode), sims[1].run(x, mode=mode), strict=True):
            assert_bits_equal(p, q)
