"""Steady FIXED runs of the onnxruntime profile executed by onnxruntime
(quantlab.simulate.runtime_program): the captured run's bits on new inputs, after a new
calibration, a new qconfig and changed weights, and the runs that stay on quantlab's program."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from torch import nn
from torch.nn import functional as F

pytest.importorskip("onnxruntime")

from program_switch import build_in_first_run

from quantlab.export.ort_host import onnxruntime_profile  # noqa: E402
from quantlab.qconfig import OpQConfig, QConfigSpec  # noqa: E402
from quantlab.simulate import Mode, Simulator  # noqa: E402
from quantlab.simulate import runtime_program as rp  # noqa: E402
from quantlab.simulate.program import Program  # noqa: E402
from quantlab.simulate.runtime_program import RuntimeProgram  # noqa: E402

ASYMMETRIC = QConfigSpec(global_=OpQConfig(activation_symmetry="asymmetric"))


class Net(nn.Module):
    """Conv + ReLU6, a residual add, a depthwise conv, a global mean, a linear and a sigmoid:
    integer kernels and float islands of the onnxruntime profile."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = F.relu6(self.conv(x))
        h = h + self.dw(h)
        return torch.sigmoid(self.head(h.mean((2, 3))))


class LogSoftmaxNet(nn.Module):
    """A log_softmax, which the QDQ export refuses (quantlab does not model it)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return F.log_softmax(self.conv(x), dim=1)


def _calib(g, n=2):
    return [(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(n)]


def _pair(monkeypatch, model=None, spec=None, platform=None):
    """(steady simulator, captured simulator, generator, x): the steady one switched to its
    program in its first FIXED run of x."""
    build_in_first_run(monkeypatch)
    torch.manual_seed(0)
    m = (model or Net()).eval()
    g = torch.Generator().manual_seed(5)
    calib = _calib(g)
    platform = platform or onnxruntime_profile()
    sims = []
    for steady in (True, False):
        sim = Simulator(m, platform, qconfig=spec, steady_programs=steady)
        sim.calibrate(calib, progress=False)
        sims.append(sim)
    x = torch.randn(2, 3, 8, 8, generator=g)
    assert_bits_equal(sims[0].run(x, mode=Mode.FIXED), sims[1].run(x, mode=Mode.FIXED))
    return sims[0], sims[1], g, x


def _inputs(g):
    xs = [torch.randn(2, 3, 8, 8, generator=g) * s for s in (0.05, 1.0, 3.0, 40.0)]
    return xs + [torch.zeros(2, 3, 8, 8), torch.full((2, 3, 8, 8), -0.5)]


@pytest.mark.parametrize("spec", [None, ASYMMETRIC], ids=["symmetric", "asymmetric"])
def test_onnxruntime_runs_give_the_captured_bits(monkeypatch, spec):
    sim, captured, g, x = _pair(monkeypatch, spec=spec)
    state = sim.steady_programs.status((x,), Mode.FIXED)
    assert isinstance(state.program, RuntimeProgram), state.runtime_failed
    assert state.runtime_failed is None
    prog = state.program
    xs = _inputs(g)
    for xi in xs:
        assert_bits_equal(sim.run(xi, mode=Mode.FIXED), captured.run(xi, mode=Mode.FIXED))
    assert prog.runtime_runs == len(xs) and prog.program_runs == 0


def test_inputs_in_another_memory_layout(monkeypatch):
    sim, captured, g, _ = _pair(monkeypatch)
    for _ in range(3):  # channels last: its own signature, program and session
        x = torch.randn(2, 8, 8, 3, generator=g).permute(0, 3, 1, 2)
        assert not x.is_contiguous()
        assert_bits_equal(sim.run(x, mode=Mode.FIXED), captured.run(x, mode=Mode.FIXED))
    prog = sim.steady_programs.status((x,), Mode.FIXED).program
    assert isinstance(prog, RuntimeProgram) and prog.runtime_runs == 2


def test_a_new_calibration_runs_on_quantlabs_program_then_a_new_session(monkeypatch):
    sim, captured, g, x = _pair(monkeypatch)
    prog = sim.steady_programs.status((x,), Mode.FIXED).program
    monkeypatch.setattr(rp, "REBUILD_AFTER_S", 3600.0)
    calib = _calib(g, 3)
    for s in (sim, captured):
        s.calibrate([(c[0] * 7,) for c in calib], progress=False)
    xs = _inputs(g)
    for xi in xs[:2]:
        assert_bits_equal(sim.run(xi, mode=Mode.FIXED), captured.run(xi, mode=Mode.FIXED))
    assert prog.runtime_runs == 0 and prog.program_runs == 2 and prog.builds == 1
    monkeypatch.setattr(rp, "REBUILD_AFTER_S", 0.0)  # the next run writes the export again
    for xi in xs[2:]:
        assert_bits_equal(sim.run(xi, mode=Mode.FIXED), captured.run(xi, mode=Mode.FIXED))
    assert prog.builds == 2 and prog.reason is None
    assert prog.program_runs == 3 and prog.runtime_runs == len(xs) - 3


def test_changed_weights_and_qconfig_leave_the_session(monkeypatch):
    sim, captured, g, x = _pair(monkeypatch)
    prog = sim.steady_programs.status((x,), Mode.FIXED).program
    monkeypatch.setattr(rp, "REBUILD_AFTER_S", 3600.0)
    with torch.no_grad():
        sim.model.dw.weight.mul_(-2.0)  # in place: the same tensor at a new version
    assert_bits_equal(sim.run(x, mode=Mode.FIXED), captured.run(x, mode=Mode.FIXED))
    assert prog.runtime_runs == 0 and prog.program_runs == 1
    spec = QConfigSpec(by_type={"sigmoid": OpQConfig(output_dtype="int16")})
    for s in (sim, captured):
        s.set_qconfig(spec)
    assert_bits_equal(sim.run(x, mode=Mode.FIXED), captured.run(x, mode=Mode.FIXED))
    assert prog.runtime_runs == 0 and prog.program_runs == 2


def test_the_session_is_checked_on_the_build_inputs(monkeypatch):
    """A session whose outputs differ from the FIXED run's is never used."""
    sim, captured, g, x = _pair(monkeypatch)
    prog = sim.steady_programs.status((x,), Mode.FIXED).program
    real = prog._run_session

    def off_by_one_lsb(inputs):
        out = real(inputs)
        return out + out.abs().max() / 128

    monkeypatch.setattr(prog, "_run_session", off_by_one_lsb)
    prog._build((x,), captured.run(x, mode=Mode.FIXED))
    assert prog._session is None and "differs" in prog.reason
    xi = _inputs(g)[1]
    assert_bits_equal(sim.run(xi, mode=Mode.FIXED), captured.run(xi, mode=Mode.FIXED))


