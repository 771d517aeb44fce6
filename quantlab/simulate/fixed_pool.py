"""Average pools in fixed mode, by ``platform.avg_pool_rule``: INTEGER_SUM sums each window's
centred codes exactly and requantizes the sum over the window's count (windows that differ,
by padding, ``ceil_mode``, ``divisor_override`` or adaptive sizes that do not divide, each over
its own: ``numerics.pool_windows``); FLOAT_WINDOW_SUM is onnxruntime's QLinearAveragePool
(``numerics.float_window_pool``). 1-d pools run as 2-d ones over a height-1 image. Every kernel
returns ``(value, QInfo)``, or None for the float fallback."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics import pool_windows
from quantlab.numerics.dtypes import DType
from quantlab.numerics.float_window_pool import float_window_avg_pool2d, global_mean_in_range
from quantlab.numerics.ort_reduce import onnxruntime_reduce
from quantlab.numerics.quantize import dequantize
from quantlab.platforms import AvgPoolRule, FloatIslands
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.qtensor import QInfo


def pool_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    """(value, QInfo) of an average pool in fixed mode by ``platform.avg_pool_rule``, or None
    (the float fallback)."""
    if call.op_type in ("avg_pool1d", "adaptive_avg_pool1d"):
        return _pool1d(sim, call, plan, args, kwargs, in_infos, rq)
    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    if not fc.zp_info(info) or not out.is_int:
        return None
    x = A.get(args, kwargs, plan.acts[0])
    integer_sum = sim.platform.avg_pool_rule is AvgPoolRule.INTEGER_SUM
    if call.op_type == "adaptive_avg_pool2d":
        osz = args[1] if len(args) > 1 else kwargs["output_size"]
        osz = (osz, osz) if isinstance(osz, int) else tuple(osz)
        h, w = x.shape[-2:]
        if any(o is None for o in osz) and not integer_sum:
            return None  # (a runtime profile's export names the sizes)
        osz = tuple(n if o is None else o for o, n in zip(osz, (h, w)))
        if h % osz[0] or w % osz[1]:
            if not integer_sum:
                return None
            xc = info.codes_of(x) - info.zero_point
            return _uneven_windows(sim, call, *pool_windows.adaptive_window_sums(xc, osz), info, rq)
        k = (h // osz[0], w // osz[1])
        stride, padding, include_pad = k, (0, 0), True
        # pooling to one value is a GlobalAveragePool in ONNX (QLinearGlobalAveragePool: an
        # integer sum), any other a windowed AveragePool
        windows = osz != (1, 1)
    elif call.op_type == "avg_pool2d":
        names = (
            "kernel_size",
            "stride",
            "padding",
            "ceil_mode",
            "count_include_pad",
            "divisor_override",
        )
        vals = [args[i + 1] if len(args) > i + 1 else kwargs.get(n) for i, n in enumerate(names)]
        k, stride, padding, ceil_mode, include_pad, divisor = vals
        windows = True
        k = _pair(k)
        stride = k if stride in (None, []) else _pair(stride)
        padding = _pair(padding or 0)
        if integer_sum and (ceil_mode or divisor is not None or padding != (0, 0)):
            xc = info.codes_of(x) - info.zero_point
            include = include_pad is not False
            sums = pool_windows.window_sums(
                xc, k, stride, padding, bool(ceil_mode), include, divisor
            )
            return _uneven_windows(sim, call, *sums, info, rq)
        if ceil_mode or divisor is not None:
            return None
    else:
        return None
    so = fc.out_scale(sim, call, rq)
    zo = fc.out_zero_point(sim, call, rq)
    islands = sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ
    if islands and not windows and not global_mean_in_range(info.scale, so, k[0] * k[1]):
        v = dequantize(info.codes_of(x), info.scale, zero_point=info.zero_point)  # ReduceMean
        r = onnxruntime_reduce(v, (-2, -1), mean=True, keepdim=True)  # (QLinear refuses scales)
        return fc.emit(sim.platform.quantize_codes(r, so, out, zo), so, out, zo)
    if sim.platform.avg_pool_rule is AvgPoolRule.FLOAT_WINDOW_SUM and windows:
        codes = float_window_avg_pool2d(
            info.codes_of(x),
            info.scale,
            info.zero_point,
            k,
            stride,
            padding,
            so,
            zo,
            out,
            held_offset=sim.platform.qlinear_zero_point if out is DType.INT8 else 0,
            count_include_pad=include_pad is not False,
        )
        return fc.emit(codes, so, out, zo)
    xc = info.codes_of(x) - info.zero_point
    acc = F.avg_pool2d(xc.to(torch.float64), k, stride, 0, divisor_override=1)
    n = k[0] * k[1]
    codes = fc.rescale(sim, call.name, acc.to(torch.int64), info.scale, so, out, n, zo)
    return fc.emit(codes, so, out, zo)


def _uneven_windows(sim, call, sums: Tensor, counts: Tensor, info, rq):
    """(value, QInfo) of an integer average pool whose windows hold different numbers of
    values: each window's exact sum (int64 (N, C, Ho, Wo)) requantized by the ratio of scales
    over its own count (``counts`` (Ho, Wo)), one ``rescale`` per distinct count."""
    out = rq.output_dtype
    so, zo = fc.out_scale(sim, call, rq), fc.out_zero_point(sim, call, rq)
    codes = torch.empty(sums.shape, dtype=out.torch_dtype)
    for i, n in enumerate(torch.unique(counts).tolist()):
        at = (counts == n).expand(sums.shape)
        part = fc.rescale(sim, call.name, sums[at], info.scale, so, out, n, zo, part=i)
        codes[at] = part.to(codes.dtype)
    return fc.emit(codes, so, out, zo)


def _pool1d(sim, call, plan, args, kwargs, in_infos, rq):
    """A 1-d average pool as the 2-d one over a height-1 image (the same window sums; an
    adaptive pool to 1 is a global mean): (value, QInfo) with the height dropped, or None."""
    from quantlab.capture import OpCall

    x = A.get(args, kwargs, plan.acts[0])
    info = in_infos[0] if in_infos else None
    if not isinstance(x, Tensor) or x.dim() != 3 or info is None:
        return None

    def one(v, fill):  # a 1-d size, stride or padding as the 2-d pair (fill, v)
        v = v[0] if isinstance(v, (tuple, list)) else v
        return (fill, int(v))

    names = (
        ("output_size",)
        if call.op_type == "adaptive_avg_pool1d"
        else ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")
    )
    vals = [args[i + 1] if len(args) > i + 1 else kwargs.get(n) for i, n in enumerate(names)]
    if call.op_type == "adaptive_avg_pool1d":
        op_type, rest = "adaptive_avg_pool2d", [one(vals[0], 1)]
    else:
        k, stride, padding, ceil_mode, include_pad = vals
        stride = k if stride in (None, []) else stride
        op_type = "avg_pool2d"
        rest = [one(k, 1), one(stride, 1), one(padding or 0, 0), bool(ceil_mode)]
        rest.append(True if include_pad is None else bool(include_pad))
    x2 = x.unsqueeze(2)  # its codes: info.codes_of(x2), exact from the values on the grid
    call2 = OpCall(call.name, op_type, call.category, call.module, call.call_index,
                   F.avg_pool2d, (x2, *rest), {})  # fmt: skip
    res = pool_op(sim, call2, A.ArgPlan([("a", 0)]), [x2, *rest], {}, [info], None, rq)
    if res is None:
        return None
    value, q = res
    codes = q.codes.squeeze(2) if q.codes is not None else None
    return value.squeeze(2), QInfo(q.dtype, q.scale, codes, q.zero_point)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)
