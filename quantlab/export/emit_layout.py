"""Ops that move, select or reshape values without computing new ones, as ONNX: reshapes,
transposes, indexing and slicing (chunk, split, unbind, narrow, select, flip), expand, repeat
and tile, roll, index_select and gather, repeat_interleave, tril / triu, movedim, pixel
(un)shuffle, casts and constant padding. A quantized input's codes pass
through unchanged; the exporter quantizes the output at the input's scale where quantlab
does."""

from __future__ import annotations

import numpy as np
import torch

from quantlab.export.context import ExportContext, Value, as_tensor
from quantlab.export.graph import TORCH_TO_ONNX, QParams, UnsupportedOpError
from quantlab.export.trace_adapter import ConstRef, InputRef, OpRef, RecordedOp


def reshape_requantized(ctx: ExportContext, x: str, q: QParams | None, shape, base: str) -> str:
    """Reshape a (dequantized) tensor to ``shape``; a quantized one is quantized again at its
    own scale after it (QDQ around a Reshape: onnxruntime moves the codes, and its SIGNED
    encoding's Q/DQ propagation does not have to)."""
    y = ctx.graph.node("Reshape", [x, ctx.graph.int64s(f"{base}/shape", shape)], base)
    if q is None:
        return y
    return ctx.graph.dequantize(ctx.graph.quantize(y, q, base=f"{base}/q"), q)


def input_quant(op: RecordedOp) -> QParams | None:
    """The quantization the op's first input enters with (None: float)."""
    want = op.in_quant[0] if op.in_quant else None
    if want is None:
        return None
    return QParams.of(want.dtype, want.scale, zero_point=want.zero_point)


def first_input(ctx: ExportContext, op: RecordedOp) -> str:
    """Input 0 of an op: the activation as quantized for the op, or a float argument."""
    if op.acts:
        return ctx.act(op, 0)
    return ctx.value(op.args[0], f"{op.name}/in").name


def emit_reshape(ctx: ExportContext, op: RecordedOp) -> None:
    shape = ctx.graph.int64s(f"{op.name}/shape", op.outputs[0].shape)
    ctx.set_outputs(
        op, [ctx.graph.node("Reshape", [first_input(ctx, op), shape], f"{op.name}/float")]
    )


def emit_transpose(ctx: ExportContext, op: RecordedOp) -> None:
    nd = op.outputs[0].dim()
    if op.op_type == "permute":
        dims = op.args[1:] if len(op.args) > 2 else ctx.arg(op, 1, "dims")
        perm = [int(d) % nd for d in (dims if not isinstance(dims, int) else [dims])]
    elif op.op_type == "t":
        perm = [1, 0] if nd == 2 else [0]
    else:
        d0, d1 = int(ctx.arg(op, 1, "dim0")) % nd, int(ctx.arg(op, 2, "dim1")) % nd
        perm = list(range(nd))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    ctx.set_outputs(
        op, [ctx.graph.node("Transpose", [first_input(ctx, op)], f"{op.name}/float", perm=perm)]
    )


def emit_identity(ctx: ExportContext, op: RecordedOp) -> None:
    src = op.args[0] if op.args else op.kwargs.get("input")
    v = ctx.value(src, f"{op.name}/in")
    q = input_quant(op)
    if op.acts and q is not None and not q.same_as(v.quant):
        ctx.set_outputs(op, [ctx.act(op, 0)])  # quantized on the way in
        return
    ctx.alias(op, v)


_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


