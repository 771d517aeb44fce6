"""What onnxruntime does with the parts of an exported QDQ graph it does not fuse into a QLinear
kernel, and fixed mode (onnxruntime profile) giving the same bits:

- a GEMM whose output leaves wide (no output quantization: a model output) is written as
  ConvInteger / MatMulInteger, + bias codes, Cast, times the accumulator scale: the integer
  accumulator fixed mode computes (a float Conv / MatMul would sum in float32), with a fused
  clamp on its values;
- sub, add / mul with a scalar constant (held as int16 codes), clamps, sums and means (but a
  global mean) run in float32 between DequantizeLinear and QuantizeLinear
  (``platform.float_islands`` ONNXRUNTIME_QDQ), average pools as QLinearAveragePool sums them;
- a write through a view (``t.permute(...).add_(1)`` and then ``t`` read) has no ONNX form:
  the export refuses it, unless what read the stale tensor reaches no output.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from ort_encodings import require_modelled  # noqa: E402

from quantlab import ops as quantlab_ops  # noqa: E402
from quantlab.analysis.onnx_fidelity import measure  # noqa: E402
from quantlab.export import ActivationEncoding, UnsupportedOpError, to_onnx_qdq  # noqa: E402
from quantlab.export import runtime as R  # noqa: E402
from quantlab.export.ort_host import onnxruntime_profile, onnxruntime_saturates_u8s8  # noqa: E402
from quantlab.numerics.dtypes import DType  # noqa: E402
from quantlab.numerics.lut import TableValues  # noqa: E402
from quantlab.numerics.quantize import QuantizeCast  # noqa: E402
from quantlab.platforms import FloatIslands, MulRule, load_platform  # noqa: E402
from quantlab.qconfig import OpQConfig, QConfigSpec  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402

ORT_PROFILE = onnxruntime_profile()


class _WideOutputs(nn.Module):
    """Three GEMMs whose outputs are model outputs: a convolution, a convolution with a fused
    clamp, and a matrix product of two activations."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.clamped = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        return y, F.hardtanh(self.clamped(x), -0.2, 0.3), torch.tanh(y) @ y.transpose(-1, -2)


class _WideThroughLayout(nn.Module):
    """A 1x1-conv head leaving through flatten and reshape (its int32 accumulator moves as it
    is), a view of the same output that a tanh reads (quantized there), and a linear whose
    output leaves through a transpose."""

    def __init__(self):
        super().__init__()
        self.head = nn.Conv2d(3, 8, 1)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        y = self.head(F.adaptive_avg_pool2d(x, 2))
        z = self.fc(x.mean(1))
        return y.flatten(1).reshape(-1, 4, 8), torch.tanh(y.flatten(2)), z.transpose(1, 2)


class _Elementwise(nn.Module):
    """sub of two tensors, of the input and itself (an all-zero output: its scale is the
    smallest the observer gives), and add / sub / mul / div with scalar constants."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        z = torch.sigmoid(x[:, :1])
        return y - z, x - x, 0.5 - y, (y + 0.25) * 1.5, z / 3.0


def _calibrated(model: nn.Module, platform=ORT_PROFILE, seed: int = 0):
    torch.manual_seed(seed)
    sim = Simulator(model.eval(), platform)
    g = torch.Generator().manual_seed(seed + 1)
    sim.calibrate([(torch.randn(2, 3, 6, 6, generator=g),) for _ in range(2)], progress=False)
    return sim, [torch.randn(2, 3, 6, 6, generator=g) * s for s in (0.5, 1.0, 4.0)]


def _onnxruntime_outputs(sim, xs, tmp_path, encoding):
    require_modelled(encoding)
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", (xs[0],), encoding=encoding)
    sess = R.session(info.path, tmp_path / "opt.onnx")
    kinds = {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    return [R.run(sess, info.input_names, (x,)) for x in xs], kinds


def _same(runtime: list, fixed) -> bool:
    return all(np.array_equal(a, b.numpy()) for a, b in zip(runtime, fixed, strict=True))


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_wide_gemm_outputs_run_as_integer_kernels_in_onnxruntime(tmp_path, encoding):
    sim, xs = _calibrated(_WideOutputs())
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert {"ConvInteger", "MatMulInteger"} <= kinds and not {"Conv", "MatMul"} & kinds
    for x, ys in zip(xs, outs, strict=True):
        fixed = sim.run(x, mode=Mode.FIXED)
        assert _same(ys, fixed)
        assert fixed[1].min() >= np.float32(-0.2) and fixed[1].max() <= np.float32(0.3)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_wide_gemm_outputs_pass_layout_ops_to_the_model_output(tmp_path, encoding):
    """A layout op between a GEMM and a model output moves the wide output as it is, in fixed
    mode and in onnxruntime (no QuantizeLinear on the way); the same output read by another
    op is quantized for it."""
    sim, xs = _calibrated(_WideThroughLayout())
    ops = sim.ops.set_index("name")
    assert (
        ops.loc[[":flatten#0", ":reshape#0", ":transpose#0"], "output_dtype"].tolist()
        == ["INT32"] * 3
    )
    assert ops.loc[":flatten#1", "output_dtype"] == "INT8"  # feeds the tanh only
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert {"ConvInteger", "MatMulInteger"} <= kinds
    for x, ys in zip(xs, outs, strict=True):
        fixed = sim.run(x, mode=Mode.FIXED)
        assert _same(ys, fixed)
    if encoding is ActivationEncoding.UNSIGNED_OFFSET:  # every op's tensor, probed
        f = measure(sim, (xs[1],), tmp_path, "probed", encoding)
        assert f.summary["outputs_differing"] == 0 and f.summary["first_diverging_op"] == ""


def test_signed_exports_are_modelled_only_where_products_sum_exactly(tmp_path):
    """The premise of ``ort_encodings.require_modelled``: an UNSIGNED_OFFSET export gives the
    fixed-mode bits of this CPU's profile on every CPU; a SIGNED one does where uint8 x int8
    products sum exactly, and not where they saturate in pairs (there onnxruntime runs this
    model's int8 convolution as a float32 Conv, while ``onnxruntime_no_vnni`` saturates)."""
    sim, xs = _calibrated(_Elementwise())
    for encoding in ActivationEncoding:
        info = to_onnx_qdq(sim, tmp_path / f"{encoding.value}.onnx", (xs[0],), encoding=encoding)
        sess = R.session(info.path)
        same = all(
            _same(R.run(sess, info.input_names, (x,)), sim.run(x, mode=Mode.FIXED)) for x in xs
        )
        signed = encoding is ActivationEncoding.SIGNED
        assert same is not (signed and onnxruntime_saturates_u8s8()), encoding


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_sub_and_scalar_operands_run_in_float_between_dequantize_and_quantize(tmp_path, encoding):
    sim, xs = _calibrated(_Elementwise())
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "Sub" in kinds  # onnxruntime has no QLinearSub
    for x, ys in zip(xs, outs, strict=True):
        fixed = sim.run(x, mode=Mode.FIXED)
        assert _same(ys, fixed)
        assert not fixed[1].any()  # x - x is 0, whatever the output scale
    # the integer forms (QLinearAdd's arithmetic for sub, the product requantization) do not
    # give onnxruntime's bits for these
    sim.platform = replace(sim.platform, float_islands=FloatIslands.NONE)
    assert not all(_same(ys, sim.run(x, mode=Mode.FIXED)) for x, ys in zip(xs, outs))


class _MakesNaN(nn.Module):
    """NaN where a relu left 0 (0 / 0, a Div between DequantizeLinear and QuantizeLinear),
    then a convolution of it; and whatever NaN the input holds, quantized at the input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.mix = nn.Conv2d(4, 3, 1)

    def forward(self, x):
        r = torch.relu(self.conv(x))
        return self.mix(r / r), torch.tanh(x)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_nan_takes_the_lowest_code_as_quantize_linear_gives_it(tmp_path, encoding):
    """onnxruntime's QuantizeLinear writes NaN as the lowest code (not the zero point), at a
    float op's output and at the model input: fixed mode (the profile's ``quantize_cast``)
    gives the same bits."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # calibration saw NaN at the division: it is meant
        sim, xs = _calibrated(_MakesNaN())
    xs[1][0, 0, :2] = float("nan")
    outs, _ = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))
    # the zero point for NaN (the J6 profiles' assumption) gives other values there
    sim.platform = replace(sim.platform, quantize_cast=QuantizeCast.NAN_TO_ZERO_POINT)
    assert not _same(outs[1], sim.run(xs[1], mode=Mode.FIXED))


