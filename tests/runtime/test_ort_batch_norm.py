"""``numerics.ort_batch_norm`` gives onnxruntime's BatchNormalization float32 bits (torch's
``F.batch_norm`` rounds otherwise), and an unfolded batch norm exported as ONNX QDQ runs with
the onnxruntime profile's fixed-mode bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from ort_encodings import require_modelled  # noqa: E402

from quantlab.export import ActivationEncoding, to_onnx_qdq  # noqa: E402
from quantlab.export import runtime as R  # noqa: E402
from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402
from quantlab.numerics.ort_batch_norm import ort_batch_norm  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402


def _onnxruntime_batch_norm(x, scale, bias, mean, var, eps):
    inits = [
        numpy_helper.from_array(a, n)
        for a, n in ((scale, "s"), (bias, "b"), (mean, "m"), (var, "v"))
    ]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=eps)
    graph = helper.make_graph(
        [node],
        "bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_batch_norm_float32_steps_are_onnxruntimes():
    rng = np.random.default_rng(0)
    torch_differs = 0
    for trial in range(12):
        c = 16
        x = rng.integers(-128, 128, (2, c, 9, 7)).astype(np.float32) * np.float32(0.037)
        scale, bias = rng.uniform(0.5, 2, c), rng.uniform(-1, 1, c)
        mean, var = rng.uniform(-1, 1, c), rng.uniform(0.2, 3, c)
        scale, bias, mean, var = (a.astype(np.float32) for a in (scale, bias, mean, var))
        eps = (1e-5, 1e-3, 0.1)[trial % 3]
        want = _onnxruntime_batch_norm(x, scale, bias, mean, var, eps)
        t = [torch.from_numpy(a) for a in (x, mean, var, scale, bias)]
        got = ort_batch_norm(t[0], t[1], t[2], t[3], t[4], eps).numpy()
        assert np.array_equal(got, want)
        plain = F.batch_norm(t[0], t[1], t[2], t[3], t[4], False, 0.0, eps).numpy()
        torch_differs += int((plain != want).sum())
        no_affine = _onnxruntime_batch_norm(x, np.ones(c, np.float32), np.zeros(c, np.float32),
                                            mean, var, eps)  # fmt: skip
        assert np.array_equal(ort_batch_norm(t[0], t[1], t[2], None, None, eps).numpy(), no_affine)
    assert torch_differs > 1000  # the emulation is needed: torch rounds otherwise


class _Unfolded(nn.Module):
    """Batch norms after an add and after a mean (no GEMM to fold them into)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1)
        self.bn, self.bn1 = nn.BatchNorm2d(8), nn.BatchNorm1d(8, affine=False)
        with torch.no_grad():
            for bn in (self.bn, self.bn1):
                bn.running_mean.uniform_(-1, 1)
                bn.running_var.uniform_(0.3, 3.0)
            self.bn.weight.uniform_(0.5, 2.0)
            self.bn.bias.uniform_(-1.0, 1.0)

    def forward(self, x):
        y = self.bn(self.a(x) + self.b(x))
        return torch.tanh(y), self.bn1(y.mean((2, 3))) * 1.0


@pytest.mark.parametrize("encoding", list(ActivationEncoding))
def test_unfolded_batch_norm_exports_with_fixed_modes_bits(tmp_path, encoding):
    require_modelled(encoding)
    torch.manual_seed(0)
    sim = Simulator(_Unfolded().eval(), onnxruntime_profile())
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 32, 32, generator=g),) for _ in range(2)], progress=False)
    kernels = sim.ops.set_index("op_type").loc["batch_norm", "fixed_kernel"]
    assert (kernels.str.startswith("float between dequantize and quantize")).all()
    info = to_onnx_qdq(sim, tmp_path / "bn.onnx", (torch.zeros(2, 3, 32, 32),), encoding=encoding)
    sess = R.session(info.path)
    for s in (0.5, 1.0, 3.0):
        x = torch.randn(2, 3, 32, 32, generator=g) * s
        got = R.run(sess, info.input_names, (x,))
        for a, b in zip(got, sim.run(x, mode=Mode.FIXED), strict=True):
            assert np.array_equal(a, b.numpy())
