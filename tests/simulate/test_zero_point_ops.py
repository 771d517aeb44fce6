"""Fixed mode with activation zero points (``activation_symmetry: ASYMMETRIC``) through the ops
beyond the GEMMs: segment-LUT ops, sub, mul, pooling, resampling and grid_sample run their
integer kernels (no float fallback), and each output code is what an independent integer
reference computes from the op's input codes, scales and zero points."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics import DType
from quantlab.numerics.lut import default_spec
from quantlab.numerics.lut.zero_point import build_zero_point_lut
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator, fixed_ops

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


def _observe(sim, x, monkeypatch):
    """(trace, {op name: (op type, input QInfos)}, ops whose fixed kernel returned None)."""
    fell_back = []
    run_fixed = fixed_ops.run_fixed

    def spy(sim_, call, *a, **k):
        res = run_fixed(sim_, call, *a, **k)
        if res is None and call.category is not None:
            fell_back.append(call.name)
        return res

    monkeypatch.setattr(fixed_ops, "run_fixed", spy)
    seen = {}

    def on_call(oc):
        seen[oc.call.name] = (oc.call.op_type, oc.incoming)

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
    the segment LUT on the centred codes (its reference evaluation)."""
    torch.manual_seed(0)
    sym = "ASYMMETRIC" if out_dtype == "INT8" else "SYMMETRIC"  # int16 codes take no zero point
    # gelu stays int8: its default table (fixed dividing points) has the J6 table count
    luts = {t: OpQConfig(output_dtype=out_dtype, activation_symmetry=sym) for t in LUT_MATH}
    luts.pop("gelu")
    sim = Simulator(_Luts().eval(), platform, _asymmetric(**luts))
    sim.calibrate([(torch.randn(2, 3, 6, 6) + 0.7,) for _ in range(3)], progress=False)
    trace, seen, fell_back = _observe(sim, torch.randn(2, 3, 6, 6) + 0.7, monkeypatch)
    checked = 0
    for name, (op_type, incoming) in seen.items():
        if op_type not in LUT_MATH:
            continue
        assert name not in fell_back
        xi, yi = incoming[0], trace.qinfo[name]
        assert xi.dtype is DType.INT8 and xi.zero_point != 0
        x = xi.codes.to(torch.int64)
        if yi.dtype is DType.INT8:
            assert yi.zero_point != 0
            real = LUT_MATH[op_type]((x - xi.zero_point).double() * float(xi.scale))
            want = torch.round(real / float(yi.scale)) + yi.zero_point
            want = want.clamp(-128, 127).to(torch.int8)
        else:
            assert yi.dtype is DType.INT16 and yi.zero_point == 0
            spec = default_spec(op_type)
            table = build_zero_point_lut(
                op_type, DType.INT8, float(xi.scale), xi.zero_point, DType.INT16,
                float(yi.scale), 0, spec, sim.platform.lut_format(),
                sim.observed_range(name, "in0"),
            )  # fmt: skip
            assert not table.direct
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
