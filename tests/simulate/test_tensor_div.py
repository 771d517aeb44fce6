"""Division by a tensor: on J6 (``TensorDivRule.RECIPROCAL_TABLE``) x times a reciprocal
segment LUT of the divisor, whose int16 scale is calibrated on 1 / y; on the runtime profiles
float between dequantize and quantize, as before. And a scalar constant added under the TFLite
reference ADD (LEFT_SHIFT) is the int8 constant a LiteRT model holds."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut
from quantlab.numerics.requant import requant_scale
from quantlab.platforms import TensorDivRule, load_platform
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator


class _Ratio(nn.Module):
    """x / y for a divisor of one sign away from 0, and for one through a sqrt (a LayerNorm
    written out, as ONNX exports it)."""

    def __init__(self):
        super().__init__()
        self.num = nn.Conv2d(3, 4, 1)
        self.den = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.num(x)
        z = torch.sigmoid(self.den(x)) + 0.25
        return y / z, torch.div(y, z.sqrt())


def _calibrated(platform, spec=None, seed=0):
    torch.manual_seed(seed)
    sim = Simulator(_Ratio().eval(), platform, spec)
    g = torch.Generator().manual_seed(seed + 1)
    sim.calibrate([(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(3)], progress=False)
    return sim, [torch.randn(2, 3, 8, 8, generator=g) * s for s in (0.5, 1.0, 2.0)]


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_j6_divides_by_a_reciprocal_table_and_the_platforms_product(dtype):
    """Codes: T(y_q) the int16 reciprocal table on the divisor's codes (its range from
    calibration), then (x_q * T(y_q)) requantized by s_x s_r / s_out (MUL_SHIFT, HALF_UP),
    as the reference computes it."""
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype)
    spec = QConfigSpec(by_type={t: rule for t in ("conv2d", "add", "sqrt", "div", "sigmoid")})
    sim, xs = _calibrated("j6m", spec)
    plat = sim.platform
    divs = sim.ops[sim.ops.op_type == "div"]
    assert set(divs["fixed_kernel"]) == {
        "integer (scalar divisor; tensor divisor: times its reciprocal lut)"
    }
    for name, divisor in ((":div#0", ":add#0"), (":div#1", ":sqrt#0")):
        sr = sim.act_scale(name, "recip", DType.INT16, sim.qconfig_of(name))
        seen = sim.observed_range(name, "in1")
        for x in xs:
            trace = sim.trace(x, mode=Mode.FIXED)
            xq, yq, out = (trace.qinfo[n] for n in ("num:conv2d#0", divisor, name))
            table = build_lut(
                "reciprocal",
                yq.dtype,
                float(yq.scale),
                DType.INT16,
                float(sr),
                plat.lut_spec("reciprocal"),
                plat.lut_format(),
                seen,
            )
            r = table.evaluate(yq.codes).to(torch.int64)
            acc = xq.codes.to(torch.int64) * r
            real = requant_scale(xq.scale, sr, out.scale, plat.requant)
            want = reference.requantize(
                acc, real, plat.requant, dtype, plat.requant_round, None, plat.requant_mult_bits
            )
            assert_bits_equal(out.codes.to(torch.int64), torch.from_numpy(want))


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_the_reciprocal_table_is_within_one_code_of_the_quotient(dtype):
    """Inputs like the calibration's: the table's quotient codes are within one code of the
    float quotient of the same codes (``TensorDivRule.FLOAT``). Divisors beyond the calibrated
    range meet the table's extrapolated tails and can differ more (thousands of int16 codes
    at twice the calibration's spread)."""
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype)
    sim, xs = _calibrated("j6m", QConfigSpec(global_=rule))
    table_rule = sim.platform
    float_rule = dataclasses.replace(table_rule, tensor_div_rule=TensorDivRule.FLOAT)
    for x in xs[:2]:
        traces = []
        for p in (table_rule, float_rule):
            sim.platform = p
            traces.append(sim.trace(x, mode=Mode.FIXED))
        for name in (":div#0", ":div#1"):
            a, b = (t.qinfo[name].codes.to(torch.int64) for t in traces)
            assert int((a - b).abs().max()) <= 1


def test_the_runtime_profiles_divide_in_float_between_dequantize_and_quantize():
    """onnxruntime (Div on dequantized float32 values) and a J6 profile told FLOAT: the
    quotient of the dequantized inputs, quantized once."""
    for platform in ("onnxruntime", "j6m"):
        sim, xs = _calibrated(platform)
        if platform == "j6m":
            sim.platform = dataclasses.replace(sim.platform, tensor_div_rule=TensorDivRule.FLOAT)
        trace = sim.trace(xs[1], mode=Mode.FIXED)
        x, y, q = (trace.qinfo[n] for n in ("num:conv2d#0", ":add#0", ":div#0"))
        xv = x.codes.float().sub(x.zero_point) * x.scale
        yv = y.codes.float().sub(y.zero_point) * y.scale
        want = torch.round(xv / yv / q.scale) + q.zero_point
        want = want.clamp(q.dtype.qmin, q.dtype.qmax)
        assert torch.equal(q.codes.to(torch.float32), want)


class _ByACount(nn.Module):
    """A mean pool's division by a count of one value (MiniLM's token count): the divisor's
    reciprocal saturates every code of its table at the calibrated scale."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        count = torch.ones_like(y[:, :1]).sum((2, 3), keepdim=True)
        return y.sum((2, 3), keepdim=True) / count


def test_a_divisor_of_one_value_takes_a_table_without_the_inverse_rule():
    """The inverse-function rule would leave the table less than one input code; the table
    then covers the divisor's range without it, and the quotient stays within one code of
    the float quotient."""
    torch.manual_seed(0)
    sim = Simulator(_ByACount().eval(), "j6m")
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 4, 4, generator=g),) for _ in range(2)], progress=False)
    x = torch.randn(2, 3, 4, 4, generator=g)
    table = sim.trace(x, mode=Mode.FIXED).qinfo[":div#0"].codes.to(torch.int64)
    sim.platform = dataclasses.replace(sim.platform, tensor_div_rule=TensorDivRule.FLOAT)
    plain = sim.trace(x, mode=Mode.FIXED).qinfo[":div#0"].codes.to(torch.int64)
    assert int((table - plain).abs().max()) <= 1


def test_the_reciprocal_dtype_must_be_an_integer_code():
    with pytest.raises(ValueError, match="platform.div_reciprocal_dtype=FLOAT16 is not allowed"):
        dataclasses.replace(load_platform("j6m"), div_reciprocal_dtype=DType.FLOAT16)