def emit_getitem(ctx: ExportContext, op: RecordedOp) -> None:
    """Basic indexing: slices (any step; bounds may be 0-d integer tensors), integers, None and
    Ellipsis, as a tuple or as a list torch reads as one (``_torch_index``); constant integer
    index tensors on the leading dims (GatherND); one integer index tensor, computed or an
    input, at one axis with every other axis whole (Gather: ``table[ids]``, ``x[:, idx]``, as
    onnx2torch's Gather indexes)."""
    x = first_input(ctx, op)
    index = _torch_index(op, op.args[1])
    shape = list(_first_shape(ctx, op))
    if index and all(_int_constant(i) for i in index):
        _gather_nd(ctx, op, x, [as_tensor(i) for i in index], shape)
        return
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    expanded: list = []
    for i in index:
        if i is Ellipsis:
            expanded += [slice(None)] * (len(shape) - n_real)
        else:
            expanded.append(i)
    tensors = [k for k, i in enumerate(expanded) if isinstance(i, (InputRef, OpRef, ConstRef))]
    whole = all(i == slice(None) for k, i in enumerate(expanded) if k not in tensors)
    if len(tensors) == 1 and whole:
        indices = ctx.value(expanded[tensors[0]], f"{op.name}/indices")
        if indices.dtype in (torch.int32, torch.int64):
            gathered = ctx.graph.node("Gather", [x, indices.name], f"{op.name}/float",
                                      axis=tensors[0])  # fmt: skip
            ctx.set_outputs(op, [gathered])
            return
    if any(isinstance(i, (InputRef, OpRef, ConstRef, list)) for i in index):
        raise UnsupportedOpError(f"op {op.name}: indexing with tensors or lists")
    starts, ends, axes, steps, squeeze = [], [], [], [], []
    dim = 0
    for i in expanded:
        if i is None:
            continue
        if isinstance(i, int):
            starts.append(i)
            ends.append(i + 1 if i != -1 else _INT64_MAX)
            axes.append(dim)
            steps.append(1)
            squeeze.append(dim)
        elif isinstance(i, slice):
            if i != slice(None):
                starts.append(0 if i.start is None else int(i.start))
                ends.append(_INT64_MAX if i.stop is None else int(i.stop))
                axes.append(dim)
                steps.append(1 if i.step is None else int(i.step))
        else:
            raise UnsupportedOpError(f"op {op.name}: index {i!r}")
        dim += 1
    ctx.set_outputs(op, [_slice(ctx, op.name, x, starts, ends, axes, steps, op.outputs[0].shape)])


def _torch_index(op: RecordedOp, index) -> tuple:
    """``index`` as the tuple torch reads it: a list holding a slice, None, Ellipsis or a tensor
    is read as a tuple of them (torch's legacy rule; onnx2torch's Slice and Gather index so), a
    list of integers alone as one integer index tensor."""
    if not isinstance(index, list):
        return index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, bool) for i in index):
        raise UnsupportedOpError(f"op {op.name}: indexing with a list of bools")
    if all(isinstance(i, int) for i in index):
        return (ConstRef(torch.tensor(index, dtype=torch.int64)),)
    return tuple(index)


def _int_constant(i) -> bool:
    """An integer index tensor held by the model (a bool mask selects instead: not this)."""
    return (
        isinstance(i, ConstRef)
        and not i.value.is_floating_point()
        and i.value.dtype is not torch.bool
    )


def _gather_nd(ctx: ExportContext, op: RecordedOp, x: str, index: list, shape: list) -> None:
    """x[i0, i1, ...] with constant integer index tensors on the leading dims (transformers'
    ``padding_mask[batch_idx, kv_idx]``): GatherND on the broadcast indices, each taken
    modulo its dim (torch's negative indices)."""
    dims = shape[: len(index)]
    parts = np.broadcast_arrays(*[i.detach().cpu().numpy().astype(np.int64) for i in index])
    if any(((p < -d) | (p >= d)).any() for p, d in zip(parts, dims)):
        raise UnsupportedOpError(f"op {op.name}: an index out of range")
    idx = np.stack([p % d for p, d in zip(parts, dims)], axis=-1)
    names = ctx.graph.const(f"{op.name}/indices", idx)
    ctx.set_outputs(op, [ctx.graph.node("GatherND", [x, names], f"{op.name}/float")])


