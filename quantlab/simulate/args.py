"""Which arguments of a captured call are activations, which the weight and which the bias."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from quantlab.capture import OpCall, is_run_constant, views_parameter
from quantlab.op_kinds import OpCategory, has_values

Slot = tuple  # ("a", i) positional, ("a", i, j) element j of a list argument, ("k", name)


@dataclass
class ArgPlan:
    """Slots of one call: activations (quantized), weight (per-channel), bias (kept float)."""

    acts: list[Slot]
    weight: Slot | None = None
    bias: Slot | None = None


def get(call_args: tuple, kwargs: dict, slot: Slot):
    kind, i = slot[0], slot[1]
    if kind == "k":
        return kwargs.get(i)
    v = call_args[i] if i < len(call_args) else None
    return v[slot[2]] if len(slot) == 3 and v is not None else v


def put(call_args: list, kwargs: dict, slot: Slot, value) -> None:
    if slot[0] == "k":
        kwargs[slot[1]] = value
    elif len(slot) == 3:
        seq = list(call_args[slot[1]])
        seq[slot[2]] = value
        call_args[slot[1]] = seq
    else:
        call_args[slot[1]] = value


def _slot(call: OpCall, pos: int, kw: str) -> Slot | None:
    if pos < len(call.args):
        return ("a", pos)
    if kw in call.kwargs:
        return ("k", kw)
    return None


def named(call_args: tuple, kwargs: dict, names: tuple) -> dict:
    """A call's arguments by ``names`` in torch's positional order: the positional value where
    the call gave one, else the keyword's, else None."""
    return {n: (call_args[i] if i < len(call_args) else kwargs.get(n)) for i, n in enumerate(names)}


def is_weight(v) -> bool:
    """A parameter, a view of one (the rows nn.MultiheadAttention's in-projection splits from
    its packed weight), or a constant of the run (``capture.ModelConstants``: a weight computed
    from parameters alone, as weight normalization does)."""
    return isinstance(v, nn.Parameter) or (
        isinstance(v, Tensor) and (views_parameter(v) or is_run_constant(v))
    )


def plan(call: OpCall) -> ArgPlan:
    """The ArgPlan of a modelled call (category not None)."""
    cat = call.category
    a0 = _slot(call, 0, "input")
    if call.op_type in _WEIGHTED:
        w = _slot(call, 1, "weight")
        b = _slot(call, 2, "bias")
        wv = get(call.args, call.kwargs, w) if w else None
        if is_weight(wv):
            return ArgPlan([a0], w, b)
        return ArgPlan([a0, w], None, b)
    if call.op_type == "pow":  # its exponent is a constant (op_kinds.pow_exponent)
        return ArgPlan([a0])
    if cat in (OpCategory.GEMM, OpCategory.ADD, OpCategory.MUL, OpCategory.DIV):
        other = _slot(call, 1, "other")
        return ArgPlan([s for s in (a0, other) if s is not None])
    if call.op_type in ("maximum", "minimum"):
        return ArgPlan([s for s in (a0, _slot(call, 1, "other")) if s is not None])
    if call.op_type == "where":  # the condition is no activation; a number operand neither
        slots = (_slot(call, 1, "input"), _slot(call, 2, "other"))
        return ArgPlan(
            [s for s in slots if s is not None and has_values(get(call.args, call.kwargs, s))]
        )
    if cat is OpCategory.REQUANT and call.op_type in ("cat", "stack"):
        seq = call.args[0] if call.args else call.kwargs.get("tensors")
        return ArgPlan([("a", 0, j) for j in range(len(seq))]) if call.args else ArgPlan([])
    if cat is OpCategory.GRID_SAMPLE:
        return ArgPlan([a0, _slot(call, 1, "grid")])
    return ArgPlan([a0] if a0 is not None else [])


