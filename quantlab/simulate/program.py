"""A steady run compiled to straight-line code: the per-op capture traced away.

A steady run (``Simulator.run(..., mode=m)`` in FAKE, HYBRID or FIXED mode with no per-op
overrides, replay, trace or gradients) pays for seeing each op: the module-call tracking that
names its path and the torch-function mode that hands the call over, and the checks of its
prepared call (``steady``). A ``Program`` traces the model once with torch.fx
(every module inlined, in eval mode), names each traced call as the capture names it, and
generates Python code in which

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
  quantization ``t`` carried, as the capture does (``_Writes``); an in-place operator
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

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as nn_module

from quantlab.capture import OpCall, is_float_output, mutates
from quantlab.numerics.dtypes import DType
from quantlab.simulate import args as A
from quantlab.simulate import steady
from quantlab.simulate.forward_guard import ForwardGuard, GuardError
from quantlab.simulate.model_inputs import copy_inputs, mark_quantized_inputs
from quantlab.simulate.modes import Mode
from quantlab.simulate.qtensor import QInfo
from quantlab.simulate.traced_graph import (
    ProgramError,
    attr_paths,
    fetch,
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


class _Run:
    """The run state the program's steps share (set per program call) and how many ops
    computed by their prepared call in it."""

    st: Any = None
    prepared: int = 0


class _Full:
    """A captured op run through the simulator's dispatch, as the capture would hand it over."""

    def __init__(self, sim: Any, run: _Run, call: OpCall, form: Callable | None, index: int):
        self.sim, self.run = sim, run
        self.form = form  # the node's arguments -> the captured call's (None: as they are)
        self.name, self.op_type, self.category = call.name, call.op_type, call.category
        self.module, self.call_index, self.func = call.module, call.call_index, call.func
        self.mutates = call.category is None and mutates(call.func)
        self.__name__ = f"ql_full_{index}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.form is not None:
            args, kwargs = self.form(args, kwargs)
        return self.dispatch(args, kwargs)

    def dispatch(self, args: tuple, kwargs: dict) -> Any:
        """The call as the capture hands it over (``args`` in the captured order)."""
        result = None
        if self.category is None:  # not modelled: runs before the handler, as in capture
            result = self.func(*args, **kwargs)
            if self.mutates and isinstance(args[0], Tensor):
                self.run.st.forget(args[0])
            if not is_float_output(result):
                return result
        call = OpCall(
            self.name,
            self.op_type,
            self.category,
            self.module,
            self.call_index,
            self.func,
            args,
            kwargs,
            result,
        )
        if type(result) is Tensor and self.name not in self.sim._fused_into:
            return self.sim._kept_float(call, self.run.st)
        return self.sim._dispatch(call, self.run.st)


class _Prepared:
    """An op that followed its prepared call when the program was built: the simulator's
    current prepared call of the op, computed directly when every check of it holds (those
    about the simulator once per program call, in ``bind``; the quantization its activation
    inputs arrived with per call), else the dispatch, as a captured run would."""

    def __init__(self, full: _Full, index: int, mode: Mode) -> None:
        self.full, self.run, self.name, self.key = full, full.run, full.name, (full.name, mode)
        self.prep: steady.PreparedCall | None = None
        self.passes: Any = None  # a plain pass-through's (function, input dtype), else None
        self.__name__ = f"ql_prepared_{index}"

    def bind(self, sim: Any) -> None:
        """Follow the simulator's prepared call of the op when it holds (None: dispatch)."""
        prep = sim._prepared.get(self.key)
        if prep is not None and not _prepared_holds(sim, self.name, prep):
            prep = None
        if prep is not self.prep:
            self.prep = prep
            self.passes = None
            if prep is not None:
                self.acts = list(zip(prep.route.plan.acts, prep.in_dtypes))
                self.passes = _plain_pass_through(prep, self.acts)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.full.form is not None:  # the arguments as the capture saw them
            args, kwargs = self.full.form(args, kwargs)
        prep = self.prep
        if prep is None:
            return self.full.dispatch(args, kwargs)
        st = self.run.st
        if self.passes is not None:  # steady.compute's pass-through, its one check inline
            fn, want = self.passes
            info = st.qt.get(args[0]) if args else None
            if info is None or info.dtype is not want:
                return self.full.dispatch(args, kwargs)
            out = fn(*args, **kwargs)
            if info.codes is not None:  # the output keeps the quantization, not the codes
                info = QInfo(info.dtype, info.scale, zero_point=info.zero_point)
            st.qt.set(out, info)
            self.run.prepared += 1
            return out
        x_info = steady.arrived_info(self.acts, args, kwargs, st.qt, st.grid)
        if x_info is steady.MISMATCH:
            return self.full.dispatch(args, kwargs)
        if not steady.arguments_hold(prep, args, kwargs, x_info, st.qt):
            return self.full.dispatch(args, kwargs)
        out, info = steady.compute(prep, self.name, args, kwargs, x_info, st)
        st.qt.set(out, info)
        self.run.prepared += 1
        return out