class _FilterResponseNorm(nn.Module):
    """HyNet's filter response norm after a convolution: x * rsqrt(mean(x^2) + eps) over each
    map, a product of two activations (QLinearMul in onnxruntime), then a gated product."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x):
        h = self.conv(x)
        y = h * torch.rsqrt(h.pow(2).mean((-2, -1), keepdim=True) + 1e-6)
        return y, y * torch.sigmoid(h)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_products_of_activations_give_qlinear_muls_bits(tmp_path, encoding):
    """A product of two int8 activations fuses into QLinearMul, which adds the output's zero
    point (128 for codes held as uint8) in float32 before the rounding: fixed mode
    (``MulRule.QLINEAR_MUL``) gives its bits (where the GEMM's rule, the zero point after the
    rounding, misses: ``tests/runtime/test_ort_qlinear_ops.py``)."""
    sim, _ = _calibrated(_FilterResponseNorm())
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(2, 3, 32, 32, generator=g) * s for s in (0.5, 1.0, 2.0)]
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    # int8 codes (SIGNED) are not fused: the Mul runs in float, which these scales match too
    assert ("QLinearMul" in kinds) == (encoding is ActivationEncoding.UNSIGNED_OFFSET)
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))
    assert sim.platform.mul_rule is MulRule.QLINEAR_MUL


class _WritesThroughAView(nn.Module):
    def __init__(self, read_after: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.read_after = read_after

    def forward(self, x):
        y = self.conv(x)
        y.permute(0, 1, 3, 2).add_(1.0)  # changes y
        stale = torch.tanh(y)  # reads y as written
        return stale if self.read_after else torch.sigmoid(x)


def test_a_write_through_a_view_is_refused_where_it_is_read(tmp_path):
    sim, xs = _calibrated(_WritesThroughAView(read_after=True))
    with pytest.raises(UnsupportedOpError, match="cannot express a write through a view"):
        to_onnx_qdq(sim, tmp_path / "m.onnx", (xs[0],))
    # what read it reaches no output: the graph computes the outputs
    sim, xs = _calibrated(_WritesThroughAView(read_after=False))
    outs, _ = _onnxruntime_outputs(sim, xs, tmp_path, ActivationEncoding.UNSIGNED_OFFSET)
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, [sim.run(x, mode=Mode.FIXED)])


def test_fidelity_measures_per_channel_wide_outputs(tmp_path):
    """A convolution's wide output has one LSB per channel (axis 1): the comparison reads it
    so (it divided along the last axis before, and failed on this shape)."""
    sim, xs = _calibrated(_WideOutputs())
    f = measure(sim, (xs[1],), tmp_path, "wide", ActivationEncoding.UNSIGNED_OFFSET)
    assert f.summary["outputs_differing"] == 0
    assert f.summary["max_diff_lsb"] == 0.0
    assert f.summary["first_diverging_op"] == ""


class _Stacks(nn.Module):
    """stack on a new first, middle and last axis, and of scalars."""

    def forward(self, x):
        a, b = torch.relu(x), torch.tanh(x)
        return (
            torch.stack([a, b]).sum(0),
            torch.stack([a, b, x * 0.5], 2) * 1.5,
            torch.stack([a, b], -1),
            torch.stack([a.sum(), b.mean()]) * 2.0,
        )


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_stacks_load_and_match_in_onnxruntime(tmp_path, encoding):
    """Unsqueeze nodes between the dequantized inputs and the Concat made onnxruntime refuse
    the model with int8 activations ("output_dtype INT8 does not match y_zero_point type
    UINT8")."""
    sim, xs = _calibrated(_Stacks())
    outs, _ = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _Pools(nn.Module):
    """Average pools onnxruntime runs as QLinearAveragePool: padded (the padding counted or
    not), strided, unpadded, wide, and adaptive pooling to 2 x 2 windows."""

    def forward(self, x):
        t = torch.tanh(x) * 2.0
        return (
            F.avg_pool2d(t, 3, 1, 1),
            F.avg_pool2d(t, 3, 1, 1, count_include_pad=False),
            F.avg_pool2d(t, (3, 5), (2, 1), (1, 2), count_include_pad=False),
            F.avg_pool2d(t, 3, 2, 1),
            F.avg_pool2d(t, 2),
            F.avg_pool2d(t, 5, 1, 2),
            F.adaptive_avg_pool2d(t, 2),
        )


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_average_pools_match_onnxruntime_qlinear_average_pool(tmp_path, encoding):
    """Exported average pools run as QLinearAveragePool, whose bits the onnxruntime profile's
    FLOAT_WINDOW_SUM rule gives (padded pools fell back to float before; the rule against the
    kernel on ties: tests/runtime/test_ort_qlinear_ops.py)."""
    platform = ORT_PROFILE
    if encoding is ActivationEncoding.SIGNED:  # int8 codes held as they are
        platform = replace(load_platform(ORT_PROFILE), qlinear_zero_point=0)
    for seed in range(3):
        sim, xs = _calibrated(_Pools(), platform, seed)
        assert "float_fallback" not in " ".join(sim.ops["fixed_kernel"])
        sub = tmp_path / str(seed)
        sub.mkdir()
        outs, kinds = _onnxruntime_outputs(sim, xs, sub, encoding)
        # int8 activations: onnxruntime (x86) keeps a float AveragePool between DQ and Q
        unsigned = encoding is ActivationEncoding.UNSIGNED_OFFSET
        assert ("QLinearAveragePool" if unsigned else "AveragePool") in kinds
        for x, ys in zip(xs, outs, strict=True):
            assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _Reductions(nn.Module):
    """Sums and means onnxruntime computes as ReduceSum / ReduceMean in float32 (two stacked
    tensors summed, whose output scale is twice theirs: every odd code sum a real tie), and a
    clamp that changes the scale (Clip)."""

    def forward(self, x):
        t = torch.tanh(x) + 0.5
        return (
            torch.stack([F.relu(t), t]).sum(0),
            t.sum(-1),
            t.mean(1),
            torch.tanh(x).clamp(-0.3, 0.4),
        )


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_sums_means_and_clamps_run_in_float_between_dequantize_and_quantize(tmp_path, encoding):
    sim, xs = _calibrated(_Reductions())
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert {"ReduceSum", "ReduceMean", "Clip"} <= kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))
    # the integer sums and requantizations tie differently
    sim.platform = replace(sim.platform, float_islands=FloatIslands.NONE)
    assert not all(_same(ys, sim.run(x, mode=Mode.FIXED)) for x, ys in zip(xs, outs))


