"""Float16 overflow: values beyond +-65504 are counted per op (before saturation) in the op
tables, in fake and fixed mode; an int8 platform counts none."""

from __future__ import annotations

import torch
from torch import nn

from quantlab.simulate import Mode, Simulator, View

LIMIT = 65504.0


class Amplify(nn.Module):
    """A linear layer, then a multiply whose output leaves the float16 range."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(8))
            self.fc.bias.zero_()

    def forward(self, x):
        return self.fc(x) * 40000.0


def _x():
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(3)) * 2.0


def test_overflow_is_counted_per_op_where_an_output_exceeds_65504():
    x = _x()
    sim = Simulator(Amplify(), "j6p")
    sim.calibrate([(x,)])
    for mode in (Mode.FAKE, Mode.FIXED):
        y = sim.run(x, mode=mode)
        assert float(y.abs().max()) == LIMIT  # saturated, not inf
        # the mul's float16 input is the fc output at float16 (fixed: int8 x int8 -> float16);
        # the expected count is recomputed from what the mul received, before its output cast
        mul_in = sim.trace(x, mode=mode).outputs["fc:linear#0"]
        expected = int((mul_in.to(torch.float32) * 40000.0).abs().gt(LIMIT).sum())
        assert expected > 10
        assert sim.float16_overflow == {":mul#0": expected}
        ops = sim.ops.set_index("name")
        assert ops.at[":mul#0", "float16_overflow"] == expected
        assert ops.at["fc:linear#0", "float16_overflow"] == 0


def test_compare_table_shows_the_overflow_and_int8_platforms_count_none():
    x = _x()
    sim = Simulator(Amplify(), "j6p")
    sim.calibrate([(x,)])
    t = sim.compare(x, a=Mode.FLOAT, b=Mode.FAKE, view=View.ACCUMULATED).set_index("name")
    assert t.at[":mul#0", "float16_overflow"] > 0
    assert t.at["fc:linear#0", "float16_overflow"] == 0
    m = Simulator(Amplify(), "j6m")
    m.calibrate([(x,)])
    m.run(x, mode=Mode.FIXED)
    assert m.float16_overflow == {} and (m.ops["float16_overflow"] == 0).all()
