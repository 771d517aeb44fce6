"""Asymmetric activations (``activation_symmetry: ASYMMETRIC``): zero points calibrated from the
observed min / max, carried between ops, through convs, a linear, a matmul of two activations,
add, mul, average pooling, a mean, cat (inputs at other scales and zero points) and softmax.
Fixed mode under the onnxruntime profile gives onnxruntime's bits on the exported QDQ model
(QLinearConv / QLinearAdd / QLinearMul / QLinearMatMul / QLinearAveragePool / QLinearConcat /
QLinearSoftmax / QGemm with nonzero zero points), with int8 codes and as uint8; FAKE mode is the
fake quantization with those zero points."""

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

from quantlab.export import ActivationEncoding, to_onnx_qdq  # noqa: E402
from quantlab.export import runtime as R  # noqa: E402
from quantlab.numerics import (  # noqa: E402
    Divide,
    DType,
    compute_zero_point_scale,
    fake_quant,
)
from quantlab.qconfig import OpQConfig, QConfigSpec  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402

ASYMMETRIC = QConfigSpec(global_=OpQConfig(activation_symmetry="ASYMMETRIC"))


class _Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(16, 6)

    def forward(self, x):
        a = F.relu(self.c1(x))
        b = self.c2(a)
        y = F.avg_pool2d(a + b, 2)  # (N, 8, 4, 4)
        y = torch.cat([y, y * torch.sigmoid(b[:, :, ::2, ::2])], 1)
        t = y.flatten(2)  # (N, 16, 16)
        att = torch.softmax(torch.matmul(t, t.transpose(1, 2)) * 0.25, dim=-1)
        return self.fc(torch.matmul(att, t).mean(1))


@pytest.fixture(scope="module")
def asymmetric_sim():
    torch.manual_seed(0)
    sim = Simulator(_Mixed().eval(), ORT_PROFILE, ASYMMETRIC)
    sim.calibrate([(torch.rand(2, 3, 8, 8) - 0.3,) for _ in range(3)], progress=False)
    return sim, (torch.rand(3, 3, 8, 8) - 0.3,)


def test_asymmetric_fixed_mode_matches_onnxruntime(asymmetric_sim, tmp_path):
    """int8 codes with zero points, held by onnxruntime as uint8 (code + 128, zero point + 128:
    the encoding its x86 kernels fuse)."""
    sim, x = asymmetric_sim
    trace = sim.trace(*x, mode=Mode.FIXED)
    infos = [i[0] if isinstance(i, list) and i else i for i in trace.qinfo.values()]
    zps = [i.zero_point for i in infos if i is not None and i.dtype.is_int]
    assert sum(1 for z in zps if z != 0) >= 8, zps
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", x, encoding=ActivationEncoding.UNSIGNED_OFFSET)
    sess = R.session(info.path, tmp_path / "opt.onnx")
    kinds = {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    for kernel in ("QLinearConv", "QLinearAdd", "QLinearMul", "QLinearMatMul", "QLinearConcat"):
        assert kernel in kinds, kinds
    assert "QLinearSoftmax" in kinds and "QLinearAveragePool" in kinds
    (y,) = R.run(sess, info.input_names, x)
    assert np.array_equal(y, sim.run(*x, mode=Mode.FIXED).numpy())


def test_asymmetric_fake_mode_is_fake_quant_with_the_observed_range():
    """A one-conv model: its FAKE output is fake_quant(conv(fq(x), fq(w))) at the (scale, zero
    point) of the global min / max its float outputs reached during calibration."""
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 4, 3).eval()
    spec = QConfigSpec(
        global_=OpQConfig(activation_symmetry="ASYMMETRIC"),
        by_type={"conv2d": OpQConfig(high_precision_output=False)},  # a quantized output
    )
    sim = Simulator(conv, ORT_PROFILE, spec)
    calib = [(torch.rand(2, 3, 6, 6) * 2 - 0.5,) for _ in range(3)]
    sim.calibrate(calib, progress=False)
    x = torch.rand(2, 3, 6, 6) * 2 - 0.5
    with torch.no_grad():
        xs = torch.cat([b[0] for b in calib])
        outs = torch.cat([conv(b[0]) for b in calib])
        s_in, z_in = compute_zero_point_scale(float(xs.min()), float(xs.max()), DType.INT8)
        s_out, z_out = compute_zero_point_scale(float(outs.min()), float(outs.max()), DType.INT8)
        assert z_in != 0 and z_out != 0
        name = sim.ops.name.iloc[0]
        w = sim.weight_value(name, conv.weight, DType.INT8, Mode.FAKE)
        fq = dict(divide=Divide.BY_RECIPROCAL)  # QAT's kernel (numerics.quantize.Divide)
        xq = fake_quant(x, s_in, DType.INT8, zero_point=z_in, **fq)
        b = sim.bias_value(conv.bias, s_in, sim.weight_q(name, conv.weight, DType.INT8, True)[1])
        want = fake_quant(F.conv2d(xq, w, b), s_out, DType.INT8, zero_point=z_out, **fq)
        got = sim.run(x, mode=Mode.FAKE)
    assert torch.equal(got, want)


