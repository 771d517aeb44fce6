"""Conv / Linear / MatMul as ONNX QDQ: DequantizeLinear on the activation (per tensor), the
weight (per output channel, axis 0) and the int32 bias (scale x_scale * w_scale per channel,
quantlab's ``quantize_bias``), the float op, then the output QuantizeLinear. A relu6 / clamp
fused into the GEMM becomes a Clip of the output codes written as uint8 (``code_clip``), else a
Clip on the dequantized output, quantized again at the same scale (the bounds quantlab applies
to the output codes)."""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto

from quantlab.export.context import ExportContext, int_list
from quantlab.export.emit_layout import reshape_requantized
from quantlab.export.graph import QParams, UnsupportedOpError
from quantlab.export.trace_adapter import ConstRef, OpRef, RecordedOp, fused_clamp_bounds
from quantlab.numerics.code_bounds import BoundRule, bound_codes
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import acc_scale, quantize_bias
from quantlab.numerics.shapes import along_axis
from quantlab.simulate import args as sim_args


def _weight_codes(op: RecordedOp) -> tuple[torch.Tensor, QParams]:
    """A GEMM's integer weight codes and their quantization: per output channel (axis 0; a
    transposed convolution's axis 1), or one scale per tensor."""
    if op.weight_codes is None:
        raise UnsupportedOpError(
            f"op {op.name} ({op.op_type}): its weight is not an integer-quantized parameter "
            f"(weight_dtype {op.qconfig.weight_dtype.name if op.qconfig else '?'}); the exporter "
            "writes INT8/INT16 weights"
        )
    wdt = op.qconfig.weight_dtype
    scale = op.weight_scale.reshape(-1)
    if scale.numel() == 1:
        qw = QParams.of(wdt, scale[0])
    else:
        qw = QParams.of(wdt, scale, axis=sim_args.weight_channel_axis(op))
    return op.weight_codes.detach().to(wdt.torch_dtype), qw


def _bias(ctx: ExportContext, op: RecordedOp, xq: QParams, qw: QParams) -> str | None:
    codes = _bias_codes(op, xq, qw)
    if codes is None:
        return None
    xs, ws = torch.from_numpy(xq.scale), torch.from_numpy(qw.scale)
    s = acc_scale(xs, ws).reshape(-1)
    qb = QParams.of(DType.INT32, s, axis=0) if s.numel() > 1 else QParams.of(DType.INT32, s[0])
    return ctx.graph.const_dq(f"{op.name}/bias", codes, qb)


def clip_changes_codes(lo: float | None, hi: float | None, q: QParams) -> bool:
    """Whether Clip(lo, hi) between DequantizeLinear and QuantizeLinear at ``q`` (per tensor)
    can change a code: only where a bound lies strictly inside the dequantized code range,
    fl32(fl32(c - z) * s) for c from qmin to qmax (a value below lo exists only if lo exceeds
    the lowest one). An asymmetric ReLU6 output calibrated on [0, m], m <= 6, has neither."""
    if q.axis is not None:
        return True
    s, z = np.float32(q.scale), np.float32(q.zero_point)
    low = np.float32(np.float32(q.dtype.qmin) - z) * s
    high = np.float32(np.float32(q.dtype.qmax) - z) * s
    return (lo is not None and np.float32(lo) > low) or (hi is not None and np.float32(hi) < high)


_CLIP_CODE_NAMES = ("min_code", "max_code")


