"""One-value constants of an ONNX graph's Mul and Div are the numbers the exported PyTorch code
held (quantlab.models.onnx_constants): a model's products and quotients by numbers are simulated
alike from PyTorch and from its ONNX export, Add and Sub keep theirs as tensor operands, and the
converted graph still computes what onnxruntime does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantlab.models.onnx_constants import OnnxScalarMath
from quantlab.models.registry import build_model
from quantlab.models.schema import ModelConfig

pytest.importorskip("onnxruntime")


class _ScaledHead(nn.Module):
    """Products and quotients by numbers, in both operand orders (a hard sigmoid's / 6 and
    a learnable affine's scale, as Paddle's exports write them)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.stem(x)
        y = y * F.relu6(y) / 6
        return self.head(1.25 * (y * 0.5))


def _scalar_modules(module: nn.Module) -> list[OnnxScalarMath]:
    return [m for m in module.modules() if isinstance(m, OnnxScalarMath)]


def test_an_exported_model_is_simulated_as_the_model_itself(tmp_path):
    from quantlab.simulate import Mode, Simulator

    torch.manual_seed(0)
    model = _ScaledHead().eval()
    x = torch.randn(5, 3, 12, 12) * 2
    path = tmp_path / "scaled.onnx"
    torch.onnx.export(model, (x[:1],), str(path), opset_version=17, dynamo=False)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    # the exporter writes 1.25 * y as Mul(y, 1.25)
    expected = [("div", False), ("mul", False), ("mul", False)]
    assert [(m.op, m.constant_first) for m in _scalar_modules(b.module)] == expected
    outputs = {}
    for name, module in (("torch", model), ("onnx", b.module)):
        sim = Simulator(module, "j6m")
        sim.calibrate([(x[i : i + 1],) for i in range(4)], progress=False)
        kernels = dict(zip(sim.ops.op_type, sim.ops.fixed_kernel))
        outputs[name] = [sim.run(x[4:], mode=m) for m in (Mode.FAKE, Mode.FIXED)], kernels
    (want, want_kernels), (got, got_kernels) = outputs["torch"], outputs["onnx"]
    assert got_kernels == want_kernels
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)


def _constants_graph(tmp_path, constants: dict[str, tuple[list[int], float]], nodes, x_rank: int):
    """A graph of ``nodes`` over input x (shape [2, 3, ...] of ``x_rank`` dims) whose constants
    are initializers of the given shapes and values."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(torch.full(shape, value).numpy(), name)
        for name, (shape, value) in constants.items()
    ]
    shape = [2, 3, 4, 5][:x_rank]
    graph = helper.make_graph(
        [helper.make_node(op, ins, [out]) for op, ins, out in nodes],
        "constants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(nodes[-1][2], TensorProto.FLOAT, None)],
        inits,
    )
    path = tmp_path / "constants.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return build_model(ModelConfig(name="onnx", path=str(path))), shape


def test_initializer_constants_of_every_shape_keep_onnxs_results(tmp_path):
    constants = {"c0": ([], 3.0), "c1": ([1], 6.0), "c4": ([1, 1, 1, 1], 0.25)}
    nodes = [
        ("Mul", ["x", "c0"], "a"),  # x * 3
        ("Div", ["a", "c1"], "b"),  # / 6
        ("Mul", ["c4", "b"], "y"),  # 0.25 * b, a rank-4 constant on a rank-2 tensor
    ]
    b, shape = _constants_graph(tmp_path, constants, nodes, x_rank=2)
    assert [(m.op, m.constant_first) for m in _scalar_modules(b.module)] == [
        ("mul", False), ("div", False), ("mul", True),
    ]  # fmt: skip
    x = torch.randn(shape)
    with torch.no_grad():
        got = b.module(x)
    want = torch.as_tensor(b.reference(x))
    assert got.shape == want.shape == (1, 1, 2, 3)  # ONNX's broadcast shape
    torch.testing.assert_close(got, want, rtol=2**-23, atol=0)


def test_added_numbers_tensor_constants_and_divided_numbers_stay_tensor_operands(tmp_path):
    constants = {"v": ([2, 1], 0.5), "six": ([], 6.0), "three": ([1], 3.0)}
    nodes = [
        ("Mul", ["x", "v"], "a"),  # a per-row scale: a tensor operand in PyTorch too
        ("Div", ["six", "a"], "b"),  # a number divided by a tensor
        ("Add", ["b", "three"], "c"),  # added numbers: int8 tensor operands (module docstring)
        ("Sub", ["three", "c"], "y"),
    ]
    b, shape = _constants_graph(tmp_path, constants, nodes, x_rank=2)
    assert _scalar_modules(b.module) == []
    x = torch.rand(shape) + 0.5
    with torch.no_grad():
        got = b.module(x)
    torch.testing.assert_close(got, torch.as_tensor(b.reference(x)), rtol=2**-22, atol=0)
