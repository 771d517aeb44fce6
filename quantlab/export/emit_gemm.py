"""Conv / Linear / MatMul as ONNX QDQ: DequantizeLinear on the activation (per tensor), the
weight (per output channel, axis 0) and the int32 bias (scale x_scale * w_scale per channel,
quantlab's ``quantize_bias``), the float op, then the output QuantizeLinear. A relu6 / clamp
fused into the GEMM becomes a Clip on the dequantized output, quantized again at the same scale
(the bounds quantlab applies to the output codes)."""

from __future__ import annotations

import numpy as np
import torch

from quantlab.export.context import ExportContext
from quantlab.export.graph import QParams, UnsupportedOpError
from quantlab.export.trace_adapter import ConstRef, OpRef, RecordedOp, fused_clamp_bounds
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import acc_scale, quantize_bias
from quantlab.simulate import args as sim_args


def _pair(v, n: int) -> list[int]:
    if isinstance(v, int):
        return [v] * n
    return [int(t) for t in v]


def _weight(ctx: ExportContext, op: RecordedOp) -> tuple[str, QParams]:
    if op.weight_codes is None:
        raise UnsupportedOpError(
            f"op {op.name} ({op.op_type}): its weight is not an integer-quantized parameter "
            f"(weight_dtype {op.qconfig.weight_dtype.name if op.qconfig else '?'}); the exporter "
            "writes INT8/INT16 weights"
        )
    wdt = op.qconfig.weight_dtype
    qw = QParams.of(wdt, op.weight_scale.reshape(-1), axis=0)
    codes = op.weight_codes.detach().to(wdt.torch_dtype)
    return ctx.graph.const_dq(f"{op.name}/weight", codes, qw), qw


def _bias(ctx: ExportContext, op: RecordedOp, xq: QParams, qw: QParams) -> str | None:
    if op.bias is None:
        return None
    b = sim_args.get(op.args, op.kwargs, op.bias)
    if b is None:
        return None
    if not isinstance(b, ConstRef):
        raise UnsupportedOpError(f"op {op.name}: the bias is computed by the model, not a constant")
    xs, ws = torch.from_numpy(xq.scale), torch.from_numpy(qw.scale)
    codes = quantize_bias(b.value.detach().float(), xs, ws).to(torch.int32)
    qb = QParams.of(DType.INT32, acc_scale(xs, ws).reshape(-1), axis=0)
    return ctx.graph.const_dq(f"{op.name}/bias", codes, qb)


def _finish(ctx: ExportContext, op: RecordedOp, y: str) -> None:
    """Output quantization of a GEMM, with the fused clamp of its chain."""
    chain = ctx.fused.get(op.name, [])
    for f in chain:
        if f.op_type == "batch_norm":
            raise UnsupportedOpError(
                f"op {f.name} (batch_norm) is fused into {op.name}; export a model whose "
                "batch norms are folded (quantlab.models.fold.to_deployment_form)"
            )
    q = op.out_quant[0] if op.out_quant else None
    if chain and q is not None:
        lo, hi = fused_clamp_bounds(chain[-1])
        qp = QParams.of(q.dtype, q.scale, zero_point=q.zero_point)
        mid = ctx.graph.dequantize(ctx.graph.quantize(y, qp, base=f"{op.name}/unclamped"), qp)
        ins = [mid, ctx.float_const(f"{op.name}/min", lo if lo is not None else -np.inf)]
        ins.append(ctx.float_const(f"{op.name}/max", hi if hi is not None else np.inf))
        y = ctx.graph.node("Clip", ins, f"{op.name}/clip")
    ctx.set_outputs(op, [y])
    for f in chain:
        ctx.alias(f, ctx.env[OpRef(op.name, 0)])


def emit_conv(ctx: ExportContext, op: RecordedOp) -> None:
    nd = 2 if op.op_type == "conv2d" else 1
    xq = ctx.act_quant(op, 0)
    x = ctx.act(op, 0)
    w, qw = _weight(ctx, op)
    b = _bias(ctx, op, xq, qw)
    stride = _pair(ctx.arg(op, 3, "stride", 1), nd)
    padding = ctx.arg(op, 4, "padding", 0)
    dilation = _pair(ctx.arg(op, 5, "dilation", 1), nd)
    groups = int(ctx.arg(op, 6, "groups", 1))
    k = list(op.weight_codes.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pads = [0] * (2 * nd)
        elif padding == "same":
            total = [d * (kk - 1) for d, kk in zip(dilation, k)]
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            raise UnsupportedOpError(f"op {op.name}: padding={padding!r}")
    else:
        p = _pair(padding, nd)
        pads = p + p
    ins = [x, w] + ([b] if b is not None else [])
    y = ctx.graph.node(
        "Conv",
        ins,
        f"{op.name}/float",
        strides=stride,
        pads=pads,
        dilations=dilation,
        group=groups,
        kernel_shape=k,
    )
    _finish(ctx, op, y)


def _through(ctx: ExportContext, x: str, q: QParams | None, shape, base: str) -> str:
    """Reshape a (dequantized) tensor to ``shape``; a quantized one is quantized again at its
    own scale after it (QDQ around a Reshape: onnxruntime moves the codes)."""
    y = ctx.graph.node("Reshape", [x, ctx.graph.int64s(f"{base}/shape", shape)], base)
    if q is None:
        return y
    return ctx.graph.dequantize(ctx.graph.quantize(y, q, base=f"{base}/q"), q)


def emit_linear(ctx: ExportContext, op: RecordedOp) -> None:
    xq = ctx.act_quant(op, 0)
    x = ctx.act(op, 0)
    w, qw = _weight(ctx, op)
    b = _bias(ctx, op, xq, qw)
    shape = ctx.shape_of(op, 0)
    out_shape = tuple(op.outputs[0].shape)
    if len(shape) != 2:
        x = _through(ctx, x, xq, [-1, shape[-1]], f"{op.name}/2d")
    ins = [x, w] + ([b] if b is not None else [])
    y = ctx.graph.node("Gemm", ins, f"{op.name}/float", transB=1)
    if len(shape) == 2:
        _finish(ctx, op, y)
        return
    if ctx.fused.get(op.name):
        raise UnsupportedOpError(f"op {op.name}: a fused clamp after an N-d linear")
    q = op.out_quant[0] if op.out_quant else None
    if q is None:
        y = ctx.graph.node(
            "Reshape", [y, ctx.graph.int64s(f"{op.name}/shape", out_shape)], f"{op.name}/nd"
        )
        ctx.set_outputs(op, [y])
        return
    qp = QParams.of(q.dtype, q.scale, zero_point=q.zero_point)
    y2 = ctx.graph.dequantize(ctx.graph.quantize(y, qp, base=f"{op.name}/2d/out"), qp)
    y = ctx.graph.node(
        "Reshape", [y2, ctx.graph.int64s(f"{op.name}/shape", out_shape)], f"{op.name}/nd"
    )
    ctx.set_outputs(op, [y])


def emit_matmul(ctx: ExportContext, op: RecordedOp) -> None:
    for i in range(2):
        ctx.act_quant(op, i)
    a, b = ctx.act(op, 0), ctx.act(op, 1)
    if op.func_name == "__rmatmul__":
        a, b = b, a
    y = ctx.graph.node("MatMul", [a, b], f"{op.name}/float")
    _finish(ctx, op, y)