def _dropout_arguments(input: Any, p: Any = 0.5, training: Any = True, inplace: Any = False):
    """``F.dropout``'s arguments by name, with its defaults."""
    return input, p, training, inplace


def _eval_dropout_input(args: tuple, kwargs: dict) -> Tensor | None:
    """The input of ``F.dropout(*args, **kwargs)`` when that call returns it itself, unchanged:
    a plain tensor, not training, not in place, p a number in [0, 1]; else None."""
    try:
        x, p, training, inplace = _dropout_arguments(*args, **kwargs)
    except TypeError:
        return None
    if type(x) is not Tensor or training or inplace or type(p) not in (float, int):
        return None
    return x if 0 <= p <= 1 else None


class _EvalDropout:
    """An eval-mode ``F.dropout`` (not modelled), which returns its input itself, unchanged:
    that input, booked as the dispatch books it (``OpDispatch._kept_input``), without calling
    the function; any other call (``_eval_dropout_input`` says None, or the op is fused into a
    GEMM) goes to the dispatch."""

    def __init__(self, full: _Full, index: int) -> None:
        self.full, self.run = full, full.run
        self.__name__ = f"ql_dropout_{index}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        full = self.full
        x = _eval_dropout_input(args, kwargs)
        if x is None or full.name in full.sim._fused_into:
            return full.dispatch(args, kwargs)
        full.sim._kept_input(x, self.run.st, full.name)
        return x


def _eval_dropout(call: OpCall) -> bool:
    """Whether the captured ``call`` is an ``F.dropout`` not modelled that returned its input."""
    if call.category is not None or call.func is not F.dropout:
        return False
    x = _eval_dropout_input(call.args, call.kwargs)
    return x is not None and call.result is x


class _Writes:
    """A call that writes into its first argument and is no captured op (item assignment):
    it runs, then the run forgets the quantization that argument carried, as the capture
    does."""

    def __init__(self, node: fx.Node, run: _Run, index: int) -> None:
        self.target, self.method, self.run = node.target, node.op == "call_method", run
        self.__name__ = f"ql_writes_{index}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.method:
            out = getattr(args[0], self.target)(*args[1:], **kwargs)
        else:
            out = self.target(*args, **kwargs)
        self.run.st.forget(args[0])
        return out


class _Fused:
    """An op fused into a GEMM when the program was built: its input when it is still fused
    into a GEMM that ran with its chain in this call (the dispatch's test), else the dispatch."""

    def __init__(self, slot: A.Slot, full: _Full, index: int) -> None:
        self.slot, self.full, self.run = slot, full, full.run
        self.__name__ = f"ql_fused_{index}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.full.form is not None:
            args, kwargs = self.full.form(args, kwargs)
        head = self.full.sim._fused_into.get(self.full.name)
        if head is not None and head in self.run.st.fused_done:
            return A.get(args, kwargs, self.slot)
        return self.full.dispatch(args, kwargs)


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
        self._run = _Run()
        self._code, self._steps, self.counts = _compile(
            sim, gm, calls_of, forms, writes, hits, self._run, mode
        )
        # where the model holds the modules the trace went through and the tensors it read
        paths = attr_paths(graph, sim.model) + [p for p in tracer.modules if p]  # not ""
        self._holders = _holders(sim.model, paths)
        self._modules = list(sim.model.named_modules())
        self._settings = _settings([sim.model, *tracer.modules.values()])
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
        for d, key, obj in self._holders:
            if d.get(key) is not obj:
                return False
        if _hooked(self._modules) is not None:
            return False
        for d, key, value in self._settings:
            now = d.get(key, _MISSING)
            if now is not value and now != value:
                return False
        return self.guard is None or self.guard.holds(inputs)


