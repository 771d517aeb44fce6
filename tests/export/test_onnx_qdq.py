"""quantlab.export.to_onnx_qdq: the written model passes onnx.checker (full check), runs in
onnxruntime, carries the Simulator's scales, and an op without an ONNX form fails clearly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402

# the profile of this machine's onnxruntime (onnxruntime_no_vnni on x86 without VNNI)
ORT_PROFILE = onnxruntime_profile()
from onnx import numpy_helper  # noqa: E402

from quantlab.export import (  # noqa: E402
    SUPPORTED_OPS,
    ActivationEncoding,
    UnsupportedOpError,
    to_onnx_qdq,
)
from quantlab.export import runtime as R  # noqa: E402
from quantlab.models import build_model, example_inputs  # noqa: E402
from quantlab.numerics import DType  # noqa: E402
from quantlab.numerics.gemm import quantize_bias  # noqa: E402
from quantlab.qconfig import OpQConfig, QConfigSpec  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402


def _small_cnn(platform=ORT_PROFILE, qconfig=None):
    bundle = build_model("small_cnn")
    sim = Simulator(bundle.module, platform, qconfig)
    sim.calibrate([example_inputs("small_cnn", 2, seed=s) for s in range(2)])
    return sim, example_inputs("small_cnn", 3, seed=5)


@pytest.fixture(scope="module")
def small_cnn_export(tmp_path_factory):
    sim, x = _small_cnn()
    path = tmp_path_factory.mktemp("qdq") / "small_cnn.onnx"
    info = to_onnx_qdq(sim, path, x, encoding=ActivationEncoding.SIGNED)
    return sim, x, info


def _inits(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _node_feeding(model, output):
    return next(n for n in model.graph.node if output in n.output)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_small_cnn_passes_checker_and_matches_fixed_mode_in_onnxruntime(tmp_path, encoding):
    sim, x = _small_cnn()
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", x, encoding=encoding)
    onnx.checker.check_model(onnx.load(str(info.path)), full_check=True)
    (y,) = R.run(R.session(info.path), info.input_names, x)
    ref = sim.run(*x, mode=Mode.FIXED).numpy()
    assert y.shape == ref.shape
    assert np.array_equal(y, ref)


def test_exported_scales_equal_the_simulators(small_cnn_export):
    sim, x, info = small_cnn_export
    model = onnx.load(str(info.path))
    inits = _inits(model)
    trace = sim.trace(*x, mode=Mode.FIXED)
    checked = 0
    for name in ("conv1:conv2d#0", "conv2:conv2d#0", ":avg_pool2d#0", ":mean#0"):
        q = _node_feeding(model, info.op_tensors[name])
        assert q.op_type == "QuantizeLinear"
        assert inits[q.input[1]].dtype == np.float32
        assert inits[q.input[1]] == trace.qinfo[name].scale.numpy()
        assert int(inits[q.input[2]]) == 0
        checked += 1
    for mod, name in ((sim.model.conv1, "conv1:conv2d#0"), (sim.model.conv2, "conv2:conv2d#0")):
        rq = sim.qconfig_of(name)
        codes, ws = sim.weight_q(name, mod.weight, rq.weight_dtype, True)
        assert np.array_equal(inits[f"{name}/weight"], codes.numpy())
        dq = _node_feeding(model, f"{name}/weight/dq")
        assert np.array_equal(inits[dq.input[1]], ws.numpy().reshape(-1))
        conv = next(n for n in model.graph.node if n.op_type == "Conv" and name in n.name)
        xq = _node_feeding(model, _node_feeding(model, conv.input[0]).input[0])
        xs = torch.tensor(inits[xq.input[1]])
        bias = quantize_bias(mod.bias.detach(), xs, ws).numpy()
        assert np.array_equal(inits[f"{name}/bias"], bias.astype(np.int32))
        checked += 1
    assert checked == 6


def test_default_encoding_is_the_profiles(tmp_path):
    """Without an encoding the export holds int8 activations with the zero point the profile
    computes with: uint8 / 128 for onnxruntime, int8 / 0 for j6m."""
    for platform, dtype, zp in (("onnxruntime", np.uint8, 128), ("j6m", np.int8, 0)):
        sim, x = _small_cnn(platform)
        info = to_onnx_qdq(sim, tmp_path / f"{platform}.onnx", x)
        model = onnx.load(str(info.path))
        q = _node_feeding(model, info.op_tensors["conv1:conv2d#0"])
        z = _inits(model)[q.input[2]]
        assert z.dtype == dtype and int(z) == zp


def test_j6m_int8_int16_mix_passes_checker_and_runs(tmp_path):
    spec = QConfigSpec(
        by_name={
            "conv1:conv2d#0": OpQConfig(output_dtype=DType.INT16),
            ":avg_pool2d#0": OpQConfig(output_dtype=DType.INT16),
            "fc:linear#0": OpQConfig(weight_dtype=DType.INT16),
        }
    )
    sim, x = _small_cnn("j6m", spec)
    info = to_onnx_qdq(sim, tmp_path / "j6m.onnx", x)
    model = onnx.load(str(info.path))
    onnx.checker.check_model(model, full_check=True)
    inits = _inits(model)
    q_types = {inits[n.input[2]].dtype for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert q_types == {np.dtype(np.int8), np.dtype(np.int16)}
    assert inits["fc:linear#0/weight"].dtype == np.int16
    (y,) = R.run(R.session(info.path), info.input_names, x)
    assert y.shape == (3, 10) and np.isfinite(y).all()


class _LogSoftmax(nn.Module):
    """log_softmax, which the export has no form for (quantlab does not model it)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return F.log_softmax(self.conv(x), dim=1)