class _CancellingMeans(nn.Module):
    """Spatial means of a tensor whose spatial means are removed: their output scale is far
    below the input's, outside what QLinearGlobalAveragePool takes."""

    def forward(self, x):
        t = torch.tanh(x)
        t = t - t.mean((2, 3), keepdim=True)
        return t.mean((2, 3)), F.adaptive_avg_pool2d(t, 1)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_spatial_means_onnxruntime_refuses_to_pool_are_float_reduce_means(tmp_path, encoding):
    sim, xs = _calibrated(_CancellingMeans())
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "ReduceMean" in kinds
    assert any("GlobalAveragePool" in k for k in kinds)  # the first mean is in range
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _TokenLinears(nn.Module):
    """Linears over (batch, tokens, features) with a fused clamp: one quantized (read by tanh),
    one a wide model output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 8)
        self.head = nn.Linear(3, 4)

    def forward(self, x):
        t = x.flatten(2).transpose(1, 2)  # (2, 36, 3)
        return torch.tanh(F.relu6(self.fc(t))), self.head(t).clamp(-0.5, 0.5)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_a_clamp_fused_after_an_nd_linear_is_exported(tmp_path, encoding):
    """It was refused ("a fused clamp after an N-d linear")."""
    sim, xs = _calibrated(_TokenLinears())
    assert sim.ops["fused_into"].str.len().gt(0).sum() == 2
    outs, _ = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _NormalizesInPlace(nn.Module):
    """Writes into its input (``x.sub_(m).mul_(k)``): the Simulator runs it on a copy."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        x.sub_(0.5).mul_(2.0)
        return torch.tanh(self.conv(x))


@pytest.mark.filterwarnings("ignore:_NormalizesInPlace.forward writes into its input")
def test_a_model_writing_its_input_exports_its_input_as_the_graph_input(tmp_path):
    """The run the exporter records gets a copy of the input (``Simulator.writes_inputs``); the
    copy was not known as the graph input, so the example input was baked in as a constant."""
    sim, xs = _calibrated(_NormalizesInPlace())
    assert sim.writes_inputs
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", (xs[0],))
    sess = R.session(info.path)
    for x in xs[1:]:  # not the example input
        (y,) = R.run(sess, info.input_names, (x.clone(),))
        assert np.array_equal(y, sim.run(x.clone(), mode=Mode.FIXED).numpy())


class _Tables(nn.Module):
    """Table ops on inputs wide enough to saturate tanh and sigmoid: the observer gives their
    outputs the scale fl32(1 / 127.5), on which +-1 lands on a tie that the last bit of the
    float32 kernel decides."""

    def forward(self, x):
        w = x * 6.0
        e = torch.exp(x.clamp(-4.0, 2.0))
        tables = torch.tanh(w), torch.sigmoid(w), e, F.silu(w), torch.sin(x), torch.sqrt(F.relu(x))
        return *tables, F.hardsigmoid(w), F.hardswish(w), F.leaky_relu(x, 0.2)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_table_ops_give_onnxruntime_float32_kernels_bits(tmp_path, encoding):
    """Table ops run in onnxruntime as Dequantize -> float32 op (MLAS's tanh / logistic / exp)
    -> Quantize; the profile's direct tables (``lut_table_values`` RUNTIME_FLOAT32) give the
    same bits, the exact float64 tables do not."""
    exact_float64_differs = False
    for seed in (3, 4):
        sim, xs = _calibrated(_Tables(), seed=seed)
        sub = tmp_path / str(seed)
        sub.mkdir()
        outs, kinds = _onnxruntime_outputs(sim, xs, sub, encoding)
        assert {"Tanh", "Exp", "Sin", "Sqrt", "HardSigmoid"} <= kinds  # HardSwish: HardSigmoid, Mul
        assert kinds & {"LeakyRelu", "QLinearLeakyRelu"}  # fused into a table on uint8 codes
        for x, ys in zip(xs, outs, strict=True):
            assert _same(ys, sim.run(x, mode=Mode.FIXED))
        sim.platform = replace(sim.platform, lut_table_values=TableValues.EXACT_FLOAT64)
        exact_float64_differs |= not all(
            _same(ys, sim.run(x, mode=Mode.FIXED)) for x, ys in zip(xs, outs)
        )
    assert exact_float64_differs


