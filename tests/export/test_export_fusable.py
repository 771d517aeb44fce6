"""QDQ graphs onnxruntime can fuse completely, with fixed mode's bits: zero padding written as a
Pad of the codes (with their zero point), a fused ReLU6 whose bounds change no code left out,
one that changes codes written as a Clip of the uint8 codes, and no node whose output nothing
reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from quantlab.export import ActivationEncoding, to_onnx_qdq  # noqa: E402
from quantlab.export import runtime as R  # noqa: E402
from quantlab.export.emit_gemm import clip_changes_codes, code_clip  # noqa: E402
from quantlab.export.graph import QParams  # noqa: E402
from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402
from quantlab.numerics import DType  # noqa: E402
from quantlab.qconfig import OpQConfig, QConfigSpec  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402

SIGNED = ActivationEncoding.SIGNED
ASYMMETRIC = QConfigSpec(global_=OpQConfig(activation_symmetry="asymmetric"))


class PadNet(nn.Module):
    """EfficientNet-Lite's pattern: conv + ReLU6, explicit zero padding, depthwise conv."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 1)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, groups=8)
        self.c2 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        h = F.relu6(self.c1(x))
        h = F.relu6(self.dw(F.pad(h, (0, 1, 0, 1))))
        return self.c2(h)


def _export(tmp_path, spec, scale: float = 1.0):
    torch.manual_seed(0)
    sim = Simulator(PadNet().eval(), onnxruntime_profile(), spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 9, 9, generator=g) * scale,) for _ in range(3)], False)
    x = torch.randn(2, 3, 9, 9, generator=g) * scale
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", (x,))
    return sim, info, g