def test_runs_stay_on_quantlabs_program(monkeypatch):
    # a model the export refuses: the reason is kept, quantlab's program runs
    sim, captured, g, x = _pair(monkeypatch, model=LogSoftmaxNet())
    state = sim.steady_programs.status((x,), Mode.FIXED)
    assert type(state.program) is Program and "log_softmax" in state.runtime_failed
    xi = _inputs(g)[2]
    assert_bits_equal(sim.run(xi, mode=Mode.FIXED), captured.run(xi, mode=Mode.FIXED))
    # a device profile names no runtime
    sim, _, _, x = _pair(monkeypatch, platform="j6m")
    state = sim.steady_programs.status((x,), Mode.FIXED)
    assert type(state.program) is Program and state.runtime_failed is None
    # asked not to
    build_in_first_run(monkeypatch)
    torch.manual_seed(0)
    off = Simulator(Net().eval(), onnxruntime_profile())
    off.calibrate(_calib(torch.Generator().manual_seed(1)), progress=False)
    off.steady_programs.runtime_sessions = False
    off.run(x, mode=Mode.FIXED)
    assert type(off.steady_programs.status((x,), Mode.FIXED).program) is Program
    # a FAKE program never runs in the runtime
    off.run(x, mode=Mode.FAKE)
    assert type(off.steady_programs.status((x,), Mode.FAKE).program) is Program


def test_a_profile_this_hosts_onnxruntime_does_not_compute_is_refused():
    other = "onnxruntime" if onnxruntime_profile() != "onnxruntime" else "onnxruntime_no_vnni"
    sim = Simulator(Net().eval(), other)
    reason = rp.runtime_unavailable(sim)
    assert reason is not None and "u8s8_pair_saturation" in reason
    assert rp.runtime_unavailable(Simulator(Net().eval(), onnxruntime_profile())) is None
    assert "names no runtime" in rp.runtime_unavailable(Simulator(Net().eval(), "j6m"))