def _hooked(named_modules) -> str | None:
    """Who has forward hooks a traced program would skip: "the process" (global module hooks),
    else the first of ``named_modules`` ((name, module) pairs) with hooks of its own; None."""
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return "the process (global module hooks)"
    for name, m in named_modules:
        if m._forward_hooks or m._forward_pre_hooks:
            return f"module {name or type(m).__name__}"
    return None


def _plain_pass_through(prep: steady.PreparedCall, acts: list) -> tuple | None:
    """(function, dtype) of a prepared pass-through op whose only check per call is that its
    one activation, the first positional argument, arrives quantized at that dtype (what
    ``steady.arrived_info`` and ``steady.arguments_hold`` check of it), else None."""
    if not prep.passes or prep.layout or prep.kernel is not None or prep.fixed is not None:
        return None
    if prep.statics or prep.x_scale is not None or len(acts) != 1:
        return None
    slot, want = acts[0]
    if slot != ("a", 0) or not isinstance(want, DType):
        return None
    return prep.route.fn, want


def _prepared_holds(sim: Any, name: str, prep: steady.PreparedCall) -> bool:
    """What ``steady.prepared_value`` checks about the simulator for op ``name`` (not about
    the call's arguments): the prepared call is current and everything it was made from holds."""
    cached = sim._plans.get(name)
    if (
        sim._prepared.get((name, prep.route.mode)) is not prep
        or cached is None
        or cached[1] is not prep.route.plan
        or not steady.holds(sim, name, prep)
    ):
        return False
    if prep.weight is not None and prep.weight._version != prep.weight_version:
        return False
    if prep.bias is not None and prep.bias._version != prep.bias_version:
        return False
    return True


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


def _compile(
    sim: Any,
    gm: fx.GraphModule,
    calls_of: dict,
    forms: dict,
    writes: set,
    hits: set,
    run: _Run,
    mode: Mode,
):
    """The traced graph with every captured node's call replaced by its step; the generated
    module, its prepared steps and the count of each kind.

    Each attribute the graph reads becomes one flat attribute of the generated module, bound to
    the object the path led to when building: while the program's checks hold, every such
    path of the model still leads to the same object (``_holders``), and the trace's own
    constants belong to it. The generated code then reads one attribute where it walked the
    module tree (four to six lookups per parameter)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    prepared: list[_Prepared] = []
    counts = {"prepared": 0, "fused": 0, "kept": 0, "dispatched": 0}
    attrs: dict[str, Any] = {}
    for i, node in enumerate(gm.graph.nodes):
        if node.op == "get_attr":
            name = f"ql_attr_{len(attrs)}"
            attrs[name] = fetch(gm, node.target)
            env[node] = graph.get_attr(name)
            continue
        calls = calls_of.get(node)
        if calls is None and node in writes:
            args = fx.node.map_arg(node.args, env.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
            env[node] = graph.call_function(_Writes(node, run, i), args, kwargs)
            continue
        if calls is None:
            env[node] = graph.node_copy(node, env.__getitem__)
            continue
        call = calls[0]
        full = _Full(sim, run, call, forms[node], i)
        step: Callable = full
        head = sim._fused_into.get(call.name)
        if call.name in hits:
            step = _Prepared(full, i, mode)
            prepared.append(step)
            counts["prepared"] += 1
        elif head is not None and call.category is not None:
            plan = A.plan_of(call, sim._plans)
            step = _Fused(plan.acts[0], full, i)
            counts["fused"] += 1
        elif _eval_dropout(call) and forms[node] is None:
            step = _EvalDropout(full, i)
            counts["kept"] += 1
        else:
            counts["dispatched"] += 1
        args = fx.node.map_arg(node.args, env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
        env[node] = graph.call_function(step, args, kwargs)  # a method's self is args[0]
    return fx.GraphModule(attrs, graph), prepared, counts
