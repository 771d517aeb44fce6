"""A FLOAT replay run keeps its convolutions' outputs in oneDNN's blocked layout where the op
graph allows it (``blocked_layout.plan``) and gives the dense run's bits: the naive run's for
every studied op of the activation and weight passes. A blocked form that gave other bits on
its first call, a convolution whose partial sums could overflow float32 or whose input holds a
NaN, stays dense; a run that departs from the discovered graph makes its blocked tensors dense
before anything else reads them; a modelled op writing in place into one writes the dense
call's values into it, and any other call that would is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.analysis.sensitivity import SensitiveType, pass_modes, studied_ops
from quantlab.simulate import Mode, Simulator, blocked_layout


class Inverted(nn.Module):
    """MobileNetV2's pattern and its neighbours: conv + ReLU6 chains (in place or not), a
    depthwise conv, a projection without a clamp, a residual add, a conv + ReLU, a conv +
    batch_norm (a chain oneDNN's post-op does not take), and a conv read by a mean (its output
    is made dense)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.expand = nn.Conv2d(16, 48, 1)
        self.dw = nn.Conv2d(48, 48, 3, padding=1, groups=48)
        self.project = nn.Conv2d(48, 16, 1)
        self.plain = nn.Conv2d(16, 16, 3, padding=1)
        self.normed = nn.Conv2d(16, 16, 1)
        self.bn = nn.BatchNorm2d(16)
        self.head = nn.Conv2d(16, 32, 1)
        self.fc = nn.Linear(32, 5)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        h = F.relu6(self.stem(x))
        y = F.relu6(self.dw(F.relu6(self.expand(h), inplace=True)), inplace=True)
        h = h + self.project(y)
        h = F.relu(self.plain(h))
        h = self.bn(self.normed(h))
        h = F.relu6(self.head(h))
        return self.fc(h.mean((2, 3)))


