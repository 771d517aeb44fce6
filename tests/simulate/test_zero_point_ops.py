"""Fixed mode with activation zero points (``activation_symmetry: ASYMMETRIC``) through the ops
beyond the GEMMs: segment-LUT ops, sub, mul, pooling, resampling and grid_sample run their
integer kernels (no float fallback), and each output code is what an independent integer
reference computes from the op's input codes, scales and zero points."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from float_fallbacks import record_float_fallbacks
from torch import nn

from quantlab.numerics import DType
from quantlab.numerics.lut import TableValues
from quantlab.numerics.lut.zero_point import build_zero_point_lut
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

LUT_MATH = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "exp": torch.exp,
    "silu": F.silu,
    "gelu": F.gelu,
}


def _asymmetric(**by_type) -> QConfigSpec:
    return QConfigSpec(
        global_=OpQConfig(activation_symmetry="ASYMMETRIC"),
        by_type={"conv2d": OpQConfig(high_precision_output=False), **by_type},
    )


def _observe(sim, x, monkeypatch, also=None):
    """(trace, {op name: (op type, input QInfos)}, ops whose fixed kernel returned None)."""
    fell_back = record_float_fallbacks(monkeypatch)
    seen = {}

    def on_call(oc):
        seen[oc.call.name] = (oc.call.op_type, oc.incoming)
        if also is not None:
            also(oc)

    trace = sim.trace(x, mode=Mode.FIXED, on_call=on_call)
    return trace, seen, fell_back


class _Luts(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        outs = [torch.sigmoid(y), torch.tanh(y), torch.exp(y * 0.5), F.silu(y), F.gelu(y)]
        return torch.cat(outs, 1)


@pytest.mark.parametrize("platform", ["tflite", "onnxruntime", "litert_xnnpack"])
@pytest.mark.parametrize("out_dtype", ["INT8", "INT16"])
def test_lut_ops_run_fixed_with_zero_points(platform, out_dtype, monkeypatch):
    """int8 codes with zero points in; int8 out with a zero point: the direct table
    saturate(round_half_even(f((x - zx) sx) / so) + zo) on every element; int16 out (symmetric):
    the segment LUT on the centred codes (its reference evaluation). onnxruntime computes each
    code in float32 (``TableValues.RUNTIME_FLOAT32``): its direct table's reference, both
    widths."""
    torch.manual_seed(0)
    sym = "ASYMMETRIC" if out_dtype == "INT8" else "SYMMETRIC"  # int16 codes take no zero point
    luts = {t: OpQConfig(output_dtype=out_dtype, activation_symmetry=sym) for t in LUT_MATH}
    sim = Simulator(_Luts().eval(), platform, _asymmetric(**luts))
    sim.calibrate([(torch.randn(2, 3, 6, 6) + 0.7,) for _ in range(3)], progress=False)
    trace, seen, fell_back = _observe(sim, torch.randn(2, 3, 6, 6) + 0.7, monkeypatch)
    runtime = sim.platform.lut_table_values is TableValues.RUNTIME_FLOAT32  # onnxruntime
    checked = 0
    for name, (op_type, incoming) in seen.items():
        if op_type not in LUT_MATH:
            continue
        assert name not in fell_back
        xi, yi = incoming[0], trace.qinfo[name]
        assert xi.dtype is DType.INT8 and xi.zero_point != 0
        x = xi.codes.to(torch.int64)
        assert (yi.zero_point != 0) == (yi.dtype is DType.INT8)
        if yi.dtype is DType.INT8 and not runtime:
            real = LUT_MATH[op_type]((x - xi.zero_point).double() * float(xi.scale))
            want = torch.round(real / float(yi.scale)) + yi.zero_point
            want = want.clamp(-128, 127).to(torch.int8)
        else:
            spec = sim.platform.lut_spec(op_type)
            table = build_zero_point_lut(
                op_type, DType.INT8, float(xi.scale), xi.zero_point, yi.dtype,
                float(yi.scale), yi.zero_point, spec, sim.platform.lut_format(),
                sim.observed_range(name, "in0"),
            )  # fmt: skip
            assert table.direct == (runtime or yi.dtype is DType.INT8)
            want = table.evaluate_reference(x.to(torch.int8))
        assert_bits_equal(yi.codes, want)
        checked += 1
    assert checked == len(LUT_MATH)


def test_lut_op_with_16_bit_zero_point_warns_naming_the_field():
    """16-bit codes with a zero point leave int16 once centred: the op runs in float, and the
    run says so naming the op and activation_symmetry."""
    torch.manual_seed(0)
    spec = _asymmetric(sigmoid=OpQConfig(output_dtype="INT16"))
    sim = Simulator(_Luts().eval(), "tflite", spec)
    sim.calibrate([(torch.randn(1, 3, 6, 6) + 0.7,)], progress=False)
    with pytest.warns(UserWarning, match="sigmoid#0 .*float.*16-bit.*activation_symmetry"):
        sim.run(torch.randn(1, 3, 6, 6) + 0.7, mode=Mode.FIXED)


class _Spatial(nn.Module):
    """Ops that keep or resample a spatial map: average pooling, nearest upsampling,
    grid_sample with a computed grid, sub and mul of two conv outputs."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.c2 = nn.Conv2d(3, 4, 3, padding=1)
        self.g = nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        a, b = self.c1(x), self.c2(x)
        p = F.avg_pool2d(a - b, 2)
        u = F.interpolate(p * b[:, :, ::2, ::2], scale_factor=2.0, mode="nearest")
        grid = torch.tanh(self.g(x)).permute(0, 2, 3, 1)
        return u + F.grid_sample(a, grid, mode="bilinear", align_corners=False)


