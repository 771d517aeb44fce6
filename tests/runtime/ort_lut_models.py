"""One-op ONNX graphs DequantizeLinear -> Sigmoid / Tanh / Exp -> QuantizeLinear on every 8-bit
code, with nonzero zero points, and their cases.

Sessions run single-threaded with onnxruntime's default graph optimizations, as users run
them: the Sigmoid group becomes com.microsoft QLinearSigmoid (a 256-entry lookup table), Tanh
and Exp stay float32 between DequantizeLinear and QuantizeLinear.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp"}
_ONNX_TYPE = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}


@dataclass(frozen=True)
class LutCase:
    """Every code ``x`` of the dtype through ``op`` (a key of OPS) at (sx, zx) -> (sy, zy)."""

    op: str
    x: np.ndarray
    sx: np.float32
    zx: int
    sy: np.float32
    zy: int


def lut_case(seed: int, op: str, dtype) -> LutCase:
    """Random scales (power-of-two ones every third seed: exact ties) and zero points."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype)
    zx, zy = (int(rng.integers(info.min, info.max + 1)) for _ in range(2))
    if seed % 3 == 2:
        sx = np.float32(2.0 ** -int(rng.integers(3, 7)))
        sy = np.float32(2.0 ** -int(rng.integers(2 if op == "exp" else 6, 9)))
    else:
        sx = np.float32(rng.uniform(0.005, 0.08))
        sy = np.float32(rng.uniform(0.02, 0.3) if op == "exp" else rng.uniform(0.002, 0.02))
    return LutCase(op, x, sx, zx, sy, zy)


def _model(c: LutCase) -> onnx.ModelProto:
    t = _ONNX_TYPE[c.x.dtype]
    inits = [
        numpy_helper.from_array(np.array(c.sx, np.float32), "sx"),
        numpy_helper.from_array(np.array(c.zx, c.x.dtype), "zx"),
        numpy_helper.from_array(np.array(c.sy, np.float32), "sy"),
        numpy_helper.from_array(np.array(c.zy, c.x.dtype), "zy"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
        helper.make_node(OPS[c.op], ["xf"], ["yf"]),
        helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", t, list(c.x.shape))],
        [helper.make_tensor_value_info("y", t, list(c.x.shape))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def run_lut(c: LutCase, optimized_path=None) -> np.ndarray:
    """onnxruntime's output codes of the case (default optimizations, one thread);
    ``optimized_path``: where to write the optimized graph."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    sess = ort.InferenceSession(
        _model(c).SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    return sess.run(None, {"x": c.x})[0]
