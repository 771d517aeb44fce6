"""onnxruntime's Resize as quantlab exports ``F.interpolate``: ``ort_nearest_indices`` gives
the pixels its nearest mode (asymmetric, floor) reads for every size pair up to 29 -> 59 and
for the scale factors the exporter writes; ``ort_resize_bilinear`` gives its linear mode's
float32 bits (half_pixel and align_corners, by sizes and by factors); torch misses some of
both; the onnxruntime profile's fixed mode, exported, gives onnxruntime's codes where torch
would not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from onnx import TensorProto, helper
from ort_graphs import session
from torch import nn

from quantlab.numerics.ort_resize import ort_nearest_indices, ort_resize_bilinear


def _onnxruntime_indices(n_in: int, n_out=None, scale=None) -> np.ndarray:
    """The input index of each output of onnxruntime's nearest Resize (asymmetric, floor) of
    [0, 1, ..., n_in - 1] (one row), to ``n_out`` pixels or by ``scale``."""
    ins, inits = ["x", "", ""], []
    if scale is None:
        inits.append(helper.make_tensor("sizes", TensorProto.INT64, [4], [1, 1, 1, n_out]))
        ins.append("sizes")
    else:
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 1, scale]))
        ins[2] = "scales"
    node = helper.make_node("Resize", ins, ["y"], mode="nearest", nearest_mode="floor",
                            coordinate_transformation_mode="asymmetric")  # fmt: skip
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, n_in])
    x = np.arange(n_in, dtype=np.float32).reshape(1, 1, 1, n_in)
    y = session([node], [xi], TensorProto.FLOAT, inits).run(None, {"x": x})[0]
    return y.reshape(-1).astype(np.int64)


def test_indices_by_size_are_onnxruntimes():
    missed_by_torch = 0
    for n_in in range(1, 30):
        x = torch.arange(float(n_in)).view(1, 1, 1, n_in)
        for n_out in range(1, 60):
            want = torch.from_numpy(_onnxruntime_indices(n_in, n_out=n_out))
            assert_bits_equal(ort_nearest_indices(n_in, n_out), want)
            plain = F.interpolate(x, size=(1, n_out), mode="nearest").long().view(-1)
            missed_by_torch += not torch.equal(plain, want)
    assert missed_by_torch > 0  # why the indices are emulated (32 pairs here)


def test_indices_by_scale_factor_are_onnxruntimes():
    """The exporter writes torch's factor as the node's scale: onnxruntime reads i / scale,
    and one to one where the output keeps the input's size (1.3 on 2 or 3 pixels)."""
    same_size = 0
    for factor in (0.3, 0.6, 0.75, 1.3, 1.5, 1.7, 2.0, 2.5, 3.0, 4.0):
        for n_in in range(1, 40):
            want = torch.from_numpy(_onnxruntime_indices(n_in, scale=factor))
            if want.numel() == 0:
                continue
            same_size += want.numel() == n_in and factor != 1.0
            assert_bits_equal(ort_nearest_indices(n_in, want.numel(), factor), want)
    assert same_size > 0


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="sizes must be positive"):
        ort_nearest_indices(0, 3)


def _onnxruntime_linear(x: np.ndarray, align: bool, out_hw=None, scale=None) -> np.ndarray:
    ins, inits = ["x", "", ""], []
    if scale is None:
        dims = [*x.shape[:2], *out_hw]
        inits.append(helper.make_tensor("sizes", TensorProto.INT64, [4], dims))
        ins.append("sizes")
    else:
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, scale, scale]))
        ins[2] = "scales"
    mode = "align_corners" if align else "half_pixel"
    node = helper.make_node("Resize", ins, ["y"], mode="linear",
                            coordinate_transformation_mode=mode)  # fmt: skip
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))
    return session([node], [xi], TensorProto.FLOAT, inits).run(None, {"x": x})[0]


@pytest.mark.parametrize("align", [False, True])
def test_bilinear_by_size_is_onnxruntimes(align):
    rng = np.random.default_rng(int(align))
    differ = 0
    for _ in range(60):
        h, w = (int(v) for v in rng.integers(1, 12, 2))
        out_hw = tuple(int(v) for v in rng.integers(1, 25, 2))
        x = (rng.integers(-128, 128, (2, 3, h, w)) * 0.037).astype(np.float32)
        want = torch.from_numpy(_onnxruntime_linear(x, align, out_hw=out_hw))
        assert_bits_equal(ort_resize_bilinear(torch.from_numpy(x), out_hw, align), want)
        plain = F.interpolate(torch.from_numpy(x), size=out_hw, mode="bilinear",
                              align_corners=align)  # fmt: skip
        differ += int((plain != want).sum())
    assert differ > 0  # torch's float bilinear sums in another order