class _PReLUs(nn.Module):
    """PReLU with a slope per channel after a convolution and after a linear layer (negative
    slopes too), and with one slope."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.per_channel = nn.PReLU(8)
        self.fc = nn.Linear(8, 5)
        self.after_fc = nn.PReLU(5)
        self.single = nn.PReLU()
        with torch.no_grad():
            self.per_channel.weight.uniform_(0.05, 0.5)
            self.after_fc.weight.uniform_(-0.3, 0.9)
            self.single.weight.fill_(0.3)

    def forward(self, x):
        y = self.per_channel(self.conv(x))
        return self.after_fc(self.fc(y.mean((2, 3)))), self.single(y)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_prelu_tables_give_onnxruntime_bits(tmp_path, encoding):
    """PReLU runs in onnxruntime as Dequantize -> PRelu (fl32(slope x) below 0) -> Quantize; the
    profile's tables, one per channel, give the same bits."""
    sim, xs = _calibrated(_PReLUs())
    assert set(sim.ops.loc[sim.ops.op_type == "prelu", "fixed_kernel"]) == {"lut"}
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "PRelu" in kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _Int16Tables(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        return torch.tanh(y * 3.0), torch.sigmoid(y), torch.exp(y.clamp(-6.0, 1.0)), F.hardswish(y)


def test_int16_table_ops_give_onnxruntime_bits(tmp_path):
    """With int16 activations onnxruntime still computes each code in float32 (DequantizeLinear
    -> op -> QuantizeLinear on int16): the profile's table covers every int16 code; a segment
    table (J6's 6 x 64 entries) differed in about half of the outputs."""
    int16 = OpQConfig(output_dtype=DType.INT16)
    names = ("conv:conv2d#0", ":mul#0", ":tanh#0", ":sigmoid#0", ":clamp#0", ":exp#0")
    names += (":hardswish#0",)
    spec = QConfigSpec(by_name=dict.fromkeys(names, int16))
    torch.manual_seed(0)
    sim = Simulator(_Int16Tables().eval(), ORT_PROFILE, spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 3, 8, 8, generator=g) * s for s in (0.5, 2.0)]
    tables = sim.ops["name"].isin([":tanh#0", ":sigmoid#0", ":exp#0", ":hardswish#0"])
    assert set(sim.ops.loc[tables, "fixed_kernel"]) == {"lut"}
    outs, _ = _onnxruntime_outputs(sim, xs, tmp_path, ActivationEncoding.UNSIGNED_OFFSET)
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _OrderedSums(nn.Module):
    """Sums and means of every axis pattern onnxruntime reduces in its own order (rows, leading
    rows, a middle axis with and without a batch of one, a kept axis between reduced ones), of
    values whose sums are near 0 (fine output scales)."""

    def forward(self, x):
        t = torch.tanh(x) * 3.0
        u = t - t.mean((0, 1, 2, 3), keepdim=True)
        return (
            u.sum(-1),
            u.mean((2, 3)),
            u.sum(0),
            u.mean(1),
            u[:1].sum(1),
            u.sum((0, 2, 3), keepdim=True),
            u.sum((0, 3)),
        )