def code_clip(lo: float | None, hi: float | None, q: QParams) -> tuple[int, int] | None:
    """The code bounds (lo_c, hi_c) with clip(c, lo_c, hi_c) == QuantizeLinear(Clip(
    DequantizeLinear(c), lo, hi)) for every code c at ``q`` (per tensor; float32 products and
    quotients, ties to even), or None where one code breaks it. The bounds are
    ``BoundRule.FLOAT32_HALF_EVEN``'s; the equality follows from quantizing being monotone and
    undoing dequantizing, and is checked here on every code of the dtype rather than assumed
    (a product that overflows float32 breaks the second)."""
    if q.axis is not None:
        return None
    s, z = np.float32(q.scale), int(q.zero_point)
    lo_c, hi_c = bound_codes(lo, hi, float(s), q.dtype, z, rule=BoundRule.FLOAT32_HALF_EVEN)
    lo_c, hi_c = min(lo_c, q.dtype.qmax), max(hi_c, q.dtype.qmin)  # a bound beyond the far end
    codes = np.arange(q.dtype.qmin, q.dtype.qmax + 1, dtype=np.int64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        v = (codes - z).astype(np.float32) * s
        v = np.clip(
            v, np.float32(-np.inf if lo is None else lo), np.float32(np.inf if hi is None else hi)
        )
        back = np.clip(np.rint(v / s), q.dtype.qmin - z, q.dtype.qmax - z).astype(np.int64) + z
    return (lo_c, hi_c) if np.array_equal(back, np.clip(codes, lo_c, hi_c)) else None


def _finish(ctx: ExportContext, op: RecordedOp, y: str, shape=None) -> None:
    """Output quantization of a GEMM, with the fused clamp of its chain; ``shape``: the output
    shape ``y`` (2-D, an N-d linear's rows) is reshaped to before its output quantization."""
    chain = ctx.fused.get(op.name, [])  # a fused batch_norm is in the weight and bias
    clamps = [f for f in chain if f.op_type != "batch_norm"]
    q = op.out_quant[0] if op.out_quant else None
    qp = QParams.of(q.dtype, q.scale, zero_point=q.zero_point) if q is not None else None
    bounds = fused_clamp_bounds(clamps[-1]) if clamps else None
    # left out where every code of the output's range is within the bounds
    chain_clip = bool(clamps) and (qp is None or clip_changes_codes(*bounds, qp))
    # on the codes where they are written as uint8 (onnxruntime's kernels take them)
    on_codes = chain_clip and qp is not None and shape is None and ctx.graph.offset(qp)
    held = code_clip(*bounds, qp) if on_codes else None
    if held is not None:
        codes = ctx.graph.quantize(y, qp, base=f"{op.name}/unclamped")
        lo_c, hi_c = (
            ctx.graph.code_const(f"{op.name}/{e}", c, qp) for e, c in zip(_CLIP_CODE_NAMES, held)
        )
        ctx.set_codes(op, ctx.graph.node("Clip", [codes, lo_c, hi_c], f"{op.name}/codes"), qp)
        for f in chain:
            ctx.alias(f, ctx.env[OpRef(op.name, 0)])
        return
    if qp is not None and (chain_clip or shape is not None):  # quantized where the GEMM computes
        y = ctx.graph.dequantize(ctx.graph.quantize(y, qp, base=f"{op.name}/unclamped"), qp)
    if chain_clip:  # the bounds on the output codes' values (a wide float output: on its values)
        lo, hi = bounds
        ins = [y, ctx.float_const(f"{op.name}/min", lo if lo is not None else -np.inf)]
        ins.append(ctx.float_const(f"{op.name}/max", hi if hi is not None else np.inf))
        y = ctx.graph.node("Clip", ins, f"{op.name}/clip")
    if shape is not None:
        y = ctx.graph.node(
            "Reshape", [y, ctx.graph.int64s(f"{op.name}/shape", shape)], f"{op.name}/nd"
        )
    ctx.set_outputs(op, [y])
    for f in chain:
        ctx.alias(f, ctx.env[OpRef(op.name, 0)])


def _wide_integer(ctx: ExportContext, op: RecordedOp, operands: list, **attrs) -> str:
    """A GEMM whose fixed run leaves a wide float output (no output quantization):
    fl32(acc) * fl32(s_x * s_w), acc the exact int32 accumulator with the int32 bias codes
    (``numerics.gemm.finish_gemm``, FLOAT32). Written as onnxruntime's integer kernel:
    ConvInteger / MatMulInteger of the 8-bit codes (int32), + bias codes, Cast to float32, times
    the accumulator scale. A float Conv / MatMul between DequantizeLinear and no
    QuantizeLinear, which onnxruntime does not fuse, sums in float32 and rounds otherwise.
    ``operands``: [(codes, QParams)] of the input and the weight (a constant; a matmul's second
    input is an activation), every one 8-bit (``_integer_operands``)."""
    names = [c for c, _ in operands]
    weight = op.weight_codes is not None
    zero_points = [
        ctx.graph.zero_point_of(c, q, activation=not (weight and i == 1))
        for i, (c, q) in enumerate(operands)
    ]
    kind = "ConvInteger" if op.op_type in ("conv1d", "conv2d") else "MatMulInteger"
    acc = ctx.graph.node(kind, names + zero_points, f"{op.name}/acc", **attrs)
    bias = _bias_codes(op, operands[0][1], operands[1][1]) if weight else None
    if bias is not None:
        b = along_axis(torch.from_numpy(bias), op.outputs[0], _channel_axis(op), "bias")
        acc = ctx.graph.node(
            "Add", [acc, ctx.graph.const(f"{op.name}/bias", b)], f"{op.name}/acc_bias"
        )
    y = ctx.graph.node("Cast", [acc], f"{op.name}/acc_float", to=TensorProto.FLOAT)
    scale = wide_output_scale(op).numpy().astype(np.float32)
    return ctx.graph.node(
        "Mul", [y, ctx.graph.const(f"{op.name}/acc_scale", scale)], f"{op.name}/float"
    )


def _leaves_wide(op: RecordedOp) -> bool:
    """Whether the GEMM's output leaves unquantized (a wide output: a model output)."""
    return not op.out_quant or op.out_quant[0] is None


def _channel_axis(op: RecordedOp) -> int:
    """The output axis of a GEMM's output channels: 1 for a convolution, the last otherwise."""
    return 1 if op.op_type in ("conv1d", "conv2d") or op.op_type in sim_args.TRANSPOSED else -1


def wide_output_scale(op: RecordedOp) -> torch.Tensor | None:
    """One LSB of a GEMM's wide (unquantized) output, fl32(s_x * s_w), shaped to broadcast
    against the output: per output channel (``_channel_axis``) for a weight, one value for a
    matmul of two activations; None when the fixed run kept the GEMM's input float."""
    if not op.in_quant or op.in_quant[0] is None:
        return None
    if op.weight_scale is not None:
        s = acc_scale(op.in_quant[0].scale, op.weight_scale.reshape(-1))
        if s.numel() == 1:  # one weight scale per tensor
            return s.reshape(())
        return along_axis(s, op.outputs[0], _channel_axis(op), "accumulator scale")
    if op.op_type == "matmul" and len(op.in_quant) == 2 and op.in_quant[1] is not None:
        return acc_scale(op.in_quant[0].scale, op.in_quant[1].scale)
    return None


def _integer_operands(*quants) -> bool:
    """Whether every operand's quantization (None: float) holds 8-bit codes: what ConvInteger
    / MatMulInteger take."""
    return all(q is not None and q.dtype is DType.INT8 for q in quants)


def _bias_codes(op: RecordedOp, xq: QParams, qw: QParams) -> np.ndarray | None:
    """The int32 bias codes a GEMM adds to its accumulator (``quantize_bias``; a fused
    batch_norm folded in), or None."""
    b = sim_args.get(op.args, op.kwargs, op.bias) if op.bias is not None else None
    if op.folded_bias is not None:
        b = ConstRef(op.folded_bias)
    if b is None:
        return None
    if not isinstance(b, ConstRef):
        raise UnsupportedOpError(f"op {op.name}: the bias is computed by the model, not a constant")
    xs, ws = torch.from_numpy(xq.scale), torch.from_numpy(qw.scale)
    return quantize_bias(b.value.detach().float(), xs, ws).to(torch.int32).numpy()


def emit_conv(ctx: ExportContext, op: RecordedOp) -> None:
    nd = 2 if op.op_type == "conv2d" else 1
    xq = ctx.act_quant(op, 0)
    stride = int_list(ctx.arg(op, 3, "stride", 1), nd)
    padding = ctx.arg(op, 4, "padding", 0)
    dilation = int_list(ctx.arg(op, 5, "dilation", 1), nd)
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
        p = int_list(padding, nd)
        pads = p + p
    attrs = dict(strides=stride, pads=pads, dilations=dilation, group=groups, kernel_shape=k)
    codes, qw = _weight_codes(op)
    if _leaves_wide(op) and _integer_operands(xq, qw):
        wc = ctx.graph.const(f"{op.name}/weight_codes", codes)
        _finish(ctx, op, _wide_integer(ctx, op, [ctx.act_codes(op, 0), (wc, qw)], **attrs))
        return
    x, w = ctx.act(op, 0), ctx.graph.const_dq(f"{op.name}/weight", codes, qw)
    b = _bias(ctx, op, xq, qw)
    ins = [x, w] + ([b] if b is not None else [])
    y = ctx.graph.node("Conv", ins, f"{op.name}/float", **attrs)
    _finish(ctx, op, y)


def emit_conv_transpose(ctx: ExportContext, op: RecordedOp) -> None:
    """ConvTranspose between DequantizeLinear and QuantizeLinear: onnxruntime has no integer
    ConvTranspose kernel, so it runs the float op on the dequantized operands (the onnxruntime
    profile's float island computes the same); a wide output stays float."""
    nd = 2 if op.op_type == "conv_transpose2d" else 1
    xq = ctx.act_quant(op, 0)
    codes, qw = _weight_codes(op)
    attrs = dict(
        strides=int_list(ctx.arg(op, 3, "stride", 1), nd),
        pads=int_list(ctx.arg(op, 4, "padding", 0), nd) * 2,
        output_padding=int_list(ctx.arg(op, 5, "output_padding", 0), nd),
        group=int(ctx.arg(op, 6, "groups", 1)),
        dilations=int_list(ctx.arg(op, 7, "dilation", 1), nd),
        kernel_shape=list(codes.shape[2:]),
    )
    x, w = ctx.act(op, 0), ctx.graph.const_dq(f"{op.name}/weight", codes, qw)
    b = _bias(ctx, op, xq, qw)
    ins = [x, w] + ([b] if b is not None else [])
    _finish(ctx, op, ctx.graph.node("ConvTranspose", ins, f"{op.name}/float", **attrs))


def emit_linear(ctx: ExportContext, op: RecordedOp) -> None:
    xq = ctx.act_quant(op, 0)
    shape = ctx.shape_of(op, 0)
    codes, qw = _weight_codes(op)
    if _leaves_wide(op) and len(shape) != 2 and _integer_operands(xq, qw):
        # onnxruntime fuses a 2-D Gemm with a float output into QGemm (exact) but runs an N-d
        # one in float: MatMulInteger on the codes instead
        wc = ctx.graph.const(f"{op.name}/weight_codes", codes.t().contiguous())
        _finish(ctx, op, _wide_integer(ctx, op, [ctx.act_codes(op, 0), (wc, qw)]))
        return
    x = ctx.act(op, 0)
    w = ctx.graph.const_dq(f"{op.name}/weight", codes, qw)
    b = _bias(ctx, op, xq, qw)
    out_shape = tuple(op.outputs[0].shape)
    if len(shape) != 2:
        x = reshape_requantized(ctx, x, xq, [-1, shape[-1]], f"{op.name}/2d")
    ins = [x, w] + ([b] if b is not None else [])
    y = ctx.graph.node("Gemm", ins, f"{op.name}/float", transB=1)
    _finish(ctx, op, y, None if len(shape) == 2 else out_shape)


def emit_matmul(ctx: ExportContext, op: RecordedOp) -> None:
    for i in range(2):
        ctx.act_quant(op, i)
    order = [1, 0] if op.func_name == "__rmatmul__" else [0, 1]
    if _leaves_wide(op) and _integer_operands(*(op.in_quant[i] for i in order)):
        _finish(ctx, op, _wide_integer(ctx, op, [ctx.act_codes(op, i) for i in order]))
        return
    a, b = (ctx.act(op, i) for i in order)
    y = ctx.graph.node("MatMul", [a, b], f"{op.name}/float")
    _finish(ctx, op, y)
