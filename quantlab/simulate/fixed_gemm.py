"""Fixed-point GEMM kernels: conv1d/conv2d, linear, matmul (exact integer sums, the platform's
requantization, int16 operand rules, the high/low weight split, fused clamps)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from quantlab.numerics import gemm
from quantlab.numerics.code_bounds import bound_codes
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm.exact import INTEGER_PATHS
from quantlab.numerics.quantize import dequantize, quantize
from quantlab.simulate import args as A
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
    if dtype is not DType.INT16:  # int8, or int8 centred on its zero point (int16)
        return (codes if codes.dtype == torch.int16 else codes.to(dtype.torch_dtype)), scale
    p = sim.platform
    if matmul and p.int16_matmul_coarsen:
        new = gemm.coarsen_int16_matmul_scale(scale, k, p.int16_operand_max)
        codes = quantize(dequantize(codes, scale), new, DType.INT16, p.fake_round)
        scale = new
    return gemm.clamp_int16_operand(codes.to(torch.int16), p.int16_operand_max), scale


def _conv_channel_axis(op_type: str, acc) -> int:
    """The output-channel axis of a convolution's sums: 1 when batched, 0 when not."""
    return 1 if acc.dim() == (4 if op_type == "conv2d" else 3) else 0


def gemm_op(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp=None):
    p = sim.platform
    xi = in_infos[0]
    if not fc.zp_info(xi):
        return None
    if xi.zero_point and xi.dtype is not DType.INT8:
        fc.warn_float(
            call, f"an integer GEMM takes zero points on int8 operands only, not {xi.dtype.name}"
        )
        return None
    xc = _operand_codes(args, kwargs, plan.acts[0], xi)
    xs = xi.scale
    matmul = call.op_type == "matmul"
    if wq is not None:
        wc, ws, w_float = wq
        wdt = rq.weight_dtype
        if rq.weight_split:
            if xi.zero_point:
                fc.warn_float(call, "the high/low weight split takes an input without a zero point")
                return None
            return _split_gemm(sim, call, plan, args, kwargs, xi, xc, w_float, ws, rq, clamp)
    else:
        wi = in_infos[1] if len(in_infos) > 1 else None
        if not fc.zp_info(wi):
            return None
        if wi.zero_point and wi.dtype is not DType.INT8:
            fc.warn_float(
                call,
                f"an integer GEMM takes zero points on int8 operands only, not {wi.dtype.name}",
            )
            return None
        if rq.weight_split and matmul:
            b = fc.codes(args, kwargs, plan.acts[1], in_infos[1])
            return _split_matmul(sim, call, xi, xc, b, in_infos[1].scale, rq, clamp)
        wc, ws, wdt = (
            _operand_codes(args, kwargs, plan.acts[1], wi),
            in_infos[1].scale,
            (in_infos[1].dtype),
        )
    if call.op_type == "linear" and wq is None:
        wq_axis_ok = ws.numel() == 1
        if not wq_axis_ok:
            return None
    k = xc.shape[-1] if call.op_type in ("linear", "matmul") else int(wc[0].numel())
    xc, xs = _prepare_int16(sim, xc, xs, xi.dtype, k, matmul)
    if wq is not None and wdt is DType.INT16:  # a weight's int16 operand codes, made once
        w_in = (wc, ws)
        wc, ws = sim.op_memo(
            call.name,
            "int16_weight",
            (*w_in, p, k, matmul),
            lambda: _prepare_int16(sim, *w_in, wdt, k, matmul),
        )
    else:
        wc, ws = _prepare_int16(sim, wc, ws, wdt, k, matmul)
    zo = 0
    hp = rq.high_precision_output
    out_dt = p.high_precision_output if hp else rq.output_dtype
    # an INT32 high-precision output leaves as its float value, acc * fl32(s_x * s_w): the
    # FLOAT32 finish computes exactly that
    fin_dt = DType.FLOAT32 if out_dt.is_float or out_dt is DType.INT32 else out_dt
    out_scale = None
    if fin_dt is not DType.FLOAT32:
        out_scale, zo = fc.out_scale(sim, call, rq), fc.out_zero_point(sim, call, rq)
    bias = A.get(args, kwargs, plan.bias) if plan.bias is not None else None
    if call.op_type == "matmul":
        bias = None
    ccodes = None
    if clamp is not None and out_scale is not None:
        ccodes = sim.op_memo(
            call.name,
            "clamp_codes",
            (clamp, out_scale, out_dt, zo),
            lambda: bound_codes(clamp[0], clamp[1], out_scale, out_dt, zo, rule=p.bound_rule),
        )
    contract = sim.op_memo(
        call.name,
        "contract",
        (p, call.op_type, out_dt, xi.dtype, wdt),
        lambda: _checked_contract(p, call.op_type, out_dt, xi.dtype, wdt),
    )
    pairs = (
        p.u8s8_pair_saturation
        and p.qlinear_zero_point == 128
        and wq is not None
        and xi.dtype is DType.INT8
        and wc.dtype == torch.int8
        and call.op_type in ("conv1d", "conv2d", "linear")
    )
    if pairs:  # the runtime's uint8 codes: x + 128 with zero point zx + 128
        zx_u8 = int(xi.zero_point or 0) + 128
        raw = xc.to(torch.int16) + zx_u8
        if call.op_type == "linear":
            acc, axis = gemm.pair_saturated_matmul(raw, wc.t(), zx_u8), -1
        else:
            params = _gemm_params(call)
            if isinstance(params.get("padding", 0), str):
                fc.warn_float(call, "u8s8_pair_saturation takes numeric convolution padding")
                return None
            acc = gemm.pair_saturated_conv(raw, wc, zx_u8, **params)
            axis = _conv_channel_axis(call.op_type, acc)
    elif call.op_type in ("conv1d", "conv2d"):
        acc = _prepared_conv(sim, call, xc, wc, wq is not None)(xc, as_int64=False)
        axis = _conv_channel_axis(call.op_type, acc)
    elif call.op_type == "linear":
        w32 = None
        if wq is not None and not _takes_int8_product(sim, call, xc, wc):
            # a weight's float32 cast for the float paths, made once while its codes are the
            # same (the int8 matrix product reads the codes: no cast)
            w32 = sim.op_memo(call.name, "w_float32", (wc,), lambda: wc.to(torch.float32))
        acc, axis = gemm.int_linear(xc, wc, as_int64=False, w_float32=w32), -1
    else:
        if call.func.__name__ == "__rmatmul__":
            return None
        acc, axis = gemm.int_matmul(xc, wc, as_int64=False), -1
    bound = k * _magnitude(xi) * _magnitude(in_infos[1] if wq is None else None, wdt)
    version = bias._version if bias is not None else None
    constants = sim.op_memo(  # scales and weight codes are cached objects, new when they change
        call.name,
        "finish",
        (xs, ws, bias, version, out_scale, fin_dt, contract),
        lambda: gemm.finish_constants(xs, ws, bias, out_scale, fin_dt, contract),
    )
    with_values = fin_dt is not DType.FLOAT32  # the codes' values in the same pass
    res = gemm.finish_gemm(
        acc,
        xs,
        ws,
        bias,
        out_scale,
        fin_dt,
        contract,
        axis,
        clamp_codes=ccodes,
        sum_bound=bound,
        reuse_acc=True,
        out_zero_point=zo,
        constants=constants,
        with_values=with_values,
    )
    if fin_dt is DType.FLOAT32:
        if clamp is not None:
            res = torch.clamp(res, clamp[0], clamp[1])
        if out_dt is DType.FLOAT16:
            return sim.cast_float(call.name, res, DType.FLOAT16), QInfo(DType.FLOAT16)
        return res, None
    return fc.emit(res[0], out_scale, out_dt, zo, value=res[1])