def test_float_sums_of_every_axis_pattern_match_onnxruntime(tmp_path):
    """ReduceSum / ReduceMean in onnxruntime's summation order (``numerics.ort_reduce``; the
    order against onnxruntime and torch's: tests/runtime/test_ort_reduce.py, a net whose codes
    torch's order missed: test_random_nets_in_onnxruntime.py)."""
    g = torch.Generator().manual_seed(0)
    sim = Simulator(_OrderedSums().eval(), ORT_PROFILE)
    sim.calibrate([(torch.randn(4, 16, 12, 20, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(4, 16, 12, 20, generator=g) * s for s in (0.5, 1.0, 2.0)]
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, ActivationEncoding.UNSIGNED_OFFSET)
    assert {"ReduceSum", "ReduceMean"} <= kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _Int16Gemms(nn.Module):
    """A convolution, a linear and a matmul of two activations with int16 operands, whose
    int32 accumulators overflow (32767 * 32767 * 64 > 2**31)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.lin = nn.Linear(8, 64)

    def forward(self, x):
        y = self.conv(x).flatten(2).transpose(1, 2)  # (N, 36, 8)
        z = self.lin(y)  # (N, 36, 64)
        return y, z, z @ z.transpose(1, 2)


def test_int16_gemms_run_in_float_as_onnxruntime_runs_them(tmp_path):
    """onnxruntime has no int16 QLinearConv / QLinearMatMul: a GEMM with an int16 operand runs
    as the float op between DequantizeLinear and QuantizeLinear, which the profile computes
    (``fixed_gemm_float``; torch's float32 sum order against MLAS's: a code at a rounding
    boundary can move by one); a wide output (the convolution's, the matmul's) is the float
    op's value, as the exported graph leaves it. The integer path, whose int32 accumulators
    wrap, was off by over a hundred codes here."""
    names = ("conv:conv2d#0", ":matmul#0", ":flatten#0", ":transpose#0")
    spec = QConfigSpec(by_name=dict.fromkeys(names, OpQConfig(output_dtype=DType.INT16)))
    # the linear's output, a model output and the matmul's operands, leaves quantized (not
    # wide): the matmul takes two int16 operands
    narrow = OpQConfig(output_dtype=DType.INT16, high_precision_output=False)
    spec.by_name["lin:linear#0"] = narrow
    torch.manual_seed(0)
    sim = Simulator(_Int16Gemms().eval(), ORT_PROFILE, spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 8, 6, 6, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 8, 6, 6, generator=g) * s for s in (0.5, 1.0)]
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, ActivationEncoding.UNSIGNED_OFFSET)
    assert {"Conv", "MatMul"} <= kinds and not {"QLinearConv", "QLinearMatMul"} & kinds
    qinfo = sim.trace(xs[0], mode=Mode.FIXED).qinfo
    # one output code of the int16 outputs; the wide matmul's: 1 / 32767 of its largest value
    codes = [float(qinfo[":transpose#0"][0].scale), float(qinfo["lin:linear#0"].scale), None]
    for x, ys in zip(xs, outs, strict=True):
        for y, f, code in zip(ys, sim.run(x, mode=Mode.FIXED), codes, strict=True):
            lsb = code if code is not None else float(f.abs().max()) / 32767
            assert np.abs(y - f.numpy()).max() <= 1.01 * lsb
    assert qinfo.get(":matmul#0") is None and qinfo.get("conv:conv2d#0") is None  # wide
    assert qinfo["lin:linear#0"].dtype is DType.INT16
    sim.platform = replace(sim.platform, float_islands=FloatIslands.NONE)
    worst = max(
        float(np.abs(y - f.numpy()).max() / (float(f.abs().max()) / 32767))
        for x, ys in zip(xs, outs)
        for y, f in zip(ys, sim.run(x, mode=Mode.FIXED))
    )
    assert worst > 10  # the integer path's int32 accumulators wrap: many codes off


class _Upsampling(nn.Module):
    """Two transposed convolutions: one (3x3, stride 2, output padding) quantized before a
    sigmoid, one with two groups (one weight scale) leaving as a wide model output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1)
        self.wide = nn.ConvTranspose2d(8, 4, 2, stride=2, groups=2)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return torch.sigmoid(self.up(y)), self.wide(y)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_transposed_convolutions_run_as_float_convtranspose_in_onnxruntime(tmp_path, encoding):
    """onnxruntime has no integer ConvTranspose: it runs the float op between DequantizeLinear
    and QuantizeLinear, as the onnxruntime profile does (``fixed_gemm_float``). MLAS may sum in
    another order than torch, so a float32 sum can differ in its last bit and, at a rounding
    boundary, move a code by one: the quantized path agrees on (nearly) every code, the wide
    output to float32 rounding."""
    sim, xs = _calibrated(_Upsampling())
    assert (sim.ops["op_type"] == "conv_transpose2d").sum() == 2
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "ConvTranspose" in kinds
    same = total = 0
    for x, (y_sig, y_wide) in zip(xs, outs, strict=True):
        f_sig, f_wide = (t.detach().numpy() for t in sim.run(x, mode=Mode.FIXED))
        lsb = float(sim.trace(x, mode=Mode.FIXED).qinfo[":sigmoid#0"].scale)
        assert np.abs(y_sig - f_sig).max() <= lsb * 1.0001
        same += int((y_sig == f_sig).sum())
        total += y_sig.size
        assert np.abs(y_wide - f_wide).max() <= 2.0**-20 * np.abs(f_wide).max()
    assert same >= 0.999 * total


class _Extremes(nn.Module):
    """amax / amin over the spatial dims, every dim, and channels kept, max / min of every
    element: pass-through ops."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        y = self.conv(x)
        pooled = torch.cat([y.amax((2, 3)), torch.amin(y, dim=(2, 3))], 1)
        return (
            self.fc(pooled),
            torch.sigmoid(y.amax(1, keepdim=True)),
            torch.tanh(y.amin()),
            torch.sigmoid(y.max()) - torch.tanh(y.min()),
        )


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_max_and_min_reductions_keep_their_input_codes(tmp_path, encoding):
    """A maximum or minimum is one of its inputs: amax / amin are pass-through ops (their
    input's scale and codes), ReduceMax / ReduceMin in onnxruntime with fixed mode's bits
    (``y.max()`` of a float tensor named its ReduceMax's output as its codes and failed)."""
    sim, xs = _calibrated(_Extremes())
    ops = sim.ops.set_index("name")
    reductions = [":amax#0", ":amin#0", ":amax#1", ":amin#1", ":max#0", ":min#0"]
    assert (ops.loc[reductions, "category"] == "PASS_THROUGH").all()
    trace = sim.trace(xs[1], mode=Mode.FIXED)
    conv = trace.outputs["conv:conv2d#0"]
    assert_bits_equal(trace.outputs[":amax#0"], conv.amax((2, 3)))
    assert trace.qinfo[":amax#0"][0].scale is trace.qinfo["conv:conv2d#0"].scale
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert {"ReduceMax", "ReduceMin"} <= kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _TopScores(nn.Module):
    """DETR's query selection: the top scores over many positions (int8 scores of a sigmoid tie
    often), their boxes gathered by the indices, and the smallest values along the channels."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        scores = torch.sigmoid(y[:, 0].flatten(1) * 4)  # (B, 36) of 256 codes or fewer
        top, idx = scores.topk(12, dim=1)
        boxes = torch.gather(y[:, 1:].flatten(2), 2, idx[:, None].expand(-1, 3, -1))
        low = torch.topk(y, 2, dim=1, largest=False)
        return top, idx, boxes, low.values, low.indices


def test_topk_takes_equal_values_in_onnxs_order_and_exports_as_topk(tmp_path):
    """FAKE and FIXED runs take equal values lower index first (ONNX's rule; torch.topk's
    order is its own kernel's), and the QDQ export writes TopK with the fixed run's bits:
    values on the input's grid and the same indices (before, topk had no ONNX form and failed
    the export of kornia's RT-DETR)."""
    from quantlab.simulate.topk_order import topk_lower_index_first

    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        x = torch.randint(-3, 4, (5, 17), generator=g).float()  # ties everywhere
        for largest in (True, False):
            got = topk_lower_index_first(x, 6, 1, largest)
            key = (-x if largest else x) * 100 + torch.arange(17)  # value first, then index
            want = key.argsort(1)[:, :6]
            assert torch.equal(got.indices, want) and torch.equal(got.values, x.gather(1, want))
    sim, xs = _calibrated(_TopScores())
    trace = sim.trace(xs[1], mode=Mode.FIXED)
    scores = trace.outputs[":sigmoid#0"]
    top, idx = trace.outputs[":topk#0"]
    assert len(scores[0].unique()) < scores.shape[1]  # the case has ties
    assert torch.equal(idx, topk_lower_index_first(scores, 12, 1).indices)
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, ActivationEncoding.UNSIGNED_OFFSET)
    assert "TopK" in kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_a_traced_program_takes_topks_order_too(monkeypatch, mode):
    """A steady run's traced program (quantlab's own, on J6M) computes the same topk as the
    captured run."""
    from program_switch import build_in_first_run

    build_in_first_run(monkeypatch)
    model = _TopScores().eval()
    steady = Simulator(copy.deepcopy(model), "j6m")
    captured, xs = _calibrated(model, "j6m")
    captured.steady_programs = None  # every run captured
    steady.share_calibration(captured)
    for x in xs:
        for a, b in zip(steady.run(x, mode=mode), captured.run(x, mode=mode), strict=True):
            assert torch.equal(a, b)
    state = steady.steady_programs.status((xs[0],), mode)
    assert state.failed is None and state.program is not None and state.program.fallbacks == 0


class _Magnitudes(nn.Module):
    """abs of a convolution's output, then another convolution (kornia's HardNet takes one)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.b(torch.abs(self.a(x)))


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_abs_exports_as_abs_with_fixed_modes_bits(tmp_path, encoding):
    """abs (run in float between Dequantize and Quantize on the onnxruntime profile) exports as
    Abs; the export refused it."""
    sim, xs = _calibrated(_Magnitudes())
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "Abs" in kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, [sim.run(x, mode=Mode.FIXED)])


class _ConstantBranch(nn.Module):
    """A where between a constant made like an activation (zeros_like) and a quotient, as
    kornia's HardNet guards its patch normalization."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.c(x)
        d = y.amax(1, keepdim=True)
        return torch.where(d == 0, torch.zeros_like(y), y / (d.abs() + 0.5)).to(x.dtype)


def test_the_probe_export_leaves_constants_out(tmp_path):
    """The probe export exposed a constant (zeros_like's value, an initializer) as an output,
    which ONNX's shape inference does not type, and its full check failed. The cast after the
    where passes a float value on: the per-op rows compare it as a value (they compared its
    value quantized at a grid it never had with onnxruntime's float, and named it the first op
    to differ while no output did)."""
    sim, xs = _calibrated(_ConstantBranch())
    f = measure(sim, (xs[1],), tmp_path, "constant", ActivationEncoding.UNSIGNED_OFFSET)
    assert f.summary["outputs_differing"] == 0
    assert f.summary["first_diverging_op"] == "" and f.per_op["differing"].sum() == 0


class _FloatThenDropout(nn.Module):
    """HyNet's thresholded unit, max(x, tau) with a parameter tau (a float op on the
    onnxruntime profiles), then an eval-mode dropout and a cast to its own dtype (no nodes)
    and a convolution."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)
        self.tau = nn.Parameter(torch.full((1, 4, 1, 1), -0.3))
        self.drop = nn.Dropout(0.3)
        self.d = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.d(self.drop(torch.maximum(self.c(x), self.tau)).to(x.dtype))


def test_a_float_value_quantlab_holds_quantized_is_compared_on_its_grid(tmp_path):
    """At the cast quantlab holds the maximum's value quantized (the convolution's input
    grid), onnxruntime its float value, which its QuantizeLinear then quantizes: the per-op
    rows compare onnxruntime's float on that grid (they compared it with the quantized value
    and named the cast the first op to differ while no output did)."""
    sim, xs = _calibrated(_FloatThenDropout())
    f = measure(sim, (xs[1],), tmp_path, "tlu", ActivationEncoding.UNSIGNED_OFFSET)
    assert f.summary["outputs_differing"] == 0
    assert f.summary["first_diverging_op"] == "" and f.per_op["differing"].sum() == 0
    assert f.per_op["elements"].sum() > 0


class _Powers(nn.Module):
    """pow: the exponent 2 (a Python number and a one-value tensor, as ONNX converters write
    it) and other exponents, of negative and non-negative inputs."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.register_buffer("two", torch.tensor([2.0]))

    def forward(self, x):
        y = self.conv(x)
        r = torch.relu(y)
        return y**2, torch.pow(y, self.two), r**0.5, y.pow(3), r.pow(1.5), (y * y + 0.5) ** -0.5


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_pow_exports_as_mul_or_pow_with_fixed_modes_bits(tmp_path, encoding, dtype):
    """pow(x, 2) is Mul(x, x) (QLinearMul on 8-bit codes where onnxruntime fuses it); other
    exponents Pow between dequantize and quantize, the profile's table of powf's values."""
    torch.manual_seed(0)
    rule = OpQConfig(output_dtype=dtype)
    sim = Simulator(_Powers().eval(), ORT_PROFILE, QConfigSpec(by_type={"pow": rule}))
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 6, 6, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 3, 6, 6, generator=g) * s for s in (0.5, 1.0, 4.0)]
    pows = sim.ops[sim.ops.op_type == "pow"]
    assert list(pows["category"]) == ["MUL", "MUL", "LUT", "LUT", "LUT", "LUT"]
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "Pow" in kinds
    if encoding is ActivationEncoding.UNSIGNED_OFFSET and dtype is DType.INT8:
        assert "QLinearMul" in kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _EluSoftplus(nn.Module):
    def __init__(self, beta: float = 1.0):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.beta = beta

    def forward(self, x):
        y = self.conv(x)
        return F.elu(y), F.elu(y, alpha=0.3), F.softplus(y, beta=self.beta)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_elu_and_softplus_export_with_fixed_modes_bits(tmp_path, encoding, dtype):
    """Elu (its alpha) and Softplus between dequantize and quantize: the profile's tables hold
    onnxruntime's float32 values of both."""
    rule = OpQConfig(output_dtype=dtype)
    spec = QConfigSpec(by_type={"elu": rule, "softplus": rule})
    sim = Simulator(_EluSoftplus().eval(), ORT_PROFILE, spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 6, 6, generator=g),) for _ in range(2)], progress=False)
    assert list(sim.ops["category"]) == ["GEMM", "LUT", "LUT", "LUT"]
    xs = [torch.randn(2, 3, 6, 6, generator=g) * s for s in (0.5, 1.0, 4.0)]
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert {"Elu", "Softplus"} <= kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