def test_unsupported_op_names_the_op_and_lists_the_supported(tmp_path):
    sim = Simulator(_LogSoftmax().eval(), ORT_PROFILE)
    x = (torch.rand(1, 3, 8, 8),)
    sim.calibrate([x])
    with pytest.raises(UnsupportedOpError) as err:
        to_onnx_qdq(sim, tmp_path / "m.onnx", x)
    msg = str(err.value)
    assert ":log_softmax#0" in msg and "'log_softmax'" in msg
    assert "supported op types: " + ", ".join(SUPPORTED_OPS) in msg
    assert not (tmp_path / "m.onnx").exists()


class _MaskedMean(nn.Module):
    """An integer model input that reaches float ops through calls quantlab does not capture
    (indexing and a cast), as a transformer's attention mask does."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x, mask):
        m = mask[:, :, None].to(torch.float32)
        return (self.fc(x) * m).sum(1) / m.sum(1).clamp(min=1.0)


def test_integer_inputs_reach_the_graph_through_uncaptured_calls(tmp_path):
    sim = Simulator(_MaskedMean().eval(), ORT_PROFILE)
    x = torch.randn(2, 5, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    sim.calibrate([(x, mask)])
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", (x, mask))
    sess = R.session(info.path)
    other = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    (y,) = R.run(sess, info.input_names, (x, other))
    assert np.array_equal(y, sim.run(x, other, mode=Mode.FIXED).numpy())


class _DeadChannelConv(nn.Module):
    """A conv whose channel 1 has near-zero weights and a large negative bias: its int32 bias
    code saturates at -2**31 and the products push the sum past it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)
        with torch.no_grad():
            self.conv.weight[1].fill_(-2e-6)
            self.conv.bias[1] = -6.0

    def forward(self, x):
        return F.max_pool2d(F.relu6(self.conv(x)), 2)


def test_int32_accumulator_wraps_as_onnxruntime_does(tmp_path):
    """onnxruntime adds a saturated int32 bias and the products in two's complement: the
    onnxruntime profile (accumulator_overflow WRAP) matches it; a saturating accumulator does
    not."""
    torch.manual_seed(0)
    x = torch.rand(2, 3, 8, 8)
    sim = Simulator(_DeadChannelConv().eval(), ORT_PROFILE)
    sim.calibrate([(x,)], progress=False)
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", (x,))
    (y,) = R.run(R.session(info.path), info.input_names, (x,))
    assert np.array_equal(y, sim.run(x, mode=Mode.FIXED).numpy())
    from dataclasses import replace

    from quantlab.numerics.accumulator import Overflow

    sim.platform = replace(sim.platform, accumulator_overflow=Overflow.SATURATE)
    assert not np.array_equal(y, sim.run(x, mode=Mode.FIXED).numpy())


class _Clips(nn.Module):
    """Clamps that are no fused activation: on the model input (its scale calibrated on values
    well beyond the bounds, so the clamp changes the scale), a relu6 after a multiply, and a
    hardtanh whose bounds lie inside its input's range."""

    def forward(self, x):
        a = x.clamp(-1.0, 1.0)
        b = F.relu6(x * 3.0)
        c = F.hardtanh(torch.cos(x), -0.5, 0.5)
        return a + torch.sigmoid(b) + c


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_clamps_that_change_the_scale_match_onnxruntime(tmp_path, encoding):
    """onnxruntime runs DequantizeLinear -> Clip -> QuantizeLinear: the clip of the dequantized
    values at the real bounds, quantized at the output scale; fixed mode requantizes, then
    clamps at the bounds' output codes, which gives the same codes (rounding is monotone)."""
    g = torch.Generator().manual_seed(3)
    sim = Simulator(_Clips().eval(), ORT_PROFILE)
    sim.calibrate([(torch.randn(2, 4, 5, 5, generator=g) * 2,) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 4, 5, 5, generator=g) * s for s in (0.5, 2.0, 8.0)]
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", (xs[0],), encoding=encoding)
    sess = R.session(info.path)
    for x in xs:
        (y,) = R.run(sess, info.input_names, (x,))
        assert np.array_equal(y, sim.run(x, mode=Mode.FIXED).numpy())


class _Scores(nn.Module):
    """Attention-like scores: a linear layer, then softmax over the last axis."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 48)

    def forward(self, x):
        return torch.softmax(self.fc(x) * 3.0, dim=-1)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_int8_softmax_matches_onnxruntime_qlinear_softmax(tmp_path, encoding):
    """onnxruntime fuses the exported DequantizeLinear -> Softmax -> QuantizeLinear into
    QLinearSoftmax; the onnxruntime profile's FLOAT_EXP_TABLE rule gives its bits, the J6
    segment-LUT composite does not."""
    from dataclasses import replace

    from quantlab.platforms import SoftmaxRule

    torch.manual_seed(3)
    sim = Simulator(_Scores().eval(), ORT_PROFILE)
    sim.calibrate([(torch.randn(4, 6, 12),) for _ in range(2)], progress=False)
    x = (torch.randn(3, 6, 12),)
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", x, encoding=encoding)
    sess = R.session(info.path, tmp_path / "opt.onnx")
    kinds = {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    assert "QLinearSoftmax" in kinds
    (y,) = R.run(sess, info.input_names, x)
    assert np.array_equal(y, sim.run(*x, mode=Mode.FIXED).numpy())
    sim.platform = replace(sim.platform, softmax_rule=SoftmaxRule.SEGMENT_LUT)
    assert not np.array_equal(y, sim.run(*x, mode=Mode.FIXED).numpy())
