"""Division by a tensor: on J6 (``TensorDivRule.RECIPROCAL_TABLE``) x times a reciprocal
segment LUT of the divisor, whose int16 scale is calibrated on 1 / y; on the runtime profiles
float between dequantize and quantize, as before. And a scalar constant added under the TFLite
reference ADD (LEFT_SHIFT) is the int8 constant a LiteRT model holds."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import nn

from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut
from quantlab.numerics.lut.composite import qat_reciprocal, reciprocal_clip_codes
from quantlab.numerics.requant import requant_scale
from quantlab.platforms import TensorDivRule, load_platform
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import FakeOps, Mode, Simulator


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


def _calibrated(platform, spec=None, seed=0, **kw):
    torch.manual_seed(seed)
    sim = Simulator(_Ratio().eval(), platform, spec, **kw)
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


class _Quotient(nn.Module):
    """x / y of two model inputs (quantized at the division's input points)."""

    def forward(self, x, y):
        return x / y


def _qat_quotient(sim, name, x, y, dtypes):
    """The plugin's QAT Div by torch's own fake quant (HALF_EVEN, the scale's reciprocal):
    fq_out(fq_x(x) * fq_r(1 / clip(fq_y(y)))), |y| clipped below at 1 code (int8) or 32 codes
    (int16), its sign kept, 0 as +."""
    rq = sim.qconfig_of(name)
    xd, yd, od = dtypes

    def fq(v, key, dt):
        s = sim.act_scale(name, key, dt, rq)
        return torch.fake_quantize_per_tensor_affine(v, float(s), 0, dt.qmin, dt.qmax), float(s)

    xq, _ = fq(x, "in0", xd)
    yq, sy = fq(y, "in1", yd)
    floor = (32 if yd is DType.INT16 else 1) * sy
    mag = torch.reciprocal(yq.abs().clamp_min(floor))
    r, _ = fq(torch.where(yq < 0, -mag, mag), "recip", DType.INT16)
    return fq(xq * r, "out", od)[0]


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_fake_mode_divides_as_the_plugins_qat_div(dtype):
    """FAKE on J6: x times the int16-fake-quantized QAT reciprocal of y (clipped at 1 or 32
    codes of y), then the output's fake quant, bit for bit with torch's fake quant; divisors
    of both signs, exact zeros and codes inside the clip give finite quotients."""
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype)
    sim = Simulator(_Quotient(), "j6m", QConfigSpec(global_=rule))
    g = torch.Generator().manual_seed(3)
    calib = [(torch.randn(4, 256, generator=g), torch.randn(4, 256, generator=g) * 0.5 + 1.0)]
    sim.calibrate(calib, progress=False)
    x = torch.randn(4, 256, generator=g) * 1.5
    sy = float(sim.act_scale(":div#0", "in1", dtype, sim.qconfig_of(":div#0")))
    y = torch.randn(4, 256, generator=g) * 0.5 + 1.0
    y[0, :64] = torch.arange(-32, 32) * sy  # every code inside the int16 clip, and 0
    y[1, :8] = torch.tensor([0.0, -0.0, sy, -sy, 0.4 * sy, -0.6 * sy, 31 * sy, -33 * sy])
    got = sim.run(x, y, mode=Mode.FAKE)
    assert torch.isfinite(got).all()
    want = _qat_quotient(sim, ":div#0", x, y, (dtype, dtype, dtype))
    assert_bits_equal(got, want)
    assert not torch.isfinite(x / y).all()  # the float quotient, infinite at y = 0
    # and the same through training's forward, with gradients to both operands
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    out = sim.train_forward(xg, yg)
    assert_bits_equal(out.detach(), got)
    out.square().sum().backward()
    assert torch.isfinite(xg.grad).all() and torch.isfinite(yg.grad).all()
    assert xg.grad.abs().sum() > 0 and yg.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_hybrid_mode_divides_by_the_deployed_reciprocal_table(dtype):
    """HYBRID (fake mode with the deployed tables): x times FIXED's reciprocal table on y's
    codes, dequantized at the reciprocal's scale, then the output's fake quant."""
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype)
    sim = Simulator(_Quotient(), "j6m", QConfigSpec(global_=rule))
    g = torch.Generator().manual_seed(5)
    sim.calibrate([(torch.randn(4, 256, generator=g), torch.rand(4, 256, generator=g) + 0.2)])
    x, y = torch.randn(4, 256, generator=g), torch.rand(4, 256, generator=g) * 1.2 + 0.1
    name, rq, plat = ":div#0", sim.qconfig_of(":div#0"), sim.platform
    sx, sy, so = (float(sim.act_scale(name, k, dtype, rq)) for k in ("in0", "in1", "out"))
    sr = sim.act_scale(name, "recip", DType.INT16, rq)
    table = build_lut(
        "reciprocal",
        dtype,
        sy,
        DType.INT16,
        float(sr),
        plat.lut_spec("reciprocal"),
        plat.lut_format(),
        sim.observed_range(name, "in1"),
    )
    yq = torch.fake_quantize_per_tensor_affine(y, sy, 0, dtype.qmin, dtype.qmax)
    codes = torch.round(yq / sy).to(dtype.torch_dtype)  # yq is on its grid: exact
    r = table.evaluate(codes).to(torch.float32) * sr
    xq = torch.fake_quantize_per_tensor_affine(x, sx, 0, dtype.qmin, dtype.qmax)
    want = torch.fake_quantize_per_tensor_affine(xq * r, so, 0, dtype.qmin, dtype.qmax)
    assert_bits_equal(sim.run(x, y, mode=Mode.HYBRID), want)
    assert not torch.equal(want, sim.run(x, y, mode=Mode.FAKE))  # the table is not 1 / y
    sim.fake_ops = FakeOps.DEPLOYED  # deployment-aware training: the same bits, gradients
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    out = sim.train_forward(xg, yg)
    assert_bits_equal(out.detach(), want)
    out.sum().backward()
    assert torch.isfinite(xg.grad).all() and yg.grad.abs().sum() > 0


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.HYBRID])
def test_fake_mode_division_keeps_its_bits_in_steady_runs(monkeypatch, mode):
    """The QAT division kept as a prepared call (steady runs) and in a traced program gives
    the bits of a simulator that captures every run."""
    build_in_first_run(monkeypatch)
    rule = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)
    spec = QConfigSpec(by_type={t: rule for t in ("conv2d", "add", "sqrt", "div", "sigmoid")})
    fast, xs = _calibrated("j6m", spec, steady_programs=True)
    captured, _ = _calibrated("j6m", spec, steady_programs=False)
    for x in xs * 3:
        for a, b in zip(fast.run(x, mode=mode), captured.run(x, mode=mode), strict=True):
            assert_bits_equal(a, b)
    state = fast.steady_programs.status((xs[0],), mode)
    assert state.program is not None and state.program.fallbacks == 0


