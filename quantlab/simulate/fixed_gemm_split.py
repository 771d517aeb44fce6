"""Fixed-mode GEMMs with a split operand: Conv/Linear with the high/low int8 weight split and
MatMul with its second operand split into int8 halves (int15); partials combine by
``platform.weight_split_combine``."""

from __future__ import annotations

import torch

from quantlab.numerics.dtypes import DType
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.fixed_gemm_operands import prepare_int16
from quantlab.simulate.qtensor import QInfo


def split_gemm(sim, call, plan, args, kwargs, xi, xc, w_float, ws, rq, clamp):
    """Conv/Linear with the high/low int8 weight split (numerics.split.split_conv2d; a linear
    runs as a 1x1 conv). Partials combine by ``platform.weight_split_combine``."""
    from quantlab.numerics.split import split_conv2d

    p = sim.platform
    if call.op_type not in ("conv2d", "linear") or xi.dtype.bits > 16:
        return None
    hp = rq.high_precision_output
    out_dt = p.high_precision_output if hp else rq.output_dtype
    float_out = hp or out_dt.is_float
    so = 1.0 if float_out else float(fc.out_scale(sim, call, rq))
    fin = DType.FLOAT32 if float_out else out_dt
    bias = A.get(args, kwargs, plan.bias) if plan.bias is not None else None
    opts = dict(
        rounding=p.requant_round,
        weight_rounding=p.fake_round,
        scheme=p.requant,
        overflow=p.accumulator_overflow,
    )
    x, w, lead = xc, w_float.detach(), None
    if call.op_type == "conv2d":
        params = A.conv_params(call)
    else:  # a linear: a 1x1 convolution over the rows
        lead, params = xc.shape[:-1], {}
        x, w = xc.reshape(-1, xc.shape[-1], 1, 1), w.reshape(*w.shape, 1, 1)
    res = split_conv2d(
        x, float(xi.scale), w, ws, rq.weight_split, so, fin, p.weight_split_combine, bias,
        **params, **opts,
    )  # fmt: skip
    if lead is not None:
        res = res.reshape(*lead, -1)
    return split_output(sim, call, res, float_out, out_dt, so, clamp)


def split_matmul(sim, call, xi, xc, b_codes, b_scale, rq, clamp):
    """MatMul with its second operand split into int8 halves, the int15 ``A (B_hi + B_lo)``
    (numerics.split_matmul.split_int15_matmul). Partials combine by
    ``platform.weight_split_combine``."""
    from quantlab.numerics.split_matmul import split_int15_matmul

    p = sim.platform
    if call.func.__name__ == "__rmatmul__" or xi.dtype.bits > 16:
        return None
    hp = rq.high_precision_output
    out_dt = p.high_precision_output if hp else rq.output_dtype
    float_out = hp or out_dt.is_float
    so = 1.0 if float_out else float(fc.out_scale(sim, call, rq))
    xc, xs = prepare_int16(sim, xc, xi.scale, xi.dtype, xc.shape[-1], True)
    res = split_int15_matmul(
        xc,
        b_codes,
        float(xs),
        float(b_scale),
        rq.weight_split,
        so,
        DType.FLOAT32 if float_out else out_dt,
        p.weight_split_combine,
        rounding=p.requant_round,
        operand_rounding=p.fake_round,
        scheme=p.requant,
        overflow=p.accumulator_overflow,
    )
    return split_output(sim, call, res, float_out, out_dt, so, clamp)


def split_output(sim, call, res, float_out: bool, out_dt: DType, so: float, clamp):
    """(value, QInfo) of a split GEMM's result: a float output (float32, or cast to float16)
    with the fused clamp applied to values, or ``out_dt`` codes at scale ``so`` with the fused
    clamp applied to codes by the platform's bound rule."""
    if float_out:
        res = res.to(torch.float32)
        if clamp is not None:
            res = torch.clamp(res, clamp[0], clamp[1])
        if out_dt is DType.FLOAT16:
            return sim.cast_float(call.name, res, DType.FLOAT16), QInfo(DType.FLOAT16)
        return res, None
    out = fc.emit(res, torch.tensor(so, dtype=torch.float32), out_dt)
    return fc.clamp_output(out, clamp, sim.platform.bound_rule) if clamp is not None else out
