"""Fake mode equals torch.ao fake quantization; fixed mode under the onnxruntime profile equals
the same network written as ONNX integer ops and run in onnxruntime, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal

from quantlab.models import build_model
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import quantize_bias
from quantlab.platforms import load_platform
from quantlab.qconfig import QConfigSpec
from quantlab.simulate import Mode, Simulator

CONVS = ("conv1:conv2d#0", "conv2:conv2d#0", "conv3:conv2d#0")


def _calibrated(platform, seed: int, spec: QConfigSpec | None = None):
    bundle = build_model("conv_only", seed=seed)
    model = bundle.module
    sim = Simulator(model, platform, spec)
    sim.calibrate([bundle.example_inputs(4, seed + 100 + i) for i in range(2)])
    return model, sim, bundle.example_inputs(4, seed + 7)[0]


def _scales(sim, model):
    convs = (model.conv1, model.conv2, model.conv3)
    out = []
    for name, conv in zip(CONVS, convs):
        rq = sim.qconfig_of(name)
        wc, ws = sim.weight_q(name, conv.weight, DType.INT8, True)
        so = sim.act_scale(name, "out", DType.INT8, rq)
        out.append((conv, wc, ws, so))
    s_in = sim.act_scale(CONVS[0], "in0", DType.INT8, sim.qconfig_of(CONVS[0]))
    return s_in, out


@pytest.mark.parametrize("seed", [0, 1])
def test_fake_mode_equals_torch_ao_fake_quant(seed):
    model, sim, x = _calibrated("j6m", seed)
    s_in, convs = _scales(sim, model)
    h = torch.fake_quantize_per_tensor_affine(x, float(s_in), 0, -128, 127)
    for i, (conv, _, ws, so) in enumerate(convs):
        w = torch.fake_quantize_per_channel_affine(
            conv.weight, ws, torch.zeros(ws.shape, dtype=torch.int32), 0, -128, 127
        )
        h = F.conv2d(h, w, conv.bias, conv.stride, conv.padding)
        if i < 2:
            h = torch.relu(torch.fake_quantize_per_tensor_affine(h, float(so), 0, -128, 127))
        # the last conv feeds the model output: high-precision output, no output fake quant
    assert sim.qconfig_of(CONVS[2]).high_precision_output
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), h)


def _onnx_conv_only(x_scale, convs):
    """QuantizeLinear -> (QLinearConv -> DQ -> Relu -> Q) x2 -> QLinearConv -> DequantizeLinear."""
    from onnx import TensorProto, helper, numpy_helper

    def const(name, arr):
        return numpy_helper.from_array(np.asarray(arr), name)

    inits = [const("x_s", np.float32(x_scale)), const("zp8", np.int8(0))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "zp8"], ["q0"])]
    cur, cur_s = "q0", "x_s"
    for i, (conv, wc, ws, so) in enumerate(convs):
        bias = quantize_bias(conv.bias.detach(), x_scale, ws).numpy().astype(np.int32)
        inits += [
            const(f"w{i}", wc.numpy().astype(np.int8)),
            const(f"ws{i}", ws.numpy().astype(np.float32)),
            const(f"wzp{i}", np.zeros(ws.shape, np.int8)),
            const(f"b{i}", bias),
            const(f"ys{i}", np.float32(so)),
        ]
        attrs = {
            "kernel_shape": list(conv.kernel_size),
            "strides": list(conv.stride),
            "pads": [conv.padding[0], conv.padding[1]] * 2,
        }
        nodes.append(
            helper.make_node(
                "QLinearConv",
                [cur, cur_s, "zp8", f"w{i}", f"ws{i}", f"wzp{i}", f"ys{i}", "zp8", f"b{i}"],
                [f"c{i}"],
                **attrs,
            )
        )
        if i < len(convs) - 1:
            nodes += [
                helper.make_node("DequantizeLinear", [f"c{i}", f"ys{i}", "zp8"], [f"d{i}"]),
                helper.make_node("Relu", [f"d{i}"], [f"r{i}"]),
                helper.make_node("QuantizeLinear", [f"r{i}", f"ys{i}", "zp8"], [f"q{i + 1}"]),
            ]
            cur = f"q{i + 1}"
        else:
            nodes.append(helper.make_node("DequantizeLinear", [f"c{i}", f"ys{i}", "zp8"], ["y"]))
        cur_s = f"ys{i}"
        x_scale = so
    graph = helper.make_graph(
        nodes,
        "conv_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("seed", [0, 1])
def test_fixed_mode_equals_onnxruntime_integer_graph(seed):
    ort = pytest.importorskip("onnxruntime")
    platform = load_platform("onnxruntime")
    # the ONNX graph requantizes every conv to int8 (no int32 high-precision output)
    model, sim, x = _calibrated(platform, seed, QConfigSpec(use_platform_template=False))
    s_in, convs = _scales(sim, model)
    onnx_model = _onnx_conv_only(float(s_in), convs)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(
        onnx_model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    (y_ort,) = sess.run(None, {"x": x.numpy()})
    y_sim = sim.run(x, mode=Mode.FIXED)
    assert_bits_equal(y_sim, torch.from_numpy(y_ort))
    # and the comparison is not vacuous: fixed differs from fake somewhere
    assert not torch.equal(y_sim, sim.run(x, mode=Mode.FAKE))


def _onnx_mlp(x_scale, layers):
    """QuantizeLinear -> QLinearMatMul -> DQ -> Relu -> Q -> QLinearMatMul -> DequantizeLinear."""
    from onnx import TensorProto, helper, numpy_helper

    def const(name, arr):
        return numpy_helper.from_array(np.asarray(arr), name)

    inits = [const("x_s", np.float32(x_scale)), const("zp8", np.int8(0))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "zp8"], ["q0"])]
    cur, cur_s = "q0", "x_s"
    for i, (wc, ws, so) in enumerate(layers):
        inits += [
            const(f"w{i}", wc.t().contiguous().numpy().astype(np.int8)),  # (in, out)
            const(f"ws{i}", ws.numpy().astype(np.float32)),
            const(f"wzp{i}", np.zeros(ws.shape, np.int8)),
            const(f"ys{i}", np.float32(so)),
        ]
        nodes.append(
            helper.make_node(
                "QLinearMatMul",
                [cur, cur_s, "zp8", f"w{i}", f"ws{i}", f"wzp{i}", f"ys{i}", "zp8"],
                [f"m{i}"],
            )
        )
        if i < len(layers) - 1:
            nodes += [
                helper.make_node("DequantizeLinear", [f"m{i}", f"ys{i}", "zp8"], [f"d{i}"]),
                helper.make_node("Relu", [f"d{i}"], [f"r{i}"]),
                helper.make_node("QuantizeLinear", [f"r{i}", f"ys{i}", "zp8"], [f"q{i + 1}"]),
            ]
            cur = f"q{i + 1}"
        else:
            nodes.append(helper.make_node("DequantizeLinear", [f"m{i}", f"ys{i}", "zp8"], ["y"]))
        cur_s = f"ys{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("seed", [0, 1])
def test_fixed_linear_equals_onnxruntime_qlinearmatmul(seed):
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(seed)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(16, 32, bias=False), torch.nn.ReLU(), torch.nn.Linear(32, 8, bias=False)
    ).eval()
    g = torch.Generator().manual_seed(seed)
    sim = Simulator(mlp, load_platform("onnxruntime"), QConfigSpec(use_platform_template=False))
    sim.calibrate([(torch.randn(64, 16, generator=g),) for _ in range(2)])
    x = torch.randn(128, 16, generator=g)
    s_in = sim.act_scale("0:linear#0", "in0", DType.INT8, sim.qconfig_of("0:linear#0"))
    layers = []
    for name, lin in (("0:linear#0", mlp[0]), ("2:linear#0", mlp[2])):
        wc, ws = sim.weight_q(name, lin.weight, DType.INT8, True)
        layers.append((wc, ws, sim.act_scale(name, "out", DType.INT8, sim.qconfig_of(name))))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(
        _onnx_mlp(float(s_in), layers).SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    (y_ort,) = sess.run(None, {"x": x.numpy()})
    assert_bits_equal(sim.run(x, mode=Mode.FIXED), torch.from_numpy(y_ort))
