"""Fake-mode bits pinned before gradients flowed through fake quantization.

``fake_mode_digests()`` runs three models in FAKE mode (a conv-batch_norm-relu6 / LayerNorm /
sigmoid / tanh net, the DETR-style decoder with its box chain at int16, the sin/cos
positional-encoding toy at int16, both with MINMAX scales and small batches to stay quick)
and hashes every captured op's output and the model output.
The golden file was written by the code before training existed; a change that moves any bit
of fake mode changes a digest.

A CPU of another kind (instruction set) compares with its own file where one is written
(``cpu_pins``): float kernels give other last bits there.

Regenerate (only when a change of fake-mode numerics is intended and explained):
    python tests/simulate/pinned_fake_mode.py [--this-cpu]
(``--this-cpu``: this CPU kind's file, ``cpu_pins.kind_path``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

GOLDEN = Path(__file__).with_name("pinned_fake_mode.json")


class SmallNet(nn.Module):
    """Conv -> batch_norm -> relu6 (fused), mean, LayerNorm, sigmoid * tanh, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = F.relu6(self.bn(self.conv(x))).mean((2, 3))
        y = self.norm(y)
        return self.head(torch.sigmoid(y) * torch.tanh(y))


def small_net(seed: int = 0) -> tuple[nn.Module, list, tuple]:
    """The seeded SmallNet (non-trivial BatchNorm statistics), 2 calibration batches, an input."""
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = SmallNet().eval()
    with torch.no_grad():
        m.bn.running_mean.copy_(torch.rand(8, generator=g) * 0.2 - 0.1)
        m.bn.running_var.copy_(torch.rand(8, generator=g) * 1.5 + 0.5)
    calib = [(torch.randn(4, 3, 8, 8, generator=g),) for _ in range(2)]
    return m, calib, (torch.randn(4, 3, 8, 8, generator=g),)


def cases():
    """(name, model, calibration batches, input tuple, QConfigSpec) of each pinned model."""
    from quantlab.models import build_model
    from quantlab.numerics.dtypes import DType
    from quantlab.qconfig import OpQConfig, QConfigSpec

    i16 = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)
    out = []
    m, calib, x = small_net()
    # MSE_POOLED as when the digests were written (then the j6m default): the pins guard the
    # arithmetic, not the choice of default observer
    out.append(("small_net", m, calib, x, QConfigSpec(global_=OpQConfig(observer="MSE_POOLED"))))
    for name, types in (
        ("detr_decoder", ("sigmoid", "inverse_sigmoid", "add")),
        ("posenc", ("mul", "sin", "cos")),
    ):
        b = build_model(name)
        calib = [b.example_inputs(2, 1)]
        spec = QConfigSpec(global_=OpQConfig(observer="MINMAX"), by_type={t: i16 for t in types})
        out.append((name, b.module, calib, b.example_inputs(2, 100), spec))
    return out


def digest(t) -> str:
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.numpy().tobytes() + str(t.dtype).encode()).hexdigest()[:16]


def _pinned_platform(case: str, platform: str):
    """The platform a case's digests were written under. posenc divides its pixel coordinates
    by a buffer; its digests (on every CPU kind) predate FAKE mode's QAT Div (the
    fake-quantized reciprocal, ``fixed_div.div_fake_op``, whose bits
    tests/simulate/test_tensor_div.py checks against torch's fake quant), so its division
    keeps the float rule here. The softmax of posenc and of the DETR decoder's attention:
    their digests predate FAKE mode's QAT softmax (``fixed_softmax.softmax_fake_op``, checked
    against torch's fake quant in tests/simulate/test_fake_softmax.py), so they keep the rule
    whose FAKE softmax is the float softmax fake-quantized (FAKE mode reads it nowhere else)."""
    from quantlab.platforms import SoftmaxRule, TensorDivRule, load_platform

    if case == "small_net":
        return platform
    p = dataclasses.replace(load_platform(platform), softmax_rule=SoftmaxRule.FLOAT_EXP_TABLE)
    if case == "posenc":
        return dataclasses.replace(p, tensor_div_rule=TensorDivRule.FLOAT)
    return p


def fake_mode_digests(platform: str = "j6m", train: bool = False) -> dict:
    """{model: {op or "__output__": digest}} of FAKE runs, with two intra-op threads; with
    ``train``, also "__train_output__": the digest of ``Simulator.train_forward``'s output."""
    from quantlab.simulate import Mode, Simulator

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        res = {}
        for name, m, calib, x, spec in cases():
            sim = Simulator(m, _pinned_platform(name, platform), spec)
            sim.calibrate(calib, progress=False)
            trace = sim.trace(*x, mode=Mode.FAKE)
            d = {n: digest(o) for n, o in trace.outputs.items() if isinstance(o, torch.Tensor)}
            d["__output__"] = digest(trace.result)
            if train:
                y = sim.train_forward(*x)
                assert y.requires_grad
                d["__train_output__"] = digest(y)
            res[name] = d
        return res
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    import sys

    from cpu_pins import kind_path

    path = kind_path(GOLDEN) if "--this-cpu" in sys.argv else GOLDEN
    path.write_text(json.dumps(fake_mode_digests(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")
