"""The simulator's fixed GEMMs take the profile's rule for their op family and activation
dtype (``platform.gemm_contract(op_type, activation=dtype)``) and its fused-bound rule."""

from __future__ import annotations

import dataclasses

import torch
from bits import assert_bits_equal

from quantlab.numerics import (
    DType,
    GemmFamily,
    GemmRule,
    Overflow,
    Requant,
    Round,
    dequantize,
    qlinear,
    quantize,
)
from quantlab.platforms import load_platform
from quantlab.qconfig import QConfigSpec
from quantlab.simulate import Simulator
from quantlab.simulate.modes import Mode


def test_fixed_linear_takes_the_linear_rule_of_the_tflite_profile():
    platform = load_platform("tflite")
    linear = platform.gemm_contract("linear", activation=DType.INT8)
    assert linear != platform.gemm_contract()  # FLOAT64_RESCALE, not the conv rule
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 24)).eval()
    sim = Simulator(model, platform, QConfigSpec(use_platform_template=False))
    g = torch.Generator().manual_seed(0)
    sim.calibrate([(torch.randn(32, 48, generator=g),) for _ in range(2)])
    x = torch.randn(256, 48, generator=g)
    name = "0:linear#0"
    rq = sim.qconfig_of(name)
    xs = sim.act_scale(name, "in0", DType.INT8, rq)
    so = sim.act_scale(name, "out", DType.INT8, rq)
    wc, ws = sim.weight_q(name, model[0].weight, DType.INT8, True)
    xc = quantize(x, xs, DType.INT8, platform.fake_round)
    codes, _ = qlinear(xc, xs, wc, ws, model[0].bias.detach(), so, DType.INT8, linear)
    assert_bits_equal(sim.run(x, mode=Mode.FIXED), dequantize(codes, so))


def test_a_family_rule_changes_the_fixed_output():
    """A LINEAR rule that truncates gives its own bits, unlike the default rule's."""
    base = load_platform("tflite")
    rule = GemmRule(
        family=GemmFamily.LINEAR,
        activation=DType.INT8,
        requant=Requant.FLOAT64_RESCALE,
        requant_round=Round.TRUNC,
        accumulator_overflow=Overflow.WRAP,
    )
    platform = dataclasses.replace(base, gemm_rules=[rule])
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16)).eval()
    sim = Simulator(model, platform, QConfigSpec(use_platform_template=False))
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(32, 32, generator=g),) for _ in range(2)])
    x = torch.randn(128, 32, generator=g)
    name = "0:linear#0"
    rq = sim.qconfig_of(name)
    xs = sim.act_scale(name, "in0", DType.INT8, rq)
    so = sim.act_scale(name, "out", DType.INT8, rq)
    wc, ws = sim.weight_q(name, model[0].weight, DType.INT8, True)
    xc = quantize(x, xs, DType.INT8, platform.fake_round)
    b = model[0].bias.detach()
    want, _ = qlinear(
        xc, xs, wc, ws, b, so, DType.INT8, platform.gemm_contract("linear", activation=DType.INT8)
    )
    other, _ = qlinear(xc, xs, wc, ws, b, so, DType.INT8, platform.gemm_contract())
    y = sim.run(x, mode=Mode.FIXED)
    assert_bits_equal(y, dequantize(want, so))
    assert int((want != other).sum()) > 0
