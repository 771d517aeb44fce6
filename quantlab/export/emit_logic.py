"""Calls on integer and boolean tensors, and the float ops quantlab does not model, as ONNX:
comparisons, boolean and bitwise logic, where / masked_fill, elementwise minimum / maximum,
negation, integer add / sub / mul and clamp, sums and cumulative sums of integer tensors, and
tensors made like another (``zeros_like``, ``full_like``: constants, since shapes are static). An
attention mask is built from these before it meets a float tensor.

Every operand is first cast to the dtype torch computes the call in (``torch.result_type`` of
the operands, a Python scalar taking the tensor's kind), so the graph computes what torch does:
exactly for comparisons, logic and integer arithmetic; float ops on the same float32 values.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from quantlab.export.context import ExportContext
from quantlab.export.emit_layout import first_input
from quantlab.export.emit_ops import is_ref
from quantlab.export.emit_pool_reduce import reduced_dims
from quantlab.export.graph import TORCH_TO_ONNX, UnsupportedOpError
from quantlab.export.trace_adapter import ConstRef, InputRef, OpRef, RecordedOp

_NUMPY = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def _arg(op: RecordedOp, pos: int, *names: str):
    if pos < len(op.args):
        return op.args[pos]
    for n in names:
        if n in op.kwargs:
            return op.kwargs[n]
    raise UnsupportedOpError(f"op {op.name} ({op.op_type}): argument {pos} missing")


def _example(ctx: ExportContext, v):
    """A stand-in with ``v``'s dtype and rank for ``torch.result_type`` (a 0-d tensor keeps
    its lower priority there); a Python scalar as it is."""
    if not is_ref(v):
        if isinstance(v, (bool, int, float)):
            return v
        raise UnsupportedOpError(f"operand {v!r} of type {type(v).__name__}")
    dtype = v.value.dtype if isinstance(v, ConstRef) else ctx.value(v).dtype
    return torch.empty([1] * len(_shape(ctx, v)), dtype=dtype)


def _shape(ctx: ExportContext, v) -> tuple:
    """A tensor reference's shape (a constant's without writing it into the graph)."""
    return tuple(v.value.shape) if isinstance(v, ConstRef) else ctx.value(v).shape


def compute_dtype(ctx: ExportContext, a, b) -> torch.dtype:
    """The dtype torch computes an elementwise call on operands ``a`` and ``b`` in."""
    return torch.result_type(_example(ctx, a), _example(ctx, b))


def operand(ctx: ExportContext, op: RecordedOp, v, dtype: torch.dtype, i: int) -> str:
    """Operand ``v`` (a tensor reference or a Python scalar) as a graph tensor of ``dtype``."""
    if not is_ref(v):
        if dtype not in _NUMPY:
            raise UnsupportedOpError(f"op {op.name}: a scalar operand of dtype {dtype}")
        return ctx.graph.const(f"{op.name}/scalar{i}", np.asarray(v, dtype=_NUMPY[dtype]))
    val = ctx.value(v, f"{op.name}/in{i}")
    if val.dtype == dtype:
        return val.name
    if dtype not in TORCH_TO_ONNX:
        raise UnsupportedOpError(f"op {op.name}: operands of dtype {dtype}")
    return ctx.graph.node("Cast", [val.name], f"{op.name}/in{i}/cast", to=TORCH_TO_ONNX[dtype])


def _promoted(ctx: ExportContext, op: RecordedOp, operands: list) -> tuple[list[str], torch.dtype]:
    """Operands (a tensor first, then one or more others) as graph tensors of the dtype torch
    computes them in, and that dtype (the first's with each other's, promoted together)."""
    first, *others = operands
    dtype = functools.reduce(torch.promote_types, [compute_dtype(ctx, first, v) for v in others])
    return [operand(ctx, op, v, dtype, i) for i, v in enumerate(operands)], dtype


def _result(ctx: ExportContext, op: RecordedOp, y: str, dtype: torch.dtype) -> None:
    """Bind ``y`` (computed in ``dtype``) as the op's output, cast to the output's dtype."""
    out = op.outputs[0].dtype
    if out != dtype:
        y = ctx.graph.node("Cast", [y], f"{op.name}/cast", to=TORCH_TO_ONNX[out])
    ctx.set_outputs(op, [y])


_COMPARE = {"eq": "Equal", "ne": "Equal", "lt": "Less", "le": "LessOrEqual"}
_COMPARE |= {"gt": "Greater", "ge": "GreaterOrEqual"}


def emit_compare(ctx: ExportContext, op: RecordedOp) -> None:
    """x == y (ne: Not(Equal)), <, <=, >, >= in the operands' common dtype."""
    names, _ = _promoted(ctx, op, [_arg(op, 0, "input", "self"), _arg(op, 1, "other")])
    y = ctx.graph.node(_COMPARE[op.op_type], names, f"{op.name}/compare")
    if op.op_type == "ne":
        y = ctx.graph.node("Not", [y], f"{op.name}/not")
    _result(ctx, op, y, torch.bool)


