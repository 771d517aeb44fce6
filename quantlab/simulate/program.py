"""A steady FAKE run compiled to straight-line code: the per-op capture traced away.

A steady FAKE run (``Simulator.run(..., mode=FAKE)`` with no per-op overrides, replay, trace
or gradients) pays for seeing each op: the module hooks that name its path, the torch-function
mode that hands the call over, and the checks of its prepared call (``steady``). A
``FakeProgram`` traces the model once with torch.fx (every module inlined, in eval mode), names
each traced call as the capture names it, and generates Python code in which

- an op that followed its prepared call in the build run computes as the simulator's current
  prepared call of it does (its fake-quantized weight and bias, its function, its output fake
  quant) when that call's checks hold: those about the simulator (routes, resolved qconfig,
  scales, platform, weight and bias versions) once per program call, the quantization its
  activation inputs arrived with per call; otherwise, as after a change of qconfig, scales or
  mode, it goes through the dispatch, which prepares it anew for the next call;
- an op fused into its GEMM (a clamp after a Conv) returns its input when the GEMM ran fused;
- every other captured op goes through the simulator's dispatch as in a captured run.

What the traced code itself assumes (the inputs' shapes, strides, dtypes and devices; the
model holding the same modules, parameters and buffers; the plain settings of those modules,
such as a convolution's stride or a norm's eps; no module hooks) is checked once per program
call; when any of it changed, the call runs ``Simulator.run`` instead (counted in
``fallbacks``; build a new program with ``Simulator.fake_program``).

Contract: for inputs with the example's signature, ``program(*inputs)`` returns the same bits as
``sim.run(*inputs, mode=Mode.FAKE)``. Building proves it on the example inputs: the traced
graph's captured run must name the same ops in the same order and give the same output bits as
the model's, and so must the program. Not detected after building: a change to a Python value
``forward`` reads that is not a plain setting of a traced module (a global, a closure
variable, a list or dict attribute); build the program again then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.fx as fx
from torch import Tensor, nn
from torch.nn.modules import module as nn_module

from quantlab.capture import CaptureMode, OpCall, is_float_output, mutates
from quantlab.simulate import args as A
from quantlab.simulate import steady
from quantlab.simulate.model_inputs import mark_quantized_inputs
from quantlab.simulate.modes import Mode
from quantlab.simulate.qtensor import QInfo


class ProgramError(ValueError):
    """The model cannot run as a traced FAKE program (the reason is in the message)."""


# what a traced tensor answers from the example's value (fixed by the input signature)
_LAYOUT_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "layout", "is_cuda"})
_LAYOUT_METHODS = frozenset(
    {"dim", "ndimension", "size", "numel", "nelement", "stride", "is_contiguous"}
    | {"is_floating_point", "is_complex", "element_size", "get_device"}
)


class _ConcreteProxy(fx.Proxy):
    """A traced value that knows the example's value: layout questions (shape, dtype, size(),
    dim(), len()) get the example's answers, as constants of the traced code; everything that
    depends on the values (``bool``, ``item``) stays symbolic, so data-dependent control flow
    still fails to trace."""

    def __getattr__(self, k: str) -> Any:
        if k in _LAYOUT_ATTRS or k in _LAYOUT_METHODS:
            return getattr(self.tracer.values[self.node], k)
        return super().__getattr__(k)

    def __len__(self) -> int:
        return len(self.tracer.values[self.node])

    def __iter__(self):
        return iter([self[i] for i in range(len(self))])


def _value_of(a: Any, values: dict) -> Any:
    return (
        values[a.node]
        if isinstance(a, fx.Proxy)
        else values.get(a, a)
        if isinstance(a, fx.Node)
        else a
    )


class _NamingTracer(fx.Tracer):
    """torch.fx tracer that inlines every module, tags each node with the module path the
    capture would name it under (``node.meta["ql_path"]``) and computes every node's value on
    the example inputs as it goes (``values``), so layout questions have concrete answers."""

    def __init__(
        self, names: dict[int, tuple[nn.Module, str]], inputs: tuple, leaves: tuple = ()
    ) -> None:
        super().__init__(autowrap_functions=leaves)
        self._constants = 0
        self._names = names
        self._inputs = [x.clone() if isinstance(x, Tensor) else x for x in inputs]
        self.stack = [""]
        self.modules: dict[str, nn.Module] = {}
        self.values: dict[fx.Node, Any] = {}

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return False

    def call_module(self, m: nn.Module, forward: Callable, args: tuple, kwargs: dict) -> Any:
        entry = self._names.get(id(m))
        if entry is None or entry[0] is not m:
            raise ProgramError(f"module {type(m).__name__} is not held by the model")
        self.stack.append(entry[1])
        self.modules[entry[1]] = m
        try:
            return forward(*args, **kwargs)
        finally:
            self.stack.pop()

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ConcreteProxy(node, self)

    def create_arg(self, a: Any) -> Any:
        """A dataclass instance (a model's config handed to a leaf function) is passed as
        itself, a constant of the traced code, rather than rebuilt field by field per call."""
        if dataclasses.is_dataclass(a) and not isinstance(a, type):
            name = f"_ql_constant_{self._constants}"
            self._constants += 1
            setattr(self.root, name, a)  # moved to the generated module after tracing
            return self.create_node("get_attr", name, (), {})
        return super().create_arg(a)

    def create_node(self, kind, target, args, kwargs, name=None, type_expr=None) -> fx.Node:
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        node.meta["ql_path"] = self.stack[-1]
        values = self.values
        if kind == "placeholder":
            i = sum(1 for n in values if n.op == "placeholder")
            values[node] = self._inputs[i] if i < len(self._inputs) else (args or (None,))[0]
        elif kind == "get_attr":
            values[node] = _fetch(self.root, target)
        elif kind in ("call_function", "call_method"):
            cargs = fx.node.map_aggregate(args, lambda a: _value_of(a, values))
            ckw = fx.node.map_aggregate(kwargs, lambda a: _value_of(a, values))
            try:
                if kind == "call_function":
                    values[node] = target(*cargs, **ckw)
                else:
                    values[node] = getattr(cargs[0], target)(*cargs[1:], **ckw)
            except Exception as e:
                what = getattr(target, "__name__", str(target))
                raise ProgramError(
                    f"torch.fx cannot trace {type(self.root).__name__}: the traced call {what} "
                    f"in module {self.stack[-1] or 'the model itself'} fails on the example "
                    f"inputs ({type(e).__name__}: {e}); the model's code takes another path "
                    "when traced than when it runs"
                ) from e
        return node


class _PathStack:
    """Stands in for the ModuleTracker while the traced graph runs node by node."""

    def __init__(self) -> None:
        self.stack = [""]


def _holding_dict(obj: Any, part: str) -> dict | None:
    """The dictionary of ``obj`` that holds attribute ``part``: a module's ``_parameters``,
    ``_buffers`` or ``_modules``, else its ``__dict__`` (None: none holds it). Read directly,
    not through ``nn.Module.__getattr__``, which torch.fx patches while it traces."""
    for name in ("_parameters", "_buffers", "_modules", "__dict__"):
        d = getattr(obj, name, None)
        if d is not None and part in d:
            return d
    return None


def _fetch(root: nn.Module, path: str) -> Any:
    """The object at dotted ``path`` from ``root`` (``_holding_dict`` at each step, else a plain
    attribute); AttributeError when the path leads nowhere."""
    obj = root
    for part in path.split("."):
        d = _holding_dict(obj, part)
        obj = d[part] if d is not None else getattr(obj, part)
    return obj


def _holders(root: nn.Module, paths: list[str]) -> list[tuple[dict, str, Any]]:
    """(dictionary, key, object) for each step of each attribute path from ``root``: the
    ``_holding_dict`` entry that holds the next object. The path still leads to the same
    objects while every entry holds them."""
    seen: dict[tuple[int, str], tuple[dict, str, Any]] = {}
    for path in paths:
        obj = root
        for part in path.split("."):
            d = _holding_dict(obj, part)
            if d is None:
                raise ProgramError(f"traced attribute {path} is not held by a module dictionary")
            child = d[part]
            seen[(id(d), part)] = (d, part, child)
            obj = child
    return list(seen.values())


_MISSING = object()
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


def _signature(inputs: tuple) -> tuple:
    """What the traced code may have taken as constant about the inputs: each tensor's shape,
    strides, dtype and device; every other input's value."""
    sig = []
    for x in inputs:
        if isinstance(x, Tensor):
            sig.append((Tensor, tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad))
        else:
            sig.append((type(x), x))
    return tuple(sig)


def _same_bits(a: Any, b: Any) -> bool:
    """Identical values (NaN matching NaN, -0.0 not matching +0.0), dtypes and shapes, through
    tuples, lists and dicts."""
    if isinstance(a, Tensor):
        if not isinstance(b, Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if not a.is_floating_point():
            return bool(torch.equal(a, b))
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        return bool((same & (torch.signbit(a) == torch.signbit(b))).all())
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_bits, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_bits(a[k], b[k]) for k in a)
    return a == b


class _Run:
    """The run state the program's steps share (set per program call) and how many ops
    computed by their prepared call in it."""

    st: Any = None
    prepared: int = 0


class _Full:
    """A captured op run through the simulator's dispatch, as the capture would hand it over."""

    def __init__(self, sim: Any, run: _Run, call: OpCall, swap: bool, index: int) -> None:
        self.sim, self.run, self.swap = sim, run, swap
        self.name, self.op_type, self.category = call.name, call.op_type, call.category
        self.module, self.call_index, self.func = call.module, call.call_index, call.func
        self.mutates = call.category is None and mutates(call.func)
        self.__name__ = f"ql_full_{index}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.dispatch((args[1], args[0]) if self.swap else args, kwargs)

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
        return self.sim._dispatch(call, self.run.st)


class _Prepared:
    """An op that followed its prepared call when the program was built: the simulator's
    current prepared call of the op, computed directly when every check of it holds (those
    about the simulator once per program call, in ``bind``; the quantization its activation
    inputs arrived with per call), else the dispatch, as a captured run would."""

    def __init__(self, full: _Full, index: int) -> None:
        self.full, self.run, self.name = full, full.run, full.name
        self.prep: steady.PreparedCall | None = None
        self.__name__ = f"ql_prepared_{index}"

    def bind(self, sim: Any) -> None:
        """Follow the simulator's prepared call of the op when it holds (None: dispatch)."""
        prep = sim._prepared.get(self.name)
        if prep is not None and not _prepared_holds(sim, self.name, prep):
            prep = None
        if prep is not self.prep:
            self.prep = prep
            if prep is not None:
                self.plan = prep.route.plan
                self.acts = list(zip(self.plan.acts, prep.in_dtypes))
                self.chain = bool(prep.route.chain)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.full.swap:  # the operator's reflected form: the captured order
            args = (args[1], args[0])
        prep = self.prep
        if prep is None:
            return self.full.dispatch(args, kwargs)
        st = self.run.st
        qt, plan = st.qt, self.plan
        x_info = None
        for i, (slot, want) in enumerate(self.acts):
            v = A.get(args, kwargs, slot)
            if want is None:
                if isinstance(v, Tensor) and v.is_floating_point():
                    return self.full.dispatch(args, kwargs)
                continue
            info = qt.get(v)
            if info is None or info.dtype is not want:
                return self.full.dispatch(args, kwargs)
            if i == 0:
                x_info = info
        if prep.passes:  # a pass-through op: its output keeps its input's quantization
            out = prep.route.fn(*args, **kwargs)
            qt.set(out, QInfo(x_info.dtype, x_info.scale, zero_point=x_info.zero_point))
            self.run.prepared += 1
            return out
        a = list(args)
        kw = dict(kwargs) if kwargs else {}
        if prep.weight is not None:
            A.put(a, kw, plan.weight, prep.weight_value)
        if prep.bias is not None:
            if x_info is None or x_info.scale is not prep.x_scale:
                return self.full.dispatch(args, kwargs)
            A.put(a, kw, plan.bias, prep.bias_value)
        if self.chain:
            st.fused_done.add(self.name)
        out = prep.fq(prep.route.fn(*a, **kw), inplace=prep.owned)
        qt.set(out, prep.out_info)
        self.run.prepared += 1
        return out


class _Fused:
    """An op fused into a GEMM when the program was built: its input when it is still fused
    into a GEMM that ran with its chain in this call (the dispatch's test), else the dispatch."""

    def __init__(self, slot: A.Slot, full: _Full, index: int) -> None:
        self.slot, self.full, self.run = slot, full, full.run
        self.__name__ = f"ql_fused_{index}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.full.swap:
            args = (args[1], args[0])
        head = self.full.sim._fused_into.get(self.full.name)
        if head is not None and head in self.run.st.fused_done:
            return A.get(args, kwargs, self.slot)
        return self.full.dispatch(args, kwargs)


class FakeProgram:
    """``sim``'s steady FAKE run of its model as generated code (see the module docstring).

    ``program(*inputs)`` returns the bits of ``sim.run(*inputs, mode=Mode.FAKE)``; ``fallbacks``
    counts the calls that ran ``Simulator.run`` because the inputs or the model changed;
    ``counts``: how many captured ops the code has as prepared, fused and dispatched steps."""

    def __init__(self, sim: Any, inputs: tuple, leaves: Iterable[Callable] = ()) -> None:
        self.sim, self._model = sim, sim.model
        self.fallbacks = 0
        self._signature = _signature(inputs)
        ref = _reference_run(sim, inputs)
        leaves = (*getattr(sim.model, "trace_leaves", ()), *leaves)
        graph, tracer, gm = _trace(sim.model, inputs, leaves)
        calls_of, swaps, hits = _named_run(sim, gm, inputs, ref, leaves)
        self._run = _Run()
        self._code, self._steps, self.counts = _compile(sim, gm, calls_of, swaps, hits, self._run)
        # where the model holds the modules the trace went through and the tensors it read
        paths = _attr_paths(graph, sim.model) + [p for p in tracer.modules if p]  # not ""
        self._holders = _holders(sim.model, paths)
        self._modules = [m for _, m in sim.model.named_modules()]
        self._settings = _settings([sim.model, *tracer.modules.values()])
        out = self._execute(inputs)
        if not _same_bits(out, ref):
            raise ProgramError("the compiled program's output differs from the FAKE run's")

    # ------------------------------------------------------------------ running
    def __call__(self, *inputs: Any) -> Any:
        if not self._holds(inputs):
            self.fallbacks += 1
            return self.sim.run(*inputs, mode=Mode.FAKE)
        return self._execute(inputs)

    @property
    def last_prepared(self) -> int:
        """How many ops of the latest program call computed by their prepared call (the
        others went through the dispatch, as after a change of qconfig, scales or mode)."""
        return self._run.prepared

    def _execute(self, inputs: tuple) -> Any:
        sim = self.sim
        for step in self._steps:
            step.bind(sim)
        st = sim._new_state(Mode.FAKE, None, None)
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
        scales. (What each prepared call assumed about the simulator is checked by its step's
        ``bind``.)"""
        sim = self.sim
        if _signature(inputs) != self._signature or sim.model is not self._model:
            return False
        if sim._learned_scales is not None or not sim._calibrated:
            return False
        for d, key, obj in self._holders:
            if d.get(key) is not obj:
                return False
        if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
            return False
        for m in self._modules:
            if m._forward_hooks or m._forward_pre_hooks:
                return False
        for d, key, value in self._settings:
            now = d.get(key, _MISSING)
            if now is not value and now != value:
                return False
        return True


def _prepared_holds(sim: Any, name: str, prep: steady.PreparedCall) -> bool:
    """What ``steady.prepared_value`` checks about the simulator for op ``name`` (not about
    the call's arguments): the prepared call is current and everything it was made from holds."""
    r = prep.route
    cached = sim._plans.get(name)
    if (
        sim._prepared.get(name) is not prep
        or cached is None
        or cached[1] is not r.plan
        or sim._routes.get((name, Mode.FAKE)) is not r
        or sim._resolved.get(name) is not r.rq
        or sim.platform is not r.platform
        or sim.fake_ops is not prep.fake_ops
        or (r.chain is not None and sim._chain.get(name) is not r.chain)
        or (r.chain and sim._fused_clamp(name) != prep.bounds)
        or (not prep.passes and sim._scale_cache.get(prep.point_key) is not prep.point)
    ):
        return False
    if prep.weight is not None and prep.weight._version != prep.weight_version:
        return False
    if prep.bias is not None and prep.bias._version != prep.bias_version:
        return False
    return True


# ---------------------------------------------------------------------- building
def _reference_run(sim: Any, inputs: tuple) -> Any:
    """Two steady FAKE runs (the first prepares the calls, the second follows them)."""
    if not sim._calibrated:
        raise ProgramError("fake_program needs calibrate(batches) first")
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        raise ProgramError("global module forward hooks are set; a traced program skips them")
    for name, m in sim.model.named_modules():
        if m._forward_hooks or m._forward_pre_hooks:
            raise ProgramError(
                f"module {name or type(m).__name__} has forward hooks; a traced program skips them"
            )
    sim.run(*inputs, mode=Mode.FAKE)
    return sim.run(*inputs, mode=Mode.FAKE)


def _trace(
    model: nn.Module, inputs: tuple, leaves: tuple = ()
) -> tuple[fx.Graph, _NamingTracer, fx.GraphModule]:
    """The model traced in eval mode (every module inlined, layout answers from ``inputs``).
    The model is left as it was: its train flags restored, and the constants torch.fx puts on
    the root module moved to the generated module. ProgramError when tracing fails or changes
    one of the model's tensors in place."""
    names = {id(m): (m, n) for n, m in model.named_modules()}
    tracer = _NamingTracer(names, inputs, leaves)
    training = [m for m in model.modules() if m.training]
    versions = [(t, t._version) for t in (*model.parameters(), *model.buffers())]
    before = set(model.__dict__)
    try:
        model.eval()
        with torch.no_grad():
            graph = tracer.trace(model)
        gm = fx.GraphModule(model, graph)
    except ProgramError:
        raise
    except Exception as e:  # torch.fx's own errors: data-dependent control flow and the like
        raise ProgramError(
            f"torch.fx cannot trace {type(model).__name__}: {type(e).__name__}: {e}"
        ) from e
    finally:
        for m in training:
            m.training = True
        for k in set(model.__dict__) - before:  # torch.fx's tensor constants
            del model.__dict__[k]
    if any(t._version != v for t, v in versions):
        raise ProgramError(f"{type(model).__name__}.forward changes its own tensors in place")
    return graph, tracer, gm


def _attr_paths(graph: fx.Graph, model: nn.Module) -> list[str]:
    """The model's attributes the graph reads (not the constants the trace made)."""
    found = []
    for target in sorted({n.target for n in graph.nodes if n.op == "get_attr"}):
        try:
            _fetch(model, target)
        except AttributeError:
            continue
        found.append(target)
    return found


def _named_run(sim: Any, gm: fx.GraphModule, inputs: tuple, ref: Any, leaves: tuple = ()):
    """Run the traced graph node by node under the simulator's capture (each node under its
    module path) as a steady FAKE run. Returns each node's captured calls, whether each call's
    two operands are the node's swapped (``_swapped``) and the ops whose prepared call held;
    ProgramError unless the op order and the output are those of the model's own run."""
    st = sim._new_state(Mode.FAKE, None, None)
    st.prepared_hits = set()
    mark_quantized_inputs(st.qt, inputs, sim.input_quant)
    paths = _PathStack()
    calls_of: dict[fx.Node, list[OpCall]] = {}
    current: list[fx.Node | None] = [None]

    def handler(call: OpCall) -> Any:
        calls_of.setdefault(current[0], []).append(call)
        return sim._handle(call)

    env: dict[fx.Node, Any] = {}
    node_args: dict[fx.Node, tuple] = {}  # the values each node was called with
    it = iter(inputs)
    prev, sim._state = sim._state, st
    try:
        with torch.no_grad(), CaptureMode(paths, handler, st.forget):
            for node in gm.graph.nodes:
                current[0] = node
                paths.stack = ["", node.meta.get("ql_path", "")]
                args = fx.node.map_arg(node.args, env.__getitem__)
                kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
                node_args[node] = (tuple(args), dict(kwargs))
                if node.op == "placeholder":
                    env[node] = next(it, node.args[0] if node.args else None)
                elif node.op == "get_attr":
                    env[node] = _fetch(gm, node.target)
                elif node.op == "call_function":
                    env[node] = node.target(*args, **kwargs)
                elif node.op == "call_method":
                    env[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
                elif node.op == "output":
                    out = args[0]
                else:
                    raise ProgramError(f"unexpected traced node {node.op} {node.target}")
    finally:
        sim._state = prev
    if st.order != sim._order:
        raise ProgramError(
            "the traced graph does not call the model's ops in the model's order "
            f"({len(st.order)} ops traced, {len(sim._order)} in the model's run)"
        )
    if not _same_bits(out, ref):
        raise ProgramError("the traced graph's FAKE run differs from the model's")
    for node, calls in calls_of.items():
        if len(calls) != 1 or node is None or node.op not in ("call_function", "call_method"):
            raise ProgramError(f"traced node {node} made {len(calls)} captured calls")
    swaps = {}
    leaf_ids = {id(f) for f in leaves}
    for node, calls in calls_of.items():
        if node.op == "call_function" and id(node.target) in leaf_ids:
            raise ProgramError(
                f"leaf function {node.target.__name__} computes captured ops "
                f"({', '.join(c.name for c in calls)}); a leaf is called as it is, so its "
                "ops would not be quantized"
            )
        swaps[node] = _swapped(node, node_args[node], calls[0])
    return calls_of, swaps, st.prepared_hits


def _same_arg(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same_arg, a, b))
    return type(a) is type(b) and a == b


def _swapped(node: fx.Node, node_args: tuple, call: OpCall) -> bool:
    """How the captured call's arguments come from the node's: as they are (False), or the two
    operands of an operator swapped (True: ``2 * x`` is captured as ``x.mul(2)``).
    ProgramError for any other relation (a step replaces the node by the captured function)."""
    args, kwargs = node_args
    if kwargs.keys() != call.kwargs.keys() or not all(
        _same_arg(v, call.kwargs[k]) for k, v in kwargs.items()
    ):
        raise ProgramError(f"traced node {node} was captured with other keyword arguments")
    if len(args) == len(call.args) and all(map(_same_arg, args, call.args)):
        return False
    if len(args) == 2 == len(call.args) and _same_arg(args, call.args[::-1]):
        return True
    raise ProgramError(f"traced node {node} ({node.target}) was captured with other arguments")


def _compile(sim: Any, gm: fx.GraphModule, calls_of: dict, swaps: dict, hits: set, run: _Run):
    """The traced graph with every captured node's call replaced by its step; the generated
    module, its prepared steps and the count of each kind."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    prepared: list[_Prepared] = []
    counts = {"prepared": 0, "fused": 0, "dispatched": 0}
    for i, node in enumerate(gm.graph.nodes):
        calls = calls_of.get(node)
        if calls is None:
            env[node] = graph.node_copy(node, env.__getitem__)
            continue
        call = calls[0]
        full = _Full(sim, run, call, swaps[node], i)
        step: Callable = full
        head = sim._fused_into.get(call.name)
        if call.name in hits:
            step = _Prepared(full, i)
            prepared.append(step)
            counts["prepared"] += 1
        elif head is not None and call.category is not None:
            plan = A.plan_of(call, sim._plans)
            step = _Fused(plan.acts[0], full, i)
            counts["fused"] += 1
        else:
            counts["dispatched"] += 1
        args = fx.node.map_arg(node.args, env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
        env[node] = graph.call_function(step, args, kwargs)  # a method's self is args[0]
    return fx.GraphModule(gm, graph), prepared, counts
