"""Constant shape arguments of converted ONNX graphs (``onnx_shape_args``): a Resize's scales
and sizes, a Reshape's shape, a Slice's starts, ends, axes and steps and a Split's sizes,
constants or computed from tensors' shapes, become Python lists in the converted graph's code,
so torch dynamo traces the model's forward as one graph and a steady loop switches to a traced
program (before, ``Tensor.tolist`` and ``torch.any(shape == 0)`` on them stopped dynamo, and
such graphs always ran captured). The converted module still gives onnxruntime's outputs, at
other batches too, and the program the captured run's bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from program_switch import build_in_first_run
from torch import nn

from quantlab.models.onnx_resize import OnnxListResize
from quantlab.models.onnx_shape_args import (
    OnnxListConstantOfShape,
    OnnxListExpand,
    OnnxListReshape,
    OnnxListSlice,
    OnnxListSplit,
)
from quantlab.models.registry import build_model
from quantlab.models.schema import ModelConfig
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.traced_graph import same_bits

pytest.importorskip("onnxruntime")


class _Shapes(nn.Module):
    """Reshapes (constant, and computed from shapes), slices with steps and a flip (negative
    steps), between convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, 2, 1), nn.Linear(16, 5)

    def forward(self, x):
        y = torch.relu(self.a(x))  # (N, 8, 8, 10)
        p, q = torch.split(y, [3, 5], dim=1)
        z = p[:, :, 1:7:2].flip(-1)[..., 1:] + q[:, 1:4, ::3, 1:]  # (N, 3, 3, 9)
        z = z.reshape(-1, 3, 27).transpose(1, 2)  # (N, 27, 3)
        flat = [t.reshape(t.shape[0], -1) for t in (z, y)]  # Reshape(t, Concat(Shape(t)[0], -1))
        return self.b(torch.cat([flat[0], flat[1][:, :-1]], 1)[:, :16])


def _export_shapes(tmp_path, opset: int) -> str:
    torch.manual_seed(0)
    path = tmp_path / f"shapes{opset}.onnx"
    x = torch.randn(1, 3, 16, 20)
    torch.onnx.export(_Shapes().eval(), (x,), str(path), opset_version=opset, dynamo=False,
                      dynamic_axes={"x": {0: "n"}}, input_names=["x"])  # fmt: skip
    return str(path)


class _Embeddings(nn.Module):
    """BERT's embedding block as torch exports it with a dynamic batch: position ids sliced
    from a buffer to the sequence length, token-type ids expanded to (batch, length), zeros of
    the ids' shape (Shape, Gather, Slice, Expand, ConstantOfShape nodes)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("pos_ids", torch.arange(64).unsqueeze(0))
        self.register_buffer("type_ids", torch.zeros(1, 64, dtype=torch.long))
        self.tok, self.pos, self.kind = (
            nn.Embedding(100, 8),
            nn.Embedding(64, 8),
            nn.Embedding(2, 8),
        )
        self.out = nn.Linear(8, 4)

    def forward(self, ids):
        n, length = ids.shape
        types = self.type_ids[:, :length].expand(n, length) + torch.zeros(
            ids.shape, dtype=ids.dtype
        )
        e = self.tok(ids) + self.pos(self.pos_ids[:, :length]) + self.kind(types)
        return self.out(e)


def _export_embeddings(tmp_path) -> str:
    torch.manual_seed(0)
    path = tmp_path / "embeddings.onnx"
    ids = torch.randint(0, 100, (2, 16))
    torch.onnx.export(_Embeddings().eval(), (ids,), str(path), opset_version=17, dynamo=False,
                      input_names=["ids"], dynamic_axes={"ids": {0: "n"}})  # fmt: skip
    return str(path)


class _Upsampler(nn.Module):
    def __init__(self, **resize) -> None:
        super().__init__()
        self.a, self.b, self.resize = nn.Conv2d(3, 6, 3, 2, 1), nn.Conv2d(6, 4, 3, 1, 1), resize

    def forward(self, x):
        return self.b(F.interpolate(torch.relu(self.a(x)), **self.resize))


def _export(tmp_path, name: str, opset: int, **resize) -> str:
    torch.manual_seed(0)
    path = tmp_path / f"{name}.onnx"
    x = torch.randn(1, 3, 16, 20)
    torch.onnx.export(_Upsampler(**resize).eval(), (x,), str(path), opset_version=opset,
                      dynamo=False)  # fmt: skip
    return str(path)


def _half_pixel_nearest(tmp_path) -> str:
    """One Resize node (nearest, half-pixel coordinates, round_prefer_floor; quantlab's
    ``OnnxNearestResize``) with its scales as an initializer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(
        "Resize", ["x", "", "scales"], ["y"], mode="nearest",
        coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor",
    )  # fmt: skip
    scales = numpy_helper.from_array(torch.tensor([1.0, 1.0, 1.5, 2.5]).numpy(), "scales")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 9, 12])], [scales],
    )  # fmt: skip
    path = tmp_path / "half_pixel_nearest.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return str(path)