def test_softplus_with_a_beta_is_refused(tmp_path):
    sim, xs = _calibrated(_EluSoftplus(beta=2.0))
    with pytest.raises(UnsupportedOpError, match="softplus with beta=2.0"):
        to_onnx_qdq(sim, tmp_path / "m.onnx", (xs[0],))


class _Resized(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.kw = kw

    def forward(self, x):
        return F.interpolate(torch.tanh(self.conv(x)), **self.kw) * 1.0


RESIZES = [
    dict(mode="nearest", scale_factor=2.0),
    dict(mode="nearest", scale_factor=1.5),
    dict(mode="nearest", size=(13, 11)),
    dict(mode="nearest", scale_factor=(2.0, 1.0)),
    dict(mode="bilinear", scale_factor=2.0, align_corners=False),
    dict(mode="bilinear", scale_factor=3.0, align_corners=False),
    dict(mode="bilinear", scale_factor=1.5, align_corners=False),
    dict(mode="bilinear", scale_factor=0.5, align_corners=False),
    dict(mode="bilinear", scale_factor=1.5, align_corners=True),
    dict(mode="bilinear", size=(13, 11), align_corners=False),
    dict(mode="bilinear", size=(5, 7), align_corners=True),
]


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
@pytest.mark.parametrize("kw", RESIZES, ids=lambda kw: "-".join(map(str, kw.values())))
def test_interpolate_runs_as_resize_with_fixed_modes_bits(tmp_path, kw, encoding):
    """F.interpolate exports as Resize: by the call's scale factor (torch maps coordinates with
    it; with the output size instead a 1.5x bilinear moved 6543 of 7488 codes) or to its
    size, nearest as torch's floor, bilinear with torch's align_corners."""
    torch.manual_seed(0)
    sim = Simulator(_Resized(**kw).eval(), ORT_PROFILE)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 8, 9, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 3, 8, 9, generator=g) * s for s in (0.5, 1.0, 4.0)]
    kernel = sim.ops.set_index("op_type").loc["interpolate", "fixed_kernel"]
    assert kernel == (
        "integer (nearest by onnxruntime's Resize indices, nearest-exact); float between "
        "dequantize and quantize (linear, bilinear: onnxruntime's float32 Resize steps)"
    )
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "Resize" in kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, [sim.run(x, mode=Mode.FIXED)])


NEAREST_EXACT = [  # on a 17 x 14 map
    dict(scale_factor=2.0),
    dict(scale_factor=0.3),
    dict(scale_factor=(1.5, 0.7)),
    dict(scale_factor=2.5, recompute_scale_factor=True),
    dict(size=(1, 4)),
    dict(size=(29, 59)),
]


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
@pytest.mark.parametrize("kw", NEAREST_EXACT, ids=lambda kw: "-".join(map(str, kw.values())))
def test_nearest_exact_runs_as_gathers_with_fixed_modes_bits(tmp_path, kw, encoding):
    """nearest-exact exports as a Gather per axis of the pixels torch reads (no Resize node
    reads them on every size: ``numerics.ort_resize``), with fixed mode's bits."""
    torch.manual_seed(0)
    sim = Simulator(_Resized(mode="nearest-exact", **kw).eval(), ORT_PROFILE)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 17, 14, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 3, 17, 14, generator=g) * s for s in (0.5, 4.0)]
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "Gather" in kinds and "Resize" not in kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, [sim.run(x, mode=Mode.FIXED)])


class _ChannelsLastResized(_Resized):
    def forward(self, x):
        y = torch.tanh(self.conv(x)).contiguous(memory_format=torch.channels_last)
        return F.interpolate(y, **self.kw) * 1.0


