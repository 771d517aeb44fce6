"""A steady run compiled to straight-line code: the per-op capture traced away.

A steady run (``Simulator.run(..., mode=m)`` in FAKE, HYBRID or FIXED mode with no per-op
overrides, replay, trace or gradients) pays for seeing each op: the module-call tracking that
names its path and the torch-function mode that hands the call over, and the checks of its
prepared call (``steady``). A ``Program`` traces the model once with torch.fx
(every module inlined, in eval mode), names each traced call as the capture names it, and
generates Python code (its steps: ``program_steps``) in which

- an op that followed its prepared call in the build run (FAKE: ops with a fake-quantized
  output; FIXED: GEMMs with integer output codes, layout ops and ops with a fixed kernel)
  computes as the simulator's current prepared call of it does (FAKE: its fake-quantized
  weight and bias, its function, its output fake quant; FIXED: its planned
  ``fixed_gemm.GemmRun``, the codes moved with the values, or its fixed kernel on the inputs'
  codes; ``steady_prepare``) when that call's checks
  hold: those about the simulator (routes, resolved qconfig, scales, platform, weight and bias
  versions) once per program call, the quantization its activation inputs arrived with per
  call; otherwise, as after a change of qconfig, scales or mode, it goes through the dispatch,
  which prepares it anew for the next call;
- an op fused into its GEMM (a clamp after a Conv) returns its input when the GEMM ran fused;
- an eval-mode ``F.dropout`` returns its input, booked as the dispatch books it (the grid it
  stays on), without the call;
- item assignment (``t[:, 0] = u``, no captured op) writes, and the run forgets the
  quantization ``t`` carried, as the capture does; an in-place operator
  (``t += u``) is traced as one (``operator.iadd``), so every name bound to ``t`` sees it;
- every other captured op (in HYBRID mode, every op not fused) goes through the simulator's
  dispatch as in a captured run: the same call, with the same arguments, under the same op
  name, so the same bits, and every change of qconfig, scales or platform is followed as the
  captured run follows it.

What the traced code itself assumes (the inputs' shapes, strides, dtypes and devices; the
model holding the same modules, parameters and buffers; the plain settings of those modules,
such as a convolution's stride or a norm's eps; no module hooks) is checked once per program
call; when any of it changed, the call runs ``Simulator.run`` instead (counted in
``fallbacks``; build a new program with ``Simulator.program``).

Every other Python value ``forward`` reads (a global, a closure variable, a list or dict
attribute, a train flag) is checked per call too, by torch dynamo's guards over a trace of
``forward`` taken when the program was built (``forward_guard.ForwardGuard``; ``guard``). Where
dynamo cannot trace ``forward`` as one graph the program has no guard (``unguarded`` says why)
and such a change is not detected; build the program again after one.

Contract: for inputs with the example's signature, ``program(*inputs)`` returns the same bits as
``sim.run(*inputs, mode=program.mode)``. Building proves it on the example inputs: the traced
graph's captured run must name the same ops in the same order and give the same output bits as
the model's, and so must the program. Afterwards the checks above keep it: while they hold,
``forward`` runs the ops it ran when the program was built.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules import module as nn_module

from quantlab.simulate.forward_guard import ForwardGuard, GuardError
from quantlab.simulate.model_inputs import copy_inputs, mark_quantized_inputs
from quantlab.simulate.modes import Mode
from quantlab.simulate.program_steps import ProgramRun, compile_steps
from quantlab.simulate.traced_graph import (
    ProgramError,
    attr_paths,
    holding_dict,
    named_run,
    same_bits,
    trace_model,
)

__all__ = ["NOT_HELD", "Program", "ProgramError", "input_signature"]


def _holders(root: nn.Module, paths: list[str]) -> list[tuple[dict, str, Any]]:
    """(dictionary, key, object) for each step of each attribute path from ``root``: the
    ``holding_dict`` entry that holds the next object. The path still leads to the same
    objects while every entry holds them."""
    seen: dict[tuple[int, str], tuple[dict, str, Any]] = {}
    for path in paths:
        obj = root
        for part in path.split("."):
            d = holding_dict(obj, part)
            if d is None:
                raise ProgramError(f"traced attribute {path} is not held by a module dictionary")
            child = d[part]
            seen[(id(d), part)] = (d, part, child)
            obj = child
    return list(seen.values())


_MISSING = object()
NOT_HELD = object()  # try_call: a check failed, the program did not run
_PLAIN = (bool, int, float, str, type(None))


def _plain(v: Any) -> bool:
    return isinstance(v, _PLAIN) or isinstance(v, tuple) and all(_plain(e) for e in v)


def _settings(modules) -> list[tuple[dict, str, Any]]:
    """(``__dict__``, name, value) of every plain setting (bool, int, float, str, None, tuples
    of them) of the modules the trace went through: a convolution's stride, a norm's eps, a
    dropout's p. The traced code took them as constants. The train flag is left out: every run
    evaluates in eval mode."""
    found = []
    for m in modules:
        d = m.__dict__
        for k, v in d.items():
            if k != "training" and not k.startswith("_") and _plain(v):
                found.append((d, k, v))
    return found


def input_signature(inputs: tuple) -> tuple:
    """What the traced code may have taken as constant about the inputs: each tensor's shape,
    strides, dtype and device; every other input's value."""
    sig = []
    for x in inputs:
        if isinstance(x, Tensor):
            sig.append((Tensor, tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad))
        else:
            sig.append((type(x), x))
    return tuple(sig)