def _slice(ctx: ExportContext, base: str, x: str, starts, ends, axes, steps, shape) -> str:
    """Slice (none without ``axes``) then Reshape to the output leaf's ``shape`` (selected dims
    dropped, new ones added)."""
    g = ctx.graph
    if axes:
        x = g.node(
            "Slice",
            [
                x,
                g.int64s(f"{base}/starts", starts),
                g.int64s(f"{base}/ends", ends),
                g.int64s(f"{base}/axes", axes),
                g.int64s(f"{base}/steps", steps),
            ],
            f"{base}/slice",
        )
    return g.node("Reshape", [x, g.int64s(f"{base}/shape", list(shape))], f"{base}/float")


def emit_pieces(ctx: ExportContext, op: RecordedOp) -> None:
    """chunk, split, unbind, narrow, select: each output is a contiguous range of the input
    along one dim (unbind / select drop it), a Slice of the codes' values."""
    x = first_input(ctx, op)
    nd = len(ctx.shape_of(op, 0))
    size_of = ctx.shape_of(op, 0)
    if op.op_type in ("narrow", "select"):
        dim = int(ctx.arg(op, 1, "dim")) % nd
        start = int(ctx.arg(op, 2, "start" if op.op_type == "narrow" else "index"))
        start %= size_of[dim]
        length = int(ctx.arg(op, 3, "length")) if op.op_type == "narrow" else 1
        spans = [(start, length)]
    else:
        dim = int(ctx.arg(op, 2 if op.op_type != "unbind" else 1, "dim", 0)) % nd
        spans, at = [], 0
        for t in op.outputs:
            n = 1 if op.op_type == "unbind" else t.shape[dim]
            spans.append((at, n))
            at += n
    names = []
    for j, ((start, n), t) in enumerate(zip(spans, op.outputs, strict=True)):
        base = f"{op.name}/{j}"
        names.append(_slice(ctx, base, x, [start], [start + n], [dim], [1], t.shape))
    ctx.set_outputs(op, names)


def emit_flip(ctx: ExportContext, op: RecordedOp) -> None:
    """flip as a Slice with step -1 on each flipped dim."""
    nd = len(ctx.shape_of(op, 0))
    dims = ctx.arg(op, 1, "dims")
    dims = sorted({int(d) % nd for d in ([dims] if isinstance(dims, int) else dims)})
    n = len(dims)
    y = _slice(
        ctx, op.name, first_input(ctx, op), [-1] * n, [_INT64_MIN] * n, dims, [-1] * n,
        op.outputs[0].shape,
    )  # fmt: skip
    ctx.set_outputs(op, [y])


def emit_expand(ctx: ExportContext, op: RecordedOp) -> None:
    """expand / expand_as / repeat: Expand to the output's shape (expand), or Tile after a
    Reshape adding the leading dims the repeat counts add (repeat)."""
    g = ctx.graph
    x, out = first_input(ctx, op), list(op.outputs[0].shape)
    if op.op_type != "repeat":
        y = g.node("Expand", [x, g.int64s(f"{op.name}/shape", out)], f"{op.name}/float")
        ctx.set_outputs(op, [y])
        return
    reps = op.args[1:] if len(op.args) > 2 else ctx.arg(op, 1, "repeats")
    _tiled(ctx, op, [int(r) for r in ([reps] if isinstance(reps, int) else reps)])


def emit_tile(ctx: ExportContext, op: RecordedOp) -> None:
    """tile: the repeat counts padded with leading 1s to the input's rank, then as repeat
    (Tile, after a Reshape adding the leading dims more counts add)."""
    reps = op.args[1:] if len(op.args) > 2 else ctx.arg(op, 1, "dims")
    reps = [int(r) for r in ([reps] if isinstance(reps, int) else reps)]
    nd = len(_first_shape(ctx, op))
    _tiled(ctx, op, [1] * (nd - len(reps)) + reps)


def _first_shape(ctx: ExportContext, op: RecordedOp) -> tuple:
    """The shape of the call's first argument: an activation, a computed integer tensor or a
    constant of the model (indexing, a repeat outside capture)."""
    src = op.args[0]
    return tuple(as_tensor(src).shape) if isinstance(src, ConstRef) else ctx.value(src).shape


