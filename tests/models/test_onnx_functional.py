"""ONNX GridSample, Gelu, Mish and SpaceToDepth converted to the torch calls they are
(``quantlab.models.onnx_functional``): the converted module gives onnxruntime's outputs to
rounding, and a converted GridSample is simulated by quantlab's grid_sample kernel."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantlab.models.registry import build_model
from quantlab.models.schema import ModelConfig

pytest.importorskip("onnxruntime")


class _Warp(nn.Module):
    def __init__(self, mode: str, padding: str, align: bool) -> None:
        super().__init__()
        self.mode, self.padding, self.align = mode, padding, align
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, grid):
        y = self.conv(x)
        return F.grid_sample(y, grid, self.mode, self.padding, align_corners=self.align)


def _same_as_onnxruntime(b, *args, atol=1e-5) -> None:
    with torch.no_grad():
        got = b.module(*args)
    want = b.reference(*args)
    torch.testing.assert_close(got, torch.as_tensor(want).reshape(got.shape), rtol=0, atol=atol)


def test_grid_sample_in_every_mode_matches_onnxruntime(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 9, 11, generator=g)
    grid = torch.rand(1, 5, 7, 2, generator=g) * 2.4 - 1.2  # some points outside
    combos = itertools.product(
        ["bilinear", "nearest", "bicubic"], ["zeros", "border", "reflection"], [False, True]
    )
    for mode, padding, align in combos:
        path = tmp_path / f"warp_{mode}_{padding}_{int(align)}.onnx"
        model = _Warp(mode, padding, align).eval()
        torch.onnx.export(model, (x, grid), str(path), opset_version=16, dynamo=False)
        b = build_model(ModelConfig(name="onnx", path=str(path)))
        _same_as_onnxruntime(b, x, grid, atol=1e-4 if mode == "bicubic" else 1e-5)


def test_a_converted_grid_sample_runs_on_quantlabs_kernel(tmp_path):
    from quantlab.simulate import Mode, Simulator

    g = torch.Generator().manual_seed(1)
    x, grid = torch.randn(1, 3, 9, 11, generator=g), torch.rand(1, 5, 7, 2, generator=g) * 2 - 1
    path = tmp_path / "warp.onnx"
    torch.onnx.export(_Warp("bilinear", "zeros", False).eval(), (x, grid), str(path),
                      opset_version=16, dynamo=False)  # fmt: skip
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    sim = Simulator(b.module, "j6m")
    sim.calibrate([(x, grid)], progress=False)
    sim.run(x, grid, mode=Mode.FIXED)
    row = sim.ops[sim.ops.op_type == "grid_sample"].iloc[0]
    assert row.supported and row.fixed_kernel == "integer"


class _Gelus(nn.Module):
    def forward(self, x):
        return F.gelu(x), F.gelu(x, approximate="tanh")


def _one_node(tmp_path, op: str, shape: list[int], out: list[int] | None, opset: int, **attrs):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
    )  # fmt: skip
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return build_model(ModelConfig(name="onnx", path=str(path)))


def test_gelu_and_mish_nodes_match_onnxruntime(tmp_path):
    import onnx

    x = torch.linspace(-6, 6, 120).reshape(1, 2, 60)
    path = tmp_path / "gelu.onnx"
    torch.onnx.export(_Gelus().eval(), (x,), str(path), opset_version=20, dynamo=False)
    assert [n.op_type for n in onnx.load(str(path)).graph.node] == ["Gelu", "Gelu"]
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    with torch.no_grad():
        got = b.module(x)
    for g, w in zip(got, b.reference(x), strict=True):
        torch.testing.assert_close(g, torch.as_tensor(w), rtol=0, atol=1e-6)
    _same_as_onnxruntime(_one_node(tmp_path, "Mish", [1, 2, 60], [1, 2, 60], 18), x, atol=1e-6)


def test_space_to_depth_orders_channels_as_onnx_does(tmp_path):
    b = _one_node(tmp_path, "SpaceToDepth", [1, 3, 4, 6], [1, 12, 2, 3], 13, blocksize=2)
    x = torch.arange(72, dtype=torch.float32).reshape(1, 3, 4, 6)
    _same_as_onnxruntime(b, x, atol=0)


@pytest.mark.parametrize("opset, per", [(18, 2), (21, 6)], ids=["per_group", "per_channel"])
def test_group_normalization_matches_onnxruntime(tmp_path, opset, per):
    """Opset 18 scales and shifts per group, 21 per channel; 6 channels in 2 groups."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = torch.Generator().manual_seed(2)
    scale, bias = torch.rand(per, generator=g) + 0.5, torch.randn(per, generator=g)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)
    graph = helper.make_graph(
        [node], "gn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4, 5])],
        [numpy_helper.from_array(scale.numpy(), "s"), numpy_helper.from_array(bias.numpy(), "b")],
    )  # fmt: skip
    path = tmp_path / "gn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    x = torch.randn(1, 6, 4, 5, generator=g) * 3 + 1
    _same_as_onnxruntime(b, x, atol=1e-5)
    from quantlab.simulate import Mode, Simulator

    sim = Simulator(b.module, "j6m")
    sim.calibrate([(x,)], progress=False)
    sim.run(x, mode=Mode.FIXED)
    assert "group_norm" in set(sim.ops.op_type)