def _takes_int8_product(sim, call, xc: Tensor, wc: Tensor) -> bool:
    """Whether the linear ``xc @ wc.T`` runs on the int8 matrix product (plan INT32). Its plan
    reads no data for int8 x int8 codes, so it is made once per input shape and weight."""
    if not (xc.dtype == wc.dtype == torch.int8):
        return False

    def plan_path() -> bool:
        plan = gemm.plan_matmul(xc, wc.t(), disabled=gemm.auto_excluded())
        return plan.path is gemm.GemmPath.INT32

    return sim.op_memo(call.name, "int8_product", (tuple(xc.shape), wc), plan_path)


def _prepared_conv(sim, call, xc: Tensor, wc: Tensor, weight: bool) -> gemm.PreparedConv:
    """The op's exact convolution, checked and planned once per input shape and dtype, weight
    codes and parameters (``gemm.prepare_conv``); a weight's codes (``weight``) get their
    float32 cast made once with it, kept while the codes are the same tensor, unless the plan
    is an integer path (``exact.INTEGER_PATHS``: int8 products, the depthwise C loop, int64),
    which reads the codes themselves."""
    params = _gemm_params(call)
    nsp = 2 if call.op_type == "conv2d" else 1

    def make():
        conv = gemm.prepare_conv(tuple(xc.shape), xc.dtype, wc, nsp, **params)
        if weight and (conv.plan is None or conv.plan.path not in INTEGER_PATHS):
            # the float paths' cast of the weight, made once (the same checks and plan)
            conv = dataclasses.replace(conv, w_float32=wc.to(torch.float32))
        return conv

    key = (tuple(xc.shape), xc.dtype, wc, tuple(params.items()))
    return sim.op_memo(call.name, "conv", key, make)


def _checked_contract(p, op_type: str, out_dt: DType, x_dt: DType, w_dt: DType):
    """The platform's GEMM contract for this op, after checking its operand dtypes against it
    (centred int8 operands count as int8)."""
    contract = p.gemm_contract(op_type, out_dt is DType.INT32, activation=x_dt)
    as_coded = [torch.empty(0, dtype=d.torch_dtype) for d in (x_dt, w_dt)]
    gemm.check_gemm_operands(*as_coded, contract)
    return contract


def _operand_codes(args, kwargs, slot, info) -> Tensor:
    """GEMM operand codes: int8/int16 codes as they are; int8 codes with a zero point centred
    on it, as int16 (|x - zx| <= 255; ``numerics.gemm.centre_codes``)."""
    codes = fc.codes(args, kwargs, slot, info)
    return gemm.centre_codes(codes, info.zero_point) if info.zero_point else codes


def _magnitude(info, dtype: DType | None = None) -> int:
    """The largest |operand code| + 1 the exact-sum bound assumes (256 for centred int8)."""
    if info is not None and info.zero_point:
        return 256
    return (info.dtype if info is not None else dtype).qmax + 1


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
    return _split_output(sim, call, res, float_out, out_dt, so, clamp)


def _split_matmul(sim, call, xi, xc, b_codes, b_scale, rq, clamp):
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
    xc, xs = _prepare_int16(sim, xc, xi.scale, xi.dtype, xc.shape[-1], True)
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
    return _split_output(sim, call, res, float_out, out_dt, so, clamp)


def _split_output(sim, call, res, float_out: bool, out_dt: DType, so: float, clamp):
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