def test_asymmetric_needs_a_min_max_observer():
    sim = Simulator(nn.Conv2d(3, 4, 3).eval(), "j6m", ASYMMETRIC)
    sim.calibrate([(torch.rand(1, 3, 6, 6),)], progress=False)
    with pytest.raises(ValueError, match="MINMAX or GLOBAL_MINMAX.*got observer=MSE"):
        sim.run(torch.rand(1, 3, 6, 6), mode=Mode.FIXED)


def test_activation_symmetry_is_a_qconfig_and_platform_field():
    from quantlab.platforms import load_platform
    from quantlab.qconfig import ActivationSymmetry

    assert OpQConfig(activation_symmetry="asymmetric").activation_symmetry is (
        ActivationSymmetry.ASYMMETRIC
    )
    with pytest.raises(ValueError, match="activation_symmetry.*SYMMETRIC, ASYMMETRIC"):
        OpQConfig(activation_symmetry="skewed")
    for name in ("j6e", "j6m", "j6b", "j6h", "j6p", "onnxruntime", "tflite", "litert_xnnpack"):
        assert load_platform(name).activation_symmetry is ActivationSymmetry.SYMMETRIC


class _ConvSub(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return self.c1(x) - self.c2(x)


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_asymmetric_sub_matches_onnxruntime(encoding, tmp_path):
    """sub with zero points (the add of the negated operand) gives onnxruntime's bits, where
    Sub runs in float32 between DequantizeLinear and QuantizeLinear (there is no QLinearSub)."""
    torch.manual_seed(4)
    spec = QConfigSpec(
        global_=OpQConfig(activation_symmetry="ASYMMETRIC"),
        by_type={"conv2d": OpQConfig(high_precision_output=False)},
    )
    # int8 activations with nonzero zero points stay on onnxruntime's exact s8s8 kernels even
    # where its u8s8 ones saturate (measured on such a CPU): the exact profile is theirs
    signed = encoding is ActivationEncoding.SIGNED
    sim = Simulator(_ConvSub().eval(), "onnxruntime" if signed else ORT_PROFILE, spec)
    sim.calibrate([(torch.randn(2, 3, 8, 8) + 0.3,) for _ in range(2)], progress=False)
    x = (torch.randn(4, 3, 8, 8) + 0.3,)
    trace = sim.trace(*x, mode=Mode.FIXED)
    assert trace.qinfo[":sub#0"].zero_point != 0
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", x, encoding=encoding)
    sess = R.session(info.path, tmp_path / "opt.onnx")
    assert "Sub" in {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    (y,) = R.run(sess, info.input_names, x)
    assert np.array_equal(y, sim.run(*x, mode=Mode.FIXED).numpy())
