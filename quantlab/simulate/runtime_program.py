"""A steady FIXED run executed by the runtime its profile emulates.

A profile whose ``runtime`` is ONNXRUNTIME computes, in fixed mode, what onnxruntime's CPU
kernels compute on the profile's ONNX QDQ export, bit for bit (the export tests demand it on
whole models, random nets and every op family). Where onnxruntime on this host is that runtime
(its uint8 x int8 products sum as ``platform.u8s8_pair_saturation`` says, ``export.ort_host``),
a steady FIXED loop need not compute the graph op by op in torch: ``RuntimeProgram`` writes the
export once, opens an onnxruntime session on torch's thread count (spinning off) and runs the
inputs there.

Contract: ``try_call(inputs)`` returns the bits of ``sim.run(*inputs, mode=FIXED)`` or
``NOT_HELD``. It runs the session only while

- the traced program it wraps holds (``Program._holds``: the inputs' signature, the model's
  modules, tensors, settings and hooks, and torch dynamo's guards of ``forward``), and
- nothing the export read has changed since it was written: the simulator's platform, qconfig,
  observers, input quantization and calibration state (the same objects), every scale-cache
  entry the export found (the same tensors), every parameter and buffer of the model (the same
  tensor at the same version).

When the second check fails (a new calibration or qconfig, weights changed in place) the call
runs the wrapped traced program, which follows such changes, and once such calls have taken
``REBUILD_AFTER_S`` seconds the export is written again from the current state (at most
``MAX_BUILDS`` times). Building proves the session on its inputs: onnxruntime's outputs must
equal the FIXED run's in every bit (the captured run at the switch, the traced program's at a
rewrite), else there is no session and the traced program runs.
"""

from __future__ import annotations

import operator
import time
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from quantlab.platform_rules import Runtime
from quantlab.simulate.modes import Mode
from quantlab.simulate.program import NOT_HELD, Program
from quantlab.simulate.traced_graph import same_bits

REBUILD_AFTER_S = 2.0  # seconds of runs on the traced program before the export is rewritten
MAX_BUILDS = 4  # exports written per program (the first included)


def runtime_unavailable(sim: Any) -> str | None:
    """Why ``sim``'s FIXED runs cannot run in their runtime on this host, or None."""
    platform = sim.platform
    if platform.runtime is not Runtime.ONNXRUNTIME:
        return f"platform {platform.name} names no runtime (platform.runtime NONE)"
    from quantlab.export.ort_host import onnxruntime_saturates_u8s8

    try:
        saturates = onnxruntime_saturates_u8s8()
    except ImportError as err:  # onnx or onnxruntime is not installed
        return f"onnxruntime is not importable: {err}"
    if saturates != platform.u8s8_pair_saturation:
        return (
            f"this host's onnxruntime sums uint8 x int8 products otherwise than platform "
            f"{platform.name} (u8s8_pair_saturation {platform.u8s8_pair_saturation})"
        )
    return None


def _export_state(sim: Any) -> tuple:
    """What the export read, as objects compared by identity (``RuntimeProgram`` docstring)."""
    return (
        sim.platform,
        sim.spec,
        sim._obs,
        sim._scale_cache,
        sim.fake_ops,
        sim.input_quant,
    )


