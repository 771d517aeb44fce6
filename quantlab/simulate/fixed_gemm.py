"""Fixed-point GEMM kernels: conv1d/conv2d, linear, matmul (exact integer sums, the platform's
requantization, int16 operand rules, the high/low weight split, fused clamps)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics import gemm
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import dequantize, fake_cast, quantize
from quantlab.simulate import args as A
from quantlab.simulate import fastpath
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.qtensor import QInfo


def _gemm_params(call) -> dict:
    names = ("stride", "padding", "dilation", "groups")
    out = {}
    for i, n in enumerate(names):
        if len(call.args) > 3 + i:
            out[n] = call.args[3 + i]
        elif n in call.kwargs:
            out[n] = call.kwargs[n]
    return out


def _prepare_int16(sim, codes: Tensor, scale: Tensor, dtype: DType, k: int, matmul: bool):
    """J6 int16 GEMM operands: coarsen a matmul operand's scale by max(32767/32639, sqrt(K/2))
    (requantizing its codes once, half to even) and clamp to the usable int16 range (s.6)."""
    if dtype is not DType.INT16:
        return codes.to(dtype.torch_dtype), scale
    p = sim.platform
    if matmul and p.int16_matmul_coarsen:
        new = gemm.coarsen_int16_matmul_scale(scale, k, p)
        codes = quantize(dequantize(codes, scale), new, DType.INT16, p.fake_round)
        scale = new
    return gemm.clamp_int16_operand(codes.to(torch.int16), p), scale


def gemm_op(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp=None):
    p = sim.platform
    xi = in_infos[0]
    if not fc.int_info(xi):
        return None
    xc = fc.codes(args, kwargs, plan.acts[0], xi)
    xs = xi.scale
    matmul = call.op_type == "matmul"
    if wq is not None:
        wc, ws, w_float = wq
        wdt = rq.weight_dtype
        if rq.weight_split:
            return _split_gemm(sim, call, plan, args, kwargs, xi, xc, w_float, ws, rq, clamp)
    else:
        if len(in_infos) < 2 or not fc.int_info(in_infos[1]):
            return None
        wc, ws, wdt = (
            fc.codes(args, kwargs, plan.acts[1], in_infos[1]),
            in_infos[1].scale,
            (in_infos[1].dtype),
        )
    if call.op_type == "linear" and wq is None:
        wq_axis_ok = ws.numel() == 1
        if not wq_axis_ok:
            return None
    k = xc.shape[-1] if call.op_type in ("linear", "matmul") else int(wc[0].numel())
    xc, xs = _prepare_int16(sim, xc, xs, xi.dtype, k, matmul)
    wc, ws = _prepare_int16(sim, wc, ws, wdt, k, matmul)
    hp = rq.high_precision_output
    out_dt = p.high_precision_output if hp else rq.output_dtype
    fin_dt = DType.FLOAT32 if out_dt.is_float else out_dt
    out_scale = None if hp or fin_dt is DType.FLOAT32 else fc.out_scale(sim, call, rq)
    bias = A.get(args, kwargs, plan.bias) if plan.bias is not None else None
    ccodes = None
    if clamp is not None and out_scale is not None:
        so = float(out_scale)
        ccodes = (
            out_dt.qmin if clamp[0] is None else int(round(float(clamp[0]) / so)),
            out_dt.qmax if clamp[1] is None else int(round(float(clamp[1]) / so)),
        )
    if out_scale is not None and fastpath.applies(p) and call.func.__name__ != "__rmatmul__":
        bound = k * (xi.dtype.qmax + 1) * (wdt.qmax + 1)
        cache = sim.fast_cache(call.name)
        if call.op_type in ("conv1d", "conv2d"):
            conv = _gemm_params(call)
            acc = None
            if wq is not None:
                if cache.get("w") is not wc:
                    cache.update(w=wc, w32=wc.to(torch.float32))
                f = F.conv2d if call.op_type == "conv2d" else F.conv1d
                acc = fastpath.conv_exact_float32(xc, cache["w32"], f, bound, **conv)
            if acc is None:
                fn = gemm.int_conv2d if call.op_type == "conv2d" else gemm.int_conv1d
                acc = fn(xc, wc, **conv)
            axis = 1 if acc.dim() == (4 if call.op_type == "conv2d" else 3) else 0
        else:
            fn = gemm.int_linear if call.op_type == "linear" else gemm.int_matmul
            acc = fn(xc, wc)
            axis = -1
            bias = bias if call.op_type == "linear" else None
        codes = fastpath.finish_gemm_fast(
            acc, xs, ws, bias, out_scale, fin_dt, p, axis, bound, ccodes, cache
        )
        if codes is not None:
            return fc.emit(codes, out_scale, out_dt)
    if call.op_type in ("conv1d", "conv2d"):
        fn = gemm.qconv2d if call.op_type == "conv2d" else gemm.qconv1d
        res, _ = fn(xc, xs, wc, ws, bias, out_scale, fin_dt, p, **_gemm_params(call))
        axis = 1 if res.dim() == (4 if call.op_type == "conv2d" else 3) else 0
    elif call.op_type == "linear":
        res, _ = gemm.qlinear(xc, xs, wc, ws, bias, out_scale, fin_dt, p)
        axis = -1
    else:
        if call.func.__name__ == "__rmatmul__":
            return None
        res, _ = gemm.qmatmul(xc, xs, wc, ws, None, out_scale, fin_dt, p)
        axis = -1
    if fin_dt is DType.INT32:
        s = gemm.acc_scale(xs, ws)
        if s.dim() == 1:
            shape = [1] * res.dim()
            shape[axis] = -1
            s = s.reshape(shape)
        v = res.to(torch.float32) * s
        return (torch.clamp(v, clamp[0], clamp[1]) if clamp is not None else v), None
    if fin_dt is DType.FLOAT32:
        if clamp is not None:
            res = torch.clamp(res, clamp[0], clamp[1])
        if out_dt is DType.FLOAT16:
            return fake_cast(res, DType.FLOAT16, p.float16_saturate), QInfo(DType.FLOAT16)
        return res, None
    out = fc.emit(res, out_scale, out_dt)
    return fc.clamp_output(out, clamp) if clamp is not None else out


def _split_gemm(sim, call, plan, args, kwargs, xi, xc, w_float, ws, rq, clamp):
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
    if call.op_type == "conv2d":
        res = split_conv2d(
            xc,
            float(xi.scale),
            w_float.detach(),
            ws,
            rq.weight_split,
            so,
            fin,
            p.weight_split_combine,
            bias,
            **_gemm_params(call),
            **opts,
        )
    else:
        lead = xc.shape[:-1]
        x4 = xc.reshape(-1, xc.shape[-1], 1, 1)
        w4 = w_float.detach().reshape(*w_float.shape, 1, 1)
        res = split_conv2d(
            x4,
            float(xi.scale),
            w4,
            ws,
            rq.weight_split,
            so,
            fin,
            p.weight_split_combine,
            bias,
            **opts,
        )
        res = res.reshape(*lead, -1)
    if float_out:
        res = res.to(torch.float32)
        if clamp is not None:
            res = torch.clamp(res, clamp[0], clamp[1])
        if out_dt is DType.FLOAT16:
            return fake_cast(res, DType.FLOAT16, p.float16_saturate), QInfo(DType.FLOAT16)
        return res, None
    out = fc.emit(res, torch.tensor(so, dtype=torch.float32), out_dt)
    return fc.clamp_output(out, clamp) if clamp is not None else out
