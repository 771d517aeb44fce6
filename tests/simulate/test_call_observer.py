"""``Simulator.trace(on_call=...)`` reports every captured call in execution order with the
quantization its activation inputs arrived with (read before an in-place op ran), its output
and a clamp's bounds, and leaves the run's results unchanged."""

from __future__ import annotations

import torch
from torch import nn

from quantlab.simulate import Mode, Simulator


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        y = torch.relu_(self.fc(x))
        return torch.clamp(y + x, min=0.25, max=2.0)


def test_on_call_reports_calls_inputs_and_bounds_without_changing_the_run():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    sim = Simulator(_Net().eval(), "onnxruntime")
    sim.calibrate([(x,)], progress=False)
    plain = sim.trace(x, mode=Mode.FIXED)
    seen = []
    observed = sim.trace(x, mode=Mode.FIXED, on_call=seen.append)
    assert torch.equal(observed.result, plain.result)
    assert [s.call.name for s in seen] == observed.order
    by_type = {s.call.op_type: s for s in seen}
    fc_out = plain.qinfo[seen[0].call.name]
    # relu_ is in place: it reports the linear's quantization it received, not its own output
    relu = by_type["relu"]
    assert relu.incoming[0].scale == fc_out.scale
    assert relu.output is not None
    assert seen[0].incoming == [None]  # the float model input
    assert by_type["clamp"].bounds == (0.25, 2.0)
    assert relu.bounds is None