class RuntimeProgram:
    """``program``'s FIXED runs executed by the platform's runtime (see the module docstring).
    ``runtime_runs`` counts the calls the session answered, ``program_runs`` those the traced
    program answered; ``builds`` the exports written; ``reason`` why the latest build has no
    session (None while it has one)."""

    def __init__(self, program: Program, inputs: tuple, reference: Any) -> None:
        if program.mode is not Mode.FIXED:
            raise ValueError(f"a runtime runs FIXED programs, got {program.mode.name}")
        self.program = program
        self.sim = program.sim
        self.guard = program.guard
        self.mode = Mode.FIXED
        self.runtime_runs = self.program_runs = self.builds = 0
        self.reason: str | None = None
        self._session = None
        self._stale_s = 0.0
        self._build(inputs, reference)

    # ------------------------------------------------------------------ building
    def _build(self, inputs: tuple, reference: Any) -> None:
        """Export the simulator's current state, open the session and check it on ``inputs``
        against ``reference`` (a FIXED run's output on them)."""
        from quantlab.export.encoding import ActivationEncoding
        from quantlab.export.onnx_qdq import build_model
        from quantlab.export.runtime import run, session

        self.builds += 1
        self._session, self._stale_s = None, 0.0
        sim = self.sim
        self.reason = runtime_unavailable(sim)
        if self.reason is not None:
            return
        leaves, spec = tree_flatten(reference)
        slots = [i for i, v in enumerate(leaves) if isinstance(v, Tensor)]
        try:
            encoding = ActivationEncoding.of_zero_point(sim.platform.qlinear_zero_point)
            state = _export_state(sim)
            model, info = build_model(sim, inputs, encoding=encoding)
            sess = session(model.SerializeToString(), threads=torch.get_num_threads())
        except Exception as err:  # no export or no session: the traced program runs
            self.reason = f"export: {type(err).__name__}: {err}".splitlines()[0]
            return
        if len(info.output_names) != len(slots):
            self.reason = (
                f"the export has {len(info.output_names)} outputs, the model returns "
                f"{len(slots)} tensors"
            )
            return
        self._state = state
        self._entries = list(sim._scale_cache.items())
        self._scales = list(sim._scale_cache.values())
        self._tensors = [*sim.model.parameters(), *sim.model.buffers()]
        self._versions = [t._version for t in self._tensors]
        self._input_names, self._spec, self._slots = info.input_names, spec, slots
        # the reference's other leaves (not tensors: the session gives those)
        self._leaves = [None if isinstance(v, Tensor) else v for v in leaves]
        self._session, self._run = sess, run
        out = self._run_session(inputs)
        if not same_bits(out, reference):
            self._session = None
            self.reason = "onnxruntime's output differs from the FIXED run's on the build inputs"

    # ------------------------------------------------------------------ running
    def try_call(self, inputs: tuple) -> Any:
        """The FIXED run's output for ``inputs`` (see the module docstring), or ``NOT_HELD``
        when the traced program does not hold (nothing ran)."""
        prog = self.program
        if not prog._holds(inputs):
            return NOT_HELD
        if self._session is not None and self._export_holds():
            self.runtime_runs += 1
            return self._run_session(inputs)
        t0 = time.perf_counter()
        out = prog._execute(inputs)
        self.program_runs += 1
        self._stale_s += time.perf_counter() - t0
        if self._stale_s >= REBUILD_AFTER_S and self.builds < MAX_BUILDS:
            self._build(inputs, out)
        return out

    def _export_holds(self) -> bool:
        """Whether nothing the export read changed (called after ``Program._holds``, which
        already refuses runs at learned scales and an uncalibrated simulator)."""
        sim = self.sim
        if not all(map(operator.is_, _export_state(sim), self._state)):
            return False
        if [t._version for t in self._tensors] != self._versions:
            return False
        cache = sim._scale_cache
        if len(cache) == len(self._scales) and all(map(operator.is_, cache.values(), self._scales)):
            return True  # every entry as exported (the cache keeps its order)
        # entries added since (another mode's scales) or replaced: look each one up
        for key, value in self._entries:
            if cache.get(key) is not value:
                return False
        self._scales = list(cache.values())
        self._entries = list(cache.items())
        return True

    def _run_session(self, inputs: tuple) -> Any:
        outs = self._run(self._session, self._input_names, inputs)
        leaves = list(self._leaves)
        for i, value in zip(self._slots, outs):
            leaves[i] = torch.from_numpy(value)
        self.sim._float16_overflow = {}
        return tree_unflatten(leaves, self._spec)