def _tiled(ctx: ExportContext, op: RecordedOp, reps: list[int]) -> None:
    g = ctx.graph
    x, shape = first_input(ctx, op), list(_first_shape(ctx, op))
    if len(reps) > len(shape):  # the leading dims the repeat counts add
        shape = [1] * (len(reps) - len(shape)) + shape
        x = reshape_requantized(ctx, x, input_quant(op), shape, f"{op.name}/lead")
    y = g.node("Tile", [x, g.int64s(f"{op.name}/repeats", reps)], f"{op.name}/float")
    ctx.set_outputs(op, [y])


def emit_roll(ctx: ExportContext, op: RecordedOp) -> None:
    """roll: per rolled dim, a Gather of the constant indices (i - shift) mod n; with no dims,
    on the flattened input (``_flattened``), reshaped back."""
    g = ctx.graph
    shifts = ctx.arg(op, 1, "shifts")
    dims = ctx.arg(op, 2, "dims", None)
    shifts = [int(s) for s in ([shifts] if isinstance(shifts, int) else shifts)]
    flat = dims is None or (not isinstance(dims, int) and len(dims) == 0)
    x, shape = _flattened(ctx, op) if flat else (first_input(ctx, op), list(ctx.shape_of(op, 0)))
    if flat:
        dims = [0]
    dims = [int(d) % len(shape) for d in ([dims] if isinstance(dims, int) else dims)]
    for k, (s, d) in enumerate(zip(shifts, dims, strict=True)):
        idx = (np.arange(shape[d], dtype=np.int64) - s) % max(shape[d], 1)
        x = g.node("Gather", [x, g.const(f"{op.name}/{k}/index", idx)], f"{op.name}/{k}", axis=d)
    out = list(op.outputs[0].shape)
    ctx.set_outputs(
        op, [g.node("Reshape", [x, g.int64s(f"{op.name}/shape", out)], f"{op.name}/float")]
    )


def _flattened(ctx: ExportContext, op: RecordedOp) -> tuple[str, list[int]]:
    """The op's input reshaped to one dim, and that shape (requantized after the Reshape,
    ``reshape_requantized``: without it onnxruntime 1.32's Q/DQ propagation wrote a
    QuantizeLinear it then rejected, under the SIGNED encoding)."""
    shape = [int(np.prod(ctx.shape_of(op, 0)))]
    x = reshape_requantized(ctx, first_input(ctx, op), input_quant(op), shape, f"{op.name}/flat")
    return x, shape


def _index(ctx: ExportContext, op: RecordedOp, pos: int, kw: str) -> str:
    """An index tensor argument's graph name (a model constant, an input, or an op's output)."""
    ref = ctx.arg(op, pos, kw)
    if not isinstance(ref, (ConstRef, InputRef, OpRef)):
        raise UnsupportedOpError(f"op {op.name} ({op.op_type}): index {ref!r} is not a tensor")
    return ctx.value(ref, f"{op.name}/index").name


_GATHERS = {"index_select": "Gather", "gather": "GatherElements"}


def emit_gather(ctx: ExportContext, op: RecordedOp) -> None:
    """index_select(x, dim, index) as Gather, gather(x, dim, index) as GatherElements, along
    ``dim``."""
    dim = int(ctx.arg(op, 1, "dim")) % len(ctx.shape_of(op, 0))
    idx = _index(ctx, op, 2, "index")
    kind = _GATHERS[op.op_type]
    y = ctx.graph.node(kind, [first_input(ctx, op), idx], f"{op.name}/float", axis=dim)
    ctx.set_outputs(op, [y])