_LOGIC = {"and": "And", "or": "Or", "xor": "Xor"}
_BITWISE = {"and": "BitwiseAnd", "or": "BitwiseOr", "xor": "BitwiseXor"}


def _logic_kind(op_type: str) -> tuple[str, bool]:
    """(and / or / xor, logical) of ``__and__``, ``__rand__``, ``__iand__``, ``bitwise_and``,
    ``logical_and``, ..."""
    logical = op_type.startswith("logical_")
    for k in _LOGIC:
        if op_type in (k, f"r{k}", f"i{k}", f"bitwise_{k}", f"logical_{k}"):
            return k, logical
    raise UnsupportedOpError(f"op type {op_type!r} is not boolean logic")


def emit_logic(ctx: ExportContext, op: RecordedOp) -> None:
    """&, |, ^ on bool tensors (And, Or, Xor) or integer ones (BitwiseAnd, ...);
    logical_and / _or / _xor on the operands' truth values."""
    kind, logical = _logic_kind(op.op_type)
    operands = [_arg(op, 0, "input", "self"), _arg(op, 1, "other")]
    if logical:
        names = [operand(ctx, op, v, torch.bool, i) for i, v in enumerate(operands)]
        dtype = torch.bool
    else:
        names, dtype = _promoted(ctx, op, operands)
    onnx_op = _LOGIC[kind] if dtype == torch.bool else _BITWISE[kind]
    if dtype.is_floating_point:
        raise UnsupportedOpError(f"op {op.name}: {op.op_type} of float tensors")
    _result(ctx, op, ctx.graph.node(onnx_op, names, f"{op.name}/logic"), dtype)


def emit_not(ctx: ExportContext, op: RecordedOp) -> None:
    """~x: Not of a bool tensor, BitwiseNot of an integer one; logical_not: Not(x != 0)."""
    x = _arg(op, 0, "input", "self")
    if op.op_type == "logical_not":
        y = ctx.graph.node("Not", [operand(ctx, op, x, torch.bool, 0)], f"{op.name}/not")
        _result(ctx, op, y, torch.bool)
        return
    val = ctx.value(x, f"{op.name}/in")
    onnx_op = "Not" if val.dtype == torch.bool else "BitwiseNot"
    _result(ctx, op, ctx.graph.node(onnx_op, [val.name], f"{op.name}/not"), val.dtype)


def emit_where(ctx: ExportContext, op: RecordedOp) -> None:
    """torch.where(cond, x, y): Where on the truth of cond, x and y in their common dtype."""
    cond = operand(ctx, op, _arg(op, 0, "condition"), torch.bool, 0)
    names, dtype = _promoted(ctx, op, [_arg(op, 1, "input", "self"), _arg(op, 2, "other")])
    _result(ctx, op, ctx.graph.node("Where", [cond, *names], f"{op.name}/where"), dtype)


def emit_masked_fill(ctx: ExportContext, op: RecordedOp) -> None:
    """x.masked_fill(mask, value): Where(mask, value, x), value in x's dtype."""
    x = ctx.value(_arg(op, 0, "input", "self"), f"{op.name}/in")
    mask = operand(ctx, op, _arg(op, 1, "mask"), torch.bool, 1)
    value = operand(ctx, op, _arg(op, 2, "value"), x.dtype, 2)
    y = ctx.graph.node("Where", [mask, value, x.name], f"{op.name}/where")
    _result(ctx, op, y, x.dtype)


