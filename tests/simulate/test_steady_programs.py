"""Steady FAKE, HYBRID and FIXED runs switching to a traced program
(quantlab.simulate.steady_programs): the captured run's bits before, during and after the
switch, a changed model sending runs back to the capture, and the runs that never switch."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import nn
from torch.nn import functional as F

from quantlab.simulate import Mode, OpMode, Simulator
from quantlab.simulate import steady_programs as sp

BIAS = 0.125  # a global Net's forward reads


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = F.relu6(self.conv(x)).mean((2, 3))
        return torch.sigmoid(self.head(h)) + BIAS


def _pair(steady: bool = True, model: nn.Module | None = None):
    """(simulator with steady programs, simulator always captured), both calibrated alike."""
    g = torch.Generator().manual_seed(3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = (model or Net()).eval()
    calib = [(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)]
    sims = []
    for s in (steady, False):
        sim = Simulator(m, "j6m", steady_programs=s)
        sim.calibrate(calib, progress=False)
        sims.append(sim)
    return m, sims[0], sims[1], g


def _inputs(g, n=6):
    xs = [torch.randn(2, 3, 8, 8, generator=g) * s for s in (0.1, 1.0, 4.0, 50.0)][:n]
    return xs + [torch.zeros(2, 3, 8, 8), torch.full((2, 3, 8, 8), 0.5)]


MODES = [Mode.FAKE, Mode.HYBRID, Mode.FIXED]


def _switched(monkeypatch, mode: Mode = Mode.FAKE):
    """A pair (``_pair``) whose steady simulator built its program in its first run of an
    input x in ``mode``: (simulator, captured simulator, generator, x, x's signature state)."""
    build_in_first_run(monkeypatch)
    _, sim, captured, g = _pair()
    x = _inputs(g, 1)[0]
    sim.run(x, mode=mode)
    return sim, captured, g, x, sim.steady_programs.status((x,), mode)


@pytest.mark.parametrize("mode", MODES)
def test_runs_switch_to_a_program_with_the_captured_bits(monkeypatch, mode):
    build_in_first_run(monkeypatch)
    _, sim, captured, g = _pair()
    xs = _inputs(g)
    for x in xs:
        assert_bits_equal(sim.run(x, mode=mode), captured.run(x, mode=mode))
    state = sim.steady_programs.status((xs[0],), mode)
    assert state.program.mode is mode
    assert state.program is not None and state.failed is None
    assert state.captured_runs == 1  # the first run built it; every later one ran it
    assert state.program_runs == len(xs) - 1
    assert state.program.fallbacks == 0
    assert captured.steady_programs is None


def test_no_program_before_the_captured_runs_have_taken_their_time(monkeypatch):
    monkeypatch.setattr(sp, "PROGRAM_AFTER_S", 3600.0)
    _, sim, _, g = _pair()
    x = _inputs(g, 1)[0]
    for _ in range(3):
        sim.run(x, mode=Mode.FAKE)
    state = sim.steady_programs.status((x,), Mode.FAKE)
    assert state.program is None and state.captured_runs == 3 and state.captured_s > 0


def test_a_run_longer_than_a_builds_time_is_not_built_after_it_alone(monkeypatch):
    """A model whose one run takes longer than ``PROGRAM_AFTER_S`` (here every run does) is not
    built after that run: a build runs it twice, so the program is built by the second run."""
    monkeypatch.setattr(sp, "PROGRAM_AFTER_S", 0.0)
    _, sim, captured, g = _pair()
    x = _inputs(g, 1)[0]
    sim.run(x, mode=Mode.FIXED)
    state = sim.steady_programs.status((x,), Mode.FIXED)
    assert state.program is None and state.captured_runs == 1 and state.build_s == 0.0
    sim.run(x, mode=Mode.FIXED)
    assert state.program is not None and state.captured_runs == 2
    assert_bits_equal(sim.run(x, mode=Mode.FIXED), captured.run(x, mode=Mode.FIXED))
    assert state.program_runs == 1


def test_other_signatures_modes_and_overrides_keep_their_own_state(monkeypatch):
    sim, captured, g, x, state = _switched(monkeypatch)
    name = sim.ops.set_index("op_type").loc["linear", "name"]
    for mode in (Mode.FIXED, Mode.FLOAT):
        assert_bits_equal(sim.run(x, mode=mode), captured.run(x, mode=mode))
    fixed = sim.steady_programs.status((x,), Mode.FIXED)  # its own program, built in that run
    assert fixed is not state and fixed.program.mode is Mode.FIXED
    assert sim.steady_programs.status((x,), Mode.FLOAT) is None  # plain: nothing to trace
    for mode in (Mode.FAKE, Mode.FIXED):
        overrides = {name: OpMode(Mode.FLOAT)}
        got = sim.run(x, mode=mode, op_modes=overrides)
        assert_bits_equal(got, captured.run(x, mode=mode, op_modes=overrides))
    assert state.program_runs == 0 and fixed.program_runs == 0
    y = torch.randn(3, 3, 8, 8, generator=g)  # another shape: its own signature
    assert_bits_equal(sim.run(y, mode=Mode.FAKE), captured.run(y, mode=Mode.FAKE))
    assert sim.steady_programs.status((y,), Mode.FAKE) is not state


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_a_changed_global_drops_the_program_and_runs_captured(monkeypatch, mode):
    sim, captured, _, x, state = _switched(monkeypatch, mode)
    assert state.program is not None
    monkeypatch.setattr(__import__(__name__), "BIAS", 2.0)
    got = sim.run(x, mode=mode)
    assert_bits_equal(got, captured.run(x, mode=mode))
    assert state.drops == 1 and state.program_runs == 0
    # that captured run rented past the (zero) threshold: a program of the new state
    assert state.program is not None
    assert_bits_equal(sim.run(x, mode=mode), got)
    assert state.program_runs == 1
    monkeypatch.setattr(__import__(__name__), "BIAS", 0.125)
    assert_bits_equal(sim.run(x, mode=mode), captured.run(x, mode=mode))
    assert state.drops == 2 and state.program is None and "changed" in state.failed
    sim.run(x, mode=mode)
    assert state.program is None  # stays captured from here on


class Unguardable(Net):
    def forward(self, x):
        torch._dynamo.graph_break()
        return super().forward(x)


def test_a_model_dynamo_cannot_guard_stays_captured_with_the_reason(monkeypatch):
    build_in_first_run(monkeypatch)
    _, sim, captured, g = _pair(model=Unguardable())
    for x in _inputs(g, 2):
        assert_bits_equal(sim.run(x, mode=Mode.FAKE), captured.run(x, mode=Mode.FAKE))
    state = sim.steady_programs.status((x,), Mode.FAKE)
    assert state.program is None and "one graph" in state.failed
    assert state.captured_runs == 4


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_a_model_with_hooks_stays_captured_and_its_hooks_run(monkeypatch, mode):
    build_in_first_run(monkeypatch)
    m, sim, _, g = _pair()
    seen = []
    h = m.head.register_forward_hook(lambda mod, inp, out: seen.append(1))
    try:
        x = _inputs(g, 1)[0]
        for _ in range(3):
            sim.run(x, mode=mode)
    finally:
        h.remove()
    state = sim.steady_programs.status((x,), mode)
    assert state.program is None and "hooks" in state.failed
    assert len(seen) == 3  # every run called the module


@pytest.mark.parametrize("limit", [1, 2])
def test_programs_kept_per_simulator_are_bounded(monkeypatch, limit):
    build_in_first_run(monkeypatch)
    monkeypatch.setattr(sp, "MAX_PROGRAMS", limit)
    _, sim, captured, g = _pair()
    xs = [torch.randn(b, 3, 8, 8, generator=g) for b in (1, 2, 3)]
    for x in xs:
        assert_bits_equal(sim.run(x, mode=Mode.FAKE), captured.run(x, mode=Mode.FAKE))
    built = [sim.steady_programs.status((x,), Mode.FAKE).program is not None for x in xs]
    assert built == [i < limit for i in range(3)]


def test_an_explicit_program_build_is_no_steady_run(monkeypatch):
    """``program`` runs the model captured: it neither counts towards nor starts a switch."""
    build_in_first_run(monkeypatch)
    _, sim, captured, g = _pair()
    x = _inputs(g, 1)[0]
    prog = sim.program(x, mode=Mode.FAKE)
    assert sim.steady_programs.status((x,), Mode.FAKE) is None
    assert_bits_equal(prog(x), captured.run(x, mode=Mode.FAKE))
    # the program's call is no steady run either
    assert sim.steady_programs.status((x,), Mode.FAKE) is None
