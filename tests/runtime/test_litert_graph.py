"""A whole quantized graph with activation zero points: the Simulator's fixed mode under the
``tflite`` profile (``activation_symmetry: ASYMMETRIC``) gives the bits of LiteRT's reference
kernels running the same graph (CONV_2D with a fused RELU and CONV_2D on one input, ADD, SUB
and MUL of their outputs, FULLY_CONNECTED per pixel), built from the Simulator's own scales,
zero points, weight and bias codes. Every intermediate tensor is a graph output and compared
too, and no op of the run falls back to float."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("ai_edge_litert")

import litert_models as L  # noqa: E402
from ai_edge_litert import schema_py_generated as S  # noqa: E402
from ai_edge_litert.interpreter import Interpreter  # noqa: E402
from bits import assert_bits_equal  # noqa: E402
from float_fallbacks import record_float_fallbacks  # noqa: E402

from quantlab.numerics import DType  # noqa: E402
from quantlab.numerics.gemm.finish import quantize_bias  # noqa: E402
from quantlab.numerics.quantize import quantize  # noqa: E402
from quantlab.qconfig import OpQConfig, QConfigSpec  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402


class _ConvAddFc(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        a, b = F.relu(self.c1(x)), self.c2(x)
        d = (a + b) - a
        return self.fc((d * b).permute(0, 2, 3, 1))


TENSORS = ("c1", "c2", "add", "sub", "mul", "fc")
SPEC = QConfigSpec(
    global_=OpQConfig(activation_symmetry="ASYMMETRIC"),
    by_type={t: OpQConfig(high_precision_output=False) for t in ("conv2d", "linear")},
)


def _qparams(info) -> tuple[float, int]:
    return float(info.scale), int(info.zero_point)


def _litert_graph(sim, model, x_q, infos, names) -> bytes:
    """The TFLite model of ``_ConvAddFc`` with the Simulator's parameters (NHWC)."""
    m = L.ModelBuilder()
    n, _, h, w = x_q[0].shape
    xi = m.tensor("x", np.int8, (n, h, w, 3), *x_q[1:])
    ops, outs = [], {}
    for key, act in (("c1", S.ActivationFunctionType.RELU), ("c2", S.ActivationFunctionType.NONE)):
        conv = getattr(model, key)
        codes, ws = sim.weight_q(names[key], conv.weight, DType.INT8, True)
        bias = quantize_bias(conv.bias.detach(), x_q[1], ws).numpy().astype(np.int32)
        wi = m.tensor(f"{key}.w", np.int8, (8, 3, 3, 3), ws.numpy(), None, 0,
                      codes.permute(0, 2, 3, 1).numpy())  # fmt: skip
        bs = (np.float64(x_q[1]) * ws.numpy().astype(np.float64)).astype(np.float32)
        bi = m.tensor(f"{key}.b", np.int32, (8,), bs, None, 0, bias)
        outs[key] = m.tensor(key, np.int8, (n, h, w, 8), *_qparams(infos[key]))
        o = S.Conv2DOptionsT()
        o.padding, o.strideH, o.strideW = S.Padding.SAME, 1, 1
        o.dilationHFactor = o.dilationWFactor = 1
        o.fusedActivationFunction = act
        ops.append((S.BuiltinOperator.CONV_2D, [xi, wi, bi], [outs[key]],
                    S.BuiltinOptions.Conv2DOptions, o))  # fmt: skip
    binary = (
        ("add", "c1", "c2", S.BuiltinOperator.ADD, S.BuiltinOptions.AddOptions, S.AddOptionsT),
        ("sub", "add", "c1", S.BuiltinOperator.SUB, S.BuiltinOptions.SubOptions, S.SubOptionsT),
        ("mul", "sub", "c2", S.BuiltinOperator.MUL, S.BuiltinOptions.MulOptions, S.MulOptionsT),
    )
    for key, a, b, builtin, otype, options in binary:
        outs[key] = m.tensor(key, np.int8, (n, h, w, 8), *_qparams(infos[key]))
        o = options()
        o.fusedActivationFunction = S.ActivationFunctionType.NONE
        ops.append((builtin, [outs[a], outs[b]], [outs[key]], otype, o))
    codes, ws = sim.weight_q(names["fc"], model.fc.weight, DType.INT8, True)
    sa = float(infos["mul"].scale)
    bias = quantize_bias(model.fc.bias.detach(), sa, ws).numpy().astype(np.int32)
    wi = m.tensor("fc.w", np.int8, (5, 8), ws.numpy(), None, 0, codes.numpy())
    bs = (np.float64(sa) * ws.numpy().astype(np.float64)).astype(np.float32)
    bi = m.tensor("fc.b", np.int32, (5,), bs, None, 0, bias)
    outs["fc"] = m.tensor("fc", np.int8, (n * h * w, 5), *_qparams(infos["fc"]))
    o = S.FullyConnectedOptionsT()
    o.fusedActivationFunction = S.ActivationFunctionType.NONE
    ops.append((S.BuiltinOperator.FULLY_CONNECTED, [outs["mul"], wi, bi], [outs["fc"]],
                S.BuiltinOptions.FullyConnectedOptions, o))  # fmt: skip
    return m.finish_graph(ops, [xi], [outs[k] for k in TENSORS])


