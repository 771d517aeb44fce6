"""sin/cos ``single_period`` per op: the plugin's custom op reduces a wide input to one period
in QAT and in the deployed op, whatever the exporter (``platform.sincos_period_reduction``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.periodic import period_reduce
from quantlab.numerics.quantize import dequantize
from quantlab.platforms import load_platform
from quantlab.qconfig import OpQConfig, QConfigSpec, load, save
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.qat import qat_fake_quant


class Wave(nn.Module):
    def forward(self, x):
        return torch.sin(x) * torch.cos(x)


def _sim(platform, single_period: bool):
    q = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16, single_period=single_period)
    sim = Simulator(Wave(), platform, QConfigSpec(by_type={"sin": q, "cos": q}))
    g = torch.Generator().manual_seed(0)
    sim.calibrate([(torch.rand(64, generator=g) * 40 - 20,)], progress=False)
    return sim, (torch.rand(64, generator=g) * 40 - 20,)


def _op(sim, op_type):
    return next(n for n, i in sim._info.items() if i.op_type == op_type)


def test_single_period_fixed_reduces_without_the_exporter():
    j6m = load_platform("j6m")
    off = dataclasses.replace(j6m, sincos_period_reduction=False)
    want = _sim(j6m, False)  # the exporter reduces
    got = _sim(off, True)  # the exporter does not; the op does
    plain = _sim(off, False)
    for op in ("sin", "cos"):
        a = want[0].trace(*want[1], mode=Mode.FIXED).outputs[_op(want[0], op)]
        b = got[0].trace(*got[1], mode=Mode.FIXED).outputs[_op(got[0], op)]
        c = plain[0].trace(*plain[1], mode=Mode.FIXED).outputs[_op(plain[0], op)]
        assert_bits_equal(b, a)
        assert not torch.equal(c, a)


def test_single_period_fake_is_the_function_of_the_reduced_input():
    sim, x = _sim("j6m", True)
    name = _op(sim, "sin")
    rq = sim.qconfig_of(name)
    s_in = sim.act_scale(name, "in0", DType.INT16, rq)
    s_out = sim.act_scale(name, "out", DType.INT16, rq)
    seen = {}

    def keep(call):
        if call.call.name == name:
            seen["out"] = call.output

    sim.trace(*x, mode=Mode.FAKE, on_call=keep)
    xq = qat_fake_quant(x[0], s_in, DType.INT16, sim.platform.fake_round)
    codes = torch.round(xq / s_in).to(torch.int64)
    rc, rs = period_reduce(codes, float(s_in), DType.INT16, sim.platform.fake_round)
    xr = dequantize(rc.to(torch.int64), torch.tensor(rs, dtype=torch.float32))
    want = qat_fake_quant(torch.sin(xr), s_out, DType.INT16, sim.platform.fake_round)
    assert_bits_equal(seen["out"], want)
    plain, _ = _sim("j6m", False)
    assert not torch.equal(plain.run(*x, mode=Mode.FAKE), sim.run(*x, mode=Mode.FAKE))


def test_single_period_gradient_passes_through_the_reduction():
    sim, x = _sim("j6m", True)
    xg = x[0].clone().requires_grad_(True)
    sim.train_forward(xg).sum().backward()
    assert xg.grad is not None and float(xg.grad.abs().sum()) > 0


def test_single_period_in_a_qconfig_file(tmp_path):
    spec = QConfigSpec(by_type={"sin": OpQConfig(single_period=True)})
    save(spec, tmp_path / "q.yaml")
    assert load(tmp_path / "q.yaml").by_type["sin"].single_period is True
    (tmp_path / "bad.yaml").write_text("by_type: {sin: {single_period: 1}}\n")
    with pytest.raises(ValueError, match="single_period must be true or false"):
        load(tmp_path / "bad.yaml")
    assert OpQConfig().single_period is None
