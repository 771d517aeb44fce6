"""Pooling, reductions and selections as ONNX: max / average pooling (adaptive too),
sums and means, max / min reductions and topk. A maximum, a minimum or a selected value is
one of its inputs, so those keep the input's codes; a mean or an average is computed as the
emitter writes it and quantized where quantlab quantizes it."""

from __future__ import annotations

import math

import numpy as np

from quantlab.export.context import ExportContext, int_list
from quantlab.export.graph import UnsupportedOpError
from quantlab.export.trace_adapter import RecordedOp
from quantlab.numerics.float_window_pool import global_mean_in_range


def emit_max_pool(ctx: ExportContext, op: RecordedOp) -> None:
    nd = 2 if op.op_type == "max_pool2d" else 1
    k = int_list(ctx.arg(op, 1, "kernel_size"), nd)
    stride = ctx.arg(op, 2, "stride", None)
    stride = k if stride in (None, []) else int_list(stride, nd)
    pad = int_list(ctx.arg(op, 3, "padding", 0), nd)
    dil = int_list(ctx.arg(op, 4, "dilation", 1), nd)
    ceil = int(bool(ctx.arg(op, 5, "ceil_mode", False)))
    if ctx.arg(op, 6, "return_indices", False):
        raise UnsupportedOpError(f"op {op.name}: max pooling with return_indices")
    y = ctx.graph.node(
        "MaxPool",
        [ctx.act(op, 0)],
        f"{op.name}/float",
        kernel_shape=k,
        strides=stride,
        pads=pad + pad,
        dilations=dil,
        ceil_mode=ceil,
    )
    ctx.set_outputs(op, [y])


