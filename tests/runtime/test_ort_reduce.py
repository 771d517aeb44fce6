"""numerics.ort_reduce gives onnxruntime's float32 ReduceSum / ReduceMean bit for bit on random
shapes (axes of size 1 anywhere) and axis sets of every pattern it emulates (trailing, leading,
middle axes, a kept run between reduced ones), values spread over five decades so that the
summation order shows; torch's own sum does not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from quantlab.numerics.ort_reduce import emulated, onnxruntime_reduce  # noqa: E402
from tests.bits import assert_bits_equal  # noqa: E402


def run_reduce(x: np.ndarray, axes, op: str, keepdims: bool) -> np.ndarray:
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=int(keepdims))
    axes_t = helper.make_tensor("axes", TensorProto.INT64, [len(axes)], list(axes))
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [axes_t],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_reductions_match_onnxruntime(op):
    rng = np.random.default_rng(len(op))
    torch_differs = 0
    checked = 0
    while checked < 160:
        case = checked
        nd = int(rng.integers(1, 5))
        shape = tuple(int(v) for v in rng.integers(1, 10, nd))
        if case % 5 == 0:
            shape = tuple(int(v) for v in rng.integers(8, 40, nd))  # long rows: blocks of 8
        axes = [d for d in range(nd) if rng.random() < 0.5] or [int(rng.integers(0, nd))]
        if not emulated(shape, axes):
            continue
        checked += 1
        x = (rng.normal(0, 1, shape) * 10.0 ** rng.integers(-2, 3, shape)).astype(np.float32)
        keep = bool(case % 2)
        want = torch.from_numpy(run_reduce(x, axes, op, keep))
        xt = torch.from_numpy(x)
        got = onnxruntime_reduce(xt, axes, mean=op == "ReduceMean", keepdim=keep)
        try:
            assert_bits_equal(got, want)
        except AssertionError as e:
            raise AssertionError(f"case {case} {shape} axes {axes}: {e}") from None
        plain = xt.sum(axes, keepdim=keep)
        plain = plain / float(x.size // max(plain.numel(), 1)) if op == "ReduceMean" else plain
        torch_differs += not torch.equal(plain, want)
    assert torch_differs > 0
