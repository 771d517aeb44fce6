"""How a run records its trace (``Simulator.trace``): every captured op's output as it was when
the op returned, and which ops returned a view of one of their inputs.

A record holds the op's own output tensor, not a copy. Before any torch call of the run writes
into a tensor (an in-place method or operator, ``inplace=True``, ``__setitem__``, ``out=``),
every record sharing that tensor's storage is replaced by a copy (``before_write``): a write
through a view reaches the records of its base, and a call that is not a modelled op (it runs
before the dispatch sees it) is caught as well. An in-place op on a tensor no op of the run
produced (the model's input or state, which a later run may change again) records a copy at
once. ``Trace.aliases`` notes the ops whose output shared an input's memory: the op returned
that input itself (an eval dropout, an activation fused into its GEMM), or a torch view of it
(a pass-through op, or a call that is not a modelled op). A replay hands on that input, or
recomputes the view, so the model's aliases hold in the replayed run as in the recorded one
(``replay.replayed_output``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from quantlab.capture import OpCall, mutates
from quantlab.op_kinds import OpCategory

if TYPE_CHECKING:
    from quantlab.simulate.run_state import RunState


def written_tensor(func, args: tuple, kwargs: dict) -> Tensor | None:
    """The tensor a torch call writes into (``out=``, an in-place call's first argument), or
    None."""
    out = kwargs.get("out")
    if isinstance(out, Tensor):
        return out
    if args and isinstance(args[0], Tensor) and (kwargs.get("inplace") or mutates(func)):
        return args[0]
    return None


def storage_key(t: Tensor) -> int:
    """The address of ``t``'s storage: tensors that share memory share it."""
    return t.untyped_storage().data_ptr()


def before_write(target: Tensor, st: RunState) -> None:
    """A call is about to write into ``target``: every record of ``st.trace`` that shares its
    storage becomes a copy, so it keeps the values its op returned."""
    if target.numel() == 0:
        return
    key = storage_key(target)
    names = st.record_storages.pop(key, None)
    if not names:
        return
    outputs = st.trace.outputs

    def keep(t):
        if isinstance(t, Tensor) and t.numel() and storage_key(t) == key:
            return t.clone()
        return t

    for name in dict.fromkeys(names):
        rec = outputs[name]
        outputs[name] = keep(rec) if isinstance(rec, Tensor) else tree_map(keep, rec)


def record(call: OpCall, out, st: RunState, target: Tensor | None) -> None:
    """Record ``out``, what ``call`` returned, in ``st.trace`` (module docstring); ``target``:
    the tensor an in-place call changed (``calls.inplace_target``), else None."""
    tr = st.trace
    tr.order.append(call.name)
    if target is not None and isinstance(out, Tensor) and st.producers.get(target) is None:
        out = out.clone()  # the model's input or state: a later run may change it again
    tr.outputs[call.name] = out
    leaves = [out] if isinstance(out, Tensor) else tree_flatten(out)[0]
    keys = [storage_key(t) for t in leaves if isinstance(t, Tensor) and t.numel()]
    for key in keys:
        st.record_storages.setdefault(key, []).append(call.name)
    if keys and target is None:
        args = tree_flatten((call.args, call.kwargs))[0]
        inputs = {storage_key(a) for a in args if isinstance(a, Tensor) and a.numel()}
        if not inputs.isdisjoint(keys):
            same = next((i for i, a in enumerate(args) if a is out), None)
            if same is not None:
                tr.aliases[call.name] = same
            elif call.result is not None or call.category is OpCategory.PASS_THROUGH:
                tr.aliases[call.name] = None  # a torch view: recomputing it reads nothing
