"""ONNX ops onnx2torch has no converter for (``quantlab.models.onnx_added_ops``): each converts
to the torch call a PyTorch model makes and gives onnxruntime's outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantlab.models.registry import build_model
from quantlab.models.schema import ModelConfig

pytest.importorskip("onnxruntime")


def _one_node(tmp_path, op, opset, shape, inits=(), extra=(), out_type=1, **attrs):
    """A graph of one ``op`` node on float input x of ``shape``, then the inputs ``extra``
    (initializers ``inits``: name -> array), its output of ONNX type ``out_type`` (1: float),
    converted by quantlab."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(op, ["x", *extra], ["y"], **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(v, n) for n, v in dict(inits).items()],
    )  # fmt: skip
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return build_model(ModelConfig(name="onnx", path=str(path)))


def _matches(b, x, atol=0.0) -> None:
    with torch.no_grad():
        got = b.module(x)
    want = torch.as_tensor(b.reference(x))
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want.reshape(got.shape), rtol=0, atol=atol)


def _x(*shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 2


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2])
def test_trilu_keeps_a_triangle_as_onnxruntime_does(tmp_path, upper, k):
    inits = {} if k is None else {"k": np.array(k, dtype=np.int64)}
    b = _one_node(tmp_path, "Trilu", 14, [1, 2, 5, 5], inits, list(inits), upper=upper)
    _matches(b, _x(1, 2, 5, 5))


@pytest.mark.parametrize(
    "op, opset, attrs",
    [
        ("Swish", 24, {}),
        ("Swish", 24, {"alpha": 1.702}),
        ("ThresholdedRelu", 10, {"alpha": 0.5}),
        ("ThresholdedRelu", 22, {}),
        ("Shrink", 9, {"lambd": 0.7, "bias": 0.7}),
        ("Shrink", 9, {"lambd": 0.7}),
        ("Shrink", 9, {"lambd": 1.0, "bias": 0.25}),
    ],
)
def test_pointwise_ops_match_onnxruntime(tmp_path, op, opset, attrs):
    _matches(_one_node(tmp_path, op, opset, [1, 3, 8], **attrs), _x(1, 3, 8), atol=1e-6)


@pytest.mark.parametrize("mode", ["DCR", "CRD", None])
def test_depth_to_space_in_both_modes_orders_channels_as_onnxruntime(tmp_path, mode):
    """DCR, the default (TensorFlow's order), was refused; CRD is torch's pixel_shuffle."""
    attrs = {"blocksize": 2} | ({} if mode is None else {"mode": mode})
    b = _one_node(tmp_path, "DepthToSpace", 13, [1, 8, 3, 4], **attrs)
    _matches(b, torch.arange(96, dtype=torch.float32).reshape(1, 8, 3, 4))


@pytest.mark.parametrize("axis", [-1, 2])
def test_rms_normalization_matches_onnxruntime(tmp_path, axis):
    shape = [1, 3, 4, 6]
    scale = np.linspace(0.5, 1.5, int(np.prod(shape[axis % 4 :])), dtype=np.float32)
    scale = scale.reshape(shape[axis % 4 :])
    b = _one_node(tmp_path, "RMSNormalization", 23, shape, {"s": scale}, ["s"], axis=axis)
    _matches(b, _x(*shape), atol=1e-6)


def test_cast_like_and_size_give_onnxruntimes_dtype_and_value(tmp_path):
    like = {"t": np.zeros(1, np.float16)}
    _matches(_one_node(tmp_path, "CastLike", 21, [1, 3, 8], like, ["t"], out_type=10), _x(1, 3, 8))
    _matches(_one_node(tmp_path, "Size", 24, [1, 3, 8], out_type=7), _x(1, 3, 8))


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [None, 0, 1])
@pytest.mark.parametrize("axis", [1, -1])
def test_cumsum_in_every_direction_matches_onnxruntime(tmp_path, exclusive, reverse, axis):
    """onnx2torch summed every CumSum without a ``reverse`` attribute from the end (its default
    is 0): ``x.cumsum(1)`` exported from torch gave other numbers, silently."""
    attrs = {"exclusive": exclusive} | ({} if reverse is None else {"reverse": reverse})
    inits = {"axis": np.array(axis, dtype=np.int64)}
    b = _one_node(tmp_path, "CumSum", 14, [1, 3, 5], inits, ["axis"], **attrs)
    _matches(b, torch.arange(15, dtype=torch.float32).reshape(1, 3, 5) + 1)
