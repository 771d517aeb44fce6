"""One-op ONNX graphs of QLinearConv and QLinearMatMul with nonzero zero points, and cases.

The graph input is the quantized tensor itself (uint8 or int8 codes), so a case fixes every
integer the kernel sees. Activation zero points are arbitrary; QLinearConv takes one weight
zero point for every output channel (onnxruntime requires them equal), QLinearMatMul one
per column of B. Sessions run single-threaded with graph optimizations off.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from ort_oracle import conv_acc, matmul_acc

_ONNX_TYPE = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}


@dataclass(frozen=True)
class QLinearConvCase:
    """x (N, C, H, W) codes; w (O, C/group, KH, KW) codes with one zero point ``zw``; sw (O,)
    or (1,) float32; bias int32 (O,) or None; pads (top, left, bottom, right)."""

    x: np.ndarray
    sx: np.float32
    zx: int
    w: np.ndarray
    sw: np.ndarray
    zw: int
    bias: np.ndarray | None
    sy: np.float32
    zy: int
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilation: tuple[int, int]
    group: int


@dataclass(frozen=True)
class QLinearMatMulCase:
    """a (..., M, K) codes; b (K, N) codes; sb, zb scalar (shape (1,)) or per column (N,)."""

    a: np.ndarray
    sa: np.float32
    za: int
    b: np.ndarray
    sb: np.ndarray
    zb: np.ndarray
    sy: np.float32
    zy: int


def _session(node, inputs, inits, out_dtype) -> ort.InferenceSession:
    out = helper.make_tensor_value_info("y", _ONNX_TYPE[np.dtype(out_dtype)], None)
    graph = helper.make_graph([node], "g", inputs, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _scalar(v, dtype, name):
    return numpy_helper.from_array(np.asarray(v, dtype=dtype), name)


def run_qlinearconv(c: QLinearConvCase) -> np.ndarray:
    """onnxruntime's QLinearConv output codes for a case (weights and bias constant)."""
    act, wt = c.x.dtype, c.w.dtype
    inits = [
        _scalar(c.sx, np.float32, "sx"),
        _scalar(c.zx, act, "zx"),
        numpy_helper.from_array(c.w, "w"),
        numpy_helper.from_array(c.sw.astype(np.float32), "sw"),
        _scalar(c.zw, wt, "zw"),
        _scalar(c.sy, np.float32, "sy"),
        _scalar(c.zy, act, "zy"),
    ]
    ins = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"]
    if c.bias is not None:
        inits.append(numpy_helper.from_array(c.bias.astype(np.int32), "b"))
        ins.append("b")
    node = helper.make_node(
        "QLinearConv",
        ins,
        ["y"],
        strides=list(c.stride),
        pads=list(c.pads),
        dilations=list(c.dilation),
        group=c.group,
    )
    inputs = [helper.make_tensor_value_info("x", _ONNX_TYPE[act], list(c.x.shape))]
    (y,) = _session(node, inputs, inits, act).run(None, {"x": c.x})
    return y


def run_qlinearmatmul(c: QLinearMatMulCase) -> np.ndarray:
    """onnxruntime's QLinearMatMul output codes for a case (B constant)."""
    act, wt = c.a.dtype, c.b.dtype
    inits = [
        _scalar(c.sa, np.float32, "sa"),
        _scalar(c.za, act, "za"),
        numpy_helper.from_array(c.b, "b"),
        numpy_helper.from_array(c.sb.astype(np.float32).reshape(-1), "sb"),
        numpy_helper.from_array(c.zb.astype(wt).reshape(-1), "zb"),
        _scalar(c.sy, np.float32, "sy"),
        _scalar(c.zy, act, "zy"),
    ]
    if c.sb.size == 1:  # per-tensor B: scalar scale and zero point
        inits[3] = _scalar(c.sb.reshape(()), np.float32, "sb")
        inits[4] = _scalar(c.zb.reshape(()), wt, "zb")
    node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
    inputs = [helper.make_tensor_value_info("a", _ONNX_TYPE[act], list(c.a.shape))]
    (y,) = _session(node, inputs, inits, act).run(None, {"a": c.a})
    return y


def _codes(rng, shape, dtype, near: int | None = None) -> np.ndarray:
    """Random codes over the dtype's range, or within 6 of ``near`` (small sums for TIES)."""
    info = np.iinfo(dtype)
    if near is not None:
        return np.clip(near + rng.integers(-6, 7, shape), info.min, info.max).astype(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)


def _zero_point(rng, dtype) -> int:
    info = np.iinfo(dtype)
    return int(rng.integers(int(info.min), int(info.max) + 1))