def test_the_runtime_profiles_fake_division_is_the_float_quotient():
    """Where FIXED divides in float (onnxruntime), so does FAKE: fq_out(fq_x(x) / fq_y(y))."""
    sim = Simulator(_Quotient(), "onnxruntime")
    g = torch.Generator().manual_seed(4)
    sim.calibrate([(torch.randn(2, 64, generator=g), torch.rand(2, 64, generator=g) + 0.5)])
    x, y = torch.randn(2, 64, generator=g), torch.rand(2, 64, generator=g) + 0.5
    got = sim.run(x, y, mode=Mode.FAKE)
    rq = sim.qconfig_of(":div#0")

    def fq(v, key):
        dt = rq.output_dtype if key == "out" else rq.input_dtype or rq.output_dtype
        s = sim.act_scale(":div#0", key, dt, rq)
        zp = sim.act_zero_point(":div#0", key, dt, rq)
        return torch.fake_quantize_per_tensor_affine(v, float(s), zp, dt.qmin, dt.qmax)

    assert_bits_equal(got, fq(fq(x, "in0") / fq(y, "in1"), "out"))


def test_the_qat_reciprocal_clips_at_one_or_thirty_two_codes():
    s = 0.01
    y = torch.tensor([0.0, -0.0, 0.005, -0.005, 0.01, -0.2, 0.5, -1.0])  # 0.32: int16 floor
    int8 = qat_reciprocal(y, s, DType.INT8)
    int16 = qat_reciprocal(y, s, DType.INT16)
    assert int8.tolist() == pytest.approx([100, 100, 100, -100, 100, -5, 2, -1])
    assert int16.tolist() == pytest.approx([3.125] * 3 + [-3.125, 3.125, -3.125, 2, -1])
    assert reciprocal_clip_codes(DType.INT8) == 1 and reciprocal_clip_codes(DType.INT16) == 32