def _one_node(tmp_path, op: str, values: list[int], opset: int, outputs: int, **attrs) -> str:
    """``op`` on input x (N, 3, 16, 20) and an int64 initializer of ``values``, each of its
    ``outputs`` through a Relu (so that every output is an op's)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    names = [f"y{i}" for i in range(outputs)]
    nodes = [helper.make_node(op, ["x", "c"], names, **attrs)]
    nodes += [helper.make_node("Relu", [n], [f"z{i}"]) for i, n in enumerate(names)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 16, 20])],
        [helper.make_tensor_value_info(f"z{i}", TensorProto.FLOAT, None) for i in range(outputs)],
        [numpy_helper.from_array(torch.tensor(values).numpy(), "c")],
    )  # fmt: skip
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return str(path)


CASES = {
    "nearest x2 (asymmetric, floor)": lambda t: _export(t, "n", 13, scale_factor=2.0),
    "bilinear x2": lambda t: _export(t, "b", 13, scale_factor=2.0, mode="bilinear"),
    "nearest to a size": lambda t: _export(t, "s", 13, size=(13, 27)),
    "nearest x2, opset 10": lambda t: _export(t, "v10", 10, scale_factor=2.0),
    "nearest, half-pixel, initializer scales": _half_pixel_nearest,
    "reshape, slice (opset 13)": lambda t: _export_shapes(t, 13),
    "reshape, slice (opset 11)": lambda t: _export_shapes(t, 11),
    "split, initializer sizes": lambda t: _one_node(t, "Split", [1, 2], 13, 2, axis=1),
    "embeddings: expand to the batch, constant of shape": _export_embeddings,
    "reshape allowzero=1, initializer shape": lambda t: _one_node(
        t, "Reshape", [-1, 60, 16], 14, 1, allowzero=1
    ),
}
LIST_MODULES = (
    OnnxListResize,
    OnnxListReshape,
    OnnxListSlice,
    OnnxListSplit,
    OnnxListExpand,
    OnnxListConstantOfShape,
)


@pytest.mark.parametrize("case", list(CASES))
def test_constant_shape_args_run_as_a_traced_program(case, tmp_path, monkeypatch):
    b = build_model(ModelConfig(name="onnx", path=CASES[case](tmp_path)))
    twins = [m for m in b.module.modules() if isinstance(m, LIST_MODULES)]
    if "allowzero" in case:  # quantlab's own module takes the list
        assert not twins and "shape = [-1, 60, 16]" in b.module.code
    elif "reshape" in case:
        split = {OnnxListSplit} if "13" in case else set()  # opset 11: Split's attribute
        assert {type(m) for m in twins} == {OnnxListReshape, OnnxListSlice} | split
        assert sum(isinstance(m, OnnxListReshape) for m in twins) == 3  # 2 from shapes
    elif "split" in case:
        assert [type(m) for m in twins] == [OnnxListSplit]
    elif "embeddings" in case:  # the batch entry is the graph's batch, read per call
        assert {OnnxListExpand, OnnxListSlice, OnnxListConstantOfShape} <= {type(m) for m in twins}
        assert "_batch_size(input_1)" in b.module.code
    else:
        assert len(twins) == 1
    # the arguments are literals of the code: no Constant or Shape node is left
    kinds = {type(m).__name__ for m in b.module.modules()}
    assert not kinds & {"OnnxConstant", "OnnxShape"}, kinds
    shape = (1, 3, 6, 5) if "half-pixel" in case else (1, 3, 16, 20)
    xs = [torch.randn(shape, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    other = torch.randn(3, *shape[1:])
    if "embeddings" in case:
        xs = [torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(s))
              for s in (1, 2)]  # fmt: skip
        other = torch.randint(0, 100, (3, 16))
    for x in (xs[0], other):  # the graph's batch is dynamic
        with torch.no_grad():
            got = b.module(x)
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        want = b.reference(x)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, torch.as_tensor(w).reshape(g.shape), rtol=0, atol=1e-5)

    build_in_first_run(monkeypatch)
    sim = Simulator(b.module, "j6m")
    captured = Simulator(b.module, "j6m", steady_programs=False)
    for s in (sim, captured):
        s.calibrate([(x,) for x in xs], progress=False)
    for mode in (Mode.FIXED, Mode.FAKE):
        for x in xs * 2:
            assert same_bits(sim.run(x, mode=mode), captured.run(x, mode=mode))
        status = sim.steady_programs.status((xs[0],), mode)
        assert status.failed is None, status.failed
        assert status.program is not None and status.program_runs > 0
