"""When a steady run becomes a traced program: ``Simulator.run``'s switch, per mode and input
signature.

A FAKE, HYBRID or FIXED run with no per-op overrides or replay (a steady run) pays for seeing
each op (``program`` module docstring). A ``Program`` computes the same bits without that, but
building one takes seconds (two runs in its mode, a torch.fx trace, a named run, torch dynamo's
trace for its guards). So ``Simulator.run`` rents before it buys, per mode and input signature
(each tensor's shape, strides, dtype and device; every other input's value): steady runs go
captured until those of one mode and signature have cost what a build costs: at least
``PROGRAM_AFTER_S`` seconds (about a build of a MobileNetV2-sized model) and at least
``PROGRAM_AFTER_RUNS`` runs (a build runs the model twice, so a model whose one run takes
seconds costs more to build than that run); the run that reaches both then builds the program
from its inputs. That keeps a run's total within about twice that of the better choice made in
hindsight, so a short session never pays a build and a loop (a sweep, an evaluation) runs at
the program's speed.

A program is kept only when torch dynamo guards its model's ``forward`` (``ForwardGuard``):
then a call whose checks hold (``Program`` docstring) runs the program, and any other runs
captured as before. A program whose checks fail is dropped and its signature starts renting
again, up to ``MAX_DROPS`` times. A signature whose build failed (torch.fx or dynamo cannot trace
the model, hooks, a forward that changes its own tensors) stays captured, with the reason in
``status``. At most ``MAX_PROGRAMS`` programs are kept per simulator. Runs at learned scales
stay captured (a program does not follow them).

A FIXED program of a platform whose fixed mode is a runtime's integer graph
(``platform.runtime``, e.g. ONNXRUNTIME) runs in that runtime where it gives the program's bits
(``runtime_program.RuntimeProgram``: the QDQ export in an onnxruntime session, proven on the
build's inputs and kept while nothing it was exported from changed); ``runtime_failed`` says why
not, and ``runtime_sessions = False`` keeps quantlab's own traced program.

A build runs ``forward`` a few more times (two runs, the traces): a forward with Python side
effects sees them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quantlab.platform_rules import Runtime
from quantlab.simulate.modes import Mode
from quantlab.simulate.program import NOT_HELD, Program, ProgramError, input_signature
from quantlab.simulate.runtime_program import RuntimeProgram

PROGRAM_AFTER_S = 2.0  # seconds of captured steady runs of one signature worth a build
PROGRAM_AFTER_RUNS = 2  # and as many runs: a build runs the model twice (and traces it)
MAX_PROGRAMS = 4  # programs kept per simulator (each holds a generated module)
MAX_DROPS = 2  # programs of one signature dropped before it stays captured


@dataclass
class SteadyProgram:
    """One mode and input signature's state: captured seconds so far, its program once built (or why
    there is none), and how many runs and seconds the latest build took."""

    captured_runs: int = 0
    captured_s: float = 0.0
    program: Program | RuntimeProgram | None = None  # guarded (its guard is not None)
    failed: str | None = None  # why no program can be built for this signature
    # a FIXED program of a platform with a runtime: why the runtime does not run it (None: it
    # does, or the platform has none)
    runtime_failed: str | None = None
    build_s: float = 0.0
    program_runs: int = 0
    drops: int = 0  # programs dropped because their checks failed


class SteadyPrograms:
    """``Simulator.run``'s programs for steady runs, per mode and input signature."""

    def __init__(self) -> None:
        self.by_signature: dict[tuple, SteadyProgram] = {}
        # FIXED programs of a platform with a runtime (platform.runtime) run there when it
        # gives their bits (``runtime_program``); False: quantlab's own traced program
        self.runtime_sessions = True

    def run(self, sim: Any, inputs: tuple, mode: Mode, captured: Callable[[], Any]) -> Any:
        """The steady run of ``inputs`` in ``mode`` (FAKE, HYBRID or FIXED): its program when
        one holds, else ``captured()`` (timed towards a build)."""
        if sim._learned_scales is not None:
            return captured()
        sig = (mode, input_signature(inputs))
        try:
            state = self.by_signature.get(sig)
        except TypeError:  # an input that cannot be hashed: no program for it
            return captured()
        if state is None:
            state = self.by_signature[sig] = SteadyProgram()
        prog = state.program
        if prog is not None:
            out = prog.try_call(inputs)
            if out is not NOT_HELD:
                state.program_runs += 1
                return out
            state.program, state.captured_s = None, 0.0  # something changed: rent again
            state.drops += 1
            if state.drops >= MAX_DROPS:
                state.failed = f"the model or simulator changed under each of {MAX_DROPS} programs"
        t0 = time.perf_counter()
        out = captured()
        state.captured_runs += 1
        state.captured_s += time.perf_counter() - t0
        if (
            state.failed is None
            and state.captured_s >= PROGRAM_AFTER_S
            and state.captured_runs >= PROGRAM_AFTER_RUNS
            and sum(s.program is not None for s in self.by_signature.values()) < MAX_PROGRAMS
        ):
            t0 = time.perf_counter()
            try:  # the build's own runs are captured runs (``program._reference_run``)
                prog = Program(sim, inputs, mode)
                if prog.guard is None:
                    state.failed = prog.unguarded
                else:
                    state.program = self._in_runtime(prog, inputs, out, state)
            except ProgramError as err:
                state.failed = str(err)
            except Exception as err:  # a run that succeeded never fails because of a build
                state.failed = f"building failed: {type(err).__name__}: {err}".splitlines()[0]
            finally:
                state.build_s = time.perf_counter() - t0
        return out

    def _in_runtime(
        self, prog: Program, inputs: tuple, out: Any, state: SteadyProgram
    ) -> Program | RuntimeProgram:
        """``prog``, run by the platform's runtime where that gives its bits on ``inputs``."""
        if (
            not self.runtime_sessions
            or prog.mode is not Mode.FIXED
            or prog.sim.platform.runtime is Runtime.NONE
        ):
            return prog
        rp = RuntimeProgram(prog, inputs, out)
        state.runtime_failed = rp.reason
        return prog if rp.reason is not None else rp

    def status(self, inputs: tuple, mode: Mode) -> SteadyProgram | None:
        """The state of ``inputs``' signature in ``mode`` (None: no steady run of it yet)."""
        try:
            return self.by_signature.get((mode, input_signature(inputs)))
        except TypeError:
            return None