class Residual(nn.Module):
    """ResNet's and UVDoc's pattern: in-place ReLUs and an in-place residual add (``out +=``)
    between convolutions, then a convolution read by a mean."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.c1 = nn.Conv2d(16, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=2, dilation=2)
        self.relu = nn.ReLU(inplace=True)
        self.head = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        identity = self.relu(self.stem(x))
        out = self.relu(self.c1(identity))
        out = self.c2(out)
        out += identity
        out = self.relu(out)
        return self.fc(self.head(out).mean((2, 3)))


def _sim(make_model, batch: int = 16) -> tuple[Simulator, torch.Tensor]:
    """A calibrated Simulator of a new net and an input batch; 16 items: torch computes a
    dense 1x1 convolution with oneDNN from 16 items on, whatever its thread count."""
    torch.manual_seed(0)  # the model's weights do not depend on the tests run before
    model = make_model().eval()
    g = torch.Generator().manual_seed(1)
    sim = Simulator(model, "j6m")
    sim.calibrate([(torch.randn(batch, 3, 16, 16, generator=g),) for _ in range(2)], progress=False)
    x = torch.randn(batch, 3, 16, 16, generator=g)
    sim.run(x, mode=Mode.FAKE)
    return sim, x


def _conv(sim: Simulator, module: str) -> str:
    return next(n for n in sim.ops["name"] if n.startswith(f"{module}:conv2d"))


def test_plan_keeps_blocked_only_outputs_that_convolutions_adds_and_relus_read():
    sim, _ = _sim(Inverted)
    plan = sim._blocked_convs_of_graph()
    got = {n.split(":")[0]: v for n, v in plan.items()}
    assert got == {
        "stem": ("hardtanh", [0.0, 6.0], True),  # read by expand and the residual add
        "expand": ("hardtanh", [0.0, 6.0], True),
        "dw": ("hardtanh", [0.0, 6.0], True),
        "project": ("none", [], True),  # read by the add, whose reader is a convolution
        "plain": ("none", [], False),  # its ReLU is read by a conv with a batch_norm chain
        "head": ("hardtanh", [0.0, 6.0], False),  # read by a mean: made dense
    }  # normed: its batch_norm is no oneDNN post-op


@pytest.mark.parametrize("kind", [SensitiveType.ACTIVATION, SensitiveType.WEIGHT])
def test_replayed_passes_give_the_naive_bits_with_blocked_convolutions(kind, monkeypatch):
    # a fused ReLU6 passes its convolution's blocked output through: nothing is written back
    monkeypatch.setattr(blocked_layout, "write_into", None)
    sim, x = _sim(Inverted)
    trace = sim.trace(x, mode=Mode.FLOAT)
    names = studied_ops(sim, kind)
    assert len(names) >= 6
    for name in names:
        mode, op_modes = pass_modes(kind, name)
        naive = sim.run(x, mode=mode, op_modes=op_modes)
        fast = sim.run(x, mode=mode, op_modes=op_modes, replay=trace)
        assert fast.layout is torch.strided
        assert_bits_equal(fast, naive)
        sim.blocked_replay = False
        assert_bits_equal(sim.run(x, mode=mode, op_modes=op_modes, replay=trace), naive)
        sim.blocked_replay = True
    checked = sim._blocked_convs.checked
    # the convolutions that run after a studied op ran blocked and gave the dense bits: the
    # head's input is dense (the batch_norm's output), the stem is never after a studied op
    assert {k[0].split(":")[0] for k in checked} == {"expand", "dw", "project", "plain"}
    assert all(checked.values())


@pytest.mark.parametrize("kind", [SensitiveType.ACTIVATION, SensitiveType.WEIGHT])
def test_in_place_relus_and_residual_adds_run_on_blocked_tensors(kind, monkeypatch):
    monkeypatch.setattr(blocked_layout, "write_into", None)  # each runs on blocked tensors
    sim, x = _sim(Residual)
    plan = {n.split(":")[0]: v[2] for n, v in sim._blocked_convs_of_graph().items()}
    assert plan == {"stem": True, "c1": True, "c2": True, "head": False}
    trace = sim.trace(x, mode=Mode.FLOAT)
    for name in studied_ops(sim, kind):
        mode, op_modes = pass_modes(kind, name)
        assert_bits_equal(
            sim.run(x, mode=mode, op_modes=op_modes, replay=trace),
            sim.run(x, mode=mode, op_modes=op_modes),
        )
    checked = sim._blocked_convs.checked
    assert {k[0].split(":")[0] for k in checked} == {"c1", "c2", "head"}
    assert all(checked.values())


def _spy(monkeypatch, perturb: bool = False) -> list:
    """Count blocked convolutions; ``perturb``: each gives other bits (one LSB more)."""
    calls = []
    real = blocked_layout.pointwise_conv

    def spy(*args):
        calls.append(args[1].shape)
        out = real(*args)
        if perturb:
            d = out.to_dense()
            out = torch.nextafter(d, torch.full_like(d, float("inf"))).to_mkldnn()
        return out

    monkeypatch.setattr(blocked_layout, "pointwise_conv", spy)
    return calls


def _replay_matches_naive(sim, x, name) -> None:
    mode, op_modes = pass_modes(SensitiveType.ACTIVATION, name)
    trace = sim.trace(x, mode=Mode.FLOAT)
    assert_bits_equal(
        sim.run(x, mode=mode, op_modes=op_modes, replay=trace),
        sim.run(x, mode=mode, op_modes=op_modes),
    )


def test_a_blocked_form_with_other_bits_on_its_first_call_stays_dense(monkeypatch):
    sim, x = _sim(Inverted)
    calls = _spy(monkeypatch, perturb=True)
    first = _conv(sim, "stem")
    _replay_matches_naive(sim, x, first)
    n = len(calls)
    # expand, dw and project refused (each input dense then); plain's input never blocked
    assert n == 3 and len(sim._blocked_convs.checked) == n
    assert not any(sim._blocked_convs.checked.values())
    _replay_matches_naive(sim, x, first)
    assert len(calls) == n  # refused keys are not tried again


def test_a_convolution_that_could_overflow_float32_stays_dense(monkeypatch):
    sim, x = _sim(Inverted)
    with torch.no_grad():
        sim.model.expand.weight.mul_(1e38)  # |partial sums| could pass float32's range / 4
    calls = _spy(monkeypatch)
    _replay_matches_naive(sim, x, _conv(sim, "stem"))
    assert [k[0].split(":")[0] for k in sim._blocked_convs.checked] == ["dw", "project", "plain"]
    assert tuple(sim.model.expand.weight.shape) not in calls


def test_an_input_holding_nan_keeps_the_convolutions_dense(monkeypatch):
    # a fused clamp (oneDNN's clip) maps NaN to its lower bound where torch's keeps NaN
    sim, x = _sim(Inverted)
    x = x.clone()
    x[0, 0, 3, 3] = float("nan")
    calls = _spy(monkeypatch)
    _replay_matches_naive(sim, x, _conv(sim, "stem"))
    assert calls == []
    a = torch.tensor([1.0, -3.0, 2.0])
    assert blocked_layout.magnitude(a) == 3.0
    assert blocked_layout.magnitude(torch.tensor([1.0, float("nan")])) != 0.0  # NaN


class Departs(nn.Module):
    """conv (studied) -> conv + ReLU6 -> conv in the discovered run; ``read`` set later puts
    another reader of the ReLU6 between: a view (not a modelled op), a mean (a modelled op),
    an in-place scaling (a modelled op) or an in-place fill (not one); or the model returns the
    ReLU6's output too."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Conv2d(3, 3, 1)
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.read = None

    def forward(self, x):
        h = F.relu6(self.a(self.pre(x)))
        extra = 0.0
        if self.read == "view":
            extra = h.reshape(h.shape[0], -1)[:, :5].sum()
        elif self.read == "mean":
            extra = h.mean()
        elif self.read == "fill":
            h.index_fill_(1, torch.tensor([0, 5]), 5.0)
        elif self.read == "scale":
            h.mul_(0.5)  # a modelled op that does not run on blocked tensors
        elif self.read == "return":
            return h, self.b(h)
        return self.b(h) + extra


