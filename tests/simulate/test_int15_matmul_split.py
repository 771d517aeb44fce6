"""The int15 MatMul split (weight_split on a MatMul of two activations) in the simulator: its
second operand arrives as int16 and runs as two int8 passes, on J6M even where dual int16 is
refused; fake and fixed agree, and the precision lies between int8 and int16."""

import dataclasses

import pytest
import torch
from torch import nn

from quantlab.analysis.cost import model_cost
from quantlab.analysis.metrics import sqnr_db
from quantlab.numerics.dtypes import DType
from quantlab.platforms import Toolchain
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.profiles import platform_config


class _Scores(nn.Module):
    def forward(self, q, kt):
        return q @ kt


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 16, 32, generator=g), torch.randn(2, 32, 16, generator=g)


def _sim(platform, **rule):
    base = dict(output_dtype=DType.INT16, high_precision_output=False)
    sim = Simulator(_Scores(), platform, QConfigSpec(by_type={"matmul": OpQConfig(**base, **rule)}))
    sim.calibrate([_inputs()], progress=False)
    return sim


def test_split_matmul_runs_on_an_old_toolchain_between_int8_and_int16():
    old = dataclasses.replace(platform_config("j6m"), toolchain=Toolchain.OE_3_2_0)
    x = _inputs()
    ref = x[0] @ x[1]
    with pytest.raises(ValueError, match="toolchain"):
        _sim(old, input_dtype=DType.INT16)  # dual int16 is refused there
    split = _sim(old, input_dtype=DType.INT8, weight_split=7)
    row = split.ops.iloc[0]
    assert row["input_dtype"] == "INT8,INT16" and row["weight_split"] == 7
    fixed = split.run(*x, mode=Mode.FIXED)
    fake = split.run(*x, mode=Mode.FAKE)
    new = dataclasses.replace(old, toolchain=Toolchain.OE_3_5_0)
    q8 = _sim(old, input_dtype=DType.INT8).run(*x, mode=Mode.FIXED)
    q16 = _sim(new, input_dtype=DType.INT16).run(*x, mode=Mode.FIXED)
    s8, s15, s16 = sqnr_db(ref, q8), sqnr_db(ref, fixed), sqnr_db(ref, q16)
    assert s15 > s8 + 1.5  # B's half of the int8 noise gone (at most +3 dB: A stays int8)
    assert s16 > s15
    assert sqnr_db(fake, fixed) > 60  # QAT and deployed values of the split agree
    ops8 = _sim(old, input_dtype=DType.INT8).ops
    assert model_cost(split.ops, True) > 2 * model_cost(ops8, True)  # two int8 passes


def test_fixed_split_matmul_is_the_kernel_on_the_operand_codes():
    """The simulator's fixed output is split_int15_matmul of the quantized operands' codes."""
    from quantlab.numerics.quantize import quantize
    from quantlab.numerics.split_matmul import split_int15_matmul

    j6m = platform_config("j6m")
    sim = _sim(j6m, input_dtype=DType.INT8, weight_split=7)
    x = _inputs()
    name = ":matmul#0"
    rq = sim.qconfig_of(name)
    sa = sim.act_scale(name, "in0", DType.INT8, rq)
    sb = sim.act_scale(name, "in1", DType.INT16, rq)
    so = sim.act_scale(name, "out", DType.INT16, rq)
    a = quantize(x[0], sa, DType.INT8, j6m.fake_round)
    b = quantize(x[1], sb, DType.INT16, j6m.fake_round)
    want = split_int15_matmul(
        a,
        b,
        float(sa),
        float(sb),
        7,
        float(so),
        DType.INT16,
        j6m.weight_split_combine,
        rounding=j6m.requant_round,
        operand_rounding=j6m.fake_round,
        scheme=j6m.requant,
    )
    got = sim.run(*x, mode=Mode.FIXED)
    assert torch.equal(got, want.to(torch.float32) * so)