def _requant_reference(p, acc, s_in, info_out, count=1):
    from quantlab.numerics import reference as R
    from quantlab.numerics.requant import rescale_multiplier

    real = float(rescale_multiplier(s_in, info_out.scale, p.requant, count))
    out = R.requantize(acc, real, p.requant, info_out.dtype, p.requant_round,
                       mult_bits=p.requant_mult_bits, zero_point=info_out.zero_point)  # fmt: skip
    return torch.from_numpy(out).to(info_out.dtype.torch_dtype)


@pytest.mark.parametrize("platform", ["tflite", "onnxruntime"])
def test_pool_resample_grid_sample_sub_mul_run_fixed_with_zero_points(platform, monkeypatch):
    """No op falls back to float (sub and mul included: their bits are LiteRT's in
    tests/runtime/test_litert_graph.py); avg_pool2d: requantize(sum of centred codes) + zo;
    nearest interpolate: requantize(selected centred codes) + zo; grid_sample: the reference
    sampler on the centred codes (padding "zeros" is the value 0), + zx (the input's scale and
    zero point), or on onnxruntime its GridSample between dequantize and quantize at the
    input's scale and zero point; each by the slow references of quantlab.numerics.reference."""
    from quantlab.numerics import grid_sample as G
    from quantlab.numerics import reference as R
    from quantlab.numerics.ort_grid_sample import ort_grid_sample
    from quantlab.numerics.quantize import dequantize, quantize

    torch.manual_seed(3)
    spec = _asymmetric(tanh=OpQConfig(activation_symmetry="SYMMETRIC"))
    # the grid chain is int16, which takes no zero point (the GEMM and the LUT would warn)
    spec.by_name["g:conv2d#0"] = OpQConfig(activation_symmetry="SYMMETRIC")
    sim = Simulator(_Spatial().eval(), platform, spec)
    sim.calibrate([(torch.randn(2, 3, 8, 8) + 0.5,) for _ in range(3)], progress=False)
    seen_args = {}

    def record(oc):
        seen_args[oc.call.name] = oc.call.args  # the run's own tensors: what the op received

    trace, seen, fell_back = _observe(sim, torch.randn(2, 3, 8, 8) + 0.5, monkeypatch, record)
    assert fell_back == [], fell_back
    p = sim.platform
    by_type = {t: n for n, (t, _) in seen.items()}
    infos = [trace.qinfo[n] for n in by_type.values()]
    zero_points = [i.zero_point for i in infos if i is not None and not isinstance(i, list)]
    assert sum(z != 0 for z in zero_points) >= 5, zero_points

    def centred(name, i):
        info = seen[name][1][i]
        assert info.zero_point != 0
        return info.codes_of(seen_args[name][i]) - info.zero_point, info

    name = by_type["avg_pool2d"]
    xc, xi = centred(name, 0)
    acc = F.avg_pool2d(xc.double(), 2, divisor_override=1).to(torch.int64)
    want = _requant_reference(p, acc, xi.scale, trace.qinfo[name], 4)
    assert_bits_equal(trace.qinfo[name].codes, want)
    name = by_type["interpolate"]
    xc, xi = centred(name, 0)
    sel = F.interpolate(xc.double(), scale_factor=2.0, mode="nearest").to(torch.int64)
    assert_bits_equal(
        trace.qinfo[name].codes, _requant_reference(p, sel, xi.scale, trace.qinfo[name])
    )
    name = by_type["grid_sample"]
    xc, xi = centred(name, 0)
    grid = seen_args[name][1]
    if platform == "onnxruntime":  # GridSample between DequantizeLinear and QuantizeLinear
        xv = dequantize(xc + xi.zero_point, xi.scale, zero_point=xi.zero_point)
        y = ort_grid_sample(xv, grid, G.SampleMode.BILINEAR, G.Padding.ZEROS, False)
        want = quantize(y, xi.scale, xi.dtype, p.fake_round, zero_point=xi.zero_point).long()
    else:
        qg = G.quantize_grid(grid, 8, 8, False, p.grid_coord, p.grid_dtype, p.fake_round,
                             G.NanRule.ZERO_CODE)  # fmt: skip
        ref = R.grid_sample_reference(xc, DType.INT32, qg, G.SampleMode.BILINEAR,
                                      G.Padding.ZEROS, p.grid_round, p.grid_weight_frac_bits,
                                      p.grid_round)  # fmt: skip
        want = (ref.to(torch.int64) + xi.zero_point).clamp(xi.dtype.qmin, xi.dtype.qmax)
    got = trace.qinfo[name]
    assert got.zero_point == xi.zero_point and float(got.scale) == float(xi.scale)
    assert_bits_equal(got.codes.to(torch.int64), want)


