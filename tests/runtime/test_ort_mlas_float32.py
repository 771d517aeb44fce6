"""numerics.mlas_float32 and eigen_float32 give onnxruntime's float32 Tanh, Sigmoid, Exp, Erf,
Gelu, Log, Sin and Cos bit for bit (one-op float graphs) on random inputs over and beyond each
kernel's range and on the adversarial inputs of the Fraction-twin test; torch's own functions
do not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from quantlab.numerics.eigen_float32 import eigen_cos, eigen_log, eigen_sin  # noqa: E402
from quantlab.numerics.mlas_float32 import (  # noqa: E402
    mlas_erf,
    mlas_exp,
    mlas_gelu,
    mlas_logistic,
    mlas_tanh,
)
from tests.bits import assert_bits_equal  # noqa: E402
from tests.mlas_inputs import CASES, GELU_EMULATED, float32_inputs  # noqa: E402

ONNX_OP = {
    "tanh": ("Tanh", mlas_tanh, torch.tanh),
    "logistic": ("Sigmoid", mlas_logistic, torch.sigmoid),
    "exp": ("Exp", mlas_exp, torch.exp),
    "erf": ("Erf", mlas_erf, torch.erf),
    "gelu": ("Gelu", mlas_gelu, torch.nn.functional.gelu),
    "log": ("Log", eigen_log, torch.log),
    "sin": ("Sin", eigen_sin, torch.sin),
    "cos": ("Cos", eigen_cos, torch.cos),
}


def run_float_op(op: str, x: np.ndarray) -> np.ndarray:
    """onnxruntime's float32 ``op`` on the 1-d array x (default optimizations, one thread)."""
    node = helper.make_node(op, ["x"], ["y"])
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [len(x)]) for n in ("x", "y")]
    model = helper.make_model(
        helper.make_graph([node], "g", vi[:1], vi[1:]), opset_imports=[helper.make_opsetid("", 20)]
    )
    model.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("func", list(ONNX_OP))
def test_mlas_kernels_match_onnxruntime(func):
    if func == "gelu" and not GELU_EMULATED:
        pytest.skip("onnxruntime computes GELU another way on a CPU without AVX2 / FMA3")
    op, fast, torch_fn = ONNX_OP[func]
    _, (lo, hi), edges = CASES[func]
    rng = np.random.default_rng(5)
    edge_cases = float32_inputs(lo, hi, edges, 9)
    x = np.concatenate([rng.uniform(lo, hi, 100_000), rng.uniform(-2.0, 2.0, 50_000), edge_cases])
    x = x[: len(x) // 16 * 16].astype(np.float32)  # Eigen: a tail of n % 4 takes libm
    want = torch.from_numpy(run_float_op(op, x))
    xt = torch.from_numpy(x)
    assert_bits_equal(fast(xt), want, inputs={"x": xt})
    assert not torch.equal(torch_fn(xt), want)  # the kernels are not torch's functions
