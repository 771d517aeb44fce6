"""One-graph onnxruntime sessions for the runtime tests: nodes built with onnx.helper, run on
one CPU thread (so that Eigen's and MLAS's kernels see each tensor whole)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ONNX_TYPES = {
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.int16): TensorProto.INT16,
}


def session(nodes, inputs, out_type, inits) -> ort.InferenceSession:
    """A session of ``nodes`` (output ``y`` of ONNX type ``out_type``) over ``inputs`` and the
    initializers ``inits``, opset 21."""
    out = helper.make_tensor_value_info("y", out_type, None)
    graph = helper.make_graph(nodes, "g", inputs, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def quantize_linear(x: np.ndarray, scale, zero_point: int, dtype) -> np.ndarray:
    """onnxruntime's QuantizeLinear of float32 ``x`` to ``dtype`` codes (per tensor)."""
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    inits = [
        numpy_helper.from_array(np.array(scale, np.float32), "s"),
        numpy_helper.from_array(np.array(zero_point, dtype), "z"),
    ]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))
    return session([node], [x_info], ONNX_TYPES[np.dtype(dtype)], inits).run(None, {"x": x})[0]


def through_float_op(codes: np.ndarray, sx, zx, sy, zy, op_nodes, inits=()) -> np.ndarray:
    """onnxruntime's codes of DequantizeLinear(x, sx, zx) -> ``op_nodes`` (float ``v`` in,
    float ``p`` out) -> QuantizeLinear(p, sy, zy) on integer ``codes`` (all codes' dtype)."""
    t = ONNX_TYPES[codes.dtype]
    scales = [
        numpy_helper.from_array(np.array(sx, np.float32), "sx"),
        numpy_helper.from_array(np.array(zx, codes.dtype), "zx"),
        numpy_helper.from_array(np.array(sy, np.float32), "sy"),
        numpy_helper.from_array(np.array(zy, codes.dtype), "zy"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["v"]),
        *op_nodes,
        helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["y"]),
    ]
    x_info = helper.make_tensor_value_info("x", t, list(codes.shape))
    return session(nodes, [x_info], t, [*scales, *inits]).run(None, {"x": codes})[0]
