"""An ONNX Resize whose scales or sizes are constants (``onnx_resize.constant_resize_args``):
the converted graph passes them as Python lists, so torch dynamo traces the model's forward as
one graph and a steady loop switches to a traced program (before, ``Tensor.tolist`` of the
float scales stopped dynamo and such graphs always ran captured). The converted module still
gives onnxruntime's outputs, and the program the captured run's bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import nn

from quantlab.models.onnx_resize import OnnxListResize
from quantlab.models.registry import build_model
from quantlab.models.schema import ModelConfig
from quantlab.simulate import Mode, Simulator

pytest.importorskip("onnxruntime")


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


CASES = {
    "nearest x2 (asymmetric, floor)": lambda t: _export(t, "n", 13, scale_factor=2.0),
    "bilinear x2": lambda t: _export(t, "b", 13, scale_factor=2.0, mode="bilinear"),
    "nearest to a size": lambda t: _export(t, "s", 13, size=(13, 27)),
    "nearest x2, opset 10": lambda t: _export(t, "v10", 10, scale_factor=2.0),
    "nearest, half-pixel, initializer scales": _half_pixel_nearest,
}


@pytest.mark.parametrize("case", list(CASES))
def test_constant_resize_runs_as_a_traced_program(case, tmp_path, monkeypatch):
    b = build_model(ModelConfig(name="onnx", path=CASES[case](tmp_path)))
    resizes = [m for m in b.module.modules() if isinstance(m, OnnxListResize)]
    assert len(resizes) == 1
    assert "Constant" not in b.module.code  # the scales and sizes are literals of the code
    shape = (1, 3, 6, 5) if "half-pixel" in case else (1, 3, 16, 20)
    xs = [torch.randn(shape, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    with torch.no_grad():
        got = b.module(xs[0])
    want = torch.as_tensor(b.reference(xs[0])).reshape(got.shape)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    build_in_first_run(monkeypatch)
    sim = Simulator(b.module, "j6m")
    captured = Simulator(b.module, "j6m", steady_programs=False)
    for s in (sim, captured):
        s.calibrate([(x,) for x in xs], progress=False)
    for mode in (Mode.FIXED, Mode.FAKE):
        for x in xs * 2:
            assert_bits_equal(sim.run(x, mode=mode), captured.run(x, mode=mode))
        status = sim.steady_programs.status((xs[0],), mode)
        assert status.failed is None, status.failed
        assert status.program is not None and status.program_runs > 0
