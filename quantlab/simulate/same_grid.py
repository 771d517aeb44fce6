"""Codes that follow values through ops that do not change them, so nothing has to find them
again: float ops whose output stays on their input's grid (below), and layout ops (view,
transpose, indexing, ...) whose codes are the same op applied to the input's codes
(``layout_codes``).

Two kinds of op are recognised (both run in float: not modelled, or a platform's float
fallback):

* an op that returns its input tensor itself, unchanged: eval-mode dropout (removed at
  export), a cast to the dtype the tensor already has;
* ``pad`` with mode "constant" and value 0, and ``masked_fill`` of a bool mask with the value
  0 where it runs in float (masked_fill on the runtime profiles, the safe softmax's rows in
  ``decompositions.attention_by_definition``; pad on a platform whose ``supported_ops`` leave it
  out, or an op a sensitivity run keeps in float): every value is an input value or 0, and 0
  is the code ``zero_point`` at any scale.

Where they are modelled (masked_fill on J6, pad everywhere) they are pass-through ops whose
fill is quantized on their input's grid (``snap_fill``, ``snap_pad``).

Their outputs are recorded (``grid_of``) with the input's ``QInfo`` (in FIXED mode with the
padded or filled codes). ``codes_on_grid`` then answers for a quantization at activation point
(``dtype``, ``scale``, ``zero_point``, rounding): when the record has the same dtype and zero
point and the same float32 scale value, and the rounding is to nearest, the codes are the
recorded ones. Proof: a value on the grid is ``fl32((c - zp) * s)`` with |c - zp| <= 2**16;
``fl32(v / s)`` (or ``fl32(v * fl32(1 / s))``) is within 3 * 2**-24 * 2**16 < 0.5 of ``c - zp``,
so any round-to-nearest gives ``c - zp``, inside the dtype's code range (the clamp changes
nothing). The value itself is returned unchanged: it is bit for bit ``dequantize`` of those
codes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._pytree import tree_flatten

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import dequantize, quantize
from quantlab.numerics.rounding import Round
from quantlab.op_kinds import WHERE_PARAMS, has_values
from quantlab.simulate import args as A
from quantlab.simulate import calls
from quantlab.simulate.qtensor import QInfo, QTable

NEAREST = frozenset({Round.HALF_EVEN, Round.HALF_UP, Round.HALF_AWAY})
_PAD_NAMES = ("input", "pad", "mode", "value")


def returns_input(call, out) -> bool:
    """Whether the float op ``call`` returned its first argument itself, unchanged (the first
    kind in the module doc): not through ``out=``, in place or by a training dropout."""
    if type(out) is not Tensor or not call.args or out is not call.args[0]:
        return False
    return "out" not in call.kwargs and not _writes_new_values(call)


def _writes_new_values(call) -> bool:
    return calls.is_inplace(call) or ("dropout" in call.op_type and _training(call))


def grid_of(call, out, qt: QTable, fixed: bool) -> QInfo | None:
    """The grid ``out`` of the float op ``call`` stays on when it is one of the two kinds
    (module doc) and its input carries an integer ``QInfo`` in ``qt`` (in FIXED mode, with
    codes), or None. Read before ``out``'s own entries are replaced; every other output of an
    op loses any grid it had (``RunState.forget`` and the dispatch's output bookkeeping)."""
    if type(out) is not Tensor or not call.args or not isinstance(call.args[0], Tensor):
        return None
    x = call.args[0]
    if "out" in call.kwargs or (out is x and _writes_new_values(call)):
        return None  # written through out=, in place, or by a training dropout: new values
    info = qt.get(x)
    if out is x:
        return kept_grid(info, x, fixed)
    if info is None or not info.dtype.is_int or info.scale is None:
        return None
    fill = _zero_fill(call)
    if fill is None:
        return None
    if not fixed:
        return QInfo(info.dtype, info.scale, zero_point=info.zero_point)
    codes = _codes_of(info, x)
    if codes is None:
        return None
    filled = fill(codes, info.zero_point)
    return (
        QInfo(info.dtype, info.scale, filled, info.zero_point)
        if filled.shape == out.shape
        else None
    )


def _zero_fill(call) -> Callable[[Tensor, int], Tensor] | None:
    """For a zero-constant ``pad`` or a zero ``masked_fill`` of a bool mask, the same op on
    codes, filling with the zero point: ``fill(codes, zero_point)``; None for any other call."""
    if call.op_type == "pad" and _zero_constant_pad(call):
        pad = _pad_arguments(call)["pad"]
        return lambda codes, zp: F.pad(codes, pad, mode="constant", value=zp)
    if call.op_type == "masked_fill" and not call.kwargs and len(call.args) == 3:
        mask, value = call.args[1], call.args[2]
        if isinstance(mask, Tensor) and mask.dtype == torch.bool and _positive_zero(value):
            return lambda codes, zp: codes.masked_fill(mask, zp)
    return None


def _one_scale(call, op_type: str, src: QInfo, what: str) -> None:
    """ValueError unless ``src`` has one scale (``what``: the part of the op that needs it)."""
    if src.scale.numel() != 1:
        raise ValueError(
            f"op {call.name} ({op_type}): its input is quantized per channel; {what} takes "
            "one scale (the input's per-tensor quantization)"
        )


def _on_grid(value, src: QInfo, rounding: Round, dtype: torch.dtype) -> Tensor:
    """The number ``value`` quantized on ``src``'s grid (one scale) and dequantized:
    ``dequantize(clamp(round(value / scale) + zero_point, qmin, qmax))``, 0-d, in ``dtype``."""
    scale = src.scale.reshape(())
    v = torch.as_tensor(value, dtype=torch.float32).detach().reshape(())
    code = quantize(v, scale, src.dtype, rounding, zero_point=src.zero_point)
    return dequantize(code, scale, zero_point=src.zero_point).to(dtype)


def snap_fill(call, out: Tensor, src: QInfo, rounding: Round) -> Tensor:
    """``out``, the result of ``masked_fill(x, mask, value)`` on ``x`` quantized at ``src``
    (an integer dtype, one scale), with its filled values replaced by ``value`` quantized on
    that grid (``_on_grid``: the code ``rounding`` and the dtype's saturation give; the J6
    plugin's QTensor masked_fill: the output keeps the input's scale and the fill saturates,
    so -1e4 or -inf read as the lowest code); in place, as ``out`` is the op's fresh result or
    its in-place target. Raises ValueError for a per-channel ``src``, which the plugin refuses
    too."""
    _one_scale(call, "masked_fill", src, "the fill")
    mask = call.args[1] if len(call.args) > 1 else call.kwargs["mask"]
    value = call.args[2] if len(call.args) > 2 else call.kwargs["value"]
    return out.masked_fill_(mask, _on_grid(value, src, rounding, out.dtype))


def snap_where_number(call, out: Tensor, src: QInfo, rounding: Round) -> Tensor:
    """``out``, the result of ``torch.where(condition, input, other)`` with one float tensor
    quantized at ``src`` (an integer dtype, one scale) and one number, with the values taken
    from the number replaced by the number quantized on that grid, as ``snap_fill`` does for
    masked_fill (the output keeps the tensor's scale; the number saturates); in place. Raises
    ValueError for a per-channel ``src``."""
    _one_scale(call, "where", src, "the number")
    cond, x, y = A.named(call.args, call.kwargs, WHERE_PARAMS).values()
    number_is_input = not has_values(x)
    filled = _on_grid(x if number_is_input else y, src, rounding, out.dtype)
    return out.masked_fill_(cond if number_is_input else ~cond, filled)


def snap_abs(call, out: Tensor, src: QInfo, rounding: Round) -> Tensor:
    """``out``, the result of ``abs(x)`` on ``x`` quantized at ``src`` (an integer dtype, one
    scale, zero point z), kept on that grid: ``|code - z|`` of the lowest code exceeds
    ``qmax - z`` (int8 symmetric: |-128| = 128), so values above the grid's largest,
    ``dequantize(qmax)``, saturate to it; in place (``rounding`` unused: no value is rounded).
    Raises ValueError for a per-channel ``src``."""
    _one_scale(call, "abs", src, "its output")
    top = torch.tensor(src.dtype.qmax)
    largest = dequantize(top, src.scale.reshape(()), zero_point=src.zero_point)
    return out.clamp_max_(largest.to(out.dtype))


def _pad_arguments(call) -> dict:
    """F.pad's arguments by name (``_PAD_NAMES``; mode "constant" where the call gives none)."""
    vals = A.named(call.args, call.kwargs, _PAD_NAMES)
    vals["mode"] = vals["mode"] or "constant"
    return vals


def constant_pad(call) -> bool:
    """Whether ``call`` is F.pad in mode "constant" (whose fill is no input value)."""
    return call.op_type == "pad" and _pad_arguments(call)["mode"] == "constant"


def snap_pad(call, out: Tensor, src: QInfo, rounding: Round) -> Tensor:
    """``out``, the result of ``F.pad(x, pad, mode, value)`` on ``x`` quantized at ``src`` (an
    integer dtype), with a constant fill quantized on that grid as ``snap_fill`` quantizes
    masked_fill's (the output keeps the input's scale; the fill saturates); in place. The
    copying modes and a +0.0 fill (the code ``zero_point`` at any scale, per channel too) are
    on the grid already. Raises ValueError for another fill on a per-channel ``src``."""
    vals = _pad_arguments(call)
    if vals["mode"] != "constant" or vals["value"] is None or _positive_zero(vals["value"]):
        return out
    _one_scale(call, "pad", src, "the fill")
    inside = torch.zeros(call.args[0].shape, dtype=torch.bool, device=out.device)
    filled = F.pad(inside, list(vals["pad"]), mode="constant", value=True)
    return out.masked_fill_(filled, _on_grid(vals["value"], src, rounding, out.dtype))


# pass-through ops whose output keeps the input's grid only after a snap of some values:
# op type -> its snap (call, out, src, rounding) -> out, in place
SNAPS = {"masked_fill": snap_fill, "where": snap_where_number, "abs": snap_abs, "pad": snap_pad}


def snaps(call) -> bool:
    """Whether ``call``'s output keeps its input's grid only after a snap (``SNAPS``; a pad
    only in mode "constant": the copying modes move codes as any layout op does)."""
    return call.op_type in SNAPS and (call.op_type != "pad" or constant_pad(call))


def kept_grid(info: QInfo | None, x: Tensor, fixed: bool) -> QInfo | None:
    """The grid of an op's output that is its input ``x`` itself, unchanged (``info``: x's
    ``QInfo`` before the op): ``info`` when it is an integer quantization (in FIXED mode, with
    codes of x's shape), else None."""
    if info is None or not info.dtype.is_int or info.scale is None:
        return None
    return info if not fixed or _codes_of(info, x) is not None else None


def codes_on_grid(
    grid: QTable, x: Tensor, dtype: DType, scale: Tensor, zero_point: int, rounding: Round
) -> QInfo | None:
    """``x``'s recorded grid as the ``QInfo`` quantizing it at (``dtype``, ``scale``,
    ``zero_point``, ``rounding``) would give, or None when that needs the full pass."""
    g = grid.get(x)
    if g is None or g.dtype is not dtype or g.zero_point != zero_point:
        return None
    if rounding not in NEAREST:
        return None
    if g.scale is not scale and float(g.scale) != float(scale):
        return None
    return QInfo(dtype, scale, g.codes, zero_point)


def _codes_of(info: QInfo, x: Tensor) -> Tensor | None:
    c = info.codes
    return c if c is not None and c.shape == x.shape else None


def _training(call) -> bool:
    """A dropout call's ``training`` flag (the third argument; F.dropout's default is True)."""
    if "training" in call.kwargs:
        return bool(call.kwargs["training"])
    return bool(call.args[2]) if len(call.args) > 2 else True


def _zero_constant_pad(call) -> bool:
    vals = _pad_arguments(call)
    v = vals["value"]
    return vals["mode"] == "constant" and (v is None or _positive_zero(v))


def _positive_zero(v) -> bool:
    """Whether ``v`` is the Python number 0 (-0.0 is not the +0.0 that dequantizing the zero
    point gives)."""
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v == 0
        and (math.copysign(1, v) > 0)
    )


