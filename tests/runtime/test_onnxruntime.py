"""The ``onnxruntime`` platform profile reproduces ONNX Runtime's integer ops bit for bit.

Each case builds a small ONNX graph with ``onnx.helper``: QuantizeLinear -> QLinearConv or
QLinearMatMul -> DequantizeLinear (int8, zero point 0, per-channel weight scales, int32 bias),
runs it in onnxruntime and compares every output code (and the quantized input and dequantized
output) with quantlab's ``quantize`` / ``qconv2d`` / ``qconv1d`` / ``qmatmul`` / ``dequantize``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics import DType, dequantize, qconv1d, qconv2d, qmatmul, quantize, quantize_bias
from quantlab.platforms import load_platform

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

N_CONV2D = 130
N_CONV1D = 30
N_MATMUL = 70


@pytest.fixture(scope="module")
def contract():
    """The GEMM contract of the onnxruntime platform profile."""
    return load_platform("onnxruntime").gemm_contract()


def _session(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _f32(v, name):
    return numpy_helper.from_array(np.asarray(v, dtype=np.float32), name)


def _i8(v, name):
    return numpy_helper.from_array(np.asarray(v, dtype=np.int8), name)


def _qgemm_session(op, x_shape, w, w_scale, bias_q, sx, sy, w_is_input=False, **attrs):
    """QuantizeLinear(x) -> op -> DequantizeLinear; outputs xq, yq, y."""
    inits = [
        _f32(sx, "sx"),
        _i8(0, "zx"),
        _f32(w_scale, "sw"),
        _i8(np.zeros(np.shape(w_scale)), "zw"),
    ]
    inits += [_f32(sy, "sy"), _i8(0, "zy")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    if w_is_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.INT8, list(w.shape)))
    else:
        inits.append(_i8(w, "w"))
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"])]
    if op == "QLinearConv":
        ins = ["xq", "sx", "zx", "w", "sw", "zw", "sy", "zy"]
        if bias_q is not None:
            inits.append(numpy_helper.from_array(bias_q.astype(np.int32), "b"))
            ins.append("b")
        nodes.append(helper.make_node(op, ins, ["yq"], **attrs))
    else:
        nodes.append(helper.make_node(op, ["xq", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["yq"]))
    nodes.append(helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]))
    outputs = [
        helper.make_tensor_value_info("xq", TensorProto.INT8, None),
        helper.make_tensor_value_info("yq", TensorProto.INT8, None),
        helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
    ]
    return _session(nodes, inputs, outputs, inits)


def _scales(rng, n, lo=1e-3, hi=2e-2):
    return (rng.random(n) * (hi - lo) + lo).astype(np.float32)


def _conv_case(rng, nsp: int, adversarial: bool):
    """Random conv geometry with a valid (>= 1) output size."""
    while True:
        groups = int(rng.choice([1, 1, 2, 3]))
        cin = groups * int(rng.integers(1, 6))
        cout = groups * int(rng.integers(1, 5))
        k = tuple(int(v) for v in rng.integers(1, 4, nsp))
        size = tuple(int(v) for v in rng.integers(3, 10, nsp))
        stride = tuple(int(v) for v in rng.integers(1, 3, nsp))
        dil = tuple(int(v) for v in rng.integers(1, 3, nsp))
        pads = tuple(int(v) for v in rng.integers(0, 3, nsp))
        if adversarial:
            cin = groups * int(rng.integers(120, 200))  # K = 9 * cin/groups: 1080..1791
            k = (3,) * nsp
            dil = (1,) * nsp
        if all(size[i] + 2 * pads[i] - dil[i] * (k[i] - 1) - 1 >= 0 for i in range(nsp)):
            return groups, cin, cout, k, size, stride, dil, pads


def _float_conv(x, w, nsp):
    fn = torch.nn.functional.conv2d if nsp == 2 else torch.nn.functional.conv1d
    xt, wt = torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w)
    return lambda **kw: fn(xt, wt, **kw).numpy()


def _run_conv_case(seed: int, nsp: int, contract, adversarial: bool = False):
    rng = np.random.default_rng(seed)
    groups, cin, cout, k, size, stride, dil, pads = _conv_case(rng, nsp, adversarial)
    x = (rng.normal(size=(int(rng.integers(1, 3)), cin, *size)) * 2).astype(np.float32)
    sx = np.float32(np.abs(x).max() / 127.5)
    if adversarial:  # all odd, near the maximum: partial sums far above 2**24
        x = rng.choice([-1, 1], size=x.shape) * sx * rng.choice([125, 127], size=x.shape)
        x = x.astype(np.float32)
        w = (rng.choice([-1, 1], size=(cout, cin // groups, *k)) * 127).astype(np.int8)
    else:
        w = rng.integers(-128, 128, (cout, cin // groups, *k)).astype(np.int8)
    sw = _scales(rng, cout)
    bias = (rng.normal(size=cout) * 3).astype(np.float32) if rng.random() < 0.8 else None
    y_float = _float_conv(x, w.astype(np.float64) * sw.reshape(-1, *([1] * (nsp + 1))), nsp)
    y_float = y_float(stride=stride, padding=pads, dilation=dil, groups=groups)
    sy = np.float32(float(np.abs(y_float).max()) / 127.5 * (rng.random() + 0.5) + 1e-6)
    bias_q = None
    if bias is not None:
        bias_q = quantize_bias(torch.from_numpy(bias), float(sx), torch.from_numpy(sw)).numpy()
    sess = _qgemm_session(
        "QLinearConv",
        x.shape,
        w,
        sw,
        bias_q,
        sx,
        sy,
        strides=list(stride),
        pads=list(pads) * 2,
        dilations=list(dil),
        group=groups,
    )
    xq_ort, yq_ort, y_ort = sess.run(None, {"x": x})
    xq = quantize(torch.from_numpy(x), float(sx), DType.INT8)
    assert_bits_equal(xq, torch.from_numpy(xq_ort))
    fn = qconv2d if nsp == 2 else qconv1d
    yq, _ = fn(
        xq,
        float(sx),
        torch.from_numpy(w),
        torch.from_numpy(sw),
        None if bias is None else torch.from_numpy(bias),
        float(sy),
        DType.INT8,
        contract,
        stride=stride,
        padding=pads,
        dilation=dil,
        groups=groups,
    )
    assert_bits_equal(yq, torch.from_numpy(yq_ort))
    assert_bits_equal(dequantize(yq, float(sy)), torch.from_numpy(y_ort))


@pytest.mark.parametrize("block", range(5))
def test_qlinearconv2d_matches_onnxruntime(block, contract):
    per_block = N_CONV2D // 5
    for seed in range(block * per_block, (block + 1) * per_block):
        _run_conv_case(seed, 2, contract, adversarial=seed % 13 == 0)


def test_qlinearconv1d_matches_onnxruntime(contract):
    for seed in range(N_CONV1D):
        _run_conv_case(1000 + seed, 1, contract, adversarial=seed % 10 == 0)


def _run_matmul_case(seed: int, contract):
    rng = np.random.default_rng(5000 + seed)
    m, k, n = (int(v) for v in rng.integers(1, 40, 3))
    if seed % 10 == 0:
        k = int(rng.integers(1100, 1500))  # K above the single float32 chunk
    batch = [int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3)))]
    x = (rng.normal(size=(*batch, m, k)) * 3).astype(np.float32)
    sx = np.float32(np.abs(x).max() / 127.5)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    per_column = seed % 2 == 0
    sw = _scales(rng, n) if per_column else _scales(rng, 1).reshape(())
    y_float = x.astype(np.float64) @ (w.astype(np.float64) * sw)
    sy = np.float32(float(np.abs(y_float).max()) / 127.5 * (rng.random() + 0.5) + 1e-6)
    w_is_input = seed % 3 == 0
    sess = _qgemm_session("QLinearMatMul", x.shape, w, sw, None, sx, sy, w_is_input=w_is_input)
    feeds = {"x": x, "w": w} if w_is_input else {"x": x}
    xq_ort, yq_ort, y_ort = sess.run(None, feeds)
    xq = quantize(torch.from_numpy(x), float(sx), DType.INT8)
    assert_bits_equal(xq, torch.from_numpy(xq_ort))
    yq, _ = qmatmul(
        xq,
        float(sx),
        torch.from_numpy(w),
        torch.from_numpy(sw),
        None,
        float(sy),
        DType.INT8,
        contract,
    )
    assert_bits_equal(yq, torch.from_numpy(yq_ort))
    assert_bits_equal(dequantize(yq, float(sy)), torch.from_numpy(y_ort))


def test_qlinearmatmul_matches_onnxruntime(contract):
    for seed in range(N_MATMUL):
        _run_matmul_case(seed, contract)


def test_case_count_meets_acceptance():
    assert N_CONV2D + N_CONV1D + N_MATMUL >= 200


def _qlinearmatmul_int8_session(sx, sw, sy):
    inits = [_f32(sx, "sx"), _i8(0, "zx"), _f32(sw, "sw"), _i8(np.zeros(np.shape(sw)), "zw")]
    inits += [_f32(sy, "sy"), _i8(0, "zy")]
    node = helper.make_node("QLinearMatMul", ["a", "sx", "zx", "b", "sw", "zw", "sy", "zy"], ["y"])
    inputs = [
        helper.make_tensor_value_info("a", TensorProto.INT8, [256, 1]),
        helper.make_tensor_value_info("b", TensorProto.INT8, [1, 256]),
    ]
    return _session(
        [node], inputs, [helper.make_tensor_value_info("y", TensorProto.INT8, None)], inits
    )


def _discriminating_scales(rng):
    """Scales for which M = fl32(fl32(sx*sw)/sy) (ONNX Runtime) and the correctly rounded
    float32 of the exact ratio give different outputs on some int8 x int8 accumulator."""
    acc = np.arange(-128, 128).reshape(-1, 1) * np.arange(-128, 128).reshape(1, -1)
    acc = acc.astype(np.float32)
    while True:
        sx, sw = _scales(rng, 2, 1e-3, 1.0)
        sy = np.float32(float(sx) * float(sw) * 16384 / 127.5 * (rng.random() + 0.5))
        m_chain = (sx * sw) / sy
        m_exact = np.float32(np.float64(sx) * np.float64(sw) / np.float64(sy))
        if m_chain != m_exact and (np.rint(acc * m_chain) != np.rint(acc * m_exact)).any():
            return sx, sw, sy


@pytest.mark.parametrize("seed", range(12))
def test_every_int8_product_requantizes_like_onnxruntime(seed, contract):
    """(256, 1) @ (1, 256): every int8 x int8 accumulator, with scales chosen so that the way
    M is formed changes some output bits (seed 0: power-of-two scales, exact ties -> even)."""
    rng = np.random.default_rng(9000 + seed)
    if seed == 0:
        sx, sw, sy = np.float32(0.5), np.float32(0.25), np.float32(64.0)
    else:
        sx, sw, sy = _discriminating_scales(rng)
    a = np.arange(-128, 128, dtype=np.int8).reshape(256, 1)
    b = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    (y_ort,) = _qlinearmatmul_int8_session(sx, sw, sy).run(None, {"a": a, "b": b})
    y, _ = qmatmul(
        torch.from_numpy(a),
        float(sx),
        torch.from_numpy(b),
        float(sw),
        None,
        float(sy),
        DType.INT8,
        contract,
    )
    assert_bits_equal(y, torch.from_numpy(y_ort))