def test_nearest_exact_of_a_channels_last_tensor_is_refused(tmp_path):
    """torch's channels-last kernel reads other pixels than its contiguous one on some sizes,
    so the constant indices would not hold for it."""
    sim, xs = _calibrated(_ChannelsLastResized(mode="nearest-exact", size=(20, 115)))
    with pytest.raises(UnsupportedOpError, match="not contiguous"):
        to_onnx_qdq(sim, tmp_path / "m.onnx", (xs[0],))


def test_interpolate_modes_without_a_resize_form_are_refused(tmp_path):
    sim, xs = _calibrated(_Resized(mode="bicubic", scale_factor=2.0))
    with pytest.raises(UnsupportedOpError, match="interpolate mode='bicubic'"):
        to_onnx_qdq(sim, tmp_path / "m.onnx", (xs[0],))


class _Resized1d(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.conv = nn.Conv1d(3, 8, 3, padding=1)
        self.kw = kw

    def forward(self, x):
        return F.interpolate(torch.tanh(self.conv(x)), **self.kw) * 1.0


@pytest.mark.parametrize(
    "kw", [dict(mode="linear", scale_factor=1.5, align_corners=True), dict(mode="linear", size=7)]
)
def test_one_dimensional_interpolate_runs_as_resize_with_fixed_modes_bits(tmp_path, kw):
    torch.manual_seed(0)
    sim = Simulator(_Resized1d(**kw).eval(), ORT_PROFILE)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 9, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 3, 9, generator=g) * s for s in (0.5, 2.0)]
    outs, _ = _onnxruntime_outputs(sim, xs, tmp_path, ActivationEncoding.UNSIGNED_OFFSET)
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, [sim.run(x, mode=Mode.FIXED)])


