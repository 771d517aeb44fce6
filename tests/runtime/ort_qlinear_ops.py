"""onnxruntime's QLinearAdd and QLinearGlobalAveragePool (CPU, MLAS, x86) restated in numpy,
and one-op ONNX models that run them and QLinearAveragePool (com.microsoft contrib ops, the
kernels onnxruntime fuses DequantizeLinear -> Add / GlobalAveragePool / AveragePool ->
QuantizeLinear into; quantlab's QLinearAveragePool is ``numerics.float_window_pool``).

QLinearAdd (``core/mlas/lib/qladd.cpp``, ``intrinsics/avx2/qladd_avx2.cpp``):
r_ac = fl32(sa / sc), r_bc = fl32(sb / sc),
fixed = fl32(fl32(zc) - fma(r_ac, za, fl32(r_bc * zb))) (the compiler fuses the sum of the two
products into one fused multiply-add),
c = clamp(rne(fma(a, r_ac, fma(b, r_bc, fixed))), qmin, qmax): two fused multiply-adds, one
rounding each (fl32(fl32(b * r_bc) + fixed) for the inner one differs on about 1 in 400,000
uint8 adds with zero point 128).

QLinearGlobalAveragePool (``core/mlas/lib/qlgavgpool.cpp``): s = fl32(sx / fl32(sy * N)),
acc = sum(x) - zx * N (int32), y = clamp(rne(fl32(fl32(acc) * s)) + zy): one float32 product,
ties to even (the x86 kernel; the NEON kernel multiplies by s's 24-bit significand in integers
and rounds ties away from zero).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

_ONNX_TYPE = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}
F32 = np.float32


def _fma_f32(a, b, c) -> np.ndarray:
    """fl32(a * b + c) with one rounding: the product of a float32 and an 8-bit integer has at
    most 32 significant bits, so long double (64-bit significand on x86) holds a * b exactly and
    the sum of terms within 2**31 of each other's magnitude exactly."""
    ld = np.longdouble
    return (np.asarray(a, ld) * np.asarray(b, ld) + np.asarray(c, ld)).astype(F32)


def qlinear_add(a, sa, za, b, sb, zb, sc, zc) -> np.ndarray:
    """Output codes of onnxruntime's QLinearAdd (a, b: codes of one dtype, broadcasting)."""
    r_ac, r_bc = F32(F32(sa) / F32(sc)), F32(F32(sb) / F32(sc))
    fixed = F32(F32(zc) - _fma_f32(r_ac, F32(za), F32(r_bc * F32(zb))))
    af, bf = np.broadcast_arrays(a.astype(F32), b.astype(F32))
    rest = _fma_f32(bf, r_bc, fixed)
    c = _fma_f32(af, r_ac, rest)
    info = np.iinfo(a.dtype)
    return np.clip(np.rint(c.astype(np.float64)), info.min, info.max).astype(a.dtype)


def qlinear_global_average_pool(x, sx, zx, sy, zy) -> np.ndarray:
    """Output codes (N, C, 1, 1) of onnxruntime's QLinearGlobalAveragePool on NCHW codes."""
    n_img = x.shape[2] * x.shape[3]
    s = F32(F32(sx) / F32(F32(sy) * F32(n_img)))
    acc = x.astype(np.int64).sum(axis=(2, 3), keepdims=True) - int(zx) * n_img
    r = np.rint((acc.astype(F32) * s).astype(F32).astype(np.float64))  # |acc| < 2**24
    info = np.iinfo(x.dtype)
    return np.clip(r + zy, info.min, info.max).astype(x.dtype)


def _session(node, inputs, inits, out_dtype) -> ort.InferenceSession:
    out = helper.make_tensor_value_info("y", _ONNX_TYPE[np.dtype(out_dtype)], None)
    graph = helper.make_graph([node], "g", inputs, [out], inits)
    opsets = [helper.make_opsetid("", 19), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _scalar(v, dtype, name):
    return numpy_helper.from_array(np.asarray(v, dtype=dtype), name)


def run_qlinear_add(a, sa, za, b, sb, zb, sc, zc) -> np.ndarray:
    return _run_binary_qlinear("QLinearAdd", a, sa, za, b, sb, zb, sc, zc)


def run_qlinear_mul(a, sa, za, b, sb, zb, sc, zc) -> np.ndarray:
    return _run_binary_qlinear("QLinearMul", a, sa, za, b, sb, zb, sc, zc)


def _run_binary_qlinear(op: str, a, sa, za, b, sb, zb, sc, zc) -> np.ndarray:
    """One com.microsoft QLinear op of two inputs (codes a, b of one dtype, broadcasting)."""
    dt = a.dtype
    inits = [
        _scalar(sa, F32, "sa"),
        _scalar(za, dt, "za"),
        _scalar(sb, F32, "sb"),
        _scalar(zb, dt, "zb"),
        _scalar(sc, F32, "sc"),
        _scalar(zc, dt, "zc"),
    ]
    node = helper.make_node(
        op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"], domain="com.microsoft"
    )
    inputs = [
        helper.make_tensor_value_info("a", _ONNX_TYPE[dt], list(a.shape)),
        helper.make_tensor_value_info("b", _ONNX_TYPE[dt], list(b.shape)),
    ]
    (y,) = _session(node, inputs, inits, dt).run(None, {"a": a, "b": b})
    return y


def _run_unary_qlinear(op: str, x, sx, zx, sy, zy, **attrs) -> np.ndarray:
    """One com.microsoft QLinear op of one input: codes x at (sx, zx) -> codes at (sy, zy)."""
    dt = x.dtype
    inits = [
        _scalar(sx, F32, "sx"),
        _scalar(zx, dt, "zx"),
        _scalar(sy, F32, "sy"),
        _scalar(zy, dt, "zy"),
    ]
    node = helper.make_node(
        op, ["x", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft", **attrs
    )
    inputs = [helper.make_tensor_value_info("x", _ONNX_TYPE[dt], list(x.shape))]
    (y,) = _session(node, inputs, inits, dt).run(None, {"x": x})
    return y


def run_qlinear_global_average_pool(x, sx, zx, sy, zy) -> np.ndarray:
    return _run_unary_qlinear("QLinearGlobalAveragePool", x, sx, zx, sy, zy, channels_last=0)


def run_qlinear_softmax(x, sx, zx, sy, zy, axis: int = -1) -> np.ndarray:
    """onnxruntime's QLinearSoftmax (com.microsoft, opset-13 semantics: one axis) on codes x."""
    return _run_unary_qlinear("QLinearSoftmax", x, sx, zx, sy, zy, axis=axis, opset=13)


def run_qlinear_average_pool(
    x, sx, zx, sy, zy, kernel, strides, pads, count_include_pad: bool = True
) -> np.ndarray:
    """onnxruntime's QLinearAveragePool (com.microsoft, NCHW) on codes x; ``pads``: (top,
    left), the same at the bottom and the right."""
    return _run_unary_qlinear(
        "QLinearAveragePool",
        x,
        sx,
        zx,
        sy,
        zy,
        kernel_shape=list(kernel),
        strides=list(strides),
        pads=[*pads, *pads],
        count_include_pad=int(count_include_pad),
        channels_last=0,
    )