def emit_repeat_interleave(ctx: ExportContext, op: RecordedOp) -> None:
    """repeat_interleave(x, repeats, dim): Gather along ``dim`` of the index each kept value
    repeats to (arange(n).repeat_interleave(repeats), a constant: ``repeats`` an int or a
    model constant); with no dim, on the flattened input (``_flattened``)."""
    g = ctx.graph
    reps = ctx.arg(op, 1, "repeats")
    dim = ctx.arg(op, 2, "dim", None)
    if isinstance(reps, ConstRef):
        reps = reps.value
    elif not isinstance(reps, int):
        raise UnsupportedOpError(f"op {op.name}: repeat_interleave's repeats come from inputs")
    x, shape = (
        _flattened(ctx, op) if dim is None else (first_input(ctx, op), list(ctx.shape_of(op, 0)))
    )
    dim = 0 if dim is None else dim
    dim = int(dim) % len(shape)
    idx = torch.arange(shape[dim]).repeat_interleave(reps)
    y = g.node("Gather", [x, g.const(f"{op.name}/index", idx)], f"{op.name}/float", axis=dim)
    ctx.set_outputs(op, [y])


def emit_trilu(ctx: ExportContext, op: RecordedOp) -> None:
    """tril / triu(x, diagonal): Trilu (its zeros are the zero point's value)."""
    k = int(ctx.arg(op, 1, "diagonal", 0))
    y = ctx.graph.node(
        "Trilu",
        [first_input(ctx, op), ctx.graph.const(f"{op.name}/k", np.asarray(k, dtype=np.int64))],
        f"{op.name}/float",
        upper=int(op.op_type == "triu"),
    )
    ctx.set_outputs(op, [y])


def emit_movedim(ctx: ExportContext, op: RecordedOp) -> None:
    """movedim as the Transpose that moves ``source`` dims to ``destination`` (the others keep
    their order)."""
    nd = len(ctx.shape_of(op, 0))
    src, dst = ctx.arg(op, 1, "source"), ctx.arg(op, 2, "destination")
    src = [int(d) % nd for d in ([src] if isinstance(src, int) else src)]
    dst = [int(d) % nd for d in ([dst] if isinstance(dst, int) else dst)]
    perm: list = [None] * nd
    for s_, d_ in zip(src, dst, strict=True):
        perm[d_] = s_
    rest = iter(d for d in range(nd) if d not in src)
    perm = [p if p is not None else next(rest) for p in perm]
    y = ctx.graph.node("Transpose", [first_input(ctx, op)], f"{op.name}/float", perm=perm)
    ctx.set_outputs(op, [y])


