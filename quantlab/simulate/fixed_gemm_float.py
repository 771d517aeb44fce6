"""A GEMM that onnxruntime leaves in float32 between DequantizeLinear and QuantizeLinear
(``platform.float_islands`` ONNXRUNTIME_QDQ): its QLinearConv / QLinearMatMul / QGemm take
8-bit operands and an 8-bit output only, so a convolution, linear or matmul with an int16
operand or an int16 output runs as the float op on the dequantized operands, and a transposed
convolution always does (onnxruntime has no integer ConvTranspose kernel). Computed here as
the exported graph computes it: x = fl32(s_x (c - z_x)), w = fl32(s_w c_w) per output channel,
the bias as its int32 codes times fl32(s_x s_w), the float32 op (torch's; onnxruntime's MLAS
may sum in another order, which can move a code at a rounding boundary), then QuantizeLinear
(fl32 quotient, rounded by ``fake_round``) and a fused clamp on the codes by ``bound_rule``; a
wide output (``high_precision_output``) is the float op's value, a fused clamp on its values.
No integer accumulator: nothing wraps."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import acc_scale, quantize_bias
from quantlab.numerics.quantize import dequantize
from quantlab.platform_rules import FloatIslands
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc

_CONVS = {
    "conv1d": F.conv1d,
    "conv2d": F.conv2d,
    "conv_transpose1d": F.conv_transpose1d,
    "conv_transpose2d": F.conv_transpose2d,
}


def runs_in_float(
    p, x_dtype: DType, w_dtype: DType, out_dtype: DType, wide: bool, transposed: bool = False
) -> bool:
    """Whether onnxruntime runs this GEMM in float32: a transposed convolution always (it has
    no integer ConvTranspose kernel), else an operand, or a quantized output, wider than 8 bits
    (a float output of 8-bit operands is exported as ConvInteger / MatMulInteger)."""
    if p.float_islands is not FloatIslands.ONNXRUNTIME_QDQ:
        return False
    return transposed or x_dtype.bits > 8 or w_dtype.bits > 8 or (not wide and out_dtype.bits > 8)


def float_gemm(sim, call, plan, args, kwargs, xi, wq, wi, rq, clamp):
    """(value, QInfo) of the GEMM as onnxruntime's float island computes it (module doc)."""
    p = sim.platform
    x = dequantize(fc.codes(args, kwargs, plan.acts[0], xi), xi.scale, zero_point=xi.zero_point)
    if wq is not None:
        wc, ws, _ = wq
        w_scale = ws.reshape(-1)
        if w_scale.numel() > 1:
            w = dequantize(wc, w_scale, axis=A.weight_channel_axis(call))
        else:
            w = dequantize(wc, w_scale[0])
    else:
        b_codes = fc.codes(args, kwargs, plan.acts[1], wi)
        w, w_scale = dequantize(b_codes, wi.scale, zero_point=wi.zero_point), wi.scale
    bias = A.get(args, kwargs, plan.bias) if plan.bias is not None else None
    b = None
    if bias is not None and call.op_type != "matmul":
        s = acc_scale(xi.scale, w_scale).reshape(-1)
        codes = quantize_bias(bias.detach().float(), xi.scale, w_scale).to(torch.float32)
        b = codes * s  # DequantizeLinear of the int32 bias codes: one float32 product
    if call.op_type == "linear":
        y = F.linear(x, w, b)
    elif call.op_type == "matmul":
        y = torch.matmul(x, w) if call.func.__name__ != "__rmatmul__" else torch.matmul(w, x)
    else:
        y = _CONVS[call.op_type](x, w, b, **A.conv_params(call))
    if rq.high_precision_output:  # a wide output leaves as the float op's value (no Q)
        return (y if clamp is None else torch.clamp(y, clamp[0], clamp[1])), None
    out = rq.output_dtype
    so, zo = fc.out_scale(sim, call, rq), fc.out_zero_point(sim, call, rq)
    res = fc.emit(p.quantize_codes(y, so, out, zo), so, out, zo)
    return res if clamp is None else fc.clamp_output(res, clamp, p.bound_rule)
