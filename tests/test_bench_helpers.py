"""The simulator benchmark's helpers on a small model (the benchmark itself is not a test)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_simulate  # noqa: E402

from quantlab.simulate import Mode, Simulator  # noqa: E402


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.conv2 = nn.Conv2d(4, 4, 1)  # its input arrives quantized: a prepared fake quant
        self.head = nn.Linear(4 * 9, 2)

    def forward(self, x):
        h = torch.relu(self.conv2(self.conv(x)))
        return self.head(h.reshape(h.shape[0], -1).contiguous())  # layout ops: pass-through


def test_fake_quant_passes_and_the_captured_run_cover_a_model_with_layout_ops():
    torch.manual_seed(0)
    m = _Net().eval()
    x = (torch.randn(2, 3, 3, 3),)
    sim = Simulator(m, "j6m")
    sim.calibrate([x], progress=False)
    for _ in range(2):
        sim.run(*x, mode=Mode.FAKE)
    assert any(p.passes for p in sim._prepared.values())  # a pass-through op was prepared
    assert any(not p.passes for p in sim._prepared.values())
    bench_simulate.fake_quant_passes(sim)()  # only the ops with a fake quant
    with torch.no_grad():
        want = m(*x)
    assert torch.equal(bench_simulate.captured_runner(m, x)(), want)