class Program:
    """``sim``'s steady run of its model in ``mode`` as generated code (see the module
    docstring).

    ``program(*inputs)`` returns the bits of ``sim.run(*inputs, mode=mode)``; ``fallbacks``
    counts the calls that ran ``Simulator.run`` because the inputs or the model changed;
    ``counts``: how many captured ops the code has as prepared, fused, kept (eval-mode
    dropouts) and dispatched steps."""

    def __init__(
        self, sim: Any, inputs: tuple, mode: Mode, leaves: Iterable[Callable] = ()
    ) -> None:
        if mode is Mode.FLOAT:
            raise ValueError(
                "mode must be FAKE, HYBRID or FIXED, got FLOAT (a steady FLOAT run is already "
                "the model's own call)"
            )
        self.sim, self._model, self.mode = sim, sim.model, mode
        self.fallbacks = 0
        self._signature = input_signature(inputs)
        ref = _reference_run(sim, inputs, mode)
        leaves = (*getattr(sim.model, "trace_leaves", ()), *leaves)
        graph, tracer, gm = trace_model(sim.model, inputs, leaves)
        run_inputs = copy_inputs(inputs) if sim.writes_inputs else inputs
        calls_of, forms, writes, hits = named_run(sim, gm, run_inputs, ref, mode, leaves)
        self._run = ProgramRun()
        self._code, self._steps, self.counts = compile_steps(
            sim, gm, calls_of, forms, writes, hits, self._run, mode
        )
        # where the model holds the modules the trace went through and the tensors it read
        paths = attr_paths(graph, sim.model) + [p for p in tracer.modules if p]  # not ""
        self._holders = _Held(_holders(sim.model, paths))
        self._modules = list(sim.model.named_modules())
        self._settings = _Held(_settings([sim.model, *tracer.modules.values()]))
        out = self._execute(inputs)
        if not same_bits(out, ref):
            raise ProgramError(f"the compiled program's output differs from the {mode.name} run's")
        self.guard: ForwardGuard | None = None
        self.unguarded: str | None = None  # why there is no guard
        try:
            self.guard = ForwardGuard(sim.model, inputs)
        except GuardError as err:
            self.unguarded = str(err)

    # ------------------------------------------------------------------ running
    def __call__(self, *inputs: Any) -> Any:
        out = self.try_call(inputs)
        if out is NOT_HELD:
            self.fallbacks += 1
            return self.sim.run(*inputs, mode=self.mode)
        return out

    def try_call(self, inputs: tuple) -> Any:
        """The program's output for ``inputs`` when every check holds, else ``NOT_HELD`` (and
        nothing ran)."""
        return self._execute(inputs) if self._holds(inputs) else NOT_HELD

    @property
    def last_prepared(self) -> int:
        """How many ops of the latest program call computed by their prepared call (the
        others went through the dispatch, as after a change of qconfig, scales or mode)."""
        return self._run.prepared

    def _execute(self, inputs: tuple) -> Any:
        sim = self.sim
        if sim.writes_inputs:  # as ``Simulator.run`` does: the model writes into its inputs
            inputs = copy_inputs(inputs)
        for step in self._steps:
            step.bind(sim)
        st = sim._new_state(self.mode, None, None)
        mark_quantized_inputs(st.qt, inputs, sim.input_quant)
        prev, sim._state = sim._state, st
        self._run.st, self._run.prepared = st, 0
        try:
            with torch.no_grad():
                out = self._code(*inputs)
        finally:
            sim._state = prev
            self._run.st = None
        sim._float16_overflow = dict(st.float16_overflow)
        return out

    def _holds(self, inputs: tuple) -> bool:
        """What the traced code itself assumed: the inputs' signature, the same model holding
        the same modules and tensors with the same plain settings, no module hooks, no learned
        scales, and every guard of ``forward`` (when it has them). (What each prepared call
        assumed about the simulator is checked by its step's ``bind``.)"""
        sim = self.sim
        if input_signature(inputs) != self._signature or sim.model is not self._model:
            return False
        if sim._learned_scales is not None or not sim._calibrated:
            return False
        if not self._holders.same_objects() or _hooked(self._modules) is not None:
            return False
        if not self._settings.equal_values():
            return False
        return self.guard is None or self.guard.holds(inputs)


