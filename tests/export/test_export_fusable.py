"""QDQ graphs onnxruntime can fuse completely, with fixed mode's bits: zero padding written as a
Pad of the codes (with their zero point), a fused ReLU6 whose bounds change no code left out,
and no node whose output nothing reads."""

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
from quantlab.export.emit_gemm import clip_changes_codes  # noqa: E402
from quantlab.export.graph import QParams  # noqa: E402
from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402
from quantlab.numerics import DType  # noqa: E402
from quantlab.qconfig import OpQConfig, QConfigSpec  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402

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
    assert producers[pad.input[0]].op_type == "QuantizeLinear"  # the codes, not their values
    xs = [torch.randn(2, 3, 9, 9, generator=g) * s for s in (0.1, 1.0, 5.0)]
    _check_bits(sim, info, xs + [torch.zeros(2, 3, 9, 9)])
    R.session(info.path, tmp_path / "opt.onnx")
    kernels = R.kernel_counts(tmp_path / "opt.onnx")
    # the padded codes feed the depthwise QLinearConv; c2's wide output is a ConvInteger
    assert kernels["QLinearConv"] == 2 and kernels["Pad"] == 1 and kernels["ConvInteger"] == 1
    if spec is ASYMMETRIC:  # ReLU6 outputs from 0: nothing is left between DQ and Q
        assert "DequantizeLinear" not in kernels and "Clip" not in kernels


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
    # symmetric int8 codes reach below ReLU6's 0: both Clips stay
    sim, info, g = _export(tmp_path, None)
    assert len([n for n in onnx.load(info.path).graph.node if n.op_type == "Clip"]) == 2
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