def emit_adaptive_max_pool(ctx: ExportContext, op: RecordedOp) -> None:
    """adaptive_max_pool1d / 2d as GlobalMaxPool (output 1 per axis), as a MaxPool whose kernel
    and stride are input / output size (sizes that divide), or else per axis as a Gather of
    each window's entries (``adaptive_windows``) and a ReduceMax over them; indices are
    refused. A maximum is one of its inputs: the codes move."""
    if ctx.arg(op, 2, "return_indices", False):
        raise UnsupportedOpError(f"op {op.name}: adaptive max pooling with return_indices")
    nd = 1 if op.op_type == "adaptive_max_pool1d" else 2
    sizes = tuple(ctx.shape_of(op, 0)[-nd:])
    outs = tuple(op.outputs[0].shape[-nd:])
    x = ctx.act(op, 0)
    if all(o == 1 for o in outs):
        y = ctx.graph.node("GlobalMaxPool", [x], f"{op.name}/float")
    elif all(n % o == 0 for n, o in zip(sizes, outs)):
        k = [n // o for n, o in zip(sizes, outs)]
        y = ctx.graph.node("MaxPool", [x], f"{op.name}/float", kernel_shape=k, strides=k)
    else:
        g, y, rank = ctx.graph, x, len(op.outputs[0].shape)
        for k, (n_in, n_out) in enumerate(zip(sizes, outs)):
            axis = rank - nd + k
            windows = g.const(f"{op.name}/{k}/windows", adaptive_windows(n_in, n_out))
            rows = g.node("Gather", [y, windows], f"{op.name}/{k}/rows", axis=axis)
            axes = g.int64s(f"{op.name}/{k}/axes", [axis + 1])
            name = f"{op.name}/float" if k == nd - 1 else f"{op.name}/{k}"
            y = g.node("ReduceMax", [rows, axes], name, keepdims=0)
    ctx.set_outputs(op, [y])


def adaptive_windows(n_in: int, n_out: int) -> np.ndarray:
    """int64 [n_out, K]: the input indices of each adaptive pooling window along an axis, torch's
    ``[floor(i n_in / n_out), ceil((i + 1) n_in / n_out))``, each row filled up to the widest
    window K by repeating its last index (which leaves a maximum unchanged)."""
    start = (np.arange(n_out) * n_in) // n_out
    end = -((-(np.arange(n_out) + 1) * n_in) // n_out)
    width = int((end - start).max())
    return np.minimum(start[:, None] + np.arange(width)[None, :], end[:, None] - 1).astype(np.int64)


def emit_avg_pool(ctx: ExportContext, op: RecordedOp) -> None:
    """avg_pool1d / 2d as AveragePool, adaptive ones to one value as GlobalAveragePool (or
    ReduceMean where QLinearGlobalAveragePool refuses the scales), to sizes that divide the
    input's as AveragePool with kernel = stride."""
    x = ctx.act(op, 0)
    shape = ctx.shape_of(op, 0)
    nd = 1 if op.op_type.endswith("1d") else 2
    if op.op_type.startswith("adaptive"):
        osz = ctx.arg(op, 1, "output_size")
        osz = int_list(osz, nd)
        if osz == [1] * nd:
            kind = "GlobalAveragePool" if _global_mean_runs(op, shape) else "ReduceMean"
            axes = list(range(2, 2 + nd))
            axes = [ctx.graph.int64s(f"{op.name}/axes", axes)] if kind == "ReduceMean" else []
            ctx.set_outputs(op, [ctx.graph.node(kind, [x, *axes], f"{op.name}/float")])
            return
        sizes = shape[-nd:]
        if any(s % o for s, o in zip(sizes, osz)):
            raise UnsupportedOpError(f"op {op.name}: adaptive pooling to {osz} from {sizes}")
        k = [s // o for s, o in zip(sizes, osz)]
        attrs = dict(kernel_shape=k, strides=k)
    else:
        k = int_list(ctx.arg(op, 1, "kernel_size"), nd)
        stride = ctx.arg(op, 2, "stride", None)
        stride = k if stride in (None, []) else int_list(stride, nd)
        pad = int_list(ctx.arg(op, 3, "padding", 0), nd)
        ceil = int(bool(ctx.arg(op, 4, "ceil_mode", False)))
        cip = int(bool(ctx.arg(op, 5, "count_include_pad", True)))
        if ctx.arg(op, 6, "divisor_override", None) is not None:
            raise UnsupportedOpError(f"op {op.name}: avg_pool2d with divisor_override")
        attrs = dict(
            kernel_shape=k, strides=stride, pads=pad + pad, ceil_mode=ceil, count_include_pad=cip
        )
    ctx.set_outputs(op, [ctx.graph.node("AveragePool", [x], f"{op.name}/float", **attrs)])


def _global_mean_runs(op: RecordedOp, shape) -> bool:
    """Whether onnxruntime's QLinearGlobalAveragePool takes this spatial mean's scales (it
    refuses some; ``global_mean_in_range``): else it is written as a float ReduceMean."""
    q_in = op.in_quant[0] if op.in_quant else None
    q_out = op.out_quant[0] if op.out_quant else None
    if q_in is None or q_out is None:
        return True  # a float mean: onnxruntime fuses nothing
    return global_mean_in_range(q_in.scale, q_out.scale, math.prod(shape[2:]))


def reduced_dims(v, ndim: int) -> list[int] | None:
    """A reduction's ``dim`` argument (an int or a sequence) as sorted dims in [0, ndim);
    None for None."""
    if v is None:
        return None
    v = [v] if isinstance(v, int) else list(v)
    return sorted(int(d) % ndim for d in v)


def emit_reduce(ctx: ExportContext, op: RecordedOp) -> None:
    if op.kwargs.get("dtype") is not None:
        raise UnsupportedOpError(f"op {op.name}: {op.op_type} with dtype")
    x = ctx.act(op, 0)
    shape = ctx.shape_of(op, 0)
    dims = reduced_dims(ctx.arg(op, 1, "dim"), len(shape))
    keep = bool(ctx.arg(op, 2, "keepdim", False))
    out_shape = list(op.outputs[0].shape)
    if op.op_type == "mean" and len(shape) == 4 and dims == [2, 3] and _global_mean_runs(op, shape):
        y = ctx.graph.node("GlobalAveragePool", [x], f"{op.name}/float")  # NCHW spatial mean
        if not keep:
            y = ctx.graph.node(
                "Reshape", [y, ctx.graph.int64s(f"{op.name}/shape", out_shape)], f"{op.name}/flat"
            )
        ctx.set_outputs(op, [y])
        return
    axes = dims if dims is not None else list(range(len(shape)))
    onnx_op = "ReduceMean" if op.op_type == "mean" else "ReduceSum"
    y = ctx.graph.node(
        onnx_op,
        [x, ctx.graph.int64s(f"{op.name}/axes", axes)],
        f"{op.name}/float",
        keepdims=int(keep),
    )
    ctx.set_outputs(op, [y])


def emit_reduce_extreme(ctx: ExportContext, op: RecordedOp) -> None:
    """amax / amin as ReduceMax / ReduceMin: each output is one of its inputs, so the codes
    stay on the input's grid (a pass-through op)."""
    shape = ctx.shape_of(op, 0)
    dims = reduced_dims(ctx.arg(op, 1, "dim", ()), len(shape))
    axes = dims if dims else list(range(len(shape)))  # dim=() reduces every dimension
    y = ctx.graph.node(
        "ReduceMax" if op.op_type == "amax" else "ReduceMin",
        [ctx.act(op, 0), ctx.graph.int64s(f"{op.name}/axes", axes)],
        f"{op.name}/float",
        keepdims=int(bool(ctx.arg(op, 2, "keepdim", False))),
    )
    ctx.set_outputs(op, [y])


def emit_topk(ctx: ExportContext, op: RecordedOp) -> None:
    """torch.topk as TopK: its values (each one of its inputs: on the input's grid, a
    pass-through op) and int64 indices, sorted, equal values by the lower index first, the order
    quantized runs take (``simulate.topk_order``)."""
    nd = len(ctx.shape_of(op, 0))
    k = int(ctx.arg(op, 1, "k"))
    axis = int(ctx.arg(op, 2, "dim", -1)) % nd
    largest = int(bool(ctx.arg(op, 3, "largest", True)))
    values, indices = ctx.graph.node(
        "TopK",
        [ctx.act(op, 0), ctx.graph.int64s(f"{op.name}/k", [k])],
        f"{op.name}/float",
        n_out=2,
        axis=axis,
        largest=largest,
        sorted=1,
    )
    ctx.set_outputs(op, [values, indices])
