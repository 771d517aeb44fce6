"""tan, atan, sinh, cosh, atanh, asinh, asin, acos and acosh as the J6 plugin builds them
(nn/_trigonometric.py, nn/atan.py: SegmentLUT modules with its strategies, input ranges and
inverse functions): segment LUTs in fixed mode; in fake mode the float function, fake-quantized,
with the input clips of the plugin's QAT tan, atanh, asin and acos (which calibration observes
for atanh, asin and acos); float on the runtime profiles. FIXED is checked bit for bit against
``build_lut``, FAKE against torch's own fake quant of the plugin's formulas."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import Strategy, build_lut, default_spec, get_function
from quantlab.numerics.lut.spec import RangeRule
from quantlab.numerics.quantize import quantize
from quantlab.op_kinds import OpCategory, classify
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

# op type -> (torch function, a typical input batch from uniform u in [0, 1) and normal n)
CASES = {
    "tan": (torch.tan, lambda u, n: u * 2.8 - 1.4),
    "atan": (torch.atan, lambda u, n: n * 3),
    "sinh": (torch.sinh, lambda u, n: n * 1.5),
    "cosh": (torch.cosh, lambda u, n: n * 1.5),
    "atanh": (torch.atanh, lambda u, n: u * 1.9 - 0.95),
    "asinh": (torch.asinh, lambda u, n: n * 3),
    "asin": (torch.asin, lambda u, n: u * 2 - 1),
    "acos": (torch.acos, lambda u, n: u * 2 - 1),
    "acosh": (torch.acosh, lambda u, n: 1 + u * 5),
}
CLIPPED = ("tan", "atanh", "asin", "acos")
# inputs beyond the clipped functions' domains: calibrated on them, the input scale reaches
# past the plugin's clip, so the clip is what the fake run computes there
WIDE = {"tan": 3.5, "atanh": 1.2, "asin": 1.3, "acos": 1.3}


class _Op(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _batch(op: str, g: torch.Generator) -> torch.Tensor:
    u, n = torch.rand(8, 64, generator=g), torch.randn(8, 64, generator=g)
    return CASES[op][1](u, n)


def _wide(op: str, g: torch.Generator) -> torch.Tensor:
    return (torch.rand(8, 64, generator=g) * 2 - 1) * WIDE[op]


def _calibrated(
    op: str, platform: str, dtype: DType | None, fn=None, wide: bool = False, **kw
) -> Simulator:
    spec = (
        None
        if dtype is None
        else QConfigSpec(global_=OpQConfig(input_dtype=dtype, output_dtype=dtype))
    )
    sim = Simulator(_Op(fn or CASES[op][0]), platform, spec, **kw)
    g = torch.Generator().manual_seed(21)
    data = _wide if wide else _batch
    sim.calibrate([(data(op, g),) for _ in range(2)], progress=False)
    return sim


def _scales(sim: Simulator, name: str, dtype: DType) -> tuple[float, float]:
    rq = sim.qconfig_of(name)
    return tuple(float(sim.act_scale(name, k, dtype, rq)) for k in ("in0", "out"))


def _fq(v: torch.Tensor, s: float, dtype: DType) -> torch.Tensor:
    return torch.fake_quantize_per_tensor_affine(v, s, 0, dtype.qmin, dtype.qmax)


def _plugin_qat_input(op: str, x: torch.Tensor, s: float, dtype: DType) -> torch.Tensor:
    """The plugin's QAT input clip, written as its modules write it (float32 tensors)."""
    scale = torch.tensor(s, dtype=torch.float32)
    if op in ("asin", "acos"):
        upper = (1 / scale).floor() * scale
        return x.clamp(-upper, upper)
    eps = scale if dtype is DType.INT8 else 32 * scale
    if op == "tan":
        return torch.clamp(x, -math.pi + eps, math.pi - eps)
    if op == "atanh":
        return torch.clamp(x, -1 + eps, 1 - eps)
    return x


