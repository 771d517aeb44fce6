"""ONNX files of other opsets than onnx2torch's (``quantlab.models.onnx_versions``,
``onnx_import``): torch's exports at opsets 18 and 20 (the reductions with their axes as an
input, Pad, Resize, Split, AveragePool 19), the versions that only add types (checked against
ONNX's schemas) up to opset 24, and opset-6 graphs carried to opset 13 convert and give
onnxruntime's or their recorded outputs; the forms that mean something else are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantlab.models.registry import build_model
from quantlab.models.schema import ModelConfig

pytest.importorskip("onnxruntime")


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.gn = nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8)
        self.ln, self.head = nn.LayerNorm(8), nn.Linear(8, 5)

    def forward(self, x):
        y = F.gelu(self.gn(self.conv(x)))
        y = F.pad(F.interpolate(y, scale_factor=2, mode="bilinear"), (1, 1, 1, 1))
        z = y.mean((2, 3))
        a, b = z.split(4, dim=1)
        peak = y.amax((-2, -1))
        energy = y.square().sum((2, 3)).sqrt()
        return self.head(self.ln(torch.cat([b, a], 1))).softmax(-1), peak, energy


@pytest.mark.parametrize("opset", [18, 20])
def test_a_model_exported_at_opset_18_or_20_converts_and_matches_onnxruntime(tmp_path, opset):
    import onnx

    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(1, 3, 16, 16)
    path = tmp_path / f"block{opset}.onnx"
    torch.onnx.export(model, (x,), str(path), opset_version=opset, dynamo=False)
    types = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"ReduceMean", "ReduceMax", "Pad", "Resize", "Split", "Reshape"} <= types
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        got, want = b.module(x), model(x)
    for g, w, r in zip(got, want, b.reference(x), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=2e-5)
        torch.testing.assert_close(g, r, rtol=0, atol=2e-5)


def _graph(tmp_path, nodes, inputs, initializers=(), opset: int = 18):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(initializers),
    )  # fmt: skip
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def test_opset_18_forms_with_another_meaning_are_named_and_folded_axes_convert(tmp_path):
    from onnx import helper, numpy_helper

    def ints(name, values):
        return numpy_helper.from_array(torch.tensor(values, dtype=torch.int64).numpy(), name)

    pads, axes = ints("pads", [1, 1]), ints("axes", [3])
    cases = [
        ([helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"])], [pads, axes], "axes input"),
        ([helper.make_node("Resize", ["x", "", "scales"], ["y"], antialias=1, mode="linear")],
         [numpy_helper.from_array(torch.tensor([1.0, 1.0, 2.0, 2.0]).numpy(), "scales")],
         "antialias=1"),
    ]  # fmt: skip
    for nodes, inits, words in cases:
        path = _graph(tmp_path, nodes, [("x", [1, 2, 4, 4])], inits)
        with pytest.raises(ValueError, match=f"cannot convert.*{words}"):
            build_model(ModelConfig(name="onnx", path=str(path)))
    # axes computed from the input's shape fold to a constant (onnxslim): converted
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "two", "three"], ["h"]),  # [4]
        helper.make_node("Sub", ["h", "one"], ["a"]),  # [3]: the last axis
        helper.make_node("ReduceMean", ["x", "a"], ["y"]),
    ]
    consts = [ints("one", [1]), ints("two", [2]), ints("three", [3])]
    path = _graph(tmp_path, nodes, [("x", [1, 2, 4, 4])], consts)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    x = torch.randn(1, 2, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(b.module(x), b.reference(x), rtol=0, atol=1e-6)


def test_split_18_into_parts_that_do_not_divide_matches_onnxruntime(tmp_path):
    """num_outputs=3 of 7 values: 3, 3 and 1, as onnxruntime splits them."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7])], outs
    )
    path = tmp_path / "split.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    x = torch.arange(7, dtype=torch.float32).reshape(1, 7)
    with torch.no_grad():
        got = b.module(x)
    want = b.reference(x)
    assert [g.shape[1] for g in got] == [3, 3, 1]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize(
    "allowzero, shape, want", [(0, [1, 0, -1], (1, 4, 5)), (1, [1, -1], (1, 20))]
)
def test_reshape_with_and_without_allowzero_matches_onnxruntime(tmp_path, allowzero, shape, want):
    """The dynamo exporter writes Reshape with allowzero=1 (a 0 is a size, as torch reads it),
    which onnx2torch refused; allowzero=0 keeps ONNX's copy-this-dimension 0."""
    from onnx import helper, numpy_helper

    init = numpy_helper.from_array(torch.tensor(shape, dtype=torch.int64).numpy(), "shape")
    node = helper.make_node("Reshape", ["x", "shape"], ["y"], allowzero=allowzero)
    path = _graph(tmp_path, [node], [("x", [1, 4, 5])], [init], opset=14)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    x = torch.randn(1, 4, 5)
    with torch.no_grad():
        got = b.module(x)
    assert got.shape == want and torch.equal(got, b.reference(x))


def _signature(schema) -> tuple:
    attrs = {k: (a.type, a.required, str(a.default_value)) for k, a in schema.attributes.items()}
    return attrs, [(i.name, i.option) for i in schema.inputs], [o.name for o in schema.outputs]