def test_bilinear_by_scale_factor_is_onnxruntimes():
    rng = np.random.default_rng(5)
    for factor in (0.5, 0.6, 1.5, 1.7, 2.0, 2.5, 3.0):
        for h in range(1, 10):
            x = (rng.integers(-128, 128, (1, 2, h, h + 2)) * 0.037).astype(np.float32)
            want = torch.from_numpy(_onnxruntime_linear(x, False, scale=factor))
            if want.numel() == 0:
                continue
            got = ort_resize_bilinear(torch.from_numpy(x), tuple(want.shape[2:]), False,
                                      (factor, factor))  # fmt: skip
            assert_bits_equal(got, want)


class _Nearest(nn.Module):
    """Nearest resizes of a 14 x 21 map where torch reads other pixels than onnxruntime:
    14 -> 4 and 21 -> 6 by size, and by a factor."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        a = F.interpolate(y, size=(4, 6), mode="nearest") * 1.0
        b = F.interpolate(y, scale_factor=(1.3, 0.6), mode="nearest") * 1.0
        return a, b


def test_onnxruntime_profile_selects_as_onnxruntime_after_export(tmp_path):
    from quantlab.export import runtime as R
    from quantlab.export import to_onnx_qdq
    from quantlab.export.ort_host import onnxruntime_profile
    from quantlab.simulate import Mode, Simulator

    torch.manual_seed(0)
    sim = Simulator(_Nearest().eval(), onnxruntime_profile())
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 14, 21, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 3, 14, 21, generator=g) * s for s in (0.5, 1.0, 3.0)]
    info = to_onnx_qdq(sim, tmp_path / "nn.onnx", (xs[0],))
    sess = R.session(info.path)
    for x in xs:
        got = R.run(sess, info.input_names, (x,))
        for a, b in zip(got, sim.run(x, mode=Mode.FIXED), strict=True):
            assert_bits_equal(torch.from_numpy(a), b)
    # torch's own selection would differ here
    y = torch.arange(14.0).view(1, 1, 14, 1)
    plain = F.interpolate(y, size=(4, 1), mode="nearest").long().view(-1)
    assert not torch.equal(plain, ort_nearest_indices(14, 4))


class _Bilinear(nn.Module):
    """Bilinear resizes with int16 outputs (a last-bit difference of the float value moves an
    int16 code often): by size, by factor, with align_corners."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.tanh(self.conv(x))
        a = F.interpolate(y, size=(17, 23), mode="bilinear")
        b = F.interpolate(y, scale_factor=1.7, mode="bilinear")
        c = F.interpolate(y, size=(9, 11), mode="bilinear", align_corners=True)
        return a, b, c


def test_onnxruntime_profile_interpolates_as_onnxruntime_after_export(tmp_path):
    from quantlab.export import runtime as R
    from quantlab.export import to_onnx_qdq
    from quantlab.export.ort_host import onnxruntime_profile
    from quantlab.numerics.dtypes import DType
    from quantlab.qconfig import OpQConfig, QConfigSpec
    from quantlab.simulate import Mode, Simulator

    torch.manual_seed(0)
    spec = QConfigSpec(by_type={"interpolate": OpQConfig(output_dtype=DType.INT16)})
    sim = Simulator(_Bilinear().eval(), onnxruntime_profile(), spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 7, 9, generator=g),) for _ in range(2)], progress=False)
    xs = [torch.randn(2, 3, 7, 9, generator=g) * s for s in (0.5, 1.0, 3.0)]
    info = to_onnx_qdq(sim, tmp_path / "bl.onnx", (xs[0],), probe=True)
    sess = R.session(info.path)
    names = [n for n in info.op_tensors if ":interpolate#" in n]
    assert len(names) == 3
    for x in xs:
        got = R.run(sess, info.input_names, (x,), [info.op_tensors[n] for n in names])
        trace = sim.trace(x, mode=Mode.FIXED)
        for name, codes in zip(names, got, strict=True):
            runtime = R.codes_from_runtime(codes, info.op_tensors[name] in info.offset_tensors)
            assert_bits_equal(torch.from_numpy(runtime), trace.qinfo[name].codes.long())