class _TwoConvAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.c2 = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.c1(x) + self.c2(x) - self.c1(x * 0.5)


def test_j6_add_with_zero_points_runs_fixed(monkeypatch):
    """A J6 profile told activation_symmetry ASYMMETRIC (and a min / max observer): its add
    rule (INTER_SCALE) takes the centred codes and adds the output's zero point, by the slow
    reference (reference.add_inter_scale); sub is its add of the negated operand."""
    from quantlab.numerics import reference as R

    torch.manual_seed(5)
    spec = QConfigSpec(
        global_=OpQConfig(activation_symmetry="ASYMMETRIC", observer="MINMAX"),
        by_type={"conv2d": OpQConfig(high_precision_output=False)},
    )
    sim = Simulator(_TwoConvAdd().eval(), "j6m", spec)
    sim.calibrate([(torch.randn(2, 3, 6, 6) + 0.5,) for _ in range(3)], progress=False)
    args = {}
    trace, seen, fell_back = _observe(
        sim, torch.randn(2, 3, 6, 6) + 0.5, monkeypatch, lambda oc: args.setdefault(
            oc.call.name, oc.call.args)
    )  # fmt: skip
    assert fell_back == [], fell_back
    p = sim.platform
    zero_points = []
    for name, sign in ((":add#0", 1), (":sub#0", -1)):
        (xi, yi), out = seen[name][1], trace.qinfo[name]
        zero_points += [xi.zero_point, yi.zero_point, out.zero_point]
        xc, yc = (i.codes_of(a) for i, a in zip((xi, yi), args[name]))
        want = R.add_inter_scale(
            xc, xi.scale, sign * yc, yi.scale, out.scale, out.dtype, p.requant, p.requant_round,
            p.add_inter_shift, zero_points=(xi.zero_point, sign * yi.zero_point, out.zero_point),
        )  # fmt: skip
        assert_bits_equal(out.codes.to(torch.int64), torch.from_numpy(want))
    assert sum(z != 0 for z in zero_points) >= 5, zero_points


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.softmax(self.fc(x) * 2.0, dim=-1)


