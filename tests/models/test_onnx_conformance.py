"""ONNX's own node test cases (the graphs, inputs and expected outputs that ship with the onnx
package) through quantlab's ONNX conversion: a case either converts and gives its expected
outputs, or is refused with an error; none converts to other numbers silently, except the few
named below with their reason."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

KNOWN_DIFFERENCES = {
    # torch.topk orders equal values otherwise than ONNX's lower-index-first rule
    "test_top_k_same_values": "tie order",
    "test_top_k_same_values_2d": "tie order",
    "test_top_k_same_values_largest": "tie order",
    # float16 attention written out op by op: each op rounds to float16 in torch's order
    "test_attention_4d_causal_fp16_expanded": "float16 rounding",
}
MIN_CONVERTED = 640  # of the cases with numeric data; 644 convert exactly today


def _numeric(arrays) -> bool:
    return all(isinstance(a, np.ndarray) and a.dtype.kind not in "OUS" for a in arrays)


def _same(got, want: np.ndarray) -> bool:
    g = np.asarray(got.detach().numpy() if isinstance(got, torch.Tensor) else got)
    if g.shape != want.shape:
        if g.size != want.size:
            return False
        g = g.reshape(want.shape)
    if want.dtype.kind == "f" or g.dtype.kind == "f":
        return np.allclose(g.astype(np.float64), want.astype(np.float64), 1e-3, 1e-5, True)
    return np.array_equal(g, want)


def test_no_onnx_node_case_converts_to_other_numbers(tmp_path):
    import onnx
    from onnx.backend.test.case.node import collect_testcases

    from quantlab.models.onnx_import import load_onnx

    converted, differing = 0, []
    path = tmp_path / "case.onnx"
    for case in collect_testcases(None):
        if not case.data_sets or not all(map(_numeric, case.data_sets[0])):
            continue
        inputs, outputs = case.data_sets[0]
        onnx.save(case.model, path)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = load_onnx(path).module
                with torch.no_grad():
                    got = module(*[torch.from_numpy(np.array(a)) for a in inputs])
        except Exception:  # refused or failing by name: not a silent difference
            continue
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        if len(got) == len(outputs) and all(map(_same, got, outputs)):
            converted += 1
        else:
            differing.append(case.name)
    assert sorted(set(differing) - KNOWN_DIFFERENCES.keys()) == []
    assert converted >= MIN_CONVERTED


def test_a_nearest_resize_torch_cannot_express_selects_onnxs_pixels(tmp_path):
    """A half-pixel nearest downscale (ONNX's default coordinates): F.interpolate took other
    pixels; it is an index_select per axis, simulated as the pass-through selection it is,
    while an integer upscale in the same mode stays F.interpolate (the same pixels)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from quantlab.models.onnx_import import load_onnx
    from quantlab.simulate import Mode, Simulator

    x = torch.randn(1, 2, 5, 5, generator=torch.Generator().manual_seed(0))
    kinds = {}
    for scale in (0.6, 2.0):
        scales = numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "s")
        graph = helper.make_graph(
            [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest")], "r",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [scales],
        )  # fmt: skip
        path = tmp_path / "resize.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
        converted = load_onnx(path)
        with torch.no_grad():
            got = converted.module(x)
        torch.testing.assert_close(got, converted.reference(x), rtol=0, atol=0)
        sim = Simulator(converted.module, "j6m")
        sim.calibrate([(x,)], progress=False)
        assert sim.run(x, mode=Mode.FIXED).shape == got.shape
        kinds[scale] = set(sim.ops.op_type)
    assert "index_select" in kinds[0.6] and "interpolate" in kinds[2.0]


_NORM_POOL_NODES = [  # op, input shape, int64 constants, attributes, an op captured
    ("LpNormalization", [1, 4, 6], {}, {"axis": 1}, "sqrt"),
    ("LpPool", [1, 4, 6, 6], {}, {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]},
     "lp_pool2d"),
    ("MeanVarianceNormalization", [1, 4, 6, 6], {}, {}, "mean"),
    ("Hardmax", [1, 4, 6], {}, {}, "movedim"),
    ("Col2Im", [1, 8, 25], {"image": [6, 6], "block": [2, 2]}, {}, "fold"),
]  # fmt: skip


@pytest.mark.parametrize("op, shape, inits, attrs, captured", _NORM_POOL_NODES)
def test_the_added_normalizations_and_pools_run_in_fixed_point(
    tmp_path, op, shape, inits, attrs, captured
):
    """LpNormalization, LpPool, MeanVarianceNormalization, Hardmax and Col2Im convert to torch
    calls quantlab captures (the 2-norm's parts and a division, lp_pool2d, means and a
    division, argmax's one-hot, fold) and simulates."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from quantlab.models.onnx_import import load_onnx
    from quantlab.simulate import Mode, Simulator

    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in inits.items()]
    graph = helper.make_graph(
        [helper.make_node(op, ["x", *inits], ["y"], **attrs)], op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts,
    )  # fmt: skip
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    converted = load_onnx(path)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = converted.module(x)
    torch.testing.assert_close(got, torch.as_tensor(converted.reference(x)), rtol=0, atol=1e-5)
    sim = Simulator(converted.module, "j6m")
    sim.calibrate([(x,)], progress=False)
    assert sim.run(x, mode=Mode.FIXED).shape == got.shape
    assert captured in set(sim.ops.op_type)