def emit_pixel_shuffle(ctx: ExportContext, op: RecordedOp) -> None:
    """pixel_shuffle as DepthToSpace (CRD: channel c * r * r + i * r + j goes to pixel (i, j)
    of channel c's block); pixel_unshuffle, its inverse, as Reshape, Transpose, Reshape (the
    intermediate quantized again at the input's scale, as the codes are)."""
    g = ctx.graph
    x = first_input(ctx, op)
    if op.op_type == "pixel_shuffle":
        r = int(ctx.arg(op, 1, "upscale_factor"))
        y = g.node("DepthToSpace", [x], f"{op.name}/float", blocksize=r, mode="CRD")
        ctx.set_outputs(op, [y])
        return
    r = int(ctx.arg(op, 1, "downscale_factor"))
    n, c, h, w = ctx.shape_of(op, 0)
    blocks = [n, c, h // r, r, w // r, r]
    y = reshape_requantized(ctx, x, input_quant(op), blocks, f"{op.name}/blocks")
    y = g.node("Transpose", [y], f"{op.name}/moved", perm=[0, 1, 3, 5, 2, 4])
    out = g.int64s(f"{op.name}/shape", list(op.outputs[0].shape))
    ctx.set_outputs(op, [g.node("Reshape", [y, out], f"{op.name}/float")])


def emit_channel_shuffle(ctx: ExportContext, op: RecordedOp) -> None:
    """channel_shuffle as Reshape (N, g, C / g, rest), Transpose of the two channel axes,
    Reshape back (the intermediate quantized again at the input's scale, as the codes are)."""
    g = ctx.graph
    groups = int(ctx.arg(op, 1, "groups"))
    n, c, *rest = ctx.shape_of(op, 0)
    y = reshape_requantized(
        ctx, first_input(ctx, op), input_quant(op), [n, groups, c // groups, *rest],
        f"{op.name}/groups",
    )  # fmt: skip
    perm = [0, 2, 1, *range(3, 3 + len(rest))]
    y = g.node("Transpose", [y], f"{op.name}/moved", perm=perm)
    out = g.int64s(f"{op.name}/shape", list(op.outputs[0].shape))
    ctx.set_outputs(op, [g.node("Reshape", [y, out], f"{op.name}/float")])


# x.to(dtype), x.float(), x.long(), ..., x.type_as(y): a Cast to the recorded output's dtype
CAST_TYPES = ("to", "type", "type_as", "float", "double", "half", "long", "int", "short")
CAST_TYPES += ("char", "byte", "bool")


def emit_cast(ctx: ExportContext, op: RecordedOp) -> None:
    src = ctx.value(op.args[0], f"{op.name}/in")
    out = op.outputs[0].dtype
    if out == src.dtype:
        ctx.alias(op, src)
        return
    y = ctx.graph.node("Cast", [src.name], f"{op.name}/float", to=TORCH_TO_ONNX[out])
    ctx.set_outputs(op, [y])


# F.pad's modes that copy input values, as ONNX Pad names them
_COPYING_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def emit_pad(ctx: ExportContext, op: RecordedOp) -> None:
    """F.pad as Pad: constant padding of the codes (``_pad_codes``) or of the float values;
    reflect, replicate and circular padding (a pass-through op: every value an input value)
    as Pad's reflect, edge and wrap modes."""
    src = ctx.value(op.args[0], f"{op.name}/in")
    pad = list(ctx.arg(op, 1, "pad"))
    mode = ctx.arg(op, 2, "mode", "constant")
    value = ctx.arg(op, 3, "value", None)
    if mode != "constant" and mode not in _COPYING_PAD_MODES:
        raise UnsupportedOpError(f"op {op.name}: pad mode {mode!r}")
    nd = len(src.shape)
    begins, ends = [0] * nd, [0] * nd
    for k in range(len(pad) // 2):
        begins[nd - 1 - k], ends[nd - 1 - k] = int(pad[2 * k]), int(pad[2 * k + 1])
    pads = ctx.graph.int64s(f"{op.name}/pads", begins + ends)
    if mode != "constant":
        x = first_input(ctx, op)
        y = ctx.graph.node("Pad", [x, pads], f"{op.name}/float", mode=_COPYING_PAD_MODES[mode])
        ctx.set_outputs(op, [y])
        return
    if _pad_codes(ctx, op, src, pads, float(value or 0.0)):
        return
    ins = [src.name, pads, ctx.float_const(f"{op.name}/value", float(value or 0.0))]
    ctx.set_outputs(op, [ctx.graph.node("Pad", ins, f"{op.name}/float", mode="constant")])


def _pad_codes(ctx: ExportContext, op: RecordedOp, src: Value, pads: str, fill: float) -> bool:
    """Zero padding of a per-tensor quantized value as Pad of its codes with their zero point,
    then DequantizeLinear: the same values as padding the dequantized tensor with 0.0, but a
    node onnxruntime runs on the codes and can fuse into the next QLinearConv (a float Pad
    between DequantizeLinear and QuantizeLinear runs in float). Only for codes written as
    uint8 (``GraphBuilder.offset``: onnxruntime's x86 kernels take int8 activations by
    rewriting Q/DQ pairs to uint8, which a Pad between them would stop) and where the op's
    output keeps the input's quantization or has none; False: not written."""
    q = src.quant
    if src.codes is None or q is None or not ctx.graph.offset(q) or fill != 0.0:
        return False
    out = op.out_quant[0] if op.out_quant else None
    if out is not None and not q.same_as(
        QParams.of(out.dtype, out.scale, zero_point=out.zero_point)
    ):
        return False
    g = ctx.graph
    zero = g.zero_point_of(src.codes, q)
    codes = g.node("Pad", [src.codes, pads, zero], f"{op.name}/codes", mode="constant")
    ctx.set_codes(op, codes, q)
    return True