class _Pieces(nn.Module):
    """chunk, split, unbind, narrow, select, flip, expand, repeat (with a leading dim) and
    movedim: ops that move or select codes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))  # (N, 8, H, W)
        a, b = y.chunk(2, 1)
        p, q, r = torch.split(y, [2, 3, 3], dim=1)
        u0, u1 = torch.unbind(y[:, :2], 1)
        mixed = a * b + p.sum(1, keepdim=True) + q[:, :1] - r[:, 2:] + (u0 * u1).unsqueeze(1)
        tiled = y[:, :1].expand(-1, 4, -1, -1) + y[:, :2].repeat(1, 2, 1, 1)
        return (
            mixed,
            y.narrow(2, 1, 3) * 2.0,
            y.select(3, -1) + 1.0,
            torch.flip(y, dims=(1, -1)) * y,
            tiled,
            torch.movedim(y, 1, -1) * 0.5,
            y.repeat(2, 1, 1, 1, 2) * 2.0,
        )


class _Selected(nn.Module):
    """roll (on dims and flattened), tile, index_select, gather, repeat_interleave (an int and
    a constant tensor of counts) and tril / triu: ops that select or repeat codes (the J6
    plugin's QTensor keeps the scale through them)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))  # (N, 8, H, W)
        w = y.shape[-1]
        order = torch.tensor([5, 0, 7, 7, 2])
        turned = torch.arange(w - 1, -1, -1).expand(*y.shape[:-1], w)
        return (
            torch.roll(y, shifts=(2, -1), dims=(1, 3)) * y,
            y.roll(5) + 1.0,
            y[:, :2].tile((1, 2, 1, 1)) + torch.tile(y[:, :1], (4, 1, 1)),
            y[0].tile((2, 1, 1, 2)) * 2.0,
            y.index_select(1, order) * 2.0,
            torch.gather(y, 3, turned) * y,
            y.repeat_interleave(2, dim=1) * 0.5,
            torch.repeat_interleave(y[:, :3], torch.tensor([1, 0, 2]), dim=1) + 0.25,
            torch.tril(y, diagonal=-1) + y.triu(1) * 2.0,
        )


class _Copied(nn.Module):
    """F.pad's reflect, replicate and circular modes (every value copied from the input, on
    4-d and 3-d tensors) and torch.max / torch.min over a dimension (the values, and their int64
    indices as outputs: the first index among equal codes, as torch takes it)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))  # (N, 8, H, W)
        hi, where = torch.max(y, dim=1)
        lo = y.min(-1, keepdim=True)
        return (
            F.pad(y, (1, 2, 2, 1), mode="reflect") * 2.0,
            F.pad(y, (0, 3, 1, 0), mode="replicate") + 0.5,
            F.pad(y, (2, 1, 1, 2), mode="circular") * 0.5,
            F.pad(y[:, 0], (2, 1), mode="reflect") * 2.0,
            hi * 2.0,
            where,
            lo.values + 1.0,
            lo.indices,
        )


# model -> (the ops it moves or selects codes with, ONNX node types its export must hold)
MOVING = {
    _Pieces: (
        "chunk split unbind narrow select flip expand repeat movedim",
        {"Slice", "Tile", "Expand", "Transpose"},
    ),
    _Selected: (
        "roll tile index_select gather repeat_interleave tril triu",
        {"Tile", "Gather", "GatherElements", "Trilu"},
    ),
    _Copied: ("pad max min", {"Pad", "ReduceMax", "ReduceMin", "ArgMax", "ArgMin"}),
}


@pytest.mark.parametrize("model", list(MOVING), ids=lambda m: m.__name__)
@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_codes_moving_ops_export_with_fixed_modes_bits(tmp_path, encoding, model):
    sim, xs = _calibrated(model())
    moved, nodes = MOVING[model]
    moved = moved.split()
    assert set(moved) <= set(sim.ops["op_type"])
    assert (sim.ops[sim.ops["op_type"].isin(moved)]["category"] == "PASS_THROUGH").all()
    outs, onnx_kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert nodes <= onnx_kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _ListIndexed(nn.Module):
    """Indexing with a list of slices whose bounds are 0-d tensors and numpy integers, as
    onnx2torch's Slice writes it (torch reads the list as a tuple)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        starts, ends = torch.tensor([1, 2]), torch.tensor([5, 6])
        index = [slice(None), slice(starts[0], ends[0], np.int64(1))]
        index.append(slice(starts[1], ends[1], np.int64(2)))
        with warnings.catch_warnings():  # torch: "a non-tuple sequence ... is deprecated"
            warnings.simplefilter("ignore", UserWarning)
            return y[index] * 1.0


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_a_list_of_slices_exports_as_slice(tmp_path, encoding):
    sim, xs = _calibrated(_ListIndexed())
    outs, onnx_kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "Slice" in onnx_kinds
    for x, ys in zip(xs, outs, strict=True):
        fixed = sim.run(x, mode=Mode.FIXED)
        assert fixed.shape == (2, 3, 2, 6)
        assert _same(ys, [fixed])


class _Shuffled(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.down = nn.Conv2d(32, 4, 1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        shuffled = self.down(F.pixel_unshuffle(F.channel_shuffle(y, 4), 2))
        return F.pixel_shuffle(y, 2) * 2.0, shuffled


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_pixel_and_channel_shuffles_move_codes_with_fixed_modes_bits(tmp_path, encoding):
    sim, xs = _calibrated(_Shuffled())
    ops = sim.ops.set_index("op_type")
    moved = ["pixel_shuffle", "pixel_unshuffle", "channel_shuffle"]
    assert (ops.loc[moved, "category"] == "PASS_THROUGH").all()
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "DepthToSpace" in kinds and "Transpose" in kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


class _InverseSigmoid(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return quantlab_ops.inverse_sigmoid(torch.sigmoid(self.conv(x) * 3.0)) * 1.0


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_inverse_sigmoid_exports_with_the_table_onnxruntime_computes(tmp_path, dtype, encoding):
    """inverse_sigmoid is written as Clip, Sub, Clip, Div, Log; the profile's table holds each
    code as those float32 ops and Eigen's log compute it (``runtime_values``); every tensor
    here has a multiple of 4 elements, so no element takes the C library's log."""
    both = OpQConfig(input_dtype=dtype, output_dtype=dtype)
    spec = QConfigSpec(by_type={"inverse_sigmoid": both, "sigmoid": OpQConfig(output_dtype=dtype)})
    torch.manual_seed(0)
    sim = Simulator(_InverseSigmoid().eval(), ORT_PROFILE, spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 3, 8, 8, generator=g) * s for s in (0.5, 2.0)]
    assert sim.qconfig_of(":inverse_sigmoid#0").output_dtype is dtype
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert "Log" in kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, [sim.run(x, mode=Mode.FIXED)])


def test_the_detr_style_decoder_exports_with_fixed_modes_bits(tmp_path):
    """The registry's DETR-style decoder (six refinements ref = sigmoid(delta +
    inverse_sigmoid(ref))) runs in onnxruntime with fixed mode's bits in both encodings."""
    from quantlab.models import build_model, example_inputs

    sim = Simulator(build_model("detr_decoder").module, ORT_PROFILE)
    sim.calibrate([example_inputs("detr_decoder", 2, seed=s) for s in range(2)], progress=False)
    x = example_inputs("detr_decoder", 2, seed=7)
    for encoding in ActivationEncoding:
        info = to_onnx_qdq(sim, tmp_path / f"{encoding.name}.onnx", x, encoding=encoding)
        got = R.run(R.session(info.path), info.input_names, x)
        assert _same(got, [sim.run(*x, mode=Mode.FIXED)])


class _AdaptiveMax(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))  # (N, 8, 6, 6)
        return (
            F.adaptive_max_pool2d(y, 1) * 2.0,
            F.adaptive_max_pool2d(y, (3, 2)) * 2.0,
            F.adaptive_max_pool2d(y, 4) * 2.0,  # 6 -> 4: windows of 2 and 3 rows overlap
            F.adaptive_max_pool2d(y, (5, 3)) * 2.0,  # overlapping rows, dividing columns
            F.adaptive_max_pool2d(y[:, :, :5], (4, 7)) * 2.0,  # 5 -> 4; 6 -> 7: repeated
            F.adaptive_max_pool1d(y.flatten(2), 1) * 2.0,  # the 1-d forms: global,
            F.adaptive_max_pool1d(y.flatten(2), 9) * 2.0,  # 36 -> 9: dividing,
            F.adaptive_max_pool1d(y.flatten(2), 10) * 2.0,  # 36 -> 10: overlapping
        )


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_adaptive_max_pooling_exports_with_fixed_modes_bits(tmp_path, encoding):
    """Output 1 x 1 as GlobalMaxPool, sizes that divide as MaxPool, overlapping (and
    repeating) windows as a Gather of each window's rows and a ReduceMax per axis; the 1-d
    pools the same way along their one axis."""
    sim, xs = _calibrated(_AdaptiveMax())
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert {"MaxPool", "GlobalMaxPool", "Gather", "ReduceMax"} <= kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


def test_adaptive_windows_are_torchs():
    """Every window of ``adaptive_windows`` gives adaptive_max_pool1d's maximum, sizes 1 to 29
    into 1 to 34 (outputs wider than the input repeat pixels)."""
    from quantlab.export.emit_pool_reduce import adaptive_windows

    g = torch.Generator().manual_seed(0)
    for n_in, n_out in itertools.product(range(1, 30), range(1, 35)):
        x = torch.randn(2, 3, n_in, generator=g)
        idx = torch.from_numpy(adaptive_windows(n_in, n_out))
        assert torch.equal(x[:, :, idx].amax(-1), F.adaptive_max_pool1d(x, n_out)), (n_in, n_out)


class _Pools1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 8, 3, padding=1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))  # (N, 8, 12)
        return (
            F.avg_pool1d(y, 3) * 2.0,
            F.avg_pool1d(y, 4, 2, 1) * 2.0,
            F.avg_pool1d(y, 3, 1, 1, count_include_pad=False) * 2.0,
            F.adaptive_avg_pool1d(y, 1) * 2.0,
            F.adaptive_avg_pool1d(y, 4) * 2.0,
        )


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_one_dimensional_average_pools_export_with_fixed_modes_bits(tmp_path, encoding):
    """avg_pool1d / adaptive_avg_pool1d run as the 2-d pools over a height-1 image (on the
    onnxruntime profile QLinearAveragePool's float32 window sums) and export as AveragePool /
    GlobalAveragePool; they ran in float before."""
    torch.manual_seed(0)
    sim = Simulator(_Pools1d().eval(), ORT_PROFILE)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 3, 12, generator=g) * s for s in (0.5, 1.0, 3.0)]
    sim.calibrate([(x,) for x in xs[:2]], progress=False)
    trace = sim.trace(xs[0], mode=Mode.FIXED)
    pools = [n for n in trace.order if "pool1d" in n]
    assert len(pools) == 5 and all(trace.qinfo[n].codes is not None for n in pools)
    outs, kinds = _onnxruntime_outputs(sim, xs, tmp_path, encoding)
    assert {"AveragePool", "QLinearAveragePool"} & kinds
    for x, ys in zip(xs, outs, strict=True):
        assert _same(ys, sim.run(x, mode=Mode.FIXED))


def test_a_one_dimensional_pool_is_the_two_dimensional_one_over_a_row():
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(3, 8, 3, padding=1)

        def forward(self, x):
            y = torch.tanh(self.conv(x))
            two = F.avg_pool2d(y.unsqueeze(2), (1, 3)).squeeze(2)
            return F.avg_pool1d(y, 3) * 2.0, two * 2.0

    torch.manual_seed(0)
    sim = Simulator(Both().eval(), "j6m")
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 12, generator=g),) for _ in range(2)], progress=False)
    one, two = sim.run(torch.randn(2, 3, 12, generator=g), mode=Mode.FIXED)
    assert_bits_equal(one, two)
