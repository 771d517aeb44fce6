"""onnxruntime's ConvInteger and MatMulInteger, the kernels of a GEMM with a wide (unquantized)
output in an exported graph, against quantlab's integer sums on this machine's CPU: ConvInteger
sums uint8 x int8 products exactly on every CPU (so fixed mode takes no product pairs for a
convolution with a wide output, even under ``onnxruntime_no_vnni``); MatMulInteger's uint8 x
int8 sums saturate in pairs exactly where QLinearMatMul's do (``export.ort_host``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from ort_graphs import session  # noqa: E402

from quantlab.export.ort_host import onnxruntime_saturates_u8s8  # noqa: E402
from quantlab.numerics.gemm import pair_saturated_matmul  # noqa: E402
from quantlab.numerics.reference.gemm import int_conv2d, int_matmul  # noqa: E402


def _codes(rng, shape, dtype, extreme: bool) -> np.ndarray:
    """Random codes of ``dtype``; ``extreme``: only its two end codes (every product pair of
    255 and +-127 / -128 overflows int16)."""
    info = np.iinfo(dtype)
    if extreme:
        return np.where(rng.random(shape) < 0.5, info.max, info.min).astype(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("x_dtype", [np.uint8, np.int8])
def test_conv_integer_sums_exactly(x_dtype, extreme):
    rng = np.random.default_rng(int(extreme) + 2 * (x_dtype is np.int8))
    xt = TensorProto.UINT8 if x_dtype is np.uint8 else TensorProto.INT8
    info = np.iinfo(x_dtype)
    for c, k, pad, zx in ((6, 3, 1, 128), (16, 1, 0, 3), (5, 3, 0, 255), (32, 3, 1, -128)):
        zx = min(max(zx, int(info.min)), int(info.max))
        x = _codes(rng, (2, c, 6, 7), x_dtype, extreme)
        w = _codes(rng, (4, c, k, k), np.int8, extreme)
        node = helper.make_node("ConvInteger", ["x", "w", "zx"], ["y"], pads=[pad] * 4)
        zero = numpy_helper.from_array(np.array(zx, x_dtype), "zx")
        inits = [numpy_helper.from_array(w, "w"), zero]
        xi = helper.make_tensor_value_info("x", xt, list(x.shape))
        got = session([node], [xi], TensorProto.INT32, inits).run(None, {"x": x})[0]
        want = int_conv2d(x, w, padding=pad, zero_point=zx)
        assert_bits_equal(torch.from_numpy(got.astype(np.int64)), torch.from_numpy(want))


@pytest.mark.parametrize("extreme", [False, True])
def test_matmul_integer_sums_as_the_host_profile(extreme):
    """uint8 activations x int8 weights: pair-saturated where this host's onnxruntime
    saturates (``pair_saturated_matmul``), else exact; int8 x int8 and uint8 x uint8: exact."""
    rng = np.random.default_rng(10 + int(extreme))
    for a_dtype, b_dtype, za, zb in (
        (np.uint8, np.int8, 128, 0),
        (np.uint8, np.int8, 7, 0),
        (np.int8, np.int8, 0, 0),
        (np.uint8, np.uint8, 128, 128),
    ):
        a = _codes(rng, (5, 33), a_dtype, extreme)
        b = _codes(rng, (33, 6), b_dtype, extreme)
        node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
        inits = [
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.array(za, a_dtype), "za"),
            numpy_helper.from_array(np.array(zb, b_dtype), "zb"),
        ]
        at = TensorProto.UINT8 if a_dtype is np.uint8 else TensorProto.INT8
        ai = helper.make_tensor_value_info("a", at, list(a.shape))
        got = torch.from_numpy(
            session([node], [ai], TensorProto.INT32, inits).run(None, {"a": a})[0]
        )
        if a_dtype is np.uint8 and b_dtype is np.int8 and onnxruntime_saturates_u8s8():
            want = pair_saturated_matmul(torch.from_numpy(a), torch.from_numpy(b), za)
        else:
            want = torch.from_numpy(int_matmul(a.astype(np.int64) - za, b.astype(np.int64) - zb))
        assert_bits_equal(got.to(torch.int64), want.to(torch.int64))
