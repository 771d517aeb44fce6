"""pow with a scalar exponent as the vendor builds it: the exponent 2 is the platform's product
of x with itself (a MUL op), any other exponent a segment LUT of x ** e; a tensor of exponents
and a scalar base are not modelled (float)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut, default_spec
from quantlab.numerics.requant import requant_scale
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator


class _Squares(nn.Module):
    """x ** 2 in each way torch spells it (an exponent tensor as ONNX converters write it),
    beside x * x."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.register_buffer("two", torch.tensor([2.0]))

    def forward(self, x):
        y = self.conv(x)
        inplace = y.clone()
        inplace.pow_(2)
        return y * y, y**2, torch.pow(y, self.two), y.pow(2.0), inplace


def _calibrated(model, platform, spec=None, seed=0):
    torch.manual_seed(seed)
    sim = Simulator(model.eval(), platform, spec)
    g = torch.Generator().manual_seed(seed + 1)
    sim.calibrate([(torch.randn(2, 3, 6, 6, generator=g),) for _ in range(2)], progress=False)
    return sim, [torch.randn(2, 3, 6, 6, generator=g) * s for s in (0.5, 1.0, 4.0)]


@pytest.mark.parametrize("platform", ["j6m", "j6p", "tflite", "onnxruntime"])
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_the_square_is_the_platforms_product_of_x_with_itself(platform, dtype):
    """Every spelling of x ** 2 gives x * x's bits (its output scale calibrated alike); each is
    a MUL op whose kernel says so."""
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype)
    spec = QConfigSpec(by_type={t: rule for t in ("conv2d", "mul", "pow")})
    sim, xs = _calibrated(_Squares(), platform, spec)
    pows = sim.ops[sim.ops.op_type == "pow"]
    assert len(pows) == 4 and set(pows["category"]) == {"MUL"}
    assert all(k.startswith("x * x (the exponent 2) as mul") for k in pows["fixed_kernel"])
    for x in xs:
        product, *squares = sim.run(x, mode=Mode.FIXED)
        for s in squares:
            assert_bits_equal(s, product)


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_the_square_on_j6m_is_the_integer_reference(dtype):
    """J6M: codes (x_q)^2 requantized by s_x^2 / s_out (MUL_SHIFT, HALF_UP) as the reference
    computes it, from the input codes of the trace."""
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype)
    sim, xs = _calibrated(_Squares(), "j6m", QConfigSpec(by_type={"conv2d": rule, "pow": rule}))
    plat = sim.platform
    for x in xs:
        trace = sim.trace(x, mode=Mode.FIXED)
        xin = trace.qinfo["conv:conv2d#0"]
        xc = xin.codes.to(torch.int64)
        info = trace.qinfo[":pow#0"]
        real = requant_scale(xin.scale, xin.scale, info.scale, plat.requant)
        want = reference.requantize(
            xc * xc, real, plat.requant, dtype, plat.requant_round, None, plat.requant_mult_bits
        )
        assert_bits_equal(info.codes.to(torch.int64), torch.from_numpy(want))


class _Power(nn.Module):
    def __init__(self, exponent: float):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.exponent = exponent

    def forward(self, x):
        return torch.pow(self.conv(x), self.exponent)


@pytest.mark.parametrize("exponent", [0.5, 3.0, -1.0, 1.5])
@pytest.mark.parametrize(("dtype", "scale"), [(DType.INT8, 2.0**-4), (DType.INT16, 2.0**-11)])
def test_other_exponents_go_through_the_table_of_x_to_the_e(exponent, dtype, scale):
    """int8: the direct table; int16: J6's segment tables, built for the call's exponent over
    the calibrated input range."""
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype, observer="FIXED", fixed_scale=scale)
    spec = QConfigSpec(by_name=dict.fromkeys(("conv:conv2d#0", ":pow#0"), rule))
    sim, xs = _calibrated(_Power(exponent), "j6m", spec)
    row = sim.ops.set_index("name").loc[":pow#0"]
    assert (row["category"], row["fixed_kernel"]) == ("LUT", "lut")
    table_spec = dataclasses.replace(default_spec("pow"), exponent=exponent)
    seen = sim.observed_range(":pow#0", "in0")
    table = build_lut("pow", dtype, scale, dtype, scale, table_spec, observed_range=seen)
    for x in xs:
        trace = sim.trace(x, mode=Mode.FIXED)
        codes = (trace.outputs["conv:conv2d#0"] / scale).to(dtype.torch_dtype)  # powers of 2
        want = table.evaluate(codes).to(torch.float32) * scale
        assert_bits_equal(sim.run(x, mode=Mode.FIXED), want)
    # the table follows x ** e where it is defined and the output does not saturate
    x = torch.linspace(0.25, 1.5, 41)
    codes = torch.round(x / scale).to(dtype.torch_dtype)
    got = table.evaluate(codes).double() * scale
    ideal = (codes.double() * scale) ** exponent
    inside = ideal.abs() < dtype.qmax * scale
    lsb = 3 if dtype is DType.INT8 else 40  # direct: rounding; segment tables: interpolation
    assert inside.sum() > 10
    assert float((got - ideal)[inside].abs().max()) <= lsb * scale


class _NotModelled(nn.Module):
    def forward(self, x):
        return torch.pow(x, torch.tensor([2.0, 3.0])), 2.0**x


def test_a_tensor_of_exponents_and_a_scalar_base_run_in_float():
    sim = Simulator(_NotModelled().eval(), "j6m")
    sim.calibrate([(torch.rand(3, 2),)], progress=False)
    assert set(sim.ops["category"]) == {"NONE"}
    x = torch.rand(3, 2)
    for got, want in zip(sim.run(x, mode=Mode.FIXED), _NotModelled()(x), strict=True):
        assert np.array_equal(got.numpy(), want.numpy())
