"""F.grid_sample exports as GridSample between DequantizeLinear and QuantizeLinear, and fixed
mode on the onnxruntime profiles computes what onnxruntime computes there
(``numerics.ort_grid_sample``): its codes of the op and of the model's output are fixed mode's,
for bilinear and nearest sampling, zeros and border padding, with and without align_corners,
int8 and int16 inputs, both activation encodings, on a grid computed by the model (int16
codes) that reaches beyond the input. Fake mode reads that grid as its value, without J6's
grid-format fake quant. Bicubic and reflection padding are refused with the reason."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

pytest.importorskip("onnxruntime")

from ort_encodings import require_modelled  # noqa: E402

from quantlab.export import ActivationEncoding, UnsupportedOpError, to_onnx_qdq  # noqa: E402
from quantlab.export import runtime as R  # noqa: E402
from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402
from quantlab.numerics.dtypes import DType  # noqa: E402
from quantlab.qconfig import OpQConfig, QConfigSpec  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402

NAME = "grid_sample#0"


class _Warp(nn.Module):
    """A feature map (tanh of a convolution) sampled at a grid the model computes, reaching
    1.25x beyond the input."""

    def __init__(self, **kw):
        super().__init__()
        self.feat = nn.Conv2d(3, 6, 3, padding=1)
        self.offset = nn.Conv2d(3, 2, 3, padding=1)
        self.kw = kw

    def forward(self, x):
        grid = (torch.tanh(self.offset(x)) * 1.25).permute(0, 2, 3, 1)
        return F.grid_sample(torch.tanh(self.feat(x)), grid, **self.kw) * 1.0


def _sim(kw: dict, input_dtype: str = "INT8") -> tuple[Simulator, list]:
    """The convolutions' outputs are int8 (an int16 one runs in float between Dequantize and
    Quantize, in torch's order, which may miss onnxruntime's last bit); the grid is int16 from
    its tanh on, and the sampled map has ``input_dtype`` codes (a direct table of int8 codes)."""
    torch.manual_seed(0)
    int8 = OpQConfig(output_dtype=DType.INT8)
    spec = QConfigSpec(by_name={
        "offset:conv2d#0": int8,
        "feat:conv2d#0": int8,
        ":tanh#1": OpQConfig(output_dtype=DType.parse(input_dtype)),
    })  # fmt: skip
    sim = Simulator(_Warp(**kw).eval(), onnxruntime_profile(), spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 7, 23, generator=g),) for _ in range(2)], progress=False)
    return sim, [torch.randn(2, 3, 7, 23, generator=g) * s for s in (0.5, 1.0, 3.0)]


_CASES = list(itertools.product(("bilinear", "nearest"), ("zeros", "border"), (False, True)))


@pytest.mark.parametrize(("mode", "padding", "align"), _CASES)
def test_grid_sample_exports_with_fixed_modes_bits(tmp_path, mode, padding, align):
    sim, xs = _sim(dict(mode=mode, padding_mode=padding, align_corners=align))
    _check(sim, xs, tmp_path, None)  # the profile's own encoding


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
@pytest.mark.parametrize("input_dtype", ["INT8", "INT16"])
def test_grid_sample_encodings_and_int16_inputs_keep_fixed_modes_bits(
    tmp_path, encoding, input_dtype
):
    sim, xs = _sim(dict(mode="bilinear", align_corners=False), input_dtype)
    info = sim.trace(xs[0], mode=Mode.FIXED).qinfo
    op = next(n for n in info if n.endswith(NAME))
    assert info[op].dtype is DType.parse(input_dtype)
    _check(sim, xs, tmp_path, encoding)


def _check(sim, xs, tmp_path, encoding) -> None:
    require_modelled(encoding)
    name = next(n for n in sim.ops.name if n.endswith(NAME))
    kernel = sim.ops.set_index("name").loc[name, "fixed_kernel"]
    assert kernel.startswith("float between dequantize and quantize (GridSample's float32")
    info = to_onnx_qdq(sim, tmp_path / "gs.onnx", (xs[0],), probe=True, encoding=encoding)
    sess = R.session(info.path, tmp_path / "opt.onnx")
    assert R.kernels_by_op(tmp_path / "opt.onnx", [name])[name] == ["GridSample"]
    tensor = info.op_tensors[name]
    for x in xs:
        got, out = R.run(sess, info.input_names, (x,), [tensor, info.output_names[0]])
        trace = sim.trace(x, mode=Mode.FIXED)
        codes = R.codes_from_runtime(got, tensor in info.offset_tensors)
        assert_bits_equal(torch.from_numpy(codes), trace.qinfo[name].codes.to(torch.int64))
        assert_bits_equal(torch.from_numpy(out), sim.run(x, mode=Mode.FIXED))
        # the sampled codes stay on the input's grid (scale and zero point)
        feat = trace.qinfo[next(n for n in trace.qinfo if n.endswith("tanh#1"))]
        assert float(trace.qinfo[name].scale) == float(feat.scale)


def test_torch_grid_sample_would_miss_onnxruntimes_codes(tmp_path, monkeypatch):
    """Sampling the dequantized codes with torch's float grid_sample instead moves codes: the
    emulation of onnxruntime's order is what the bits rest on."""
    from quantlab.simulate import fixed_sampling

    sim, xs = _sim(dict(mode="bilinear", align_corners=False), "INT16")
    name = next(n for n in sim.ops.name if n.endswith(NAME))
    want = [sim.trace(x, mode=Mode.FIXED).qinfo[name].codes for x in xs]

    def torch_sampler(x, grid, mode, padding, align):
        return F.grid_sample(x, grid, mode=mode.value, padding_mode=padding.value,
                             align_corners=align)  # fmt: skip

    monkeypatch.setattr(fixed_sampling, "ort_grid_sample", torch_sampler)
    got = [sim.trace(x, mode=Mode.FIXED).qinfo[name].codes for x in xs]
    moved = sum(int((a != b).sum()) for a, b in zip(got, want, strict=True))
    assert moved > 0


def test_fake_mode_reads_the_grid_as_its_value():
    """On the onnxruntime profiles fake mode samples the fake-quantized map at the grid's own
    (fake-quantized) value and fake-quantizes the result at the map's scale; J6's grid-format
    fake quant (``qat.fake_grid``) is not applied."""
    sim, xs = _sim(dict(mode="bilinear", align_corners=False), "INT16")
    trace = sim.trace(xs[2], mode=Mode.FAKE)
    grid, feat = trace.outputs[":permute#0"], trace.outputs[":tanh#1"]
    s = trace.qinfo[":tanh#1"].scale
    y = F.grid_sample(feat, grid, align_corners=False)
    want = torch.clamp(torch.round(y / s), -32768, 32767) * s
    assert_bits_equal(trace.outputs[":grid_sample#0"], want)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(mode="bicubic", align_corners=False), "mode='bicubic'"),
        (dict(padding_mode="reflection", align_corners=False), "padding_mode='reflection'"),
    ],
)
def test_grid_sample_without_a_gridsample_form_is_refused(tmp_path, kw, match):
    sim, xs = _sim(kw)
    with pytest.raises(UnsupportedOpError, match=match):
        to_onnx_qdq(sim, tmp_path / "gs.onnx", (xs[0],))