def test_the_default_specs_are_the_plugins_modules():
    curv, even = Strategy.CURVATURE, Strategy.EVENLY
    want = {  # (strategy, is_centrosymmetric, input_range)
        "tan": (curv, True, None),
        "atan": (curv, True, None),
        "sinh": (curv, True, None),
        "cosh": (even, False, None),
        "atanh": (curv, True, (-1.0, 1.0)),
        "asinh": (curv, True, None),
        "asin": (curv, True, None),
        "acos": (curv, False, None),
        "acosh": (curv, False, (1.0, None)),
    }
    for op, (strategy, symmetric, rng) in want.items():
        spec = default_spec(op)
        assert (spec.strategy, spec.symmetric, spec.input_range) == (strategy, symmetric, rng)
    # the modules with an inverse_func take the inverse-function range rule
    for op in CASES:
        inverse = get_function(op).range_rule is RangeRule.INVERSE
        assert inverse == (op in ("asinh", "asin", "acos")), op


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("op", sorted(CASES))
def test_fixed_is_the_segment_lut_on_the_input_codes(op, dtype):
    sim = _calibrated(op, "j6m", dtype)
    name = f":{op}#0"
    plat = sim.platform
    s_in, s_out = _scales(sim, name, dtype)
    table = build_lut(
        op,
        dtype,
        s_in,
        dtype,
        s_out,
        plat.lut_spec(op),
        plat.lut_format(),
        sim.observed_range(name, "in0"),
    )
    g = torch.Generator().manual_seed(22)
    x = _batch(op, g)
    x[0, :6] = torch.tensor([0.0, -1.0, 1.0, 1.5, -2.0, 1e4])  # edges of every domain
    xc = quantize(x, s_in, dtype, plat.fake_round).to(dtype.torch_dtype)
    got = sim.run(x, mode=Mode.FIXED)
    assert_bits_equal(got, table.evaluate(xc).to(torch.float32) * s_out)
    assert torch.isfinite(got).all()
    assert_bits_equal(sim.run(x, mode=Mode.HYBRID), got)  # one op: the deployed table
    ops = sim.ops.set_index("name")
    assert ops.loc[name, "category"] == "LUT" and ops.loc[name, "fixed_kernel"] == "lut"


@pytest.mark.parametrize("op", sorted(CASES))
def test_int16_tables_follow_the_function_inside_its_calibrated_range(op):
    """Not the exactness proof (above) but the sense check a user makes, and what tells one
    function's table from another's: inside the range the model was calibrated on, away from
    where the function is steep, the table's value is within 0.2% of the output's range of
    the float function (plus one input step's change)."""
    sim = _calibrated(op, "j6m", DType.INT16)
    s_in, s_out = _scales(sim, f":{op}#0", DType.INT16)
    top_in, top_out = (0.95 * s * DType.INT16.qmax for s in (s_in, s_out))
    x = _batch(op, torch.Generator().manual_seed(23))
    if op in ("atanh", "asin", "acos"):  # steep at +-1
        x = x.clamp(-0.9, 0.9)
    fn = CASES[op][0]
    inside = (x.abs() <= top_in) & (fn(x).abs() <= top_out)  # nothing saturates
    assert inside.float().mean() > 0.5
    slope = (fn(x + s_in) - fn(x)).abs() / s_in
    err = (sim.run(x, mode=Mode.FIXED) - fn(x)).abs()
    tol = 0.002 * s_out * DType.INT16.qmax
    assert (err <= tol + slope * s_in)[inside].all()


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("op", sorted(CASES))
def test_fake_is_the_plugins_qat_forward(op, dtype):
    """FAKE: fq_out(f(clip(fq_in(x)))), the clip the plugin's QAT module applies (tan, atanh,
    asin, acos; none for the others), on inputs that cross every domain's edge; the clipped
    functions calibrated on inputs beyond their domains, so that the clip acts. Where f is
    NaN (acosh below 1, which the plugin does not clip), the output is NaN."""
    wide = op in CLIPPED
    sim = _calibrated(op, "j6m", dtype, wide=wide)
    s_in, s_out = _scales(sim, f":{op}#0", dtype)
    g = torch.Generator().manual_seed(24)
    x = _wide(op, g) if wide else _batch(op, g)
    x[0, :8] = torch.tensor([0.0, -1.0, 1.0, 1.5, -1.5, 3.2, -3.2, 0.999])
    fn = CASES[op][0]
    xq = _fq(x, s_in, dtype)
    f = fn(_plugin_qat_input(op, xq, s_in, dtype))
    want = torch.where(torch.isnan(f), f, _fq(f, s_out, dtype))
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), want)
    if wide:  # the clip acts, and keeps these finite where the float function is not
        assert torch.isfinite(want).all()
        assert (~torch.isfinite(fn(xq)) | (fn(xq) != f)).sum() >= 8