@pytest.mark.parametrize("read", ["view", "mean", "return", "scale"])
def test_a_run_that_departs_from_the_discovered_graph_reads_dense_values(read, monkeypatch):
    written = []
    real = blocked_layout.write_into
    monkeypatch.setattr(
        blocked_layout, "write_into", lambda t, c, b: written.append(c.op_type) or real(t, c, b)
    )
    sim, x = _sim(Departs)
    first = _conv(sim, "pre")
    assert sim._blocked_convs_of_graph()[_conv(sim, "a")][2]  # discovered: conv b reads it
    trace = sim.trace(x, mode=Mode.FLOAT)
    sim.model.read = read
    mode, op_modes = pass_modes(SensitiveType.WEIGHT, first)
    naive = sim.run(x, mode=mode, op_modes=op_modes)
    sim.model.read = None
    sim.run(x)  # the discovered graph again
    sim.model.read = read
    fast = sim.run(x, mode=mode, op_modes=op_modes, replay=trace)
    for p, q in zip(fast if read == "return" else [fast], naive if read == "return" else [naive]):
        assert p.layout is torch.strided
        assert_bits_equal(p, q)
    assert all(sim._blocked_convs.checked.values()) and sim._blocked_convs.checked
    assert written == (["mul"] if read == "scale" else [])


def test_an_in_place_write_into_a_blocked_tensor_by_a_call_not_modelled_is_refused():
    sim, x = _sim(Departs)
    first = _conv(sim, "pre")
    trace = sim.trace(x, mode=Mode.FLOAT)
    sim.model.read = "fill"
    mode, op_modes = pass_modes(SensitiveType.WEIGHT, first)
    with pytest.raises(RuntimeError, match="blocked layout.*blocked_replay = False"):
        sim.run(x, mode=mode, op_modes=op_modes, replay=trace)
    sim.blocked_replay = False
    naive = sim.run(x, mode=mode, op_modes=op_modes)
    sim.model.read = None
    sim.run(x)
    sim.model.read = "fill"
    assert_bits_equal(sim.run(x, mode=mode, op_modes=op_modes, replay=trace), naive)


def test_the_bound_of_a_convolution_counts_its_bias_whatever_its_input():
    from quantlab.capture import OpCall
    from quantlab.op_kinds import OpCategory
    from quantlab.simulate.qtensor import QTable

    x = torch.full((2, 16, 8, 8), 0.5)
    w = torch.full((8, 16, 3, 3), 0.25)  # 3x3, batch 2: torch's dense call is oneDNN's too
    for b_max, runs in ((1.0, True), (float(blocked_layout.FINITE_LIMIT), False)):
        b = torch.zeros(8)
        b[3] = -b_max
        call = OpCall("c:conv2d#0", "conv2d", OpCategory.GEMM, "c", 0, F.conv2d, (x, w, b), {})
        bounds = QTable()
        out = blocked_layout.BlockedConvs().run(call, ("none", [], True), bounds)
        assert (out is not None) is runs
        if runs:  # 0.5 x (16 x 9 x 0.25) + 1
            assert bounds.get(out) == 19.0
            assert_bits_equal(out.to_dense(), F.conv2d(x, w, b))


def test_a_call_reading_a_blocked_tensor_gets_it_dense_unless_it_writes_into_it():
    a, b = torch.randn(2, 16, 4, 4), torch.randn(2, 16, 4, 4)
    blocked = b.to_mkldnn()
    assert blocked_layout.dense_args(torch.Tensor.shape.__get__, (blocked,), {}) is None
    assert blocked_layout.dense_args(torch.Tensor.add_, (a, b), {}) is None  # nothing blocked
    args, kwargs = blocked_layout.dense_args(torch.Tensor.add_, (a, [blocked]), {"alpha": 2})
    assert args[0] is a and not args[1][0].is_mkldnn and kwargs == {"alpha": 2}
    assert_bits_equal(args[1][0], b)
    with pytest.raises(RuntimeError, match="add_ would write in place"):
        blocked_layout.dense_args(torch.Tensor.add_, (blocked, a), {})
    with pytest.raises(RuntimeError, match="would write in place"):
        blocked_layout.dense_args(F.relu, (blocked,), {"inplace": True})
    with pytest.raises(RuntimeError, match="__setitem__ would write in place"):
        blocked_layout.dense_args(torch.Tensor.__setitem__, (blocked, 0, 0.0), {})
    with pytest.raises(RuntimeError, match="would write in place"):
        blocked_layout.dense_args(torch.add, (a, a), {"out": blocked})
    assert blocked_layout.magnitude(torch.empty(0, 16)) == 0.0


def test_a_kernel_this_torch_build_lacks_leaves_the_convolution_dense(monkeypatch):
    sim, x = _sim(Inverted)

    def missing(*args):
        raise NotImplementedError("no oneDNN kernel for this build")

    monkeypatch.setattr(blocked_layout, "pointwise_conv", missing)
    _replay_matches_naive(sim, x, _conv(sim, "stem"))
    checked = sim._blocked_convs.checked
    assert checked and not any(checked.values())