def test_every_type_only_version_adds_types_and_nothing_else():
    """ONNX's own schemas: each version TYPE_ONLY converts as the one before has that version's
    attributes (with their defaults), inputs and outputs, and admits every type it admitted."""
    import onnx.defs

    from quantlab.models.onnx_versions import TYPE_ONLY

    for_new_types_only = {("Cast", 19): "saturate"}  # its float8 targets' overflow rule
    for op, versions in TYPE_ONLY.items():
        for v in versions:
            new, old = onnx.defs.get_schema(op, v), onnx.defs.get_schema(op, v - 1)
            assert new.since_version == v, (op, v)
            attrs, ins, outs = _signature(new)
            attrs.pop(for_new_types_only.get((op, v)), None)
            assert (attrs, ins, outs) == _signature(old), (op, v)
            before = {t.type_param_str: set(t.allowed_type_strs) for t in old.type_constraints}
            after = {t.type_param_str: set(t.allowed_type_strs) for t in new.type_constraints}
            assert before.keys() == after.keys(), (op, v)
            assert all(before[k] <= after[k] for k in before), (op, v)


@pytest.mark.parametrize("opset", [21, 22, 23, 24])
def test_the_model_at_opsets_21_to_24_converts_and_matches_onnxruntime(tmp_path, opset):
    """The opset-20 export carried to later opsets by ONNX's version converter (Conv 22,
    Reshape, Shape and Constant 23 / 24, ...): Conv 22 stopped every such file before."""
    import onnx
    from onnx import version_converter

    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(1, 3, 16, 16)
    path = tmp_path / "block20.onnx"
    torch.onnx.export(model, (x,), str(path), opset_version=20, dynamo=False)
    later = version_converter.convert_version(onnx.load(str(path)), opset)
    path = tmp_path / f"block{opset}.onnx"
    onnx.save(later, path)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    with torch.no_grad():
        got = b.module(x)
    for g, w, r in zip(got, model(x), b.reference(x), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=2e-5)
        torch.testing.assert_close(g, torch.as_tensor(r), rtol=0, atol=2e-5)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_average_pool_at_torchs_default_opset_matches_onnxruntime(
    tmp_path, ceil_mode, count_include_pad
):
    """torch writes nn.AvgPool2d as AveragePool 19 at opset 20 (its default), which onnx2torch
    lacked: every model with an average pool failed to convert."""
    import onnx

    pool = nn.AvgPool2d(3, 2, 1, ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), pool).eval()
    x = torch.randn(1, 3, 12, 12)
    path = tmp_path / "pool.onnx"
    torch.onnx.export(model, (x,), str(path), opset_version=20, dynamo=False)
    assert "AveragePool" in [n.op_type for n in onnx.load(str(path)).graph.node]
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    with torch.no_grad():
        got = b.module(x)
    torch.testing.assert_close(got, model(x), rtol=0, atol=1e-6)
    torch.testing.assert_close(got, torch.as_tensor(b.reference(x)), rtol=0, atol=1e-6)


def test_a_dilated_average_pool_is_named_and_pools_and_log_sums_match_onnxruntime(tmp_path):
    from onnx import helper, numpy_helper

    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], dilations=[2, 2])
    path = _graph(tmp_path, [node], [("x", [1, 2, 6, 6])], opset=19)
    with pytest.raises(ValueError, match=r"cannot convert.*dilations=\[2, 2\]"):
        build_model(ModelConfig(name="onnx", path=str(path)))
    axes = numpy_helper.from_array(torch.tensor([1], dtype=torch.int64).numpy(), "axes")
    for nodes, inits, opset in (
        ([helper.make_node("ReduceLogSum", ["x", "axes"], ["y"])], [axes], 18),
        ([helper.make_node("GlobalMaxPool", ["x"], ["y"])], [], 22),
    ):
        path = _graph(tmp_path, nodes, [("x", [1, 2, 6, 6])], inits, opset=opset)
        b = build_model(ModelConfig(name="onnx", path=str(path)))
        x = torch.rand(1, 2, 6, 6) + 0.1
        with torch.no_grad():
            torch.testing.assert_close(b.module(x), b.reference(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", ["test_Conv2d_groups", "test_ConvTranspose2d", "test_MaxPool2d"])
def test_an_opset_6_graph_converts_through_onnxs_version_converter(case):
    """onnx's own backend tests of PyTorch layers, exported at opset 6 (onnx2torch took none of
    them, and folding such a graph failed): carried to opset 13 and checked against onnxruntime
    on the original graph, each gives its recorded output."""
    folder = _backend_case(case)
    x = _tensor(folder / "test_data_set_0/input_0.pb")
    want = _tensor(folder / "test_data_set_0/output_0.pb")
    b = build_model(ModelConfig(name="onnx", path=str(folder / "model.onnx")))
    with torch.no_grad():
        torch.testing.assert_close(b.module(x), want, rtol=1e-4, atol=1e-5)


def test_an_old_graph_onnxruntime_cannot_check_is_refused_naming_the_converter():
    """onnxruntime has no BatchNormalization-6 kernel, so the carried graph cannot be checked
    against the original: refused, naming onnx's version converter as the way on."""
    folder = _backend_case("test_BatchNorm2d_eval")
    with pytest.raises(ValueError, match=r"does not run the opset-6 graph.*version_converter"):
        build_model(ModelConfig(name="onnx", path=str(folder / "model.onnx")))


def _backend_case(case: str) -> Path:
    import onnx

    folder = Path(onnx.__file__).parent / "backend/test/data/pytorch-converted" / case
    model = onnx.load(str(folder / "model.onnx"))
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 6
    return folder


def _tensor(path: Path) -> torch.Tensor:
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return torch.from_numpy(numpy_helper.to_array(t).copy())
