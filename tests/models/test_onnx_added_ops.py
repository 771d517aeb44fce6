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


def _refused(tmp_path, words, op, opset, shape, inits=(), extra=(), **attrs) -> None:
    with pytest.raises(ValueError, match=f"cannot convert.*{op} node with {words}"):
        _one_node(tmp_path, op, opset, shape, inits, extra, **attrs)


def _special_rows() -> torch.Tensor:
    """Normal values, with along the last axis a row of zeros, one whose norm lies below
    F.normalize's default eps (1e-12) and one whose squares all underflow (a 2-norm of 0), and
    along axis 1 a column of zeros."""
    x = _x(2, 3, 4)
    x[0, 0], x[0, 1], x[0, 2] = 0.0, torch.tensor([1e-13, -2e-13, 0.0, 3e-13]), 1e-24
    x[1, :, 1] = 0.0
    return x


@pytest.mark.parametrize("opset", [1, 22])
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_lp_normalization_matches_onnxruntime_on_zero_and_tiny_rows(tmp_path, opset, p, axis):
    """onnxruntime divides by the norm with no epsilon and gives 0 where the norm is 0 (its
    squares may underflow): F.normalize's 1e-12 would scale the tiny rows otherwise."""
    attrs = {"p": p} | ({} if axis is None else {"axis": axis})
    b = _one_node(tmp_path, "LpNormalization", opset, [2, 3, 4], **attrs)
    _matches(b, _special_rows(), atol=1e-6)


@pytest.mark.parametrize(
    "opset, shape, attrs",
    [
        (2, [1, 3, 9], {"kernel_shape": [3], "p": 3}),
        (11, [1, 3, 7, 8], {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 0, 2]}),
        (18, [1, 3, 7, 8], {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "p": 1}),
        (18, [1, 3, 7, 6], {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [2, 1, 2, 1],
                            "ceil_mode": 1}),
        (18, [1, 3, 7, 8], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
        (18, [1, 3, 7, 8], {"kernel_shape": [1, 2], "strides": [3, 3], "auto_pad": "SAME_LOWER",
                            "p": 3}),
        (18, [1, 3, 7, 8], {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "VALID"}),
        (22, [1, 2, 5, 6, 7], {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "p": 4,
                               "pads": [1, 0, 1, 0, 1, 0]}),
    ],
)  # fmt: skip
def test_lp_pool_matches_onnxruntime_with_pads_strides_and_ceil_mode(tmp_path, opset, shape, attrs):
    """The p-th root of each window's sum of |x|^p (torch's lp_pool raises x itself to p),
    zeros for the pads and ceil_mode's last windows, auto_pad's pads from the input size (a
    stride above the kernel cuts the input's ends off, as onnxruntime does)."""
    _matches(_one_node(tmp_path, "LpPool", opset, shape, **attrs), _x(*shape), atol=1e-5)


def test_lp_ops_name_what_they_cannot_convert(tmp_path):
    _refused(tmp_path, r"dilations=\[2, 2\]", "LpPool", 18, [1, 2, 6, 6],
             kernel_shape=[2, 2], dilations=[2, 2])  # fmt: skip
    _refused(tmp_path, "p=0", "LpPool", 18, [1, 2, 6, 6], kernel_shape=[2, 2], p=0)
    _refused(tmp_path, "p=3", "LpNormalization", 22, [1, 2, 6], p=3)


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize("axes", [None, [1], [2, 3], [-1], [3, 1], [0, 1, 2, 3]])
def test_mean_variance_normalization_matches_onnxruntime(tmp_path, opset, axes):
    attrs = {} if axes is None else {"axes": axes}
    b = _one_node(tmp_path, "MeanVarianceNormalization", opset, [2, 3, 4, 5], **attrs)
    _matches(b, _x(2, 3, 4, 5) + 1, atol=1e-5)


def test_mean_variance_normalization_of_constant_slices_and_rank_3_is_onnxruntimes(tmp_path):
    """onnxruntime's kernel, (x - mean) / sqrt(mean((x - mean)^2)) with no epsilon: a constant
    slice gives NaN (ONNX's function body, sqrt(E[x^2] - E[x]^2) + 1e-9, gives 0); the default
    axes [0, 2, 3] of a rank-3 input are [0, 2] there."""
    b = _one_node(tmp_path, "MeanVarianceNormalization", 13, [1, 2, 3, 3])
    x = torch.ones(1, 2, 3, 3)
    x[0, 1] = _x(3, 3)
    with torch.no_grad():
        got = b.module(x)
    assert got[0, 0].isnan().all() and not got[0, 1].isnan().any()
    torch.testing.assert_close(got, torch.as_tensor(b.reference(x)), equal_nan=True)
    _matches(_one_node(tmp_path, "MeanVarianceNormalization", 13, [2, 3, 6]), _x(2, 3, 6), 1e-5)


@pytest.mark.parametrize(
    "opset, axis", [(1, None), (1, 0), (1, 2), (11, None), (11, -1), (11, 2), (13, None),
                    (13, 0), (13, 1), (13, -2)]
)  # fmt: skip
def test_hardmax_marks_the_first_of_tied_maxima_as_onnxruntime(tmp_path, opset, axis):
    """Values 0 to 2 (ties everywhere): torch.argmax takes the first maximum, as ONNX; opsets
    1 and 11 flatten the input to 2-D at the axis, 13 takes the one axis."""
    attrs = {} if axis is None else {"axis": axis}
    b = _one_node(tmp_path, "Hardmax", opset, [3, 4, 5], **attrs)
    gen = torch.Generator().manual_seed(0)
    _matches(b, torch.randint(0, 3, (3, 4, 5), generator=gen).float())


@pytest.mark.parametrize(
    "image, block, attrs",
    [
        ([5, 5], [1, 5], {}),
        ([7, 6], [2, 2], {"strides": [2, 2], "dilations": [2, 1], "pads": [1, 1, 1, 1]}),
        ([5, 6], [2, 3], {"pads": [1, 0, 2, 1]}),
        ([6, 7], [3, 2], {"strides": [2, 1], "dilations": [1, 2], "pads": [0, 2, 1, 0]}),
    ],
)
def test_col2im_folds_blocks_as_onnxruntime(tmp_path, image, block, attrs):
    """F.fold; pads differing at an axis's two ends fold onto the padded image, then slice."""
    pads, dil = attrs.get("pads", [0] * 4), attrs.get("dilations", [1, 1])
    strides = attrs.get("strides", [1, 1])
    count = 1
    for i in range(2):
        span = image[i] + pads[i] + pads[i + 2] - dil[i] * (block[i] - 1) - 1
        count *= span // strides[i] + 1
    shape = [2, 3 * block[0] * block[1], count]
    inits = {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    b = _one_node(tmp_path, "Col2Im", 18, shape, inits, ["image", "block"], **attrs)
    _matches(b, _x(*shape), atol=1e-6)


def test_col2im_of_another_rank_or_computed_shapes_is_named(tmp_path):
    three = {"image": np.array([3, 3, 3], np.int64), "block": np.array([2, 2, 2], np.int64)}
    _refused(tmp_path, "a 3-D image", "Col2Im", 18, [1, 8, 8], three, ["image", "block"])
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"])
    shapes = [helper.make_tensor_value_info(n, TensorProto.INT64, [2]) for n in ("image", "block")]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4]), *shapes],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    path = tmp_path / "col2im.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    with pytest.raises(ValueError, match="Col2Im node with a computed image_shape"):
        build_model(ModelConfig(name="onnx", path=str(path)))
