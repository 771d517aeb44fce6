"""Deployment patterns: calls that change where a model runs on the chip but that the op
capture does not keep (they return no float tensor, or they mutate one in place).

``record_patterns`` runs the model once in float mode under a Simulator with a second
``TorchFunctionMode`` pushed inside it, which sees each call before the Simulator does and notes:

- ``setitem``: in-place assignment ``x[idx] = v``; ``kind`` is ``slice`` (slices and integer
  indices, exported as ScatterND), ``index`` (tensor indices, ScatterND) or ``bool_mask``;
  ``index_put``/``masked_fill``/``masked_scatter`` likewise (``index`` / ``bool_mask``);
- ``nonzero`` (also ``argwhere`` and one-argument ``where``) and ``einsum``;
- ``argmax``/``argmin``/``topk``: the index dtype, the largest index the op can return, whether it
  fits int8 / int16, and the dtype of a cast applied to the index later in the run;
- ``fmod``/``remainder`` (``%``), and ``where`` whose operands broadcast;
- ``multi_add``: a ``sum`` over a ``stack`` of three or more tensors (a many-input Add).

A call on the model's constants alone (``capture.ModelConstants``: a window mask built from
``zeros`` and slicing) is none of these: the export folds it into a constant.

Each record carries the op name the Simulator gives the same call (``<module>:<op>#<k>``) when it
captures it, else a name built the same way, and ``position``: how many captured ops ran before
it (its place in ``Simulator.ops``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from quantlab.capture import ModelConstants, ModuleTracker, model_constants
from quantlab.op_kinds import classify

_NAMES = {
    "__setitem__": "setitem",
    "index_put": "index_put",
    "index_put_": "index_put",
    "masked_fill": "masked_fill",
    "masked_fill_": "masked_fill",
    "masked_scatter": "masked_scatter",
    "masked_scatter_": "masked_scatter",
    "nonzero": "nonzero",
    "argwhere": "nonzero",
    "einsum": "einsum",
    "argmax": "argmax",
    "argmin": "argmin",
    "topk": "topk",
    "fmod": "fmod",
    "fmod_": "fmod",
    "remainder": "remainder",
    "remainder_": "remainder",
    "__mod__": "remainder",
    "__rmod__": "remainder",
    "__imod__": "remainder",
    "where": "where",
}
_CASTS = frozenset({"to", "type", "char", "short", "int", "long", "byte"})
INT8_MAX, INT16_MAX = 127, 32767


@dataclass
class PatternCall:
    """One deployment-relevant call: ``pattern`` (setitem, nonzero, einsum, argmax, topk, fmod,
    remainder, where, ...), where it ran and what decides its placement (``detail``)."""

    name: str
    pattern: str
    op_type: str  # the op type the capture gives the call (e.g. "mod" for x % y)
    module: str
    position: int  # captured ops that ran before this call
    detail: dict[str, Any] = field(default_factory=dict)


def _index_kind(index: Any) -> str:
    items = index if isinstance(index, (tuple, list)) else (index,)
    kinds = set()
    for it in items:
        if isinstance(it, Tensor):
            kinds.add("bool_mask" if it.dtype is torch.bool else "index")
    if "bool_mask" in kinds:
        return "bool_mask"
    return "index" if kinds else "slice"


def _shape(v: Any) -> tuple:
    return tuple(v.shape) if isinstance(v, Tensor) else ()


def _largest_index(pattern: str, args: tuple, kwargs: dict) -> int:
    x = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 and pattern != "topk" else None)
    if pattern == "topk":
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
    if dim is None:
        return max(int(x.numel()) - 1, 0)
    return max(int(x.shape[dim]) - 1, 0) if x.dim() else 0


class PatternMode(TorchFunctionMode):
    """Record the calls of ``_NAMES`` (module docstring); ``position()`` counts captured ops."""

    def __init__(self, tracker: ModuleTracker, position, constants: ModelConstants) -> None:
        super().__init__()
        self.tracker = tracker
        self.position = position
        self.constants = constants  # calls on constants alone are folded at export: no pattern
        self.records: list[PatternCall] = []
        self.counts: dict[tuple[str, str], int] = {}
        self._indices: dict[int, tuple[Tensor, PatternCall]] = {}
        self._stacks: dict[int, tuple[Tensor, int]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.constants.all_constant(func, args, kwargs):
            out = func(*args, **kwargs)
            self.constants.add(out)
            return out
        self.constants.written(func, args, kwargs)
        fname = getattr(func, "__name__", "")
        if fname in _CASTS and args and isinstance(args[0], Tensor):
            hit = self._indices.get(id(args[0]))
            out = func(*args, **kwargs)
            if hit is not None and hit[0] is args[0] and isinstance(out, Tensor):
                hit[1].detail.setdefault("cast_to", str(out.dtype).removeprefix("torch."))
            return out
        if fname == "stack" and args and isinstance(args[0], (list, tuple)) and len(args[0]) > 2:
            out = func(*args, **kwargs)
            self._stacks[id(out)] = (out, len(args[0]))
            return out
        if fname == "sum" and args and id(args[0]) in self._stacks:
            stacked, n = self._stacks[id(args[0])]
            if stacked is args[0]:
                return self._record(func, args, kwargs, "multi_add", {"inputs": n})
        pattern = _NAMES.get(fname)
        if pattern is None or (pattern == "where" and len(args) + len(kwargs) < 3):
            if fname == "where" and len(args) == 1:
                pattern = "nonzero"
            else:
                return func(*args, **kwargs)
        return self._record(func, args, kwargs, pattern, {})

    def _record(self, func, args: tuple, kwargs: dict, pattern: str, detail: dict) -> Any:
        kind = classify(func, args, kwargs)
        op_type = kind[0] if kind is not None else pattern
        module = self.tracker.current
        k = self.counts.get((module, op_type), 0)
        self.counts[(module, op_type)] = k + 1
        rec = PatternCall(f"{module}:{op_type}#{k}", pattern, op_type, module, self.position())
        rec.detail.update(detail)
        out = func(*args, **kwargs)
        self._describe(rec, args, kwargs, out)
        self.records.append(rec)
        return out

    def _describe(self, rec: PatternCall, args: tuple, kwargs: dict, out: Any) -> None:
        d = rec.detail
        p = rec.pattern
        if p == "setitem":
            d["kind"] = _index_kind(args[1])
        elif p == "index_put":
            d["kind"] = _index_kind(args[1])
        elif p in ("masked_fill", "masked_scatter"):
            d["kind"] = "bool_mask"
        elif p == "where":
            shapes = [_shape(a) for a in args[:3]]
            d["broadcast"] = len({s for s in shapes}) > 1
            d["shapes"] = shapes
        elif p in ("argmax", "argmin", "topk"):
            idx = out if p != "topk" else out[1]
            top = _largest_index(p, args, kwargs)
            d["index_dtype"] = str(idx.dtype).removeprefix("torch.")
            d["largest_index"] = top
            d["fits"] = "int8" if top <= INT8_MAX else "int16" if top <= INT16_MAX else "int32"
            self._indices[id(idx)] = (idx, rec)


def record_patterns(sim, inputs: tuple) -> list[PatternCall]:
    """Run ``sim``'s model once in float mode on ``inputs`` and return its pattern calls, in
    execution order (the Simulator's op table then holds the same run's captured ops)."""
    from quantlab.simulate.modes import Mode

    model = sim.model
    tracker = ModuleTracker(model)
    mode = PatternMode(tracker, lambda: sim.recorded_ops, model_constants(model))
    entered: list[bool] = []

    def push(_module, _inputs):
        if not entered:
            mode.__enter__()
            entered.append(True)

    def pop(_module, _inputs, _output):
        if entered:
            mode.__exit__(None, None, None)
            entered.clear()

    h1 = model.register_forward_pre_hook(push)
    h2 = model.register_forward_hook(pop, always_call=True)
    try:
        with tracker:
            sim.run(*inputs, mode=Mode.FLOAT)
    finally:
        h1.remove()
        h2.remove()
        if entered:
            mode.__exit__(None, None, None)
    return mode.records
