"""PReLU as a segment-LUT op: one leaky_relu table per channel at its slope (one table for a
single slope), in fixed mode, in deployed-table training with the tables' own slopes as the
gradient, and on int16 codes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut, default_spec
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import FakeOps, Mode, Simulator

SLOPES = (0.05, 0.25, -0.2, 0.8)


class _Net(nn.Module):
    def __init__(self, channels: int = len(SLOPES)) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, len(SLOPES), 3, padding=1)
        self.act = nn.PReLU(channels)
        with torch.no_grad():
            self.act.weight.copy_(torch.tensor(SLOPES[:channels]))

    def forward(self, x):
        return self.act(self.conv(x))


def _sim(channels: int, spec: QConfigSpec | None = None, fake_ops=FakeOps.QAT):
    torch.manual_seed(0)
    sim = Simulator(_Net(channels).eval(), "j6m", spec, fake_ops=fake_ops)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 6, 6, generator=g) * 2,) for _ in range(2)], progress=False)
    return sim, torch.randn(2, 3, 6, 6, generator=g) * 2


def _known_scales(dtype: DType, scale: float) -> QConfigSpec:
    """The convolution's output and the PReLU's at ``dtype`` with fixed scale ``scale``."""
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype, observer="FIXED", fixed_scale=scale)
    return QConfigSpec(by_name=dict.fromkeys(("conv:conv2d#0", "act:prelu#0"), rule))


@pytest.mark.parametrize("channels", [1, len(SLOPES)])
@pytest.mark.parametrize(("dtype", "scale"), [(DType.INT8, 2.0**-4), (DType.INT16, 2.0**-11)])
def test_each_channel_goes_through_the_leaky_relu_table_of_its_slope(channels, dtype, scale):
    """int8: the direct tables; int16: segment tables (two per channel, meeting at 0)."""
    sim, x = _sim(channels, _known_scales(dtype, scale))
    assert sim.ops.set_index("name").at["act:prelu#0", "fixed_kernel"] == "lut"
    trace = sim.trace(x, mode=Mode.FIXED)
    codes = (trace.outputs["conv:conv2d#0"] / scale).to(dtype.torch_dtype)  # exact: powers of 2
    fixed = sim.run(x, mode=Mode.FIXED)
    for c in range(len(SLOPES)):
        slope = float(torch.tensor(SLOPES[c if channels > 1 else 0]))  # the float32 weight
        spec = dataclasses.replace(default_spec("leaky_relu"), negative_slope=slope)
        table = build_lut("leaky_relu", dtype, scale, dtype, scale, spec)
        assert_bits_equal(fixed[:, c], table.evaluate(codes[:, c]).to(torch.float32) * scale)


def test_deployed_training_takes_each_tables_slope_as_the_gradient():
    """A deployed-table training forward gives the FAKE run's bits; the input's gradient through
    each channel's int16 table is that table's slope: about the channel's PReLU slope below 0."""
    sim, x = _sim(len(SLOPES), fake_ops=FakeOps.DEPLOYED)
    y = sim.train_forward(x)
    assert_bits_equal(y.detach(), sim.run(x, mode=Mode.FAKE))
    conv = sim.trace(x, mode=Mode.FLOAT).outputs["conv:conv2d#0"].requires_grad_(True)
    int16 = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)  # segment tables
    spec = QConfigSpec(by_type={"prelu": int16})
    probe = Simulator(nn.PReLU(len(SLOPES)).eval(), "j6m", spec, fake_ops=FakeOps.DEPLOYED)
    with torch.no_grad():
        probe.model.weight.copy_(torch.tensor(SLOPES))
    probe.calibrate([(conv.detach(),)], progress=False)
    out = probe.train_forward(conv)
    out.sum().backward()
    negative = conv.detach() < -0.5
    for c, slope in enumerate(SLOPES):
        g = conv.grad[:, c][negative[:, c]]
        assert g.numel() > 0 and torch.allclose(g, torch.full_like(g, slope), atol=0.1)