def plan_of(call: OpCall, cache: dict) -> ArgPlan:
    """``plan(call)`` of a modelled call, remembered in ``cache`` per op name while the call's
    argument layout (function, argument count, keyword names, list length, weight kind) stays
    the same. The plan is shared: callers must not change it."""
    args = call.args
    n = len(args)
    extra = None
    if n and isinstance(args[0], (list, tuple)):
        extra = len(args[0])
    elif call.op_type in _WEIGHTED:
        extra = is_weight(args[1] if n > 1 else call.kwargs.get("weight"))
    elif call.op_type == "where":  # which operands are tensors, which numbers
        extra = tuple(has_values(a) for a in args[1:])
    layout = (call.func, n, tuple(call.kwargs) if call.kwargs else (), extra)
    hit = cache.get(call.name)
    if hit is not None and hit[0] == layout:
        return hit[1]
    p = plan(call)
    cache[call.name] = (layout, p)
    return p


_WEIGHTED = frozenset(
    ("conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "linear")
)  # GEMMs whose second argument is a weight (a parameter) or an activation
TRANSPOSED = frozenset(("conv_transpose1d", "conv_transpose2d"))
_CONV_PARAMS = ("stride", "padding", "dilation", "groups")
_TRANSPOSED_PARAMS = ("stride", "padding", "output_padding", "groups", "dilation")


def conv_params(call) -> dict:
    """A convolution call's parameters as the call gives them (positions after input, weight,
    bias): stride, padding, dilation, groups; a transposed one's stride, padding,
    output_padding, groups, dilation (torch's order)."""
    names = _TRANSPOSED_PARAMS if call.op_type in TRANSPOSED else _CONV_PARAMS
    out = {}
    for i, n in enumerate(names):
        if len(call.args) > 3 + i:
            out[n] = call.args[3 + i]
        elif n in call.kwargs:
            out[n] = call.kwargs[n]
    return out


_GRID_SAMPLE_ARGS = ("input", "grid", "mode", "padding_mode", "align_corners")


def grid_sample_options(call_args: tuple, kwargs: dict) -> tuple[str, str, bool]:
    """(mode, padding_mode, align_corners) of an ``F.grid_sample`` call, torch's defaults
    filled in."""
    v = named(call_args, kwargs, _GRID_SAMPLE_ARGS)
    return v["mode"] or "bilinear", v["padding_mode"] or "zeros", bool(v["align_corners"])


def weight_channel_axis(call) -> int | None:
    """The axis of a GEMM's weight that holds its output channels, for per-channel scales: 0
    for conv1d / conv2d / linear ((O, ...)); 1 for a transposed convolution with one group
    ((C, O, *kernel)); None (one scale per tensor) for a transposed convolution with groups,
    whose output channels are (group, column) pairs along no single axis (ONNX's and torch.ao's
    per-axis weights cannot hold them either)."""
    if call.op_type not in TRANSPOSED:
        return 0
    return 1 if conv_params(call).get("groups", 1) == 1 else None


def is_float_tensor(v) -> bool:
    return isinstance(v, Tensor) and v.is_floating_point()


def fresh_result(out, call_args, kwargs: dict) -> bool:
    """True when ``out`` is a tensor a call on ``call_args`` / ``kwargs`` has just made, which a
    fake quant may overwrite in place: not a view, no gradient, and sharing no storage with an
    argument tensor (or one in a list argument), so an in-place op, ``out=`` and ``detach``
    results are not fresh; neither is a tensor subclass's result, nor one whose storage cannot
    be read (a nested or sparse argument). Only the caller that received ``out`` may hold it."""
    if type(out) is not Tensor or out._base is not None or out.requires_grad:
        return False
    try:
        p = out.untyped_storage().data_ptr()
        for v in (*call_args, *kwargs.values()) if kwargs else call_args:
            for t in v if isinstance(v, (list, tuple)) else (v,):
                if isinstance(t, Tensor) and (t is out or t.untyped_storage().data_ptr() == p):
                    return False
    except (RuntimeError, NotImplementedError):
        return False
    return True
