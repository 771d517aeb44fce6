"""A replayed run must give the naive run's bits: it stops before the studied op, or before the
GEMM a studied activation is fused into; each replayed op is booked as the recorded run booked
it (kept in float or not), and hands the model a new tensor whose record is copied in only when
a call reads it (``RunState.pending``), whatever reads it; the trace never changes. A trace
keeps each output as its op returned it, whatever later writes into that memory (through views,
by calls that are not modelled ops), and a replay keeps the model's aliases (views, an op that
returns its input)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal, leaves
from torch import nn

from quantlab.simulate import Mode, OpMode, Simulator


class InplaceChain(nn.Module):
    """conv -> in-place ReLU6 -> conv -> in-place ReLU6 -> residual add -> in-place scaling ->
    conv: the pattern the deferral is for (MobileNetV2's blocks)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        a = F.relu6(self.c1(x), inplace=True)
        b = F.relu6(self.c2(a), inplace=True)
        h = a + b
        h.mul_(0.5)  # an in-place op of its own (studied, it reads what the add left)
        return self.c3(h)


class Readers(nn.Module):
    """Replayed outputs read next by ops that are not modelled or not captured by name: a
    comparison steering Python control flow, ``.item()``, ``__setitem__``, a view, a reduction
    kept in a module attribute, and a replayed output returned as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 6, 1)
        self.fc = nn.Linear(6, 5)
        self.kept = None

    def forward(self, x):
        a = self.c1(x)
        if bool((a > 0).any()):  # a comparison: not a modelled op, its result drives Python
            a = a * 1.5
        s = self.c2(a)
        scale = float(s.abs().amax().item())  # .item() of a replayed reduction
        t = self.c2(s)
        t[:, 0] = 0.0  # __setitem__ on a replayed output
        self.kept = t.mean()
        u = t.view(t.shape[0], t.shape[1], -1).mean(-1)
        return self.fc(u) / scale, a


class AttentionTail(nn.Module):
    """Attention's last steps with an eval-mode dropout between the softmax and the matmul: the
    dropout returns its input, which a naive run does not book as an op kept in float, so the
    matmul quantizes it; a replay must book it the same way."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.v = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        scores = torch.softmax(self.q(x) @ x.transpose(-1, -2), dim=-1)
        return self.drop(scores) @ self.v(x)


class Writes(nn.Module):
    """Writes into an op's output after the op returned: through views (an in-place add and an
    in-place multiply on slices), and by a call that is not a modelled op (``index_add_``),
    with a view taken before the writes and read after them (it sees them, as an alias)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 4, 1)
        self.c3 = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        t = self.c1(x)
        v = t[:, 3:]
        t[:, :2] += 1.0
        t[:, 2:4].mul_(2.0)
        t.index_add_(1, torch.tensor([3, 4]), torch.ones_like(t[:, :2]))
        return self.c2(t), self.c3(v)


class FusedChain(nn.Module):
    """Out-of-place activations fused into their convolutions: in FAKE and FIXED runs such an
    activation returns its input, the GEMM's output, itself (and a view follows)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        a = F.relu6(self.c1(x))
        b = F.relu(self.c2(a))
        h = (a + b).flatten(2).mean(-1)
        return self.fc(h)


class Chunks(nn.Module):
    """Writes through the views of a tuple (``chunk``: an in-place multiply and an in-place
    ReLU on its parts), item assignment into a contiguous copy, and an in-place clamp."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.c2 = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        t = self.c1(x)
        a, b = t.chunk(2, dim=1)
        a.mul_(0.5)
        F.relu(b, inplace=True)
        u = t.permute(0, 2, 3, 1).contiguous()
        u[..., 0] = u[..., 1] * 2
        s = torch.sigmoid(t)
        s.clamp_(0.1, 0.9)
        return self.c2(t) + self.c2(s), u.sum(-1), a


class Cache(nn.Module):
    """A cache filled by item assignment from an op's output, then read by matmuls, and an
    in-place ``masked_fill_`` on the scores."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)

    def forward(self, x):
        cache = torch.zeros(x.shape[0], 6, 8)
        k = self.k(x)
        cache[:, :5] = k
        cache[:, 5] = k.mean(1)
        att = self.q(x) @ cache.transpose(1, 2)
        att.masked_fill_(att > 1.0, 1.0)
        return torch.softmax(att, -1) @ cache


class Interleaved(nn.Module):
    """A convolution's fused chain (batch_norm, in-place ReLU6) reached only after other ops: a
    replay that stops between them replays the convolution, whose record is the chain's output,
    and must pass the chain's ops through as the naive run does."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.c2 = nn.Conv2d(3, 6, 1)
        self.c3 = nn.Conv2d(6, 4, 1)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        a = self.c1(x)
        b = torch.sigmoid(self.c2(x))
        a = F.relu6(self.bn(a), inplace=True)
        return self.c3(a * b)


class Accumulates(nn.Module):
    """Model state changed in place on every run (a running sum kept in a plain attribute, not
    a buffer: a run restores buffers): a trace keeps the value its run left, whatever later runs
    do."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 1)
        self.acc = torch.zeros(1, 4, 1, 1)

    def forward(self, x):
        y = self.c1(x)
        self.acc.add_(y.mean((0, 2, 3), keepdim=True))
        return y * self.acc


def _sim(model: nn.Module, shape, seed: int = 0) -> tuple[Simulator, torch.Tensor]:
    torch.manual_seed(seed)
    model = model.eval()
    g = torch.Generator().manual_seed(seed)
    calib = [(torch.randn(shape, generator=g),) for _ in range(2)]
    sim = Simulator(model, "j6m")
    sim.calibrate(calib, progress=False)
    return sim, torch.randn(shape, generator=g)


def _snapshot(trace) -> dict:
    return {k: v.clone() for k, v in trace.outputs.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize(
    "model,shape",
    [
        (InplaceChain, (2, 3, 8, 8)),
        (Readers, (2, 3, 6, 6)),
        (AttentionTail, (2, 5, 8)),
        (Writes, (2, 3, 6, 6)),
        (FusedChain, (2, 3, 6, 6)),
        (Chunks, (2, 3, 6, 6)),
        (Cache, (2, 5, 8)),
        (Interleaved, (2, 3, 6, 6)),
    ],
    ids=["chain", "readers", "attention", "writes", "fused", "chunks", "cache", "interleaved"],
)
@pytest.mark.parametrize("mode", [Mode.FLOAT, Mode.FAKE, Mode.FIXED])
def test_every_studied_op_replays_to_the_naive_bits_and_the_trace_stays(model, shape, mode):
    sim, x = _sim(model(), shape)
    sim.run(x, mode=Mode.FAKE)
    trace = sim.trace(x, mode=mode)
    before = _snapshot(trace)
    names = list(sim.ops["name"])  # fused activations too: the replay stops at their GEMM
    assert len(names) >= 4
    compared = 0
    for name in names:
        for om in (OpMode(Mode.FAKE), OpMode(Mode.FIXED), OpMode(Mode.FLOAT)):
            try:  # an op fused into its GEMM has no output point of its own to quantize
                naive = sim.run(x, mode=mode, op_modes={name: om})
            except ValueError as err:
                with pytest.raises(ValueError, match=str(err)[:40]):
                    sim.run(x, mode=mode, op_modes={name: om}, replay=trace)
                continue
            fast = sim.run(x, mode=mode, op_modes={name: om}, replay=trace)
            for a, b in zip(leaves(fast), leaves(naive), strict=True):
                assert_bits_equal(a, b)
            compared += 1
    assert compared >= 2 * len(names)
    after = _snapshot(trace)
    assert before.keys() == after.keys()
    for k in before:
        assert_bits_equal(after[k], before[k])


def test_the_model_state_and_output_hold_the_replayed_values():
    """A replay with no studied op replays every op: the outputs it returns and the tensor the
    model kept take their recorded values by the end of the run."""
    sim, x = _sim(Readers(), (2, 3, 6, 6))
    trace = sim.trace(x, mode=Mode.FLOAT)
    kept = sim.model.kept.clone()
    out = sim.run(x, mode=Mode.FLOAT, replay=trace)  # no studied op: every op replayed
    for a, b in zip(leaves(out), leaves(trace.result), strict=True):
        assert_bits_equal(a, b)
    assert_bits_equal(sim.model.kept, kept)


def test_replayed_outputs_only_replayed_ops_take_are_never_copied(monkeypatch):
    """Studying the chain's last convolution, every op before it is replayed: the convolutions'
    and ReLU6s' records are never copied (only replayed ops take them, and each ReLU6 overwrites
    its convolution's output), and the one copy is the in-place scaling's record, which the
    studied convolution reads."""
    sim, x = _sim(InplaceChain(), (2, 3, 8, 8))
    trace = sim.trace(x, mode=Mode.FLOAT)
    copied = []
    real_copy = torch.Tensor.copy_

    def spy(self, src, *a, **k):
        copied.append(src)
        return real_copy(self, src, *a, **k)

    names = list(sim.ops["name"])
    last = names[-1]
    naive = sim.run(x, mode=Mode.FLOAT, op_modes={last: OpMode(Mode.FAKE)})
    monkeypatch.setattr(torch.Tensor, "copy_", spy)
    fast = sim.run(x, mode=Mode.FLOAT, op_modes={last: OpMode(Mode.FAKE)}, replay=trace)
    monkeypatch.undo()
    assert_bits_equal(fast, naive)
    records = {n: trace.outputs[n] for n in names[:-1]}
    hit = [n for n, r in records.items() if any(c is r for c in copied)]
    assert hit == [names[-2]] and names[-2].endswith(":mul#0"), (hit, names)


def test_a_trace_keeps_each_output_as_its_op_returned_it():
    """Writes after an op returned (through a view, by a call that is not a modelled op) leave
    its record as the op returned it."""
    sim, x = _sim(Writes(), (2, 3, 6, 6))
    trace = sim.trace(x, mode=Mode.FLOAT)
    c1 = sim.model.c1
    assert_bits_equal(trace.outputs["c1:conv2d#0"], c1(x))  # before the writes
    assert trace.aliases[":getitem#0"] is None  # v: a torch view of the convolution's output
    assert_bits_equal(trace.outputs[":getitem#0"], c1(x)[:, 3:])


def test_a_trace_of_model_state_is_not_changed_by_later_runs():
    sim, x = _sim(Accumulates(), (2, 3, 4, 4))
    trace = sim.trace(x, mode=Mode.FLOAT)
    before = _snapshot(trace)
    state = sim.model.acc.clone()
    sim.run(x, mode=Mode.FLOAT)
    assert not torch.equal(sim.model.acc, state)  # the later run did change it
    sim.run(x, mode=Mode.FLOAT, op_modes={"c1:conv2d#0": OpMode(Mode.FAKE)}, replay=trace)
    for k, v in before.items():
        assert_bits_equal(trace.outputs[k], v)