# pass-through ops that only move, select or copy elements (not relu / max pooling, which
# compute on values): applied to the codes they give the output's codes
LAYOUT_OPS = frozenset(
    "reshape view permute transpose t flatten squeeze unsqueeze contiguous expand expand_as "
    "chunk split unbind flip narrow select repeat view_as reshape_as movedim clone detach "
    "getitem pixel_shuffle pixel_unshuffle roll tile index_select gather repeat_interleave "
    # pad: only its copying modes are pass-through ops (op_kinds)
    "channel_shuffle native_channel_shuffle pad".split()
)


def layout_codes(fn, args, kwargs, slot, src: QInfo | None, out, infos: list) -> list:
    """The output QInfos of a layout op (``LAYOUT_OPS``) with codes: ``fn`` applied to the
    input's codes in place of its value (same arguments otherwise), leaf by leaf where a codes
    leaf has its value leaf's shape; ``infos`` unchanged when the input has no codes."""
    if any(isinstance(v, torch.dtype) for v in (*args, *kwargs.values())):
        return infos  # a reinterpreting view (x.view(torch.int16)) is not a layout op
    value = A.get(args, kwargs, slot)
    if (
        src is None
        or src.codes is None
        or not isinstance(value, Tensor)
        or src.codes.shape != value.shape
    ):
        return infos
    a2, k2 = list(args), dict(kwargs)
    A.put(a2, k2, slot, src.codes)
    res = fn(*a2, **k2)
    if isinstance(out, Tensor) and isinstance(res, Tensor):  # one leaf each (most layout ops)
        coded, leaves = [res], [out]
    else:
        coded, leaves = tree_flatten(res)[0], tree_flatten(out)[0]
    if len(coded) != len(leaves):
        return infos
    return [
        QInfo(i.dtype, i.scale, c, i.zero_point)
        if isinstance(v, Tensor)
        and v.is_floating_point()
        and isinstance(c, Tensor)
        and c.shape == v.shape
        and not c.is_floating_point()
        else i
        for i, v, c in zip(infos, leaves, coded)
    ]