class _Held:
    """(dictionary, key, value) triples checked per program call, with the loops in C: each
    ``dictionary.get(key, _MISSING)`` is the same object as ``value`` (``same_objects``) or
    equal to it (``equal_values``: list equality, identity first, then ``==``)."""

    __slots__ = ("dicts", "keys", "values", "missing")

    def __init__(self, triples: list[tuple[dict, str, Any]]) -> None:
        self.dicts = [d for d, _, _ in triples]
        self.keys = [k for _, k, _ in triples]
        self.values = [v for _, _, v in triples]
        self.missing = [_MISSING] * len(triples)

    def _now(self) -> list:
        return list(map(dict.get, self.dicts, self.keys, self.missing))

    def same_objects(self) -> bool:
        return all(map(operator.is_, self._now(), self.values))

    def equal_values(self) -> bool:
        return self._now() == self.values


def _hooked(named_modules) -> str | None:
    """Who has forward hooks a traced program would skip: "the process" (global module hooks),
    else the first of ``named_modules`` ((name, module) pairs) with hooks of its own; None."""
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return "the process (global module hooks)"
    hooked = next(filter(_has_hooks, named_modules), None)
    if hooked is None:
        return None
    name, m = hooked
    return f"module {name or type(m).__name__}"


def _has_hooks(named: tuple[str, nn.Module]) -> bool:
    m = named[1]
    return bool(m._forward_hooks or m._forward_pre_hooks)


# ---------------------------------------------------------------------- building
def _reference_run(sim: Any, inputs: tuple, mode: Mode) -> Any:
    """Two steady runs in ``mode`` (in FAKE and FIXED mode the first prepares the calls, the
    second follows them), both captured: never a program of ``sim.steady_programs``."""
    if not sim._calibrated:
        raise ProgramError("a program needs calibrate(batches) first")
    hooked = _hooked(sim.model.named_modules())
    if hooked is not None:
        raise ProgramError(f"{hooked} has forward hooks; a traced program skips them")
    for _ in range(2):
        out = sim._forward(inputs, sim._new_state(mode, None, None))
    return out
