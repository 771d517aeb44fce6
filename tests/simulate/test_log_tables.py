"""log2, log10, log1p, celu and logit as segment LUTs of their functions on J6 (as log, elu
and inverse_sigmoid are; each strategy an assumption, ``lut.functions.default_spec``); the
runtime profiles run them in float."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut, default_spec
from quantlab.op_kinds import OpCategory, classify
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

# op type -> (its call, the table function and spec fields the call sets, the inputs' range)
CASES = {
    "log2": (torch.log2, "log2", {}, (0.05, 4.0)),
    "log10": (lambda y: y.log10(), "log10", {}, (0.05, 4.0)),
    "log1p": (torch.special.log1p, "log1p", {}, (-0.5, 4.0)),
    "celu": (nn.CELU(alpha=0.5), "celu", {"alpha": 0.5}, (-3.0, 3.0)),
    "logit": (lambda y: torch.logit(y, eps=1e-3), "inverse_sigmoid", {"eps": 1e-3}, (0.0, 1.0)),
}


class _Identity1x1(nn.Module):
    """A 1x1 convolution that passes its input (its output codes feed the op), then the op."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.eye(3).reshape(3, 3, 1, 1))
            self.conv.bias.zero_()
        self.fn = fn

    def forward(self, x):
        return self.fn(self.conv(x))


def _inputs(op: str, g: torch.Generator, count: int) -> list[torch.Tensor]:
    lo, hi = CASES[op][3]
    return [lo + (hi - lo) * torch.rand(2, 3, 5, 5, generator=g) for _ in range(count)]


def _calibrated(op: str, platform: str):
    g = torch.Generator().manual_seed(1)
    sim = Simulator(_Identity1x1(CASES[op][0]).eval(), platform)
    sim.calibrate([(x,) for x in _inputs(op, g, 2)], progress=False)
    return sim, _inputs(op, g, 2)


def test_each_spelling_is_a_table_op():
    x = torch.rand(8)
    for op, fn in (
        ("log2", torch.log2),
        ("log2", torch.Tensor.log2_),
        ("log10", torch.log10),
        ("log1p", torch.log1p),
        ("log1p", torch.special.log1p),
        ("log1p", torch.Tensor.log1p_),
        ("celu", F.celu),
        ("celu", torch.celu),
        ("logit", torch.logit),
        ("logit", torch.special.logit),
        ("logit", torch.Tensor.logit_),
    ):
        assert classify(fn, (x,), {}) == (op, OpCategory.LUT), (op, fn)


@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize(("dtype", "scale"), [(DType.INT8, 2.0**-4), (DType.INT16, 2.0**-11)])
def test_the_op_is_the_table_of_its_function(op, dtype, scale):
    """J6M: the op's output is the table of its function (at the call's alpha or eps) over the
    calibrated input range on the convolution's output codes, and that table follows the
    function on the codes it covers."""
    fn, func, fields, _ = CASES[op]
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype, observer="FIXED", fixed_scale=scale)
    sim, xs = _calibrated(op, "j6m")
    (name,) = sim.ops.loc[sim.ops.op_type == op, "name"]
    sim.set_qconfig(QConfigSpec(by_name=dict.fromkeys(("conv:conv2d#0", name), rule)))
    sim.calibrate([(xs[1],)], progress=False)
    row = sim.ops.set_index("name").loc[name]
    assert (row["category"], row["fixed_kernel"], row["supported"]) == ("LUT", "lut", True)
    seen = sim.observed_range(name, "in0")
    spec = dataclasses.replace(default_spec(func), **fields)
    table = build_lut(func, dtype, scale, dtype, scale, spec, observed_range=seen)
    for x in xs:
        trace = sim.trace(x, mode=Mode.FIXED)
        codes = (trace.outputs["conv:conv2d#0"] / scale).to(dtype.torch_dtype)  # powers of 2
        assert_bits_equal(sim.run(x, mode=Mode.FIXED), table.evaluate(codes).float() * scale)
    lo, hi = (float(v) for v in seen)
    x = torch.linspace(max(lo, 0.06 if op.startswith("log") else -3.0), min(hi, 3.0), 97)
    if op == "logit":
        x = x.clamp(0.02, 0.98)
    codes = torch.round(x / scale).to(dtype.torch_dtype)
    got = table.evaluate(codes).double() * scale
    ideal = fn(codes.double() * scale)
    inside = ideal.abs() < dtype.qmax * scale
    lsb = 1 if dtype is DType.INT8 else 40  # direct: rounding; segment tables: interpolation
    assert float((got - ideal).abs()[inside].max()) <= lsb * scale


@pytest.mark.parametrize("platform", ["j6m", "j6p"])
@pytest.mark.parametrize("op", list(CASES))
def test_fake_and_fixed_stay_near_the_function(platform, op):
    """FAKE is the float function fake-quantized at the output; FIXED its table (J6P: its
    float16 form): both within a few output steps of the function of the op's own input."""
    sim, xs = _calibrated(op, platform)
    (name,) = sim.ops.loc[sim.ops.op_type == op, "name"]
    fn = CASES[op][0]
    for x in xs:
        for mode in (Mode.FAKE, Mode.FIXED):
            trace = sim.trace(x, mode=mode)
            got, arg = trace.outputs[name], trace.outputs["conv:conv2d#0"]
            want = fn(arg)
            info = trace.qinfo[name]
            scale = info.scale  # None: float16 (J6P)
            step = 2.0**-9 * float(want.abs().max()) if scale is None else float(scale.max())
            # within the output's range (an MSE observer may clip a long tail such as log's)
            inside = torch.ones_like(want, dtype=torch.bool)
            if scale is not None:
                inside = want.abs() <= info.dtype.qmax * step
            assert inside.float().mean() > 0.9
            assert float((got - want).abs()[inside].max()) <= 4 * step, (mode, op)


@pytest.mark.parametrize("platform", ["onnxruntime", "tflite"])
def test_runtime_profiles_run_them_in_float(platform):
    for op in CASES:
        sim, xs = _calibrated(op, platform)
        row = sim.ops.set_index("op_type").loc[op]
        assert row["fixed_kernel"] == "float (not supported on this platform)", op
        assert torch.isfinite(sim.run(xs[0], mode=Mode.FIXED)).all()