def _input_scales(rng, n_w: int, ties: bool) -> tuple[np.float32, np.ndarray]:
    """(sx, sw); ``ties``: powers of two, so that M = 2**-k and exact ties occur."""
    if ties:
        sx = np.float32(2.0 ** -int(rng.integers(4, 9)))
        return sx, (2.0 ** -rng.integers(5, 9, n_w)).astype(np.float32)
    return np.float32(rng.uniform(1e-3, 5e-2)), rng.uniform(1e-3, 2e-2, n_w).astype(np.float32)


def _output(rng, acc, sx, sw, dtype, ties: bool) -> tuple[np.float32, int]:
    """(sy, zy): sy fitted to the exact real outputs (``ties``: a power of two, M = 2**-k),
    zy anywhere in the output range."""
    real = np.abs(acc.astype(np.float64)) * np.float64(sx) * sw.astype(np.float64).max()
    span = float(np.iinfo(dtype).max) - float(np.iinfo(dtype).min)
    sy = np.float32(max(float(real.max()), 1e-6) * 2 / span / rng.uniform(0.5, 1.5))
    if ties:
        sy = np.float32(2.0 ** np.round(np.log2(float(sy))))
    return sy, _zero_point(rng, dtype)


def qlinearconv_case(seed: int, act_dtype, w_dtype) -> QLinearConvCase:
    """A random 2-d QLinearConv case with nonzero zero points (weights: one zero point)."""
    rng = np.random.default_rng(seed)
    while True:
        group = int(rng.choice([1, 1, 2, 3]))
        depthwise = rng.random() < 0.25
        cin = group * int(rng.integers(1, 5))
        cout = group * int(rng.integers(1, 4))
        if depthwise:
            group = cin = cout = int(rng.integers(1, 6))
        k = tuple(int(v) for v in rng.integers(1, 4, 2))
        size = tuple(int(v) for v in rng.integers(3, 9, 2))
        stride = tuple(int(v) for v in rng.integers(1, 3, 2))
        dil = tuple(int(v) for v in rng.integers(1, 3, 2))
        pads = tuple(int(v) for v in rng.integers(0, 3, 4))
        if all(size[i] + pads[i] + pads[i + 2] - dil[i] * (k[i] - 1) - 1 >= 0 for i in range(2)):
            break
    ties = seed % 4 == 1
    zx, zw = _zero_point(rng, act_dtype), _zero_point(rng, w_dtype)
    if rng.random() < 0.2:
        zw = 0  # the symmetric-weight kernels (int8 weights)
    x = _codes(rng, (int(rng.integers(1, 3)), cin, *size), act_dtype, zx if ties else None)
    w = _codes(rng, (cout, cin // group, *k), w_dtype, zw if ties else None)
    per_channel = rng.random() < 0.6
    sx, sw = _input_scales(rng, cout if per_channel else 1, ties)
    spread = 50 if ties else 20000
    bias = rng.integers(-spread, spread + 1, cout).astype(np.int32) if rng.random() < 0.8 else None
    c = QLinearConvCase(x, sx, zx, w, sw, zw, bias, np.float32(1), 0, stride, pads, dil, group)
    sy, zy = _output(rng, conv_acc(c), sx, sw, act_dtype, ties)
    return QLinearConvCase(x, sx, zx, w, sw, zw, bias, sy, zy, stride, pads, dil, group)


def qlinearmatmul_case(seed: int, act_dtype, w_dtype) -> QLinearMatMulCase:
    """A random QLinearMatMul case; B has per-column scales and zero points in half of them."""
    rng = np.random.default_rng(seed)
    m, k, n = (int(v) for v in rng.integers(1, 24, 3))
    batch = [int(v) for v in rng.integers(1, 3, int(rng.integers(0, 2)))]
    ties = seed % 4 == 1
    per_column = seed % 2 == 0
    cols = n if per_column else 1
    zb = np.array([_zero_point(rng, w_dtype) for _ in range(cols)], np.int64)
    za = _zero_point(rng, act_dtype)
    a = _codes(rng, (*batch, m, k), act_dtype, za if ties else None)
    b = _codes(rng, (k, n), w_dtype, int(zb[0]) if ties else None)
    sa, sb = _input_scales(rng, cols, ties)
    c = QLinearMatMulCase(a, sa, za, b, sb, zb, np.float32(1), 0)
    sy, zy = _output(rng, matmul_acc(c), sa, sb, act_dtype, ties)
    return QLinearMatMulCase(a, sa, za, b, sb, zb, sy, zy)
