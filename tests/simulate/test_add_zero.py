"""x + 0 (a model branch left empty, as MobileOne's reparameterized blocks add 0 when a branch
is absent): the integer add of a zero code at x's scale, not a float fallback; every spelling
gives the same codes, steady runs and programs keep them, and onnxruntime gives them too."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import nn

from quantlab.simulate import Mode, Simulator


class _AddsZero(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.a, self.b, self.how = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 4, 3), how

    def forward(self, x):
        y = self.a(x)
        if self.how == "x+0":
            y = y + 0
        elif self.how == "0+x":
            y = 0 + y
        elif self.how == "x+0.0":
            y = y + 0.0
        else:
            y = y - 0
        return self.b(torch.tanh(y))


def _sim(how: str, platform: str, **kw) -> Simulator:
    torch.manual_seed(0)
    sim = Simulator(_AddsZero(how).eval(), platform, **kw)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)], progress=False)
    return sim


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_adding_zero_is_an_integer_add_in_every_spelling(platform, monkeypatch):
    build_in_first_run(monkeypatch)
    xs = [torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(s)) for s in (2, 3)]
    ref = None
    for how in ("x+0", "0+x", "x+0.0", "x-0"):
        sim = _sim(how, platform)
        outs = [sim.run(x, mode=Mode.FIXED) for x in xs * 2]  # the later runs: a program
        (name,) = [n for n in sim.ops.name if ":add#" in n or ":sub#" in n]
        row = sim.ops.set_index("name").loc[name]
        assert not row.fixed_in_float, how  # its kernel took the call (onnxruntime: a sub
        # runs between DequantizeLinear and QuantizeLinear, its kernel so)
        ref = ref or outs
        for got, want in zip(outs, ref, strict=True):
            assert_bits_equal(got, want)
        # one output code of the add from its fake value at most
        tr, fk = sim.trace(xs[0], mode=Mode.FIXED), sim.trace(xs[0], mode=Mode.FAKE)
        lsb = float(tr.qinfo[name].scale)
        assert float((tr.outputs[name] - fk.outputs[name]).abs().max()) <= lsb * 1.0001


@pytest.mark.parametrize("how", ["x+0", "0+x", "x-0"])
def test_adding_zero_exports_with_fixed_modes_bits(how, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from quantlab.export import to_onnx_qdq
    from quantlab.export.ort_host import onnxruntime_profile

    sim = _sim(how, onnxruntime_profile())
    g = torch.Generator().manual_seed(4)
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", (torch.randn(2, 3, 8, 8, generator=g),))
    session = ort.InferenceSession(str(info.path))
    for scale in (0.5, 1.0, 4.0):
        x = torch.randn(2, 3, 8, 8, generator=g) * scale
        (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        assert_bits_equal(torch.from_numpy(got), sim.run(x, mode=Mode.FIXED))