@pytest.mark.parametrize("op", CLIPPED)
def test_training_through_a_clipped_input_has_finite_gradients(op):
    sim = _calibrated(op, "j6m", DType.INT16, wide=True)
    x = _wide(op, torch.Generator().manual_seed(25))
    x[0, :4] = torch.tensor([1.0, -1.0, 3.0, -3.0])  # atanh's poles, asin's edges
    xg = x.clone().requires_grad_()
    y = sim.train_forward(xg)
    assert_bits_equal(y.detach(), sim.run(x, mode=Mode.FAKE))
    y.sum().backward()
    assert torch.isfinite(xg.grad).all() and xg.grad.abs().sum() > 0


def test_the_runtime_profiles_run_them_in_float():
    for op in sorted(CASES):
        for platform in ("onnxruntime", "tflite"):
            sim = _calibrated(op, platform, None)
            x = _batch(op, torch.Generator().manual_seed(26))
            for mode in (Mode.FAKE, Mode.FIXED):
                assert_bits_equal(sim.run(x, mode=mode), CASES[op][0](x))
            assert not sim.ops.set_index("name").loc[f":{op}#0", "supported"], (op, platform)


def test_the_numpy_names_and_in_place_methods_are_the_same_ops():
    x = torch.rand(3)
    for fn, op in (
        (torch.arctan, "atan"),
        (torch.arcsin, "asin"),
        (torch.arccos, "acos"),
        (torch.arcsinh, "asinh"),
        (torch.arccosh, "acosh"),
        (torch.arctanh, "atanh"),
        (torch.Tensor.arcsin_, "asin"),
        (torch.Tensor.tan_, "tan"),
        (torch.Tensor.cosh, "cosh"),
    ):
        assert classify(fn, (x,), {}) == (op, OpCategory.LUT), fn
    sim = _calibrated("asin", "j6m", DType.INT16, fn=torch.arcsin)
    direct = _calibrated("asin", "j6m", DType.INT16)
    x = _batch("asin", torch.Generator().manual_seed(27))
    assert list(sim.ops.op_type) == ["asin"]
    for mode in (Mode.FAKE, Mode.FIXED):
        assert_bits_equal(sim.run(x, mode=mode), direct.run(x, mode=mode))


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_steady_runs_keep_the_bits(monkeypatch, mode):
    """As prepared calls and in a traced program, a clipped QAT form (FAKE) and a table
    (FIXED) give the bits of a simulator that captures every run."""
    build_in_first_run(monkeypatch)
    fast = _calibrated("atanh", "j6m", DType.INT16, wide=True, steady_programs=True)
    captured = _calibrated("atanh", "j6m", DType.INT16, wide=True, steady_programs=False)
    g = torch.Generator().manual_seed(28)
    xs = [_wide("atanh", g) for _ in range(2)]  # beyond +-1 too
    for x in xs * 3:
        assert_bits_equal(fast.run(x, mode=mode), captured.run(x, mode=mode))
    state = fast.steady_programs.status((xs[0],), mode)
    assert state.program is not None and state.program.fallbacks == 0


@pytest.mark.parametrize("op", ["atanh", "asin", "acos"])
def test_calibration_observes_the_clipped_input(op):
    """The plugin calibrates its QAT form: atanh, asin and acos of inputs beyond their domain
    are observed through the clip (asin and acos at +-1; atanh at +-(1 - 32 codes) of the
    input scale 1 / 32767 an int16 input on [-1, 1] has), not as NaN or inf: the output
    scale is the one data already inside the clip gives."""
    rule = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16, observer="MINMAX")
    g = torch.Generator().manual_seed(29)
    wide = [(_wide(op, g),) for _ in range(2)]
    inside = [(_plugin_qat_input(op, x, 1 / 32767, DType.INT16).clamp(-1, 1),) for (x,) in wide]
    scales = []
    for data in (wide, inside):
        sim = Simulator(_Op(CASES[op][0]), "j6m", QConfigSpec(global_=rule))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no NaN or inf reached an observer
            sim.calibrate(data, progress=False)
        scales.append(_scales(sim, f":{op}#0", DType.INT16)[1])
    assert scales[0] == scales[1]
    # the runtime profiles observe the float function (NaN and inf dropped, with a warning)
    sim = Simulator(_Op(CASES[op][0]), "onnxruntime", QConfigSpec(global_=rule))
    with pytest.warns(UserWarning, match="Calibration saw NaN or infinite values"):
        sim.calibrate(wide, progress=False)