def _check_bits(sim, info, xs):
    sess = R.session(info.path)
    for x in xs:
        (y,) = R.run(sess, info.input_names, (x,))
        want = sim.run(x, mode=Mode.FIXED).numpy()
        assert y.dtype == want.dtype and np.array_equal(y.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("spec", [None, ASYMMETRIC], ids=["symmetric", "asymmetric"])
def test_padding_runs_on_codes_and_onnxruntime_fuses_it(tmp_path, spec):
    sim, info, g = _export(tmp_path, spec)
    model = onnx.load(info.path)
    (pad,) = [n for n in model.graph.node if n.op_type == "Pad"]
    producers = {o: n for n in model.graph.node for o in n.output}
    # the codes (symmetric: ReLU6's Clip of them), not their values
    assert producers[pad.input[0]].op_type == ("QuantizeLinear" if spec else "Clip")
    xs = [torch.randn(2, 3, 9, 9, generator=g) * s for s in (0.1, 1.0, 5.0)]
    _check_bits(sim, info, xs + [torch.zeros(2, 3, 9, 9)])
    R.session(info.path, tmp_path / "opt.onnx")
    kernels = R.kernel_counts(tmp_path / "opt.onnx")
    # the padded codes feed the depthwise QLinearConv; c2's wide output is a ConvInteger;
    # nothing runs between a DequantizeLinear and a QuantizeLinear
    assert kernels["QLinearConv"] == 2 and kernels["Pad"] == 1 and kernels["ConvInteger"] == 1
    assert "DequantizeLinear" not in kernels
    # asymmetric ReLU6 outputs from 0 need no Clip; symmetric ones clip their uint8 codes
    assert kernels.get("Clip", 0) == (0 if spec else 2)
    by_op = R.kernels_by_op(tmp_path / "opt.onnx", list(info.op_tensors))
    clip = ["Clip(codes)"] if spec is None else []
    assert by_op["c1:conv2d#0"] == by_op["dw:conv2d#0"] == ["QLinearConv", *clip]
    assert by_op[":pad#0"] == ["Pad(codes)"]
    assert by_op["c2:conv2d#0"] == ["ConvInteger", "Add", "Cast", "Mul"]
    floats = [op for op, k in by_op.items() if R.computes_in_float(k)]
    assert floats == ["c2:conv2d#0"]  # the wide output's Mul by the accumulator scale


class FilledPadNet(PadNet):
    """PadNet with a constant fill other than zero (snapped to the input's grid)."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.fill = fill

    def forward(self, x):
        h = torch.tanh(self.c1(x))
        h = F.relu6(self.dw(F.pad(h, (0, 1, 1, 0), value=self.fill)))
        return self.c2(h)


@pytest.mark.parametrize("fill", [0.3, -0.55, 1e4])
@pytest.mark.parametrize("spec", [None, ASYMMETRIC], ids=["symmetric", "asymmetric"])
def test_a_constant_fill_is_padded_with_fixed_modes_bits(tmp_path, spec, fill):
    torch.manual_seed(0)
    sim = Simulator(FilledPadNet(fill).eval(), onnxruntime_profile(), spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 9, 9, generator=g),) for _ in range(3)], False)
    info = to_onnx_qdq(sim, tmp_path / "m.onnx", (torch.randn(2, 3, 9, 9, generator=g),))
    xs = [torch.randn(2, 3, 9, 9, generator=g) * s for s in (0.1, 1.0, 5.0)]
    _check_bits(sim, info, xs + [torch.zeros(2, 3, 9, 9)])


def test_int8_codes_are_padded_as_values(tmp_path):
    """Written as int8 (SIGNED), the Pad stays between DequantizeLinear and QuantizeLinear:
    onnxruntime's x86 kernels move int8 activations to uint8 by rewriting Q/DQ pairs."""
    sim, _, g = _export(tmp_path, None)
    x = torch.randn(2, 3, 9, 9, generator=g)
    info = to_onnx_qdq(sim, tmp_path / "s.onnx", (x,), encoding=ActivationEncoding.SIGNED)
    model = onnx.load(info.path)
    (pad,) = [n for n in model.graph.node if n.op_type == "Pad"]
    producers = {o: n for n in model.graph.node for o in n.output}
    assert producers[pad.input[0]].op_type == "DequantizeLinear"


def test_relu6_bounds_that_change_no_code_leave_no_clip(tmp_path):
    # asymmetric outputs calibrated on [0, m], m <= 6: no Clip (the codes' range is the bounds')
    sim, info, g = _export(tmp_path, ASYMMETRIC)
    assert not [n for n in onnx.load(info.path).graph.node if n.op_type == "Clip"]
    _check_bits(sim, info, [torch.randn(2, 3, 9, 9, generator=g) * s for s in (1.0, 40.0)])
    # symmetric int8 codes reach below ReLU6's 0: both Clips stay, on the uint8 codes
    sim, info, g = _export(tmp_path, None)
    model = onnx.load(info.path)
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    producers = {o: n for n in model.graph.node for o in n.output}
    assert len(clips) == 2 and all(producers[c.input[0]].op_type == "QuantizeLinear" for c in clips)
    bounds = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    assert all(bounds[c.input[k]].dtype == np.uint8 for c in clips for k in (1, 2))
    _check_bits(sim, info, [torch.randn(2, 3, 9, 9, generator=g) * s for s in (1.0, 40.0)])
    # written as int8 (SIGNED) they stay on the dequantized values
    info = to_onnx_qdq(sim, tmp_path / "s.onnx", (torch.zeros(2, 3, 9, 9),), encoding=SIGNED)
    model = onnx.load(info.path)
    producers = {o: n for n in model.graph.node for o in n.output}
    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    assert len(clips) == 2
    assert all(producers[c.input[0]].op_type == "DequantizeLinear" for c in clips)
    _check_bits(sim, info, [torch.randn(2, 3, 9, 9, generator=g) * s for s in (1.0, 40.0)])


def test_every_node_output_is_read(tmp_path):
    _, info, _ = _export(tmp_path, ASYMMETRIC)
    model = onnx.load(info.path)
    read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    assert all(o in read for n in model.graph.node for o in n.output)
    used = {i for n in model.graph.node for i in n.input}
    assert all(t.name in used for t in model.graph.initializer)


def _clip_changes_by_brute_force(lo, hi, q: QParams) -> bool:
    """Dequantize every code as DequantizeLinear does, clip in float32, quantize again."""
    s, z = np.float32(q.scale), np.float32(q.zero_point)
    codes = np.arange(q.dtype.qmin, q.dtype.qmax + 1, dtype=np.float32)
    v = (codes - z) * s
    c = np.clip(
        v, np.float32(-np.inf if lo is None else lo), np.float32(np.inf if hi is None else hi)
    )
    back = np.clip(np.rint(c / s) + z, q.dtype.qmin, q.dtype.qmax)
    return bool((back != codes).any())


def test_clip_changes_codes_against_every_code():
    """Sound against dequantizing, clipping and quantizing every code: a Clip it leaves out
    changes no code; one it keeps changes some, unless a bound lies within half an LSB inside
    an end of the range (rounding takes the end's code back)."""
    rng = np.random.default_rng(0)
    left_out = kept = 0
    for _ in range(300):
        dtype = DType.INT8 if rng.random() < 0.7 else DType.INT16
        s = np.float32(10 ** rng.uniform(-4, 0))
        z = int(rng.integers(dtype.qmin, dtype.qmax + 1)) if rng.random() < 0.8 else 0
        q = QParams.of(dtype, s, zero_point=z)
        lo_end = np.float32(np.float32(dtype.qmin - z) * s)
        hi_end = np.float32(np.float32(dtype.qmax - z) * s)
        # bounds on, just inside and just outside the dequantized range's ends, and ReLU6's
        for lo in (None, lo_end, np.nextafter(lo_end, np.float32(1)), lo_end - s, 0.0):
            for hi in (None, hi_end, np.nextafter(hi_end, np.float32(-1)), hi_end + s, 6.0):
                lo_, hi_ = (None if b is None else float(b) for b in (lo, hi))
                if lo_ is not None and hi_ is not None and lo_ > hi_:
                    continue
                changes = _clip_changes_by_brute_force(lo_, hi_, q)
                if not clip_changes_codes(lo_, hi_, q):
                    assert not changes, (dtype, s, z, lo_, hi_)
                    left_out += 1
                elif not changes:
                    inside_lo = lo_ is not None and lo_end < lo_ <= lo_end + s / 2
                    inside_hi = hi_ is not None and hi_end - s / 2 <= hi_ < hi_end
                    assert inside_lo or inside_hi, (dtype, s, z, lo_, hi_)
                else:
                    kept += 1
    assert left_out > 300 and kept > 300


def _dq_clip_q_model():
    """uint8 codes -> DequantizeLinear -> Clip -> QuantizeLinear, every parameter an input."""
    from onnx import TensorProto, helper

    def value(name, t, shape):
        return helper.make_tensor_value_info(name, t, shape)

    nodes = [
        helper.make_node("DequantizeLinear", ["c", "s", "z"], ["v"]),
        helper.make_node("Clip", ["v", "lo", "hi"], ["w"]),
        helper.make_node("QuantizeLinear", ["w", "s", "z"], ["y"]),
    ]
    ins = [value("c", TensorProto.UINT8, [256]), value("s", TensorProto.FLOAT, [])]
    ins += [value("z", TensorProto.UINT8, []), value("lo", TensorProto.FLOAT, [])]
    ins.append(value("hi", TensorProto.FLOAT, []))
    graph = helper.make_graph(nodes, "dq_clip_q", ins, [value("y", TensorProto.UINT8, [256])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_code_clip_equals_onnxruntimes_float_clip_on_every_code(tmp_path):
    """clip(c, code_clip(lo, hi)) against onnxruntime's DequantizeLinear, float Clip and
    QuantizeLinear of all 256 int8 codes (written as uint8 + 128), over random scales, zero
    points and bounds: on the dequantized range's ends, half an LSB off them, ReLU6's, ties."""
    path = tmp_path / "dq_clip_q.onnx"
    onnx.save(_dq_clip_q_model(), path)
    sess = R.session(path)
    rng = np.random.default_rng(1)
    codes = np.arange(256, dtype=np.uint8)
    cases = 0
    for _ in range(200):
        s = np.float32(10 ** rng.uniform(-5, 1))
        z = int(rng.integers(-128, 128)) if rng.random() < 0.6 else 0
        q = QParams.of(DType.INT8, s, zero_point=z)
        lo_end, hi_end = np.float32(-128 - z) * s, np.float32(127 - z) * s
        k = np.float32(rng.integers(-128 - z, 128 - z))
        candidates = [0.0, 6.0, lo_end, hi_end, lo_end + s / 2, hi_end - s / 2]
        candidates += [(k + np.float32(0.5)) * s, k * s, float(rng.uniform(lo_end, hi_end))]
        for lo in candidates:
            for hi in candidates:
                if lo > hi:
                    continue
                held = code_clip(float(lo), float(hi), q)
                assert held is not None, (s, z, lo, hi)
                feed = {"c": codes, "s": np.asarray(s), "z": np.asarray(z + 128, np.uint8)}
                feed |= {"lo": np.asarray(lo, np.float32), "hi": np.asarray(hi, np.float32)}
                (y,) = sess.run(None, feed)
                want = np.clip(codes.astype(np.int64), held[0] + 128, held[1] + 128)
                assert np.array_equal(y.astype(np.int64), want), (s, z, lo, hi)
                cases += 1
    assert cases > 5000


def test_code_clip_declines_where_dequantizing_does_not_round_trip():
    # fl32((c - z) * s) overflows to inf for most codes, so no code bounds stand for the Clip
    q = QParams.of(DType.INT8, np.float32(1e37))
    assert code_clip(0.0, None, q) is None
    assert code_clip(0.0, 6.0, QParams.of(DType.INT8, np.float32(6 / 127))) == (0, 127)