def _run(model: bytes, x: np.ndarray) -> list[np.ndarray]:
    it = Interpreter(
        model_content=model, num_threads=1, experimental_op_resolver_type=L.Kernels.REFERENCE.value
    )
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simulator_graph_matches_litert_reference_kernels(seed, monkeypatch):
    fell_back = record_float_fallbacks(monkeypatch)
    torch.manual_seed(seed)
    model = _ConvAddFc().eval()
    sim = Simulator(model, "tflite", SPEC)
    sim.calibrate([(torch.randn(2, 3, 6, 6) * 0.8 + 0.4,) for _ in range(3)], progress=False)
    x = torch.randn(2, 3, 6, 6) * 0.9 + 0.4
    seen = {}
    trace = sim.trace(x, mode=Mode.FIXED, on_call=lambda oc: seen.setdefault(oc.call.name, oc))
    assert fell_back == [], fell_back  # every op ran its integer kernel
    names = {"c1": "c1:conv2d#0", "c2": "c2:conv2d#0", "fc": "fc:linear#0"}
    names.update({k: f":{k}#0" for k in ("add", "sub", "mul")})
    infos = {k: trace.qinfo[names[k]] for k in TENSORS}
    add = seen[":add#0"]  # its inputs: the relu'd c1 (relu passes codes through) and c2
    codes = {k: add.incoming[i].codes_of(add.call.args[i]) for i, k in enumerate(("c1", "c2"))}
    codes.update({k: infos[k].codes for k in TENSORS[2:]})
    assert sum(i.zero_point != 0 for i in infos.values()) >= 4, infos
    rq = sim.qconfig_of(names["c1"])
    s_in = sim.act_scale(names["c1"], "in0", DType.INT8, rq)
    z_in = sim.act_zero_point(names["c1"], "in0", DType.INT8, rq)
    assert z_in != 0
    x_codes = quantize(x, s_in, DType.INT8, sim.platform.fake_round, zero_point=z_in)
    graph = _litert_graph(sim, model, (x_codes, float(s_in), z_in), infos, names)
    got = _run(graph, x_codes.permute(0, 2, 3, 1).contiguous().numpy())
    for key, theirs in zip(TENSORS, got):
        mine = codes[key].to(torch.int8)
        mine = mine.permute(0, 2, 3, 1) if key != "fc" else mine.reshape(-1, 5)
        try:
            assert_bits_equal(mine.contiguous().numpy(), theirs)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, tensor {key}: {e}") from None
