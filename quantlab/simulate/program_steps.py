"""The steps of a traced program's generated code (``quantlab.simulate.program``): each captured
call of the traced graph becomes one step, which computes as a captured run would.

- ``_Prepared``: an op that followed its prepared call when the program was built;
- ``_Fused``: an op fused into its GEMM;
- ``_EvalDropout``: an eval-mode ``F.dropout``;
- ``_Writes``: item assignment, no captured op, after which the run forgets what it overwrote;
- ``_Full``: every other captured op, through the simulator's dispatch.

``compile_steps`` writes the generated module; ``ProgramRun`` is the run state its steps share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx as fx
import torch.nn.functional as F
from torch import Tensor

from quantlab.capture import OpCall, is_float_output, mutates
from quantlab.numerics.dtypes import DType
from quantlab.simulate import args as A
from quantlab.simulate import steady
from quantlab.simulate.modes import Mode
from quantlab.simulate.qtensor import QInfo
from quantlab.simulate.traced_graph import call_node, fetch


class ProgramRun:
    """The run state the program's steps share (set per program call) and how many ops
    computed by their prepared call in it."""

    st: Any = None
    prepared: int = 0


class _Full:
    """A captured op run through the simulator's dispatch, as the capture would hand it over."""

    def __init__(self, sim: Any, run: ProgramRun, call: OpCall, form: Callable | None, index: int):
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
        self.one: DType | None = None  # the dtype of an op's one activation input (_one_input)
        self.__name__ = f"ql_prepared_{index}"

    def bind(self, sim: Any) -> None:
        """Follow the simulator's prepared call of the op when it holds (None: dispatch)."""
        prep = sim._prepared.get(self.key)
        if prep is not None and not _prepared_holds(sim, self.name, prep):
            prep = None
        if prep is not self.prep:
            self.prep = prep
            self.passes = self.one = None
            if prep is not None:
                self.acts = list(zip(prep.route.plan.acts, prep.in_dtypes))
                self.passes = _plain_pass_through(prep, self.acts)
                self.one = _one_input(prep, self.acts)

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
        one = self.one
        if one is not None:  # arrived_info and arguments_hold of one input, inline
            x_info = st.qt.get(args[0]) if args else None
            if (
                x_info is None
                or x_info.dtype is not one
                or (prep.x_scale is not None and x_info.scale is not prep.x_scale)
            ):
                return self.full.dispatch(args, kwargs)
        else:
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

    def __init__(self, node: fx.Node, run: ProgramRun, index: int) -> None:
        self.kind, self.target, self.run = node.op, node.target, run
        self.__name__ = f"ql_writes_{index}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = call_node(self.kind, self.target, args, kwargs)
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


def _plain_pass_through(prep: steady.PreparedCall, acts: list) -> tuple | None:
    """(function, dtype) of a prepared pass-through op whose only check per call is that its
    one activation, the first positional argument, arrives quantized at that dtype (what
    ``steady.arrived_info`` and ``steady.arguments_hold`` check of it), else None."""
    if not prep.passes or prep.layout or prep.kernel is not None or prep.fixed is not None:
        return None
    want = _first_positional_dtype(acts)
    if prep.statics or prep.x_scale is not None or want is None:
        return None
    return prep.route.fn, want


def _one_input(prep: steady.PreparedCall, acts: list) -> DType | None:
    """The dtype of a prepared op's one activation input, the first positional argument, when
    what ``steady.arrived_info`` and ``steady.arguments_hold`` check of a call is that it
    arrives quantized at that dtype (and, for a bias value, with the scale object the value
    was made with), else None: not a pass-through, a FIXED GEMM's run or a composite with
    other arguments to check."""
    if prep.passes or prep.fixed is not None or prep.statics:
        return None
    return _first_positional_dtype(acts)


def _first_positional_dtype(acts: list) -> DType | None:
    """The dtype a prepared op's only activation input, the first positional argument,
    arrived with (not an ``OnGrid`` or ``QuantizeHere`` input), else None."""
    if len(acts) != 1:
        return None
    slot, want = acts[0]
    return want if slot == ("a", 0) and isinstance(want, DType) else None


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


def compile_steps(
    sim: Any,
    gm: fx.GraphModule,
    calls_of: dict,
    forms: dict,
    writes: set,
    hits: set,
    run: ProgramRun,
    mode: Mode,
):
    """The traced graph with every captured node's call replaced by its step; the generated
    module, its prepared steps and the count of each kind.

    Each attribute the graph reads becomes one flat attribute of the generated module, bound to
    the object the path led to when building: while the program's checks hold, every such
    path of the model still leads to the same object (``program._holders``), and the trace's own
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