def test_lut_softmax_runs_fixed_with_zero_points(monkeypatch):
    """The segment-LUT softmax (tflite's softmax_rule) on int8 codes with zero points: the
    input's zero point cancels (the composite of the centred codes), the output codes are
    formed in int16 and take the output's zero point; within 2 output codes of the float
    softmax of the dequantized input where the output does not saturate."""
    from quantlab.numerics.lut import lut_softmax

    torch.manual_seed(6)
    spec = QConfigSpec(global_=OpQConfig(activation_symmetry="ASYMMETRIC"),
                       by_type={"linear": OpQConfig(high_precision_output=False)})  # fmt: skip
    sim = Simulator(_Attention().eval(), "tflite", spec)
    sim.calibrate([(torch.randn(4, 5, 8) + 0.5,) for _ in range(3)], progress=False)
    args = {}
    trace, seen, fell_back = _observe(
        sim, torch.randn(4, 5, 8) + 0.5, monkeypatch,
        lambda oc: args.setdefault(oc.call.name, oc.call.args),
    )  # fmt: skip
    assert fell_back == [], fell_back
    (xi,), out = seen[":softmax#0"][1], trace.qinfo[":softmax#0"]
    assert xi.zero_point != 0 and out.zero_point != 0
    x = args[":softmax#0"][0]
    centred = (xi.codes_of(x) - xi.zero_point).to(torch.int16)
    fmt = sim.platform.lut_format()
    inner = lut_softmax(centred, float(xi.scale), DType.INT16, -1, float(out.scale), DType.INT16,
                        fmt).to(torch.int64)  # fmt: skip
    want = (inner + out.zero_point).clamp(-128, 127).to(torch.int8)
    assert_bits_equal(out.codes, want)
    real = torch.softmax(x, -1)
    got = (out.codes.to(torch.float32) - out.zero_point) * out.scale
    inside = real < (127 - out.zero_point) * out.scale  # not saturated
    assert float((got - real)[inside].abs().max()) <= 2 * float(out.scale)


def test_deployed_lut_ops_with_zero_points_equal_fixed_mode_and_train():
    """FakeOps.DEPLOYED computes a LUT op with zero points as fixed mode does (fed the same
    inputs), and train_forward passes a finite gradient through the table's slope."""
    from quantlab.simulate import FakeOps

    torch.manual_seed(2)
    sim = Simulator(_Luts().eval(), "tflite", _asymmetric(), fake_ops=FakeOps.DEPLOYED)
    sim.calibrate([(torch.randn(2, 3, 6, 6) + 0.7,) for _ in range(3)], progress=False)
    x = torch.randn(2, 3, 6, 6) + 0.7
    fake = sim.trace(x, mode=Mode.FAKE)
    fixed = sim.trace(x, mode=Mode.FIXED, _isolate=fake)
    luts = [n for n in fake.order if n.split("#")[0].lstrip(":") in LUT_MATH]
    assert len(luts) == len(LUT_MATH)
    for n in luts:
        assert fake.qinfo[n].zero_point != 0
        assert_bits_equal(fake.outputs[n], fixed.outputs[n])
    y = sim.train_forward(x, mode=Mode.FAKE)
    y.square().sum().backward()
    w = sim.model.conv.weight.grad
    assert w is not None and bool(torch.isfinite(w).all()) and float(w.abs().sum()) > 0


class _Sin(nn.Module):
    def forward(self, x):
        return torch.sin(x * 3.0)


def test_period_reduced_sin_with_a_zero_point_warns_naming_the_field():
    """single_period reduces a wide sin input to one period on codes without a zero point:
    with one the op runs in float and the run says so."""
    spec = _asymmetric(sin=OpQConfig(single_period=True))
    sim = Simulator(_Sin().eval(), "tflite", spec)
    sim.calibrate([(torch.rand(4, 16) * 4 + 1,)], progress=False)
    with pytest.warns(UserWarning, match="sin#0 .*period reduction.*activation_symmetry"):
        sim.run(torch.rand(4, 16) * 4 + 1, mode=Mode.FIXED)
