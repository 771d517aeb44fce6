"""The one place the exporter reads a Simulator's run: one fixed-mode run, recorded.

``record_run(sim, inputs)`` runs ``sim.trace(*inputs, mode=FIXED, on_call=...)`` and records,
for every captured op in execution order, the call itself (function, arguments with every
tensor replaced by a reference to where it came from: a graph input, an earlier op's output, or
a constant), the Simulator's argument plan (which arguments are activations, weight, bias), its
resolved qconfig, and the quantization of each activation input as the fixed run applied it.
Calls that quantlab does not capture because no float tensor enters them
(``mask[:, None].to(float32)`` on an integer model input) are recorded too when they read a
graph input or an op's output, so the exported graph can recompute them; so are comparisons
(``mask == 0``), which capture passes over as no op at all. Any other call on such a tensor
that returns a tensor (``isnan``, ``argmax``, ``x.max(dim)``'s pair) or writes into one
without being recorded makes its result unexportable: a graph read of it is refused (it would
otherwise be written as a constant holding the example input's values).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from quantlab.capture import out_of_place_name
from quantlab.export.graph import UnsupportedOpError
from quantlab.op_kinds import OpCategory, classify
from quantlab.simulate import args as sim_args
from quantlab.simulate.modes import Mode, ObservedCall
from quantlab.simulate.trace_record import storage_key, written_tensor


@dataclass(frozen=True)
class InputRef:
    """Graph input ``index``."""

    index: int


@dataclass(frozen=True)
class OpRef:
    """Output leaf ``leaf`` of the recorded call ``name`` (a captured op or an auxiliary call)."""

    name: str
    leaf: int = 0


@dataclass(frozen=True)
class ConstRef:
    """A tensor the model made itself or holds (parameter, buffer, constant)."""

    value: Tensor


@dataclass(frozen=True)
class Quant:
    """An integer quantization: ``dtype`` (quantlab DType), float32 ``scale`` (one value) and
    the integer ``zero_point``."""

    dtype: Any
    scale: Tensor
    zero_point: int = 0


@dataclass
class RecordedOp:
    """One call in execution order.

    ``args``/``kwargs``: the call's arguments, tensors replaced by InputRef/OpRef/ConstRef.
    ``acts``/``weight``/``bias``: argument slots (quantlab.simulate.args), None for auxiliary
    calls. ``in_quant[i]``: the quantization activation ``acts[i]`` enters the op's arithmetic
    with (None: float). ``out_quant[j]``: the quantization of output leaf j (None: float).
    ``weight_codes``/``weight_scale``: per-output-channel integer weight of a GEMM (a fused
    batch_norm folded in, as fixed mode computes with it, and then ``folded_bias``).
    """

    name: str
    op_type: str
    category: OpCategory | None
    func_name: str
    args: tuple
    kwargs: dict
    outputs: list  # output leaves (tensors) of the fixed run
    out_quant: list
    captured: bool = True
    acts: list = field(default_factory=list)
    weight: tuple | None = None
    bias: tuple | None = None
    in_quant: list = field(default_factory=list)
    fused_into: str = ""
    qconfig: Any = None
    in_float: list = field(default_factory=list)  # whether acts[i] is a float tensor
    weight_codes: Tensor | None = None
    weight_scale: Tensor | None = None
    bounds: tuple | None = None  # (lo, hi) of a relu6 / clamp with constant bounds
    folded_bias: Tensor | None = None  # a GEMM's bias with a fused batch_norm folded in


@dataclass
class RecordedRun:
    """A recorded fixed-mode run: ``ops`` in execution order, graph ``inputs`` and ``output``
    (the model's return value, tensors replaced by references)."""

    ops: list[RecordedOp]
    inputs: tuple
    output: Any
    output_leaves: list  # the fixed-mode output tensors


class _Refs:
    """id(tensor) -> reference, holding every tensor so that no id is reused during the run.

    A graph's values never change, but a model's tensors can: an in-place op writes its target
    and, through shared storage, every view of it (``t.view(...).sigmoid_()`` changes ``t``).
    The target's reference moves to the op's output; the other tensors overlapping it in its
    storage become stale. ``stale_reads``: reader -> what it read stale (a run the graph
    cannot express if the reader's result reaches an output)."""

    def __init__(self, inputs: tuple) -> None:
        self._map: dict[int, Any] = {}
        self._keep: list = []
        self._stale: dict[int, str] = {}  # id(tensor) -> the op that wrote its storage
        self._unrecorded: dict[int, str] = {}  # id(tensor) -> why the graph cannot hold it
        self._constants: dict[int, tuple[Tensor, list]] = {}  # id -> (tensor, its ConstRefs)
        self._before: dict[int, Tensor] = {}  # a constant the current call writes: its values
        self.stale_reads: dict[str, str] = {}
        self.bind_inputs(inputs)

    def bind_inputs(self, inputs: tuple) -> None:
        """The tensors the model is called with are graph inputs (the Simulator hands a model
        that writes into its input a copy: the copy is the input then)."""
        for i, t in enumerate(inputs):
            if isinstance(t, Tensor):
                self._map[id(t)] = InputRef(i)
                self._keep.append(t)

    def ref(self, v, reader: str = ""):
        if not isinstance(v, Tensor):
            return v
        writer = self._stale.get(id(v))
        if writer is not None:
            self.stale_reads.setdefault(
                reader,
                f"op {writer} writes in place into a tensor that shares its storage with "
                f"{self._map[id(v)]}, which {reader or 'the model output'} reads afterwards; an "
                "ONNX graph cannot express a write through a view: compute that op out of "
                "place to export the model",
            )
        why = self._unrecorded.get(id(v))
        if why is not None:
            self.stale_reads.setdefault(reader, f"{reader or 'the model output'} reads {why}")
        hit = self._map.get(id(v))
        if hit is not None:
            return hit
        if id(v) in self._before:  # read by the call that writes it: its values before
            return ConstRef(self._before[id(v)])
        c = ConstRef(v)
        self._constants.setdefault(id(v), (v, []))[1].append(c)
        return c

    def before_write(self, target: Tensor) -> None:
        """A call is about to write into ``target`` in place: every constant read so far that
        shares its storage keeps the values it had when read (its ConstRefs get a copy), and a
        constant target is read by the call itself with those values (``after_write``)."""
        if id(target) not in self._map:
            self._before[id(target)] = target.detach().clone()
        key = storage_key(target)
        for i, (t, refs) in list(self._constants.items()):
            if storage_key(t) == key:
                snapshot = t.detach().clone()
                for c in refs:
                    object.__setattr__(c, "value", snapshot)
                del self._constants[i]

    def after_write(self) -> None:
        self._before.clear()

    def unrecorded(self, tensors: list, why: str) -> None:
        """``tensors`` hold values computed from the graph's inputs by a call the exporter
        does not record (``why`` says which): reading them is refused (``stale_reads``)."""
        for t in tensors:
            self._map.pop(id(t), None)
            self._stale.pop(id(t), None)
            self._unrecorded[id(t)] = why
            self._keep.append(t)

    def wrote(self, target: Tensor, writer: str) -> None:
        """``writer`` changed ``target`` in place: every other tracked tensor on its storage
        is stale from now on."""
        storage, span = storage_key(target), _span(target)
        for t in self._keep:
            if t is target or id(t) not in self._map or storage_key(t) != storage:
                continue
            lo, hi = _span(t)
            if lo < span[1] and span[0] < hi:  # overlapping ranges of the storage
                self._stale[id(t)] = writer

    def tracked(self, v) -> bool:
        return isinstance(v, Tensor) and id(v) in self._map

    def why_unrecorded(self, v) -> str | None:
        """Why ``v`` cannot be read in the graph (``unrecorded``), or None."""
        return self._unrecorded.get(id(v)) if isinstance(v, Tensor) else None

    def produce(self, name: str, out) -> list:
        leaves = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        for j, t in enumerate(leaves):
            self._map[id(t)] = OpRef(name, j)
            self._stale.pop(id(t), None)
            self._unrecorded.pop(id(t), None)
            self._keep.append(t)
        return leaves

    def refs_of(self, args, kwargs, reader: str):
        def one(v):
            return self.ref(v, reader) if isinstance(v, Tensor) else v

        return tree_map(one, tuple(args)), tree_map(one, dict(kwargs))


class _AuxMode(TorchFunctionMode):
    """Records calls on tracked tensors that quantlab's capture lets through unrecorded."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.rec = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self.rec.handled
        target = written_tensor(func, args, kwargs)
        if target is not None:
            self.rec.refs.before_write(target)
        try:
            return self._record(func, args, kwargs, before, target)
        finally:
            self.rec.refs.after_write()

    def _record(self, func, args, kwargs, before: int, target):
        out = func(*args, **kwargs)
        if self.rec.handled != before:
            return out
        leaves = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, Tensor)]
        refs = self.rec.refs
        if not any(refs.tracked(a) for a in leaves):
            why = next(filter(None, map(refs.why_unrecorded, leaves)), None)
            if why is not None:  # computed from an unrecorded result: unrecorded too
                made = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
                refs.unrecorded([t for t in made if not any(t is a for a in leaves)], why)
            return out
        kind = aux_kind(func, args, kwargs)
        if kind is not None and isinstance(out, Tensor):
            self.rec.aux(func, args, kwargs, out, kind)
            return out
        fname = getattr(func, "__name__", type(func).__name__)
        why = f"the result of `{fname}` on a traced tensor, which the exporter does not write"
        if target is not None and self.rec.refs.tracked(target):
            self.rec.refs.unrecorded([target], why)
        made = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
        self.rec.refs.unrecorded([t for t in made if not any(t is a for a in leaves)], why)
        return out


# comparisons: capture passes over them (no op), the exporter records them on traced tensors
_COMPARISONS = {
    **dict.fromkeys(("eq", "__eq__"), "eq"),
    **dict.fromkeys(("ne", "__ne__", "not_equal"), "ne"),
    **dict.fromkeys(("lt", "__lt__", "less"), "lt"),
    **dict.fromkeys(("le", "__le__", "less_equal"), "le"),
    **dict.fromkeys(("gt", "__gt__", "greater"), "gt"),
    **dict.fromkeys(("ge", "__ge__", "greater_equal"), "ge"),
}


def aux_kind(func, args: tuple, kwargs: dict) -> str | None:
    """The op type the exporter records an uncaptured call as: capture's (``classify``), or a
    comparison's; None for a call it does not record."""
    kind = classify(func, args, kwargs)
    if kind is not None:
        return kind[0]
    return _COMPARISONS.get(getattr(func, "__name__", ""))


class _Recorder:
    def __init__(self, sim, inputs: tuple) -> None:
        self.sim = sim
        self.refs = _Refs(inputs)
        self.ops: list[RecordedOp] = []
        self.handled = 0
        self._n_aux = 0

    def aux(self, func, args, kwargs, out, op_type: str) -> None:
        name = f"aux:{getattr(func, '__name__', 'call')}#{self._n_aux}"
        self._n_aux += 1
        a, k = self.refs.refs_of(args, kwargs, name)
        fname = getattr(func, "__name__", "")
        op = RecordedOp(name, op_type, None, fname, a, k, [], [None])
        op.captured = False
        op.outputs = self.refs.produce(name, out)
        self.ops.append(op)
        target = written_tensor(func, args, kwargs)
        if target is not None:
            self.refs.wrote(target, name)

    def observe(self, seen: ObservedCall) -> None:
        """Record one captured call the fixed run computed (``Simulator.trace(on_call=...)``)."""
        self.handled += 1
        call, plan = seen.call, seen.plan
        a, k = self.refs.refs_of(call.args, call.kwargs, call.name)
        in_vals = [sim_args.get(call.args, call.kwargs, s) for s in plan.acts] if plan else []
        op = RecordedOp(
            call.name,
            call.op_type,
            call.category,
            out_of_place_name(call.func),
            a,
            k,
            [],
            [],
            acts=list(plan.acts) if plan else [],
            weight=plan.weight if plan else None,
            bias=plan.bias if plan else None,
            bounds=seen.bounds,
        )
        op.in_quant = [_quant_of(info) for info in seen.incoming]
        op.in_float = [sim_args.is_float_tensor(v) for v in in_vals]
        op.outputs = self.refs.produce(call.name, seen.output)
        self.ops.append(op)
        target = written_tensor(call.func, call.args, call.kwargs)
        if target is not None:
            self.refs.wrote(target, call.name)


def _span(t: Tensor) -> tuple[int, int]:
    """[first, last + 1) element offsets of ``t`` in its storage (empty for no elements)."""
    if t.numel() == 0:
        return t.storage_offset(), t.storage_offset()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.storage_offset(), t.storage_offset() + last + 1


def _quant_of(info) -> Quant | None:
    """The integer quantization a QInfo describes (None: float or no information)."""
    if info is None or not info.dtype.is_int or info.scale is None:
        return None
    return Quant(info.dtype, info.scale, info.zero_point)


def record_run(sim, inputs: tuple) -> RecordedRun:
    """Run ``sim`` once in fixed mode on ``inputs`` and record every call (see module doc)."""
    rec = _Recorder(sim, inputs)
    aux = _AuxMode(rec)
    root = sim.model

    def pre(_m, args):
        rec.refs.bind_inputs(args)
        aux.__enter__()

    def post(_m, _a, _o):
        aux.__exit__(None, None, None)

    h1 = root.register_forward_pre_hook(pre)
    h2 = root.register_forward_hook(post, always_call=True)
    try:
        trace = sim.trace(*inputs, mode=Mode.FIXED, on_call=rec.observe)
    finally:
        h1.remove()
        h2.remove()
    ops_table = sim.ops.set_index("name")
    for op in rec.ops:
        if not op.captured:
            continue
        _complete(sim, op, trace, ops_table)
    out_leaves = [t for t in tree_flatten(trace.result)[0] if isinstance(t, Tensor)]
    output = tree_map(lambda v: rec.refs.ref(v) if isinstance(v, Tensor) else v, trace.result)
    _check_stale_reads(rec.refs.stale_reads, rec.ops, output)
    return RecordedRun(rec.ops, tuple(inputs), output, out_leaves)


def _check_stale_reads(stale_reads: dict, ops: list, output) -> None:
    """Raise UnsupportedOpError when a read of a stale or unrecorded tensor (``_Refs``)
    reaches an output."""
    if not stale_reads:
        return
    by_name = {op.name: op for op in ops}
    todo = [r for r in tree_flatten(output)[0] if isinstance(r, OpRef)]
    if "" in stale_reads:
        raise UnsupportedOpError(stale_reads[""])
    seen: set[str] = set()
    while todo:
        name = todo.pop().name
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        if name in stale_reads:
            raise UnsupportedOpError(stale_reads[name])
        op = by_name[name]
        todo += [r for r in tree_flatten((op.args, op.kwargs))[0] if isinstance(r, OpRef)]


def _complete(sim, op: RecordedOp, trace, ops_table) -> None:
    """Fill qconfig, the applied input quantization, output quantization and weight codes."""
    qinfo = trace.qinfo.get(op.name)
    infos = qinfo if isinstance(qinfo, list) else [qinfo] * len(op.outputs)
    op.out_quant = [
        Quant(i.dtype, i.scale, i.zero_point)
        if i is not None and i.dtype.is_int and i.scale is not None
        else None
        for i in infos
    ]
    op.fused_into = str(ops_table.loc[op.name, "fused_into"]) if op.name in ops_table.index else ""
    if op.category is None or not sim.supported(op.op_type, op.category):
        op.in_quant = [None] * len(op.acts)
        return
    rq = sim.qconfig_of(op.name)
    op.qconfig = rq
    if op.fused_into:  # computed by its GEMM: the inputs are the GEMM's output as it is
        return
    if sim.moves_wide_output(op.name):  # a GEMM's wide model output, moved as it is
        op.in_quant = [None] * len(op.acts)
        return
    applied = []
    for i, inc in enumerate(op.in_quant):
        if not op.in_float[i]:
            applied.append(None)
            continue
        want = rq.input_dtype or (inc.dtype if inc is not None else rq.output_dtype)
        if want.is_float:
            applied.append(None)
        elif inc is None or inc.dtype is not want:
            s = sim.act_scale(op.name, f"in{i}", want, rq)
            applied.append(Quant(want, s, sim.act_zero_point(op.name, f"in{i}", want, rq)))
        else:
            applied.append(inc)
    op.in_quant = applied
    if op.weight is not None and rq.weight_dtype.is_int:
        w = sim_args.get(op.args, op.kwargs, op.weight)
        if isinstance(w, ConstRef):
            value = w.value
            folded = _batch_norm_folded(sim, op, value)
            if folded is not None:
                value, op.folded_bias = folded
            op.weight_codes, op.weight_scale = sim.weight_q(
                op.name, value, rq.weight_dtype, True, sim_args.weight_channel_axis(op)
            )


def _batch_norm_folded(sim, op: RecordedOp, w: Tensor) -> tuple[Tensor, Tensor] | None:
    """(weight, bias) of GEMM ``op`` with the batch_norm fused into it folded in, the tensors
    its fixed run computed with (``Simulator.batch_norm_folded``); None when none is fused."""
    b = sim_args.get(op.args, op.kwargs, op.bias) if op.bias is not None else None
    if b is not None and not isinstance(b, ConstRef):
        return None  # a computed bias: the exporter refuses it (emit_gemm)
    groups = sim_args.conv_params(op).get("groups", 1) if op.op_type in sim_args.TRANSPOSED else 0
    return sim.batch_norm_folded(op.name, w, None if b is None else b.value, int(groups))


def fused_clamp_bounds(op: RecordedOp) -> tuple | None:
    """(lo, hi) of a relu6 / clamp call (None for an open side); None for any other op."""
    return op.bounds