@pytest.mark.parametrize("opset", [7, 9])
def test_upsample_matches_onnxruntime_in_both_modes(tmp_path, opset):
    """Upsample of old exports (YOLOv3-era graphs): scales as an attribute (7) or an input (9);
    nearest exactly, linear (asymmetric coordinates, the last pixel repeated) to float rounding
    and simulated as a replicate pad and an align_corners resize; a linear scale that is not an
    integer is refused naming it (the graph carried to opset 13 computes something else)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from quantlab.simulate import Mode, Simulator

    def upsample(mode: str, scales=(1.0, 1.0, 2.0, 3.0)):
        scales = list(scales)
        out = [1, 2, int(3 * scales[2]), int(4 * scales[3])]
        if opset == 7:
            node, inits = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales), []
        else:
            node = helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)
            inits = [numpy_helper.from_array(torch.tensor(scales).numpy(), "s")]
        graph = helper.make_graph(
            [node], "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits,
        )  # fmt: skip
        path = tmp_path / f"up_{mode}_{scales[2]}.onnx"
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        onnx.save(model, path)
        return ModelConfig(name="onnx", path=str(path))

    x = torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(3))
    _same_as_onnxruntime(build_model(upsample("nearest")), x, atol=0)
    linear = build_model(upsample("linear"))
    _same_as_onnxruntime(linear, x, atol=1e-6)
    sim = Simulator(linear.module, "j6m")
    sim.calibrate([(x,)], progress=False)
    assert sim.run(x, mode=Mode.FIXED).shape == (1, 2, 6, 12)
    assert {"pad", "interpolate"} <= set(sim.ops.op_type)
    # ONNX's version converter makes it a Resize of other coordinates: refused, not taken
    refused = r"Upsample node with mode=linear and scales=.*1\.5.*computes otherwise than onnxrun"
    with pytest.raises(ValueError, match=refused):
        build_model(upsample("linear", (1.0, 1.0, 1.5, 2.0)))


def _pad_node(tmp_path, shape: list[int], pads: list[int], mode: str, opset: int, value=None):
    """A one-node ONNX Pad with its pads (and fill value) as initializers."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(pads, dtype=np.int64), "pads")]
    names = ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, dtype=np.float32), "value"))
        names.append("value")
    node = helper.make_node("Pad", names, ["y"], mode=mode)
    graph = helper.make_graph(
        [node], "pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    path = tmp_path / f"pad_{mode}_{len(shape)}_{abs(hash(tuple(pads)))}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return ModelConfig(name="onnx", path=str(path))


@pytest.mark.parametrize(
    "shape, pads, mode, opset, value",
    [
        ([1, 10], [0, 3, 0, 2], "reflect", 13, None),  # a 2-d signal framed for an STFT
        ([1, 2, 6], [0, 0, 1, 0, 0, 2], "edge", 13, None),
        ([1, 2, 4, 5], [0, 0, 1, 2, 0, 0, 2, 1], "reflect", 11, None),
        ([1, 2, 4, 5], [0, 0, 0, 1, 0, 0, 0, 2], "edge", 13, None),  # the last axis alone
        ([1, 2, 4, 5], [0, 1, 0, 0, 0, 0, 2, 0], "constant", 13, 1.5),  # channels too
        ([1, 2, 6], [0, 0, 2, 0, 0, 1], "wrap", 19, None),
    ],
    ids=["reflect_2d", "edge_3d", "reflect_4d", "edge_last_axis", "constant_value", "wrap_19"],
)
def test_pad_in_every_mode_and_rank_matches_onnxruntime(tmp_path, shape, pads, mode, opset, value):
    """onnx2torch padded in reflect / edge mode only inputs of 3 to 5 axes whose first two are
    not padded: a 2-d signal's reflect pad (silero-vad's STFT framing) failed at its first
    call. Each mode and rank pads exactly as onnxruntime does, and the 2-d one is simulated."""
    from quantlab.simulate import Mode, Simulator

    b = build_model(_pad_node(tmp_path, shape, pads, mode, opset, value))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
    _same_as_onnxruntime(b, x, atol=0)
    if len(shape) == 2:
        sim = Simulator(b.module, "j6m")
        sim.calibrate([(x,)], progress=False)
        assert sim.run(x, mode=Mode.FIXED).shape == (1, 15) and "pad" in set(sim.ops.op_type)


def test_a_reflect_pad_torch_cannot_make_is_named(tmp_path):
    """Reflect padding of both axes of a 2-d input (torch pads only the last axis of 2 axes):
    refused naming the op and its mode, not a failure inside torch."""
    with pytest.raises(ValueError, match="Pad in reflect mode of 2 innermost axes of a rank-2"):
        build_model(_pad_node(tmp_path, [1, 10], [1, 3, 1, 2], "reflect", 13))


def _same_padded(tmp_path, width: int | str, opset: int = 13):
    """Conv (SAME_UPPER, 2x2, stride 1), MaxPool (SAME_UPPER, 2x2, stride 1: one pixel at the
    end only) and Conv (SAME_LOWER, 3x3, stride 2) on a (1, 2, 8, ``width``) input, as Paddle
    exports PP-OCRv6's recognizer; ``width`` a name leaves it dynamic."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = np.random.default_rng(5)
    w1 = numpy_helper.from_array(g.standard_normal((3, 2, 2, 2)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(g.standard_normal((4, 3, 3, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], auto_pad="SAME_UPPER", kernel_shape=[2, 2]),
        helper.make_node("MaxPool", ["a"], ["b"], auto_pad="SAME_UPPER", kernel_shape=[2, 2]),
        helper.make_node("Conv", ["b", "w2"], ["y"], auto_pad="SAME_LOWER", strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes, "same", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, w2],
    )  # fmt: skip
    path = tmp_path / f"same_{width}_{opset}.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


@pytest.mark.parametrize("opset", [9, 13])  # the edge Pad's pads an attribute (9) or an input
def test_same_auto_padding_converts_and_matches_onnxruntime(tmp_path, opset):
    """onnx2torch refuses auto_pad SAME_UPPER / SAME_LOWER; their pads are written out (from
    the inferred input size where the stride is not 1) and the uneven max-pool pad is an edge
    pad, so no -inf reaches calibration; static and dynamic widths (7: an odd width the
    stride-2 conv pads at its start) match onnxruntime."""
    from quantlab.simulate import Mode, Simulator

    x = torch.randn(1, 2, 8, 7, generator=torch.Generator().manual_seed(6))
    for width, shape in ((7, None), ("W", [2, 8, 7])):
        b = build_model(
            ModelConfig(name="onnx", path=_same_padded(tmp_path, width, opset), input_shape=shape)
        )
        _same_as_onnxruntime(b, x, atol=1e-5)
    sim = Simulator(b.module, "j6m")
    sim.calibrate([(x,)], progress=False)
    assert sim.non_finite_points() == {}
    assert sim.run(x, mode=Mode.FIXED).shape == (1, 4, 4, 4)
    assert {"pad", "max_pool2d", "conv2d"} <= set(sim.ops.op_type)


class _Clamped(nn.Module):
    """A TF-style floor (the maximum with a constant) and the minimum of two branches: torch
    exports them as ONNX Max and Min."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.other = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1)
        self.floor = nn.Parameter(torch.full((1, 1, 1, 1), -0.4), requires_grad=False)

    def forward(self, x):
        y = torch.maximum(F.leaky_relu(self.stem(x), 0.2), self.floor)
        return torch.minimum(y, self.other(x))


def test_max_and_min_of_an_export_are_simulated_as_the_model_itself(tmp_path):
    """onnx2torch made Max / Min a broadcast copy of each input (run in float, not modelled),
    a stack and its reduction: the export's codes differed from the model's in both modes."""
    import onnx

    from quantlab.simulate import Mode, Simulator

    torch.manual_seed(0)
    model = _Clamped().eval()
    x = torch.randn(5, 3, 12, 12) * 2
    path = tmp_path / "clamped.onnx"
    torch.onnx.export(model, (x[:1],), str(path), opset_version=17, dynamo=False)
    assert [n.op_type for n in onnx.load(str(path)).graph.node][-3:] == ["Max", "Conv", "Min"]
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    runs = {}
    for name, module in (("torch", model), ("onnx", b.module)):
        sim = Simulator(module, "j6m")
        sim.calibrate([(x[i : i + 1],) for i in range(4)], progress=False)
        ops = list(zip(sim.ops.op_type, sim.ops.fixed_kernel))
        runs[name] = ops, [sim.run(x[4:], mode=m) for m in (Mode.FAKE, Mode.FIXED)]
    (want_ops, want), (got_ops, got) = runs["torch"], runs["onnx"]
    assert got_ops == want_ops and ("maximum", "integer") in got_ops
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("inputs", [["x"], ["x", "y"], ["x", "y", "c"]], ids=["1", "2", "3"])
def test_variadic_nodes_broadcast_and_match_onnxruntime(tmp_path, op, inputs):
    """Max / Min / Sum / Mean of one to three inputs of broadcast shapes (a constant among
    them) give onnxruntime's values: exactly for Max and Min, to rounding for the sums."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = numpy_helper.from_array(torch.linspace(-1, 1, 4).numpy(), "c")
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["z"])], op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [c],
    )  # fmt: skip
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(1, 3, 4, generator=gen), torch.randn(1, 1, 4, generator=gen)
    exact = op in ("Max", "Min")
    _same_as_onnxruntime(b, x, y, atol=0 if exact else 1e-6)


class _OneSidedClamps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return y.clamp(min=0.1) * 2, y.clamp(max=0.5), F.relu6(y)  # Clip(0, 6): relu6


def test_a_one_sided_clip_converts_and_is_simulated_as_the_models_clamp(tmp_path):
    """``x.clamp(min=0.1)`` exports as Clip(x, min, ''): onnx2torch took the empty name for a
    computed bound and refused every model with a one-sided clamp."""
    import onnx

    torch.manual_seed(0)
    model, x = _OneSidedClamps().eval(), torch.randn(3, 3, 8, 8)
    path = tmp_path / "clamps.onnx"
    torch.onnx.export(model, (x[:1],), str(path), opset_version=17, dynamo=False)
    clips = [list(n.input) for n in onnx.load(str(path)).graph.node if n.op_type == "Clip"]
    assert clips[0][2] == "" and clips[1][1] == ""
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    with torch.no_grad():
        got = b.module(x[:1])
    for g, w, r in zip(got, model(x[:1]), b.reference(x[:1]), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
        torch.testing.assert_close(g, torch.as_tensor(r), rtol=0, atol=1e-6)
    runs = _fixed_runs({"torch": model, "onnx": b.module}, [(x[:2],)], x[2:])
    assert runs["onnx"][0] == runs["torch"][0] and runs["onnx"][0].count("clamp") == 2
    for w, g in zip(runs["torch"][1], runs["onnx"][1], strict=True):
        assert torch.equal(w, g)


class _ComputedFloor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return y.clamp(min=y.mean())


def test_a_clip_by_a_computed_bound_is_the_models_clamp_by_a_tensor(tmp_path):
    """``x.clamp(min=y.mean())`` exports as a Clip whose bound a node computes: onnx2torch
    refused it; it is the same clamp, with the same codes in fixed mode."""

    torch.manual_seed(0)
    model, x = _ComputedFloor().eval(), torch.randn(3, 3, 8, 8)
    path = tmp_path / "floor.onnx"
    torch.onnx.export(model, (x[:1],), str(path), opset_version=17, dynamo=False)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    _same_as_onnxruntime(b, x[:1], atol=1e-6)
    runs = _fixed_runs({"torch": model, "onnx": b.module}, [(x[:1],), (x[1:2],)], x[2:])
    computing = [t for t in runs["onnx"][0] if t != "to"]  # the export casts the bound to float
    assert computing == runs["torch"][0] and "clamp" in computing
    assert torch.equal(runs["onnx"][1], runs["torch"][1])


def _fixed_runs(modules: dict, calib: list, x) -> dict:
    """Per named module: its captured op types and its FIXED run on ``x`` after calibrating
    on ``calib`` (j6m)."""
    from quantlab.simulate import Mode, Simulator

    runs = {}
    for name, module in modules.items():
        sim = Simulator(module, "j6m")
        sim.calibrate(calib, progress=False)
        runs[name] = list(sim.ops.op_type), sim.run(x, mode=Mode.FIXED)
    return runs


@pytest.mark.parametrize(
    "kernel, stride, size, count_pads, converts",
    [
        (3, 2, 8, 0, True),  # TensorFlow's SAME on an even size: torch's ceil mode
        (2, 2, 7, 0, True),
        (3, 2, 8, 1, True),  # the pads counted: a zero Pad before the pool
        (2, 1, 7, 0, False),  # no torch pooling makes ONNX's last window: refused
    ],
)
def test_an_average_pool_with_uneven_pads_pools_as_onnxruntime(
    tmp_path, kernel, stride, size, count_pads, converts
):
    """onnx2torch refused every AveragePool whose pads differ at the two ends (tf2onnx writes
    TensorFlow's SAME so); converted where torch can make ONNX's windows and divisors."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node(
        "AveragePool", ["x"], ["y"], kernel_shape=[kernel, kernel], strides=[stride, stride],
        pads=[0, 0, 1, 1], count_include_pad=count_pads,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    path = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    config = ModelConfig(name="onnx", path=str(path))
    if not converts:
        with pytest.raises(ValueError, match="non symmetrical padding"):
            build_model(config)
        return
    x = torch.rand(1, 2, size, size, generator=torch.Generator().manual_seed(0)) + 0.5
    _same_as_onnxruntime(build_model(config), x, atol=1e-6)
