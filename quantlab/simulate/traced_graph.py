"""Tracing a model for a ``Program``: a torch.fx graph whose calls the capture can name.

``trace_model`` traces the model once with torch.fx, every module inlined, in eval mode, each
node tagged with the module path the capture names its call under. Layout questions (``shape``,
``size()``, ``dim()``, ``len()``) get the example inputs' answers, as constants of the traced
code; everything that depends on the values stays symbolic, so value-dependent control flow
fails to trace. ``named_run`` runs that graph node by node under the simulator's real capture
and ties each node to its captured call; it refuses a graph whose ops, op order or output bits
are not the model's own.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch import Tensor, nn
from torch.fx.immutable_collections import immutable_dict, immutable_list

from quantlab.capture import IN_PLACE_OPERATORS, CaptureMode, ModelConstants, OpCall
from quantlab.decompositions import decomposition
from quantlab.simulate.model_inputs import mark_quantized_inputs
from quantlab.simulate.modes import Mode


class ProgramError(ValueError):
    """The model cannot run as a traced program (the reason is in the message)."""


# what a traced tensor answers from the example's value (fixed by the input signature)
_LAYOUT_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "layout", "is_cuda", "is_nested"})
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

    @property
    def example_value(self) -> Any:
        """The example's value of this traced value (a module's parameter for its attribute)."""
        return self.tracer.values[self.node]

    def __len__(self) -> int:
        return len(self.tracer.values[self.node])

    def __iter__(self):
        return iter([self[i] for i in range(len(self))])

    def __setitem__(self, key: Any, value: Any) -> None:
        """Item assignment (``t[:, 0] = u``) becomes an ``operator.setitem`` node; it writes
        the example's value as the model's own run does."""
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})


def _in_place_operator(name: str) -> Callable:
    """``t op= u`` as an ``operator.i<op>`` node: it writes ``t`` in place, as the model's own
    run does, so every other name bound to ``t`` sees the result (torch.fx's own proxy would
    rebind ``t`` to an out-of-place result)."""
    fn = getattr(operator, name)

    def method(self: _ConcreteProxy, other: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", fn, (self, other), {})

    method.__name__ = f"__{name}__"
    return method


for _op in IN_PLACE_OPERATORS:
    setattr(_ConcreteProxy, f"__i{_op}__", _in_place_operator(f"i{_op}"))


def call_node(kind: str, target: Any, args: tuple, kwargs: dict) -> Any:
    """What a ``call_function`` or ``call_method`` node (``kind``) computes on these argument
    values (a method's object is ``args[0]``)."""
    if kind == "call_function":
        return target(*args, **kwargs)
    return getattr(args[0], target)(*args[1:], **kwargs)


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

    def create_proxy(self, kind, target, args, kwargs, *rest, **options) -> fx.Proxy:
        """A call the capture sees as its parts (``quantlab.decompositions``) is traced as those
        parts, so the program's nodes are the captured ops (a method call as the Tensor method
        the capture sees)."""
        func = getattr(Tensor, target, None) if kind == "call_method" else target
        if kind in ("call_function", "call_method") and func is not None:
            parts = decomposition(func, args, kwargs)
            if parts is not None:
                return parts()
        return super().create_proxy(kind, target, args, kwargs, *rest, **options)

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
            values[node] = fetch(self.root, target)
        elif kind in ("call_function", "call_method"):
            cargs = fx.node.map_aggregate(args, lambda a: _value_of(a, values))
            ckw = fx.node.map_aggregate(kwargs, lambda a: _value_of(a, values))
            try:
                values[node] = call_node(kind, target, cargs, ckw)
            except Exception as e:
                what = getattr(target, "__name__", str(target))
                raise ProgramError(
                    f"torch.fx cannot trace {type(self.root).__name__}: the traced call {what} "
                    f"in module {self.stack[-1] or 'the model itself'} fails on the example "
                    f"inputs ({type(e).__name__}: {e}); the model's code takes another path "
                    "when traced than when it runs"
                ) from e
        return node


def _as_built(value: Any) -> Any:
    """``value`` with torch.fx's immutable lists and dicts (what ``fx.node.map_arg`` makes of
    a node's arguments) as the plain list and dict the model's code returns (a model returning
    a list, as onnx2torch's graphs of several outputs do, would differ from its run by type)."""
    if type(value) is immutable_list:
        return [_as_built(v) for v in value]
    if type(value) is immutable_dict:
        return {k: _as_built(v) for k, v in value.items()}
    if type(value) is tuple:
        return tuple(_as_built(v) for v in value)
    return value


class _PathStack:
    """Stands in for the ModuleTracker while the traced graph runs node by node."""

    def __init__(self) -> None:
        self.stack = [""]


def holding_dict(obj: Any, part: str) -> dict | None:
    """The dictionary of ``obj`` that holds attribute ``part``: a module's ``_parameters``,
    ``_buffers`` or ``_modules``, else its ``__dict__`` (None: none holds it). Read directly,
    not through ``nn.Module.__getattr__``, which torch.fx patches while it traces."""
    for name in ("_parameters", "_buffers", "_modules", "__dict__"):
        d = getattr(obj, name, None)
        if d is not None and part in d:
            return d
    return None


def fetch(root: nn.Module, path: str) -> Any:
    """The object at dotted ``path`` from ``root`` (``holding_dict`` at each step, else a plain
    attribute); AttributeError when the path leads nowhere."""
    obj = root
    for part in path.split("."):
        d = holding_dict(obj, part)
        obj = d[part] if d is not None else getattr(obj, part)
    return obj


def same_bits(a: Any, b: Any) -> bool:
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
        return type(a) is type(b) and len(a) == len(b) and all(map(same_bits, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)
    return a == b


def trace_model(
    model: nn.Module, inputs: tuple, leaves: tuple = ()
) -> tuple[fx.Graph, _NamingTracer, fx.GraphModule]:
    """The model traced in eval mode (every module inlined, layout answers from ``inputs``).
    The model is left as it was: its train flags restored, the constants torch.fx puts on
    the root module moved to the generated module, recurrent modules' weight lists rebuilt.
    ProgramError when tracing fails or changes one of the model's tensors in place."""
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
        _rebuild_recurrent_weight_lists(model)
    if any(t._version != v for t, v in versions):
        raise ProgramError(f"{type(model).__name__}.forward changes its own tensors in place")
    return graph, tracer, gm


def _rebuild_recurrent_weight_lists(model: nn.Module) -> None:
    """nn.LSTM / nn.GRU / nn.RNN keep a list of their weights (and weak references to them)
    that their forward rebuilds when it reads other weight objects, as it does under the trace
    (the traced values): rebuild it from the modules' own parameters."""
    for m in model.modules():
        if isinstance(m, nn.RNNBase) and hasattr(m, "_init_flat_weights"):
            m._init_flat_weights()


def attr_paths(graph: fx.Graph, model: nn.Module) -> list[str]:
    """The model's attributes the graph reads (not the constants the trace made)."""
    found = []
    for target in sorted({n.target for n in graph.nodes if n.op == "get_attr"}):
        try:
            fetch(model, target)
        except AttributeError:
            continue
        found.append(target)
    return found


def named_run(
    sim: Any, gm: fx.GraphModule, inputs: tuple, ref: Any, mode: Mode, leaves: tuple = ()
):
    """Run the traced graph node by node under the simulator's capture (each node under its
    module path) as a steady run in ``mode``. Returns each node's captured calls, how each
    call's arguments come from the node's (``_captured_form``), the nodes that write into their
    first argument by a call the capture runs without a captured op (item assignment), and the
    ops whose prepared call held (FAKE); ProgramError unless the op order and the output are
    those of the model's own run."""
    st = sim._new_state(mode, None, None)
    st.prepared_hits = set()
    mark_quantized_inputs(st.qt, inputs, sim.input_quant)
    paths = _PathStack()
    calls_of: dict[fx.Node, list[OpCall]] = {}
    current: list[fx.Node | None] = [None]

    def handler(call: OpCall) -> Any:
        calls_of.setdefault(current[0], []).append(call)
        return sim._handle(call)

    written: dict[fx.Node, list[Tensor]] = {}  # tensors written by calls the capture ran itself

    def on_mutation(t: Tensor) -> None:
        written.setdefault(current[0], []).append(t)
        st.forget(t)

    env: dict[fx.Node, Any] = {}
    node_args: dict[fx.Node, tuple] = {}  # the values each node was called with
    it = iter(inputs)
    prev, sim._state = sim._state, st
    try:
        constants = ModelConstants([*sim.model.buffers(), *gm.buffers()])
        with torch.no_grad(), CaptureMode(paths, handler, on_mutation, constants=constants):
            for node in gm.graph.nodes:
                current[0] = node
                paths.stack = ["", node.meta.get("ql_path", "")]
                args = fx.node.map_arg(node.args, env.__getitem__)
                kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
                node_args[node] = (tuple(args), dict(kwargs))
                if node.op == "placeholder":
                    env[node] = next(it, node.args[0] if node.args else None)
                elif node.op == "get_attr":
                    env[node] = fetch(gm, node.target)
                elif node.op in ("call_function", "call_method"):
                    env[node] = call_node(node.op, node.target, args, kwargs)
                elif node.op == "output":
                    out = _as_built(args[0])
                else:
                    raise ProgramError(f"unexpected traced node {node.op} {node.target}")
    finally:
        sim._state = prev
    if st.order != sim._order:
        raise ProgramError(
            "the traced graph does not call the model's ops in the model's order "
            f"({len(st.order)} ops traced, {len(sim._order)} in the model's run)"
        )
    if not same_bits(out, ref):
        raise ProgramError(f"the traced graph's {mode.name} run differs from the model's")
    for node, calls in calls_of.items():
        if len(calls) != 1 or node is None or node.op not in ("call_function", "call_method"):
            raise ProgramError(f"traced node {node} made {len(calls)} captured calls")
    forms = {}
    leaf_ids = {id(f) for f in leaves}
    for node, calls in calls_of.items():
        if node.op == "call_function" and id(node.target) in leaf_ids:
            raise ProgramError(
                f"leaf function {node.target.__name__} computes captured ops "
                f"({', '.join(c.name for c in calls)}); a leaf is called as it is, so its "
                "ops would not be quantized"
            )
        forms[node] = _captured_form(node, node_args[node], calls[0])
    writes = set()
    for node, targets in written.items():
        if node in calls_of:  # a captured call's step forgets what it writes (``_Full``)
            continue
        args = node_args[node][0]
        if node.op not in ("call_function", "call_method") or any(
            not args or t is not args[0] for t in targets
        ):
            raise ProgramError(f"traced node {node} writes into a tensor it was not called on")
        writes.add(node)
    return calls_of, forms, writes, st.prepared_hits


def _same_arg(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same_arg, a, b))
    return type(a) is type(b) and a == b


def _swap_operands(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """An operator's reflected form: ``2 * x`` is captured as ``x.mul(2)``."""
    return (args[1], args[0]), kwargs


def _captured_form(node: fx.Node, node_args: tuple, call: OpCall) -> Callable | None:
    """How the captured call's arguments come from the node's: as they are (None), the two
    operands of an operator swapped (``_swap_operands``), or the node's arguments bound to the
    captured function's Python signature and handed over as the capture saw them (``_Rebind``:
    ``t.split([1, 3], 1)`` reaches the capture as ``Tensor.split(t, [1, 3], dim=1)``).
    ProgramError for any other relation (a step replaces the node by the captured function)."""
    args, kwargs = node_args
    if _same_arguments(args, kwargs, call):
        return None
    if len(args) == 2 and _same_arguments(args[::-1], kwargs, call):
        return _swap_operands
    rebind = _Rebind.of(call.func, len(call.args), tuple(call.kwargs))
    if rebind is not None:
        try:
            if _same_arguments(*rebind(args, kwargs), call):
                return rebind
        except TypeError:  # the node's arguments do not bind to the captured function
            pass
    raise ProgramError(f"traced node {node} ({node.target}) was captured with other arguments")


def _same_arguments(args: tuple, kwargs: dict, call: OpCall) -> bool:
    """Whether ``call`` was captured with exactly these arguments (tensors by identity)."""
    return (
        len(args) == len(call.args)
        and all(map(_same_arg, args, call.args))
        and kwargs.keys() == call.kwargs.keys()
        and all(_same_arg(v, call.kwargs[k]) for k, v in kwargs.items())
    )


class _Rebind:
    """A call's arguments rearranged as the capture saw them: bound to ``signature`` with its
    defaults, the first ``n_args`` parameters positional and ``kw_names`` by keyword."""

    def __init__(self, signature: inspect.Signature, n_args: int, kw_names: tuple) -> None:
        self.signature, self.kw_names = signature, kw_names
        self.positional = tuple(signature.parameters)[:n_args]

    @classmethod
    def of(cls, func: Callable, n_args: int, kw_names: tuple) -> _Rebind | None:
        """The rebinding for ``func``, or None where it has no Python signature that names
        every parameter (C functions, ``*args``)."""
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError):
            return None
        params = sig.parameters.values()
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            return None
        if n_args > len(sig.parameters) or not set(kw_names) <= set(sig.parameters):
            return None
        return cls(sig, n_args, kw_names)

    def __call__(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        return tuple(given[p] for p in self.positional), {k: given[k] for k in self.kw_names}
