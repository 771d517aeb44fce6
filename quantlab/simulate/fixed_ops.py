"""Fixed-point kernels of the simulator: integer codes in, integer codes out.

Each kernel takes the op's activation codes (from the side table), calls the arithmetic of
``quantlab.numerics`` with the platform's fields, and returns ``(value, QInfo)`` where
``value == codes * scale`` exactly. A kernel returns None when its integer form does not apply
(float16 operands, an argument combination it does not model); the simulator then evaluates the
op's float function on the exact dequantized inputs and quantizes the output once
(``float_fallback`` in the op-support table).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.capture import OpCategory
from quantlab.numerics import gemm
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import dequantize, fake_cast, quantize
from quantlab.numerics.requant import (
    Requant,
    add_float_rescale,
    add_inter_scale,
    make_requant,
    requant_scale,
    requantize,
)
from quantlab.platforms import AddRule
from quantlab.simulate import args as A
from quantlab.simulate import fastpath
from quantlab.simulate.qtensor import QInfo

LUT_FUNCS = frozenset(
    "sigmoid tanh exp log sqrt rsqrt reciprocal sin cos gelu silu inverse_sigmoid".split()
)
CONST_DTYPE = DType.INT16  # scalar constants are int16 codes at scale |c| / 32767 (assumed)

_KERNELS = {
    OpCategory.GEMM: "integer",
    OpCategory.ADD: "integer",
    OpCategory.MUL: "integer",
    OpCategory.DIV: "integer (scalar divisor); float_fallback (tensor divisor)",
    OpCategory.PASS_THROUGH: "pass_through",
    OpCategory.REQUANT: "integer",
    OpCategory.LUT: "lut",
    OpCategory.REDUCE: "integer",
    OpCategory.POOL: "integer (even windows); float_fallback otherwise",
    OpCategory.SOFTMAX: "lut (exp, reciprocal)",
    OpCategory.NORM: "float_fallback",
    OpCategory.RESAMPLE: "integer (nearest); float_fallback (bilinear, ...)",
    OpCategory.GRID_SAMPLE: "integer",
}


def kernel_name(op_type: str, category: OpCategory | None, sim) -> str:
    """How the op runs in fixed mode on ``sim.platform`` (the op-support table's column)."""
    if not sim.supported(op_type, category):
        return "float (not supported on this platform)"
    return _KERNELS[category]


def run_fixed(sim, call, plan, args, kwargs, in_infos, wq, rq, quant_out, clamp=None) -> Any:
    """(value, QInfo) of one op in fixed mode, or None to use the float fallback. ``clamp``:
    bounds of a relu6/clamp fused into this GEMM (applied to its output codes)."""
    if not quant_out or call.category is OpCategory.PASS_THROUGH:
        return None
    if call.category is OpCategory.GEMM:
        return _gemm(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp)
    fn = _DISPATCH.get(call.category)
    if fn is None:
        return None
    return fn(sim, call, plan, args, kwargs, in_infos, wq, rq)


def clamp_output(res: tuple, bounds: tuple) -> tuple:
    """Apply a fused relu6/clamp to a GEMM result: on the output codes, at the bounds rounded
    half to even to output codes (the clamp a fused conv-relu6 does after requantization)."""
    value, info = res
    lo, hi = bounds
    if info is None or not info.dtype.is_int or info.codes is None:
        return torch.clamp(value, lo, hi), info
    s = float(info.scale)
    codes = info.codes.to(torch.int64)
    if lo is not None:
        codes = codes.clamp_min(int(round(float(lo) / s)))
    if hi is not None:
        codes = codes.clamp_max(int(round(float(hi) / s)))
    return _emit(codes, info.scale, info.dtype)


# --------------------------------------------------------------------------- helpers


def _int_info(info) -> bool:
    return info is not None and info.dtype.is_int and info.dtype is not DType.INT32


def _codes(args, kwargs, slot, info) -> Tensor:
    """The operand's integer codes in its dtype's torch dtype (int8/int16)."""
    return info.codes_native(A.get(args, kwargs, slot))


def _emit(codes: Tensor, scale: Tensor, dtype: DType) -> tuple[Tensor, QInfo]:
    """(codes * scale as float32, QInfo): one float32 product per element (``dequantize``)."""
    codes = codes.to(dtype.torch_dtype)
    s = torch.as_tensor(scale, dtype=torch.float32).reshape(())
    return codes.to(torch.float32).mul_(s), QInfo(dtype, s, codes)


def _out_scale(sim, call, rq) -> Tensor:
    return sim.act_scale(call.name, "out", rq.output_dtype, rq)


def _requant(sim, acc: Tensor, real: Tensor, out: DType, axis: int | None = None) -> Tensor:
    """acc (int32 values) * real -> ``out`` codes by the platform's requantization."""
    p = sim.platform
    acc32, _ = gemm.accumulate(acc.to(torch.int64), p.accumulator, p.accumulator_overflow)
    params = make_requant(real, p.requant, p.requant_mult_bits)
    return requantize(acc32, params, out, p.requant_round, axis=axis)


def _ratio(sim, num: float | Tensor, den: float | Tensor) -> Tensor:
    """num / den as the platform's requantization forms a real multiplier (float32 for
    FLOAT_RESCALE, float64 otherwise)."""
    if sim.platform.requant is Requant.FLOAT_RESCALE:
        return torch.as_tensor(num, dtype=torch.float32) / torch.as_tensor(den, dtype=torch.float32)
    n = torch.as_tensor(num, dtype=torch.float32).to(torch.float64)
    return n / torch.as_tensor(den, dtype=torch.float32).to(torch.float64)


def _const(c: float) -> tuple[Tensor, Tensor]:
    """A scalar constant as (int64 code, float32 scale): code +-32767, scale |c| / 32767."""
    s = torch.tensor(abs(c) / CONST_DTYPE.qmax, dtype=torch.float32)
    code = torch.tensor(CONST_DTYPE.qmax if c > 0 else -CONST_DTYPE.qmax, dtype=torch.int64)
    return code, s


def _operand(args, kwargs, slot, info):
    """(codes int64, scale) of a tensor operand with integer quantization, or of a nonzero
    scalar constant; None when the operand is neither."""
    v = A.get(args, kwargs, slot)
    if isinstance(v, Tensor):
        if not _int_info(info):
            return None
        return info.codes_of(v), info.scale
    if isinstance(v, (int, float)) and v != 0:
        return _const(float(v))
    return None


# --------------------------------------------------------------------------- GEMM


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


def _gemm(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp=None):
    p = sim.platform
    xi = in_infos[0]
    if not _int_info(xi):
        return None
    xc = _codes(args, kwargs, plan.acts[0], xi)
    xs = xi.scale
    matmul = call.op_type == "matmul"
    if wq is not None:
        wc, ws, w_float = wq
        wdt = rq.weight_dtype
        if rq.weight_split:
            return _split_gemm(sim, call, plan, args, kwargs, xi, xc, w_float, ws, rq, clamp)
    else:
        if len(in_infos) < 2 or not _int_info(in_infos[1]):
            return None
        wc, ws, wdt = (
            _codes(args, kwargs, plan.acts[1], in_infos[1]),
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
    out_scale = None if hp or fin_dt is DType.FLOAT32 else _out_scale(sim, call, rq)
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
            return _emit(codes, out_scale, out_dt)
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
    out = _emit(res, out_scale, out_dt)
    return clamp_output(out, clamp) if clamp is not None else out


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
    so = 1.0 if float_out else float(_out_scale(sim, call, rq))
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
    out = _emit(res, torch.tensor(so, dtype=torch.float32), out_dt)
    return clamp_output(out, clamp) if clamp is not None else out


# --------------------------------------------------------------------------- elementwise


def _reversed(call) -> bool:
    return getattr(call.func, "__name__", "") in ("__rsub__", "rsub", "__rtruediv__", "__rdiv__")


def _add(sim, call, plan, args, kwargs, in_infos, wq, rq):
    p = sim.platform
    if not rq.output_dtype.is_int or len(plan.acts) != 2 or kwargs.get("alpha", 1) != 1:
        return None
    a = _operand(args, kwargs, plan.acts[0], in_infos[0])
    b = _operand(args, kwargs, plan.acts[1], in_infos[1])
    if a is None or b is None:
        return None
    (xc, xs), (yc, ys) = a, b
    if call.op_type == "sub":
        if _reversed(call):
            xc = -xc
        else:
            yc = -yc
    so = _out_scale(sim, call, rq)
    out = rq.output_dtype
    if p.add_rule is AddRule.INTER_SCALE:
        codes = add_inter_scale(
            xc,
            xs,
            yc,
            ys,
            so,
            out,
            p.requant,
            p.requant_round,
            p.add_inter_shift,
            p.requant_mult_bits,
        )
    else:
        codes = add_float_rescale(xc, xs, yc, ys, so, out, p.requant_round)
    return _emit(codes, so, out)


def _mul(sim, call, plan, args, kwargs, in_infos, wq, rq, const_inv: bool = False):
    if not rq.output_dtype.is_int or len(plan.acts) != 2:
        return None
    a = _operand(args, kwargs, plan.acts[0], in_infos[0])
    bv = A.get(args, kwargs, plan.acts[1])
    if const_inv:
        if isinstance(bv, Tensor) or _reversed(call) or not isinstance(bv, (int, float)):
            return None
        if bv == 0 or kwargs.get("rounding_mode") is not None:
            return None
        b = _const(1.0 / float(bv))
    else:
        b = _operand(args, kwargs, plan.acts[1], in_infos[1])
    if a is None or b is None:
        return None
    (xc, xs), (yc, ys) = a, b
    so = _out_scale(sim, call, rq)
    real = requant_scale(xs, ys, so, sim.platform.requant)
    codes = _requant(sim, xc * yc, real, rq.output_dtype)
    return _emit(codes, so, rq.output_dtype)


def _div(sim, call, plan, args, kwargs, in_infos, wq, rq):
    return _mul(sim, call, plan, args, kwargs, in_infos, wq, rq, const_inv=True)


def _requant_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    out = rq.output_dtype
    if not out.is_int or not in_infos or not all(_int_info(i) for i in in_infos):
        return None
    so = _out_scale(sim, call, rq)
    if call.op_type in ("cat", "stack"):
        parts = []
        for slot, info in zip(plan.acts, in_infos):
            parts.append(
                _requant(sim, _codes(args, kwargs, slot, info), _ratio(sim, info.scale, so), out)
            )
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        fn = torch.cat if call.op_type == "cat" else torch.stack
        return _emit(fn(parts, dim), so, out)
    info = in_infos[0]
    xc = _codes(args, kwargs, plan.acts[0], info).to(torch.int64)
    s = float(info.scale)
    if call.op_type == "relu6":
        lo, hi = 0.0, 6.0
    elif getattr(call.func, "__name__", "") == "hardtanh":
        lo = kwargs.get("min_val", args[1] if len(args) > 1 else -1.0)
        hi = kwargs.get("max_val", args[2] if len(args) > 2 else 1.0)
    else:
        name = getattr(call.func, "__name__", "")
        lo = kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = kwargs.get("max", args[2] if len(args) > 2 else None)
        if name == "clamp_max":
            lo, hi = None, lo
        if isinstance(lo, Tensor) or isinstance(hi, Tensor):
            return None
    # bounds in input codes (round half to even of the bound / scale), then requantize
    if lo is not None:
        xc = xc.clamp_min(int(round(float(lo) / s)))
    if hi is not None:
        xc = xc.clamp_max(int(round(float(hi) / s)))
    return _emit(_requant(sim, xc, _ratio(sim, info.scale, so), out), so, out)


# --------------------------------------------------------------------------- LUT ops


def _lut_spec(call, rq):
    from quantlab.numerics.lut import Strategy, default_spec

    spec = default_spec(call.op_type)
    if call.op_type == "inverse_sigmoid":
        eps = call.kwargs.get("eps", call.args[1] if len(call.args) > 1 else None)
        if eps is not None:
            spec = dataclasses.replace(spec, eps=float(eps))
    if rq.lut_strategy is not None:
        st = rq.lut_strategy
        if not isinstance(st, Strategy):
            st = Strategy[str(st)]
        if st is not Strategy.MANUAL:
            spec = dataclasses.replace(spec, strategy=st, dividing_points=None)
    return spec


def _lut(sim, call, plan, args, kwargs, in_infos, wq, rq):
    from quantlab.numerics.lut import LutFormat, build_lut
    from quantlab.numerics.periodic import needs_period_reduction, period_reduce

    p = sim.platform
    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    if call.op_type not in LUT_FUNCS or not _int_info(info) or not out.is_int:
        return None
    if call.op_type == "gelu" and kwargs.get("approximate", "none") != "none":
        return None
    xc = _codes(args, kwargs, plan.acts[0], info)
    xs, in_dt = float(info.scale), info.dtype
    observed = sim.observed_range(call.name, "in0")
    if (
        call.op_type in ("sin", "cos")
        and p.sincos_period_reduction
        and needs_period_reduction(xs, in_dt)
    ):
        xc, xs = period_reduce(xc, xs, in_dt, p.fake_round)
        observed = None
    so = _out_scale(sim, call, rq)
    lut = build_lut(
        call.op_type,
        in_dt,
        xs,
        out,
        float(so),
        _lut_spec(call, rq),
        LutFormat.from_platform(p),
        observed,
    )
    codes = lut.evaluate(xc.to(in_dt.torch_dtype))
    return _emit(codes, so, out)


def _softmax(sim, call, plan, args, kwargs, in_infos, wq, rq):
    from quantlab.numerics.lut import LutFormat, lut_softmax

    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    if not _int_info(info) or not out.is_int:
        return None
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if dim is None or kwargs.get("dtype") is not None:
        return None
    xc = _codes(args, kwargs, plan.acts[0], info).to(info.dtype.torch_dtype)
    so = _out_scale(sim, call, rq)
    codes = lut_softmax(
        xc,
        float(info.scale),
        info.dtype,
        dim,
        float(so),
        out,
        LutFormat.from_platform(sim.platform),
    )
    return _emit(codes, so, out)


# --------------------------------------------------------------------------- reductions


def _reduce(sim, call, plan, args, kwargs, in_infos, wq, rq):
    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    if not _int_info(info) or not out.is_int or kwargs.get("dtype") is not None:
        return None
    x = A.get(args, kwargs, plan.acts[0])
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 else False)
    xc = info.codes_of(x)
    if dim is None:
        acc, n = xc.sum(), xc.numel()
    else:
        acc = xc.sum(dim=dim, keepdim=keepdim)
        n = xc.numel() // max(acc.numel(), 1) if not keepdim else xc.numel() // acc.numel()
    so = _out_scale(sim, call, rq)
    den = so if call.op_type == "sum" else torch.as_tensor(float(so) * n, dtype=torch.float64)
    real = _ratio(sim, info.scale, den)
    return _emit(_requant(sim, acc, real, out), so, out)


def _pool(sim, call, plan, args, kwargs, in_infos, wq, rq):
    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    if not _int_info(info) or not out.is_int:
        return None
    x = A.get(args, kwargs, plan.acts[0])
    if call.op_type == "adaptive_avg_pool2d":
        osz = args[1] if len(args) > 1 else kwargs["output_size"]
        osz = (osz, osz) if isinstance(osz, int) else tuple(osz)
        h, w = x.shape[-2:]
        if any(o is None for o in osz) or h % osz[0] or w % osz[1]:
            return None
        k = (h // osz[0], w // osz[1])
        stride, padding = k, 0
    elif call.op_type == "avg_pool2d":
        names = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor")
        vals = [args[i + 1] if len(args) > i + 1 else kwargs.get(n) for i, n in enumerate(names)]
        k, stride, padding, ceil_mode, _, divisor = vals
        if padding not in (None, 0, (0, 0)) or ceil_mode or divisor is not None:
            return None
        k = (k, k) if isinstance(k, int) else tuple(k)
        stride = k if stride in (None, []) else stride
        padding = 0
    else:
        return None
    xc = info.codes_of(x)
    acc = F.avg_pool2d(xc.to(torch.float64), k, stride, padding, divisor_override=1)
    n = k[0] * k[1]
    so = _out_scale(sim, call, rq)
    real = _ratio(sim, info.scale, torch.as_tensor(float(so) * n, dtype=torch.float64))
    return _emit(_requant(sim, acc.to(torch.int64), real, out), so, out)


def _resample(sim, call, plan, args, kwargs, in_infos, wq, rq):
    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
    if not _int_info(info) or not out.is_int or mode != "nearest":
        return None
    xc = _codes(args, kwargs, plan.acts[0], info)
    a2 = list(args)
    a2[0] = xc.to(torch.float64)
    sel = call.func(*a2, **kwargs).to(torch.int64)
    so = _out_scale(sim, call, rq)
    return _emit(_requant(sim, sel, _ratio(sim, info.scale, so), out), so, out)


# --------------------------------------------------------------------------- grid_sample


def _grid_sample(sim, call, plan, args, kwargs, in_infos, wq, rq):
    from quantlab.numerics import grid_sample as G

    p = sim.platform
    info = in_infos[0]
    ginfo = in_infos[1] if len(in_infos) > 1 else None
    if (
        not _int_info(info)
        or not p.grid_dtype.is_int
        or (ginfo is not None and ginfo.dtype.is_float)
    ):
        return None
    x = A.get(args, kwargs, plan.acts[0])
    grid = A.get(args, kwargs, plan.acts[1])
    mode = kwargs.get("mode", args[2] if len(args) > 2 else "bilinear")
    padding = kwargs.get("padding_mode", args[3] if len(args) > 3 else "zeros")
    align = kwargs.get("align_corners", args[4] if len(args) > 4 else None) or False
    if mode not in ("bilinear", "nearest") or padding != "zeros" or x.dim() != 4:
        return None
    qg = G.quantize_grid(
        grid,
        x.shape[2],
        x.shape[3],
        align,
        p.grid_coord,
        p.grid_dtype,
        p.fake_round,
        G.NanRule.ZERO_CODE,  # a NaN coordinate becomes code 0, as quantize does
    )
    codes = G.grid_sample_fixed(
        info.codes_of(x),
        info.scale,
        info.dtype,
        qg,
        G.SampleMode[mode.upper()],
        G.Padding.ZEROS,
        align,
    )
    return _emit(codes, info.scale, info.dtype)


_DISPATCH = {
    OpCategory.GEMM: _gemm,
    OpCategory.ADD: _add,
    OpCategory.MUL: _mul,
    OpCategory.DIV: _div,
    OpCategory.REQUANT: _requant_op,
    OpCategory.LUT: _lut,
    OpCategory.SOFTMAX: _softmax,
    OpCategory.REDUCE: _reduce,
    OpCategory.POOL: _pool,
    OpCategory.RESAMPLE: _resample,
    OpCategory.GRID_SAMPLE: _grid_sample,
}
