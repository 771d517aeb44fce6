"""A steady FAKE run computes an add or multiply and its output fake quant in one pass
(``fake_quant_native.binary``) where the operands allow: the same bits as the full path, which
runs torch's op and then the fake quant, with a broadcast mask, Python numbers and a fused
clamp; ``alpha`` and operands the pass refuses run as before."""

from __future__ import annotations

import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics import fake_quant_native
from quantlab.simulate import Mode, Simulator


class _Attention(nn.Module):
    """Scores scaled by a number, broadcast masks added, a residual sum, a product of two
    activations, a clamp fused into an add, and an add the pass is not offered."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16)

    def forward(self, x, mask, pad):
        q, k = self.q(x), self.k(x)
        scores = q @ k.transpose(-1, -2) * 0.25
        scores = scores + mask  # (1, 1, T) over (B, T, T): over leading dims
        scores = scores + pad  # (B, 1, T): not over leading dims, torch's op
        a = torch.softmax(scores, -1) @ x
        h = torch.add(a, x)
        g = torch.mul(h, q)
        r = torch.relu(g + 0.5)  # the clamp fuses into the add's fake quant
        other = 2.0 * r + torch.add(h, g, alpha=0.5)  # with alpha: torch's op
        return r, other


def _inputs(seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 9, 16, generator=g)
    mask = torch.zeros(1, 1, 9)
    mask[0, 0, 7:] = -100.0
    pad = torch.zeros(2, 1, 9)
    pad[1, 0, 6:] = -100.0
    return x, mask, pad


def test_steady_runs_fuse_adds_and_multiplies_with_the_full_paths_bits(monkeypatch):
    torch.manual_seed(0)
    sim = Simulator(_Attention().eval(), "j6m", steady_programs=False)
    sim.calibrate([_inputs(s) for s in range(3)], progress=False)
    x = _inputs(7)
    full = sim.run(*x, mode=Mode.FAKE)  # the first run goes through the full path
    fused = []
    real = fake_quant_native.binary

    def counted(op, *args, **kw):
        out = real(op, *args, **kw)
        fused.append((op, out is not None))
        return out

    monkeypatch.setattr(fake_quant_native, "binary", counted)
    for _ in range(3):
        for a, b in zip(sim.run(*x, mode=Mode.FAKE), full, strict=True):
            assert_bits_equal(a, b)
    # per run: * 0.25, + mask, + pad (refused: torch's op), torch.add, torch.mul, + 0.5,
    # 2.0 * r and the last + of two tensors; the add with alpha is not offered to the pass
    per_run = [("mul", True), ("add", True), ("add", False), ("add", True), ("mul", True)]
    per_run += [("add", True), ("mul", True), ("add", True)]
    assert fused == per_run * 3
    prog = sim.program(*x, mode=Mode.FAKE)
    for a, b in zip(prog(*x), full, strict=True):
        assert_bits_equal(a, b)
    assert prog.last_prepared == prog.counts["prepared"]


def test_every_input_scale_gives_the_unfused_bits(monkeypatch):
    """Against steady runs with the pass refused (torch's op, then the fake quant), over inputs
    whose sums and products saturate, tie and vanish."""
    torch.manual_seed(1)
    sim = Simulator(_Attention().eval(), "j6m", steady_programs=False)
    sim.calibrate([_inputs(s) for s in range(3)], progress=False)
    for scale in (1e-3, 1.0, 30.0, 1e4):
        x, mask, pad = _inputs(11)
        x = (x * scale, mask, pad)
        sim.run(*x, mode=Mode.FAKE)
        fused = sim.run(*x, mode=Mode.FAKE)
        with monkeypatch.context() as m:
            m.setattr(fake_quant_native, "binary", lambda *a, **k: None)
            plain = sim.run(*x, mode=Mode.FAKE)
        for a, b in zip(fused, plain, strict=True):
            assert_bits_equal(a, b)