def emit_extreme(ctx: ExportContext, op: RecordedOp) -> None:
    """Elementwise minimum / maximum of two tensors (``torch.min(a, b)`` too): Min / Max; the
    minimum / maximum of every element (``x.max()``): ReduceMin / ReduceMax; over a dimension
    (``x.max(dim)``): ReduceMax / ReduceMin and ArgMax / ArgMin, whose first index among equal
    values is torch's."""
    lo = op.op_type in ("min", "minimum")
    other = op.args[1] if len(op.args) > 1 else op.kwargs.get("other", op.kwargs.get("dim"))
    if other is None and not op.kwargs and len(op.args) == 1:
        x = ctx.value(op.args[0])
        y = ctx.graph.node(
            "ReduceMin" if lo else "ReduceMax", [x.name], f"{op.name}/float", keepdims=0
        )
        _result(ctx, op, y, x.dtype)
        return
    if isinstance(other, int) and not isinstance(other, bool):
        _emit_extreme_over(ctx, op, other, lo)
        return
    if not is_ref(other):
        raise UnsupportedOpError(f"op {op.name}: {op.op_type} of {other!r}")
    names, dtype = _promoted(ctx, op, [op.args[0], other])
    _result(ctx, op, ctx.graph.node("Min" if lo else "Max", names, f"{op.name}/float"), dtype)


def _emit_extreme_over(ctx: ExportContext, op: RecordedOp, dim: int, lo: bool) -> None:
    """``torch.max(x, dim, keepdim)`` / min: the values (each one of its inputs: on the input's
    grid, a pass-through op) and their indices (int64)."""
    x = first_input(ctx, op)
    nd = len(ctx.shape_of(op, 0))
    axis = dim % nd if nd else 0
    keep = int(bool(op.args[2] if len(op.args) > 2 else op.kwargs.get("keepdim", False)))
    g = ctx.graph
    values = g.node(
        "ReduceMin" if lo else "ReduceMax",
        [x, g.int64s(f"{op.name}/axes", [axis])],
        f"{op.name}/float",
        keepdims=keep,
    )
    index = g.node("ArgMin" if lo else "ArgMax", [x], f"{op.name}/index", axis=axis, keepdims=keep)
    ctx.set_outputs(op, [values, index])


def emit_neg(ctx: ExportContext, op: RecordedOp) -> None:
    """-x (float ops quantlab does not model run in float: exact)."""
    x = ctx.value(_arg(op, 0, "input", "self"))
    _result(ctx, op, ctx.graph.node("Neg", [x.name], f"{op.name}/float"), x.dtype)


def emit_like(ctx: ExportContext, op: RecordedOp) -> None:
    """zeros_like / ones_like / full_like / new_zeros / new_ones / new_full: the tensor the
    call made, as a constant (its values do not depend on the input's values; shapes are
    static). A fill value computed from the inputs is refused."""
    if any(isinstance(v, (InputRef, OpRef)) for v in (*op.args[1:], *op.kwargs.values())):
        raise UnsupportedOpError(f"op {op.name}: {op.op_type} with a fill value from the inputs")
    t = op.outputs[0]
    if t.dtype not in TORCH_TO_ONNX:
        raise UnsupportedOpError(f"op {op.name}: {op.op_type} of dtype {t.dtype}")
    ctx.set_outputs(op, [ctx.graph.const(f"{op.name}/value", t.detach().clone())])


_ARITHMETIC = {"add": "Add", "sub": "Sub", "rsub": "Sub", "mul": "Mul"}


def emit_integer_arithmetic(ctx: ExportContext, op: RecordedOp) -> None:
    """add / sub / mul of non-float tensors (an uncaptured call: no float tensor enters it),
    with a Python scalar in the dtype torch computes in (one IEEE operation for a float)."""
    if op.kwargs.get("alpha", 1) != 1:
        raise UnsupportedOpError(f"op {op.name} ({op.op_type}): alpha != 1")
    operands = [_arg(op, 0, "input", "self"), _arg(op, 1, "other")]
    if op.func_name in ("__rsub__", "rsub"):
        operands.reverse()
    names, dtype = _promoted(ctx, op, operands)  # an int tensor times 0.5: in float32, as torch
    _result(ctx, op, ctx.graph.node(_ARITHMETIC[op.op_type], names, f"{op.name}/int"), dtype)


