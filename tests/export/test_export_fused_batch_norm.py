"""A BatchNorm fused into the GEMM before it (not folded in the model) exports with the folded
weight and bias fixed mode computes with: onnxruntime gives fixed mode's bits, for a
convolution with and without a bias, a fused ReLU6 after the BatchNorm, a transposed
convolution with groups, a linear layer with BatchNorm1d, and a GEMM feeding the model's
output (its wide integer form)."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from torch import nn

pytest.importorskip("onnxruntime")

from quantlab.export import runtime as R  # noqa: E402
from quantlab.export import to_onnx_qdq  # noqa: E402
from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402


def _bn(c: int, g: torch.Generator, one_d: bool = False) -> nn.Module:
    m = nn.BatchNorm1d(c) if one_d else nn.BatchNorm2d(c)
    with torch.no_grad():
        m.running_mean.copy_(torch.randn(c, generator=g))
        m.running_var.copy_(torch.rand(c, generator=g) * 2 + 0.2)
        m.weight.copy_(torch.randn(c, generator=g))
        m.bias.copy_(torch.randn(c, generator=g))
    return m


class _Nets(nn.Module):
    def __init__(self, g: torch.Generator) -> None:
        super().__init__()
        self.a, self.a_bn = nn.Conv2d(3, 8, 3, padding=1), _bn(8, g)
        self.b, self.b_bn = nn.Conv2d(8, 8, 3, padding=1, bias=False), _bn(8, g)
        self.up, self.up_bn = nn.ConvTranspose2d(8, 4, 2, 2, groups=2), _bn(4, g)
        self.fc, self.fc_bn = nn.Linear(4, 6), _bn(6, g, one_d=True)
        self.out, self.out_bn = nn.Conv2d(4, 2, 1), _bn(2, g)

    def forward(self, x):
        y = torch.relu(self.a_bn(self.a(x)))
        y = nn.functional.relu6(self.b_bn(self.b(y)))
        y = self.up_bn(self.up(y))
        z = self.fc_bn(self.fc(y.mean((2, 3))))
        return self.out_bn(self.out(y)), z


def test_fused_batch_norms_export_with_fixed_modes_bits(tmp_path):
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(0)
    model = _Nets(g).eval()
    sim = Simulator(model, onnxruntime_profile())
    sim.calibrate([(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)], progress=False)
    fused = sim.ops.set_index("name").fused_into
    assert {fused[n] for n in fused.index if n.endswith("batch_norm#0")} == {
        "a:conv2d#0",
        "b:conv2d#0",
        "up:conv_transpose2d#0",
        "fc:linear#0",
        "out:conv2d#0",
    }
    xs = [(torch.randn(2, 3, 8, 8, generator=g) * s,) for s in (0.5, 1.0, 2.0)]
    info = to_onnx_qdq(sim, tmp_path / "bn.onnx", xs[0])
    session = R.session(info.path)
    for x in xs:
        got = R.run(session, info.input_names, x)
        for a, b in zip(got, sim.run(*x, mode=Mode.FIXED), strict=True):
            assert_bits_equal(torch.from_numpy(a), b)
