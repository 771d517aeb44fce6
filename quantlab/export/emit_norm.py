"""Emitters of the normalisations: LayerNormalization, a group or instance norm as the
LayerNormalization of each group then Mul and Add per channel, and BatchNormalization; each
the float32 steps the onnxruntime profiles compute between DequantizeLinear and
QuantizeLinear."""

from __future__ import annotations

import math

import torch

from quantlab.export.context import ExportContext
from quantlab.export.emit_layout import input_quant, reshape_requantized
from quantlab.export.graph import UnsupportedOpError
from quantlab.export.trace_adapter import ConstRef, RecordedOp


def emit_layer_norm(ctx: ExportContext, op: RecordedOp) -> None:
    ns = ctx.arg(op, 1, "normalized_shape")
    ns = [ns] if isinstance(ns, int) else list(ns)
    w, b = ctx.arg(op, 2, "weight"), ctx.arg(op, 3, "bias")
    eps = float(ctx.arg(op, 4, "eps", 1e-5))
    ones = torch.ones(ns)
    scale = ctx.value(w, f"{op.name}/weight").name if w is not None else None
    scale = scale or ctx.graph.const(f"{op.name}/weight", ones)
    ins = [ctx.act(op, 0), scale]
    if b is not None:
        ins.append(ctx.value(b, f"{op.name}/bias").name)
    y = ctx.graph.node("LayerNormalization", ins, f"{op.name}/float", axis=-len(ns), epsilon=eps)
    ctx.set_outputs(op, [y])


def emit_group_norm(ctx: ExportContext, op: RecordedOp) -> None:
    """group_norm as ``_grouped_norm``'s steps."""
    _grouped_norm(ctx, op, int(ctx.arg(op, 1, "num_groups")), 2, 3, 4)


def emit_instance_norm(ctx: ExportContext, op: RecordedOp) -> None:
    """instance_norm of its input's statistics as ``_grouped_norm``'s steps, one group per
    channel; one of running statistics (an eval-mode ``track_running_stats``) is refused."""
    if not ctx.arg(op, 5, "use_input_stats", True):
        raise UnsupportedOpError(
            f"op {op.name}: instance_norm with running statistics (track_running_stats in "
            "eval mode); exported: instance_norm of its input's statistics"
        )
    _grouped_norm(ctx, op, ctx.shape_of(op, 0)[1], 3, 4, 7)


def _grouped_norm(ctx: ExportContext, op: RecordedOp, groups: int, w_at, b_at, eps_at) -> None:
    """A group norm (``groups`` groups; weight, bias and eps at those argument positions) as
    Reshape to (N, groups, the rest), LayerNormalization over that last axis (a scale of ones,
    no bias), Reshape back, then Mul by the weight and Add the bias per channel (each left out
    when absent): onnxruntime's steps that the onnxruntime profile computes
    (``numerics.ort_layer_norm.ort_group_norm``). The steps before the last are named
    ``<op>/group_...`` (``runtime``'s role ``group``)."""
    shape = list(ctx.shape_of(op, 0))
    w, b = ctx.arg(op, w_at, "weight"), ctx.arg(op, b_at, "bias")
    eps = float(ctx.arg(op, eps_at, "eps", 1e-5))
    rest = math.prod(shape[1:]) // groups
    # quantized again after the Reshape, at its own grid: onnxruntime's SIGNED Q/DQ propagation
    # through a bare Reshape writes a QuantizeLinear of mismatched types and fails the session
    y = reshape_requantized(
        ctx, ctx.act(op, 0), input_quant(op), [shape[0], groups, rest], f"{op.name}/group_rows"
    )
    ones = ctx.graph.const(f"{op.name}/ones", torch.ones(rest))
    y = ctx.graph.node(
        "LayerNormalization", [y, ones], f"{op.name}/group_normed", axis=-1, epsilon=eps
    )
    back = ctx.graph.int64s(f"{op.name}/shape", shape)
    per_channel = [shape[1]] + [1] * (len(shape) - 2)
    steps = [(t, kind) for t, kind in ((w, "weight"), (b, "bias")) if t is not None]
    y = ctx.graph.node(
        "Reshape", [y, back], f"{op.name}/float" if not steps else f"{op.name}/group_back"
    )
    for i, (t, kind) in enumerate(steps):
        if isinstance(t, ConstRef):
            c = t.value.detach().to(torch.float32).reshape(per_channel)
            c = ctx.graph.const(f"{op.name}/{kind}", c)
        else:  # a weight or bias another op computed: its values, shaped per channel
            dims = ctx.graph.int64s(f"{op.name}/group_{kind}_shape", per_channel)
            c = ctx.graph.node("Reshape", [ctx.value(t).name, dims], f"{op.name}/group_{kind}")
        base = f"{op.name}/float" if i == len(steps) - 1 else f"{op.name}/group_scaled"
        y = ctx.graph.node("Mul" if kind == "weight" else "Add", [y, c], base)
    ctx.set_outputs(op, [y])


def emit_batch_norm(ctx: ExportContext, op: RecordedOp) -> None:
    """An eval-mode batch_norm not folded into a GEMM as BatchNormalization (the onnxruntime
    profile computes its float32 steps); a training-mode one is refused."""
    if ctx.arg(op, 5, "training", False):
        raise UnsupportedOpError(f"op {op.name}: batch_norm in training mode")
    c = ctx.shape_of(op, 0)[1]
    ins = [ctx.act(op, 0)]
    for i, name, fill in ((3, "weight", 1.0), (4, "bias", 0.0), (1, "running_mean", None),
                          (2, "running_var", None)):  # fmt: skip
        v = ctx.arg(op, i, name)
        if v is None:
            if fill is None:
                raise UnsupportedOpError(f"op {op.name}: batch_norm without running statistics")
            ins.append(ctx.graph.const(f"{op.name}/{name}", torch.full((c,), fill)))
        else:
            ins.append(ctx.value(v, f"{op.name}/{name}").name)
    eps = float(ctx.arg(op, 7, "eps", 1e-5))
    y = ctx.graph.node("BatchNormalization", ins, f"{op.name}/float", epsilon=eps)
    ctx.set_outputs(op, [y])