def emit_integer_sum(ctx: ExportContext, op: RecordedOp) -> None:
    """sum of a bool or integer tensor (an uncaptured call): ReduceSum in the output's dtype
    (torch sums them in int64)."""
    x = op.args[0]
    ndim = len(_shape(ctx, x))
    dims = reduced_dims(ctx.arg(op, 1, "dim"), ndim)
    keep = bool(ctx.arg(op, 2, "keepdim", False))
    out = op.outputs[0].dtype
    if out.is_floating_point:
        raise UnsupportedOpError(f"op {op.name}: sum of a float tensor outside capture")
    xs = operand(ctx, op, x, out, 0)
    axes = ctx.graph.int64s(f"{op.name}/axes", list(range(ndim)) if dims is None else dims)
    _result(ctx, op, ctx.graph.node("ReduceSum", [xs, axes], op.name, keepdims=int(keep)), out)


def emit_integer_clamp(ctx: ExportContext, op: RecordedOp) -> None:
    """clamp / clamp_min / clamp_max outside capture (no float tensor enters it: relative
    positions bounded, ids clipped to a table): Max by the lower bound then Min by the upper,
    each a Python number or a tensor, in the dtype torch computes in (an integer tensor and a
    float bound: float32, as torch promotes). Exact: Max and Min only select."""
    x = _arg(op, 0, "input", "self")
    if op.func_name in ("clamp_min", "clamp_min_"):
        lo, hi = ctx.arg(op, 1, "min"), None
    elif op.func_name in ("clamp_max", "clamp_max_"):
        lo, hi = None, ctx.arg(op, 1, "max")
    else:
        lo, hi = ctx.arg(op, 1, "min"), ctx.arg(op, 2, "max")
    bounds = [b for b in (lo, hi) if b is not None]
    if not bounds or any(isinstance(b, bool) for b in bounds):
        raise UnsupportedOpError(f"op {op.name}: clamp by {lo!r}, {hi!r}")
    names, dtype = _promoted(ctx, op, [x, *bounds])
    y, rest = names[0], iter(names[1:])
    if lo is not None:
        y = ctx.graph.node("Max", [y, next(rest)], f"{op.name}/min")
    if hi is not None:
        y = ctx.graph.node("Min", [y, next(rest)], f"{op.name}/max")
    _result(ctx, op, y, dtype)


def emit_cumsum(ctx: ExportContext, op: RecordedOp) -> None:
    """cumsum of a bool or integer tensor along ``dim`` in the output's dtype (int64 unless
    asked): exact. A float cumsum is refused (its order of additions is not checked)."""
    x = op.args[0]
    ndim = len(_shape(ctx, x))
    dim = int(_arg(op, 1, "dim")) % ndim
    out = op.outputs[0].dtype
    if out.is_floating_point:
        raise UnsupportedOpError(f"op {op.name}: cumsum of a float tensor")
    xs = operand(ctx, op, x, out, 0)
    axis = ctx.graph.const(f"{op.name}/axis", np.asarray(dim, dtype=np.int64))
    _result(ctx, op, ctx.graph.node("CumSum", [xs, axis], f"{op.name}/cumsum"), out)


COMPARE_TYPES = tuple(_COMPARE)
LOGIC_TYPES = tuple(
    t for k in _LOGIC for t in (k, f"r{k}", f"i{k}", f"bitwise_{k}", f"logical_{k}")
)
NOT_TYPES = ("invert", "bitwise_not", "logical_not")
LIKE_TYPES = ("zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full")

# ops any call (captured float op or uncaptured) is written by
EMITTERS = {
    **dict.fromkeys(COMPARE_TYPES, emit_compare),
    **dict.fromkeys(LOGIC_TYPES, emit_logic),
    **dict.fromkeys(NOT_TYPES, emit_not),
    **dict.fromkeys(LIKE_TYPES, emit_like),
    "where": emit_where,
    "masked_fill": emit_masked_fill,
    "minimum": emit_extreme,
    "maximum": emit_extreme,
    "min": emit_extreme,
    "max": emit_extreme,
    "neg": emit_neg,
    "cumsum": emit_cumsum,
}

# uncaptured calls (no float tensor enters them) of op types a captured call writes otherwise
UNCAPTURED_EMITTERS = {
    **dict.fromkeys(_ARITHMETIC, emit_integer_arithmetic),
    "sum": emit_integer_sum,
    "clamp": emit_integer_clamp,
}
