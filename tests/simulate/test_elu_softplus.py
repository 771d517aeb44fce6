"""elu and softplus as the vendor builds them: segment LUTs of the call's function (its alpha,
beta and threshold), on every platform that runs tables (log_softmax: test_log_softmax.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut, default_spec
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

# each case: the call, the LutSpec fields it sets
CASES = {
    "elu": (lambda y: F.elu(y), {}),
    "elu_alpha": (lambda y: F.elu(y, alpha=0.3), {"alpha": 0.3}),
    "elu_module": (nn.ELU(alpha=1.7), {"alpha": 1.7}),
    "softplus": (lambda y: F.softplus(y), {}),
    "softplus_beta": (lambda y: F.softplus(y, 2.0, 3.0), {"beta": 2.0, "threshold": 3.0}),
    "softplus_module": (nn.Softplus(beta=0.5, threshold=4.0), {"beta": 0.5, "threshold": 4.0}),
}


class _Activation(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.conv(x))


def _calibrated(model, platform, spec=None, seed=0):
    torch.manual_seed(seed)
    sim = Simulator(model.eval(), platform, spec)
    g = torch.Generator().manual_seed(seed + 1)
    sim.calibrate([(torch.randn(2, 3, 6, 6, generator=g) * 2,) for _ in range(2)], progress=False)
    return sim, [torch.randn(2, 3, 6, 6, generator=g) * s for s in (0.5, 1.0, 4.0)]


def _name(sim) -> str:
    (name,) = sim.ops.loc[sim.ops.op_type.isin(["elu", "softplus"]), "name"]
    return name


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("dtype", "scale"), [(DType.INT8, 2.0**-4), (DType.INT16, 2.0**-11)])
def test_the_op_is_the_table_of_the_calls_function(case, dtype, scale):
    """J6M: the op's output is the table of its function at the call's parameters, built over
    the calibrated input range (int8: the direct table, int16: segment tables), on the
    convolution's output codes; the table follows the function where it does not saturate."""
    fn, fields = CASES[case]
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype, observer="FIXED", fixed_scale=scale)
    sim, xs = _calibrated(_Activation(fn), "j6m")
    name = _name(sim)
    sim.set_qconfig(QConfigSpec(by_name=dict.fromkeys(("conv:conv2d#0", name), rule)))
    sim.calibrate([(xs[1],)], progress=False)
    func = sim.ops.set_index("name").loc[name, "op_type"]
    row = sim.ops.set_index("name").loc[name]
    assert (row["category"], row["fixed_kernel"], row["supported"]) == ("LUT", "lut", True)
    table_spec = dataclasses.replace(default_spec(func), **fields)
    seen = sim.observed_range(name, "in0")
    table = build_lut(func, dtype, scale, dtype, scale, table_spec, observed_range=seen)
    for x in xs:
        trace = sim.trace(x, mode=Mode.FIXED)
        codes = (trace.outputs["conv:conv2d#0"] / scale).to(dtype.torch_dtype)  # powers of 2
        want = table.evaluate(codes).to(torch.float32) * scale
        assert_bits_equal(sim.run(x, mode=Mode.FIXED), want)
    x = torch.linspace(-3.0, 3.0, 97)
    codes = torch.round(x / scale).to(dtype.torch_dtype)
    got = table.evaluate(codes).double() * scale
    ideal = fn(codes.double() * scale)
    lsb = 1 if dtype is DType.INT8 else 40  # direct: rounding; segment tables: interpolation
    assert float((got - ideal).abs().max()) <= lsb * scale


@pytest.mark.parametrize("platform", ["j6m", "j6p", "tflite", "onnxruntime"])
@pytest.mark.parametrize("case", ["elu", "softplus"])
def test_fake_and_fixed_stay_near_the_function(platform, case):
    """FAKE is the float function fake-quantized at the output; FIXED its table (J6P: its
    float16 form): both within a few output steps of the function of the op's own input in the
    same run."""
    fn = CASES[case][0]
    sim, xs = _calibrated(_Activation(fn), platform)
    name = _name(sim)
    assert sim.ops.set_index("name").loc[name, "category"] == "LUT"
    for x in xs[:2]:
        for mode in (Mode.FAKE, Mode.FIXED):
            trace = sim.trace(x, mode=mode)
            got, arg = trace.outputs[name], trace.outputs["conv:conv2d#0"]
            scale = trace.qinfo[name].scale  # None: float16 (J6P)
            step = 2.0**-9 * float(arg.abs().max()) if scale is None else float(scale.max())
            assert float((got - fn(arg)).abs().max()) <= 4 * step


def test_inplace_elu_is_the_same_op():
    """F.elu(inplace=True) gives the bits of F.elu."""
    plain, _ = _calibrated(_Activation(lambda y: F.elu(y)), "j6m")
    inplace, xs = _calibrated(_Activation(lambda y: F.elu(y, inplace=True)), "j6m")
    for x in xs:
        assert_bits_equal(inplace.run(x, mode=Mode.FIXED), plain.run(x, mode=Mode.FIXED))
