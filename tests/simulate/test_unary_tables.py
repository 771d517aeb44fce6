"""mish, log_sigmoid, softsign, selu, tanhshrink, expm1, exp2 and erfc as segment LUTs of
their functions on J6 (the vendor's way for a plain unary function; each strategy an
assumption, ``lut.functions.default_spec``); the runtime profiles run them in float."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from test_elu_softplus import _Activation  # conv, then the op
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut, default_spec
from quantlab.op_kinds import OpCategory, classify
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

# op type -> its call (a module's, a function's or a method's spelling)
CASES = {
    "mish": nn.Mish(),
    "log_sigmoid": nn.LogSigmoid(),
    "softsign": nn.Softsign(),
    "selu": nn.SELU(),
    "tanhshrink": nn.Tanhshrink(),
    "expm1": torch.expm1,
    "exp2": lambda y: y.exp2(),
    "erfc": torch.special.erfc,
}


def _calibrated(op: str, platform: str, seed: int = 0, fn=None):
    torch.manual_seed(seed)
    sim = Simulator(_Activation(fn or CASES[op]).eval(), platform)
    g = torch.Generator().manual_seed(seed + 1)
    sim.calibrate([(torch.randn(2, 3, 6, 6, generator=g),) for _ in range(2)], progress=False)
    return sim, [torch.randn(2, 3, 6, 6, generator=g) * s for s in (0.5, 1.0)]


def test_each_is_a_table_op():
    x = torch.randn(8)
    for op, fn in (
        ("mish", F.mish),
        ("log_sigmoid", F.logsigmoid),
        ("softsign", F.softsign),
        ("selu", F.selu),
        ("tanhshrink", F.tanhshrink),
        ("expm1", torch.Tensor.expm1_),
        ("exp2", torch.exp2),
        ("erfc", torch.erfc),
        ("erfc", torch.special.erfc),
        ("expm1", torch.special.expm1),
    ):
        assert classify(fn, (x,), {}) == (op, OpCategory.LUT), op


def assert_table_op(sim, name, func, spec, dtype, scale, xs, grid, fn) -> None:
    """With a FIXED ``dtype`` rule at ``scale`` on the convolution and op ``name``, the op's
    output is ``func``'s table (at ``spec``) over the calibrated input range on the
    convolution's output codes, and that table follows ``fn`` on the codes of ``grid(lo, hi)``
    (the calibrated range's part to compare) within the output's range."""
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype, observer="FIXED", fixed_scale=scale)
    sim.set_qconfig(QConfigSpec(by_name=dict.fromkeys(("conv:conv2d#0", name), rule)))
    sim.calibrate([(xs[1],)], progress=False)
    row = sim.ops.set_index("name").loc[name]
    assert (row["category"], row["fixed_kernel"], row["supported"]) == ("LUT", "lut", True)
    seen = sim.observed_range(name, "in0")
    table = build_lut(func, dtype, scale, dtype, scale, spec, observed_range=seen)
    for x in xs:
        trace = sim.trace(x, mode=Mode.FIXED)
        codes = (trace.outputs["conv:conv2d#0"] / scale).to(dtype.torch_dtype)  # powers of 2
        assert_bits_equal(sim.run(x, mode=Mode.FIXED), table.evaluate(codes).float() * scale)
    x = grid(*(float(v) for v in seen))
    codes = torch.round(x / scale).to(dtype.torch_dtype)
    got = table.evaluate(codes).double() * scale
    ideal = fn(codes.double() * scale)
    inside = ideal.abs() < dtype.qmax * scale
    lsb = 1 if dtype is DType.INT8 else 40  # direct: rounding; segment tables: interpolation
    assert float((got - ideal).abs()[inside].max()) <= lsb * scale


def assert_near_function(sim, name, fn, xs, clipped_tail: bool = False) -> None:
    """FAKE and FIXED outputs of op ``name`` within 4 output steps of ``fn`` of the op's own
    input (J6P's float16: 2**-9 of the largest value); with ``clipped_tail``, where ``fn``
    lies within the output's range only, which holds over 90% of the values (an MSE
    observer may clip a long tail such as log's)."""
    for x in xs:
        for mode in (Mode.FAKE, Mode.FIXED):
            trace = sim.trace(x, mode=mode)
            got, arg = trace.outputs[name], trace.outputs["conv:conv2d#0"]
            want = fn(arg)
            info = trace.qinfo[name]
            scale = info.scale  # None: float16 (J6P)
            step = 2.0**-9 * float(want.abs().max()) if scale is None else float(scale.max())
            inside = torch.ones_like(want, dtype=torch.bool)
            if clipped_tail and scale is not None:
                inside = want.abs() <= info.dtype.qmax * step
                assert inside.float().mean() > 0.9
            assert float((got - want).abs()[inside].max()) <= 4 * step, (mode, name)


@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize(("dtype", "scale"), [(DType.INT8, 2.0**-4), (DType.INT16, 2.0**-11)])
def test_the_op_is_the_table_of_its_function(op, dtype, scale):
    """J6M: the op's output is the table of its function over the calibrated input range
    (int8: the direct table, int16: segment tables) on the convolution's output codes, and
    that table follows the function on the codes it covers."""
    sim, xs = _calibrated(op, "j6m")
    (name,) = sim.ops.loc[sim.ops.op_type == op, "name"]

    def grid(lo, hi):
        return torch.linspace(max(lo, -3.0), min(hi, 3.0), 97)

    assert_table_op(sim, name, op, default_spec(op), dtype, scale, xs, grid, CASES[op])


@pytest.mark.parametrize("platform", ["j6m", "j6p"])
@pytest.mark.parametrize("op", list(CASES))
def test_fake_and_fixed_stay_near_the_function(platform, op):
    """FAKE is the float function fake-quantized at the output; FIXED its table (J6P: its
    float16 form): both within a few output steps of the function of the op's own input."""
    sim, xs = _calibrated(op, platform)
    (name,) = sim.ops.loc[sim.ops.op_type == op, "name"]
    assert_near_function(sim, name, CASES[op], xs)


def test_runtime_profiles_run_them_in_float():
    for op in CASES:
        sim, _ = _calibrated(op, "onnxruntime")
        row = sim.ops.set_index("op_type").loc[op]
        assert row["fixed_kernel"] == "float (not supported on this platform)", op


def _gelu_tanh(y):
    return F.gelu(y, approximate="tanh")


@pytest.mark.parametrize(("dtype", "scale"), [(DType.INT8, 2.0**-4), (DType.INT16, 2.0**-11)])
def test_gelu_tanh_is_the_table_of_its_own_form(dtype, scale):
    """gelu(approximate="tanh") (GPT-2's, and many a transformer's) is the table of the tanh
    form on J6, not of the erf form and not a float fallback; the runtime profiles, whose
    gelu kernel is the erf form's, compute it in float and say so (fixed_in_float)."""
    import dataclasses

    sim, xs = _calibrated("gelu", "j6m", fn=_gelu_tanh)
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype, observer="FIXED", fixed_scale=scale)
    sim.set_qconfig(QConfigSpec(by_name=dict.fromkeys(("conv:conv2d#0", ":gelu#0"), rule)))
    sim.calibrate([(xs[1],)], progress=False)
    seen = sim.observed_range(":gelu#0", "in0")
    spec = dataclasses.replace(default_spec("gelu"), approximate="tanh")
    table = build_lut("gelu", dtype, scale, dtype, scale, spec, observed_range=seen)
    erf = build_lut("gelu", dtype, scale, dtype, scale, default_spec("gelu"), observed_range=seen)
    for x in xs:
        trace = sim.trace(x, mode=Mode.FIXED)
        codes = (trace.outputs["conv:conv2d#0"] / scale).to(dtype.torch_dtype)
        assert_bits_equal(sim.run(x, mode=Mode.FIXED), table.evaluate(codes).float() * scale)
    assert not sim.ops.set_index("name").loc[":gelu#0", "fixed_in_float"]
    every = torch.arange(dtype.qmin, dtype.qmax + 1, dtype=torch.int64).to(dtype.torch_dtype)
    assert not torch.equal(table.evaluate(every), erf.evaluate(every))  # the form matters
    x = torch.linspace(-3.0, 3.0, 97)
    codes = torch.round(x / scale).to(dtype.torch_dtype)
    got = table.evaluate(codes).double() * scale
    lsb = 1 if dtype is DType.INT8 else 40
    assert float((got - _gelu_tanh(codes.double() * scale)).abs().max()) <= lsb * scale
    ort, _ = _calibrated("gelu", "onnxruntime", fn=_gelu_tanh)
    ort.run(xs[0], mode=Mode.FIXED)
    assert ort.ops.set_index("name").loc[":gelu#0", "fixed_in_float"]
