"""The fixed kernels of the ops that sample their input at positions: ``F.interpolate`` (by
``platform.resize``: nearest selection and the sampler of ``numerics.resize``, or LiteRT's
kernels, ``numerics.litert_resize``) and ``F.grid_sample``
(``numerics.grid_sample``, or onnxruntime's ``numerics.ort_grid_sample``). Each returns
``(value, QInfo)``, or None for the float fallback (``fixed_ops``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics import grid_sample as G
from quantlab.numerics.dtypes import DType
from quantlab.numerics.litert_resize import (
    tflite_resize_bilinear,
    tflite_resize_nearest,
    xnnpack_resize_bilinear,
)
from quantlab.numerics.ort_grid_sample import TORCH_MODES, TORCH_PADDINGS, ort_grid_sample
from quantlab.numerics.ort_resize import ort_nearest_indices, ort_resize_bilinear
from quantlab.numerics.quantize import dequantize
from quantlab.numerics.resize import resize_bilinear_fixed
from quantlab.platform_rules import AvgPoolRule, FloatIslands, ResizeRule
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc

_INTERPOLATE_ARGS = ("input", "size", "scale_factor", "mode", "align_corners")
_INTERPOLATE_ARGS += ("recompute_scale_factor", "antialias")


_NEAREST = ("nearest", "nearest-exact")
_LINEAR = ("linear", "bilinear")
_LITERT = (ResizeRule.LITERT, ResizeRule.LITERT_XNNPACK)


def resample_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    """F.interpolate on the input's codes by ``platform.resize`` (``ResizeRule``): nearest
    selects centred codes (where torch maps them; by onnxruntime's indices under ONNXRUNTIME),
    linear and bilinear take grid_sample's sampler (``numerics.resize``) on centred codes
    (GRID_SAMPLER), and either is then rescaled to the op's output scale; under ONNXRUNTIME
    bilinear is its float32 kernel between dequantize and quantize; LiteRT's kernels
    (``numerics.litert_resize``) work on the stored codes and keep the input's quantization.
    None (the float fallback) for other modes and ranks."""
    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    v = A.named(args, kwargs, _INTERPOLATE_ARGS)
    mode = v["mode"] or "nearest"
    rule = sim.platform.resize
    if not fc.zp_info(info) or not out.is_int:
        return None
    if mode == "area":
        return _area(sim, call, plan, args, kwargs, info, v, rq)
    if rule in _LITERT and mode in _NEAREST + _LINEAR:
        return _litert_resize(A.get(args, kwargs, plan.acts[0]), info, v, mode, rule)
    if mode in _LINEAR and rule is ResizeRule.ONNXRUNTIME:
        return _ort_bilinear(sim, call, args, kwargs, plan, info, v, rq)
    xc = fc.centred(args, kwargs, plan.acts[0], info)
    if mode == "nearest" and rule is ResizeRule.ONNXRUNTIME:
        sel = _ort_nearest(xc, v)
        if sel is None:
            return None
    elif mode in _NEAREST:
        sel = _torch_nearest(call, args, kwargs, plan.acts[0], xc, info)
        if sel is None:
            return None
    elif mode in _LINEAR and rule is ResizeRule.GRID_SAMPLER:
        sel = _bilinear_codes(sim, xc, v)
        if sel is None:
            return None
    else:
        return None
    so = fc.out_scale(sim, call, rq)
    zo = fc.out_zero_point(sim, call, rq)
    return fc.emit(fc.rescale(sim, call.name, sel, info.scale, so, out, zero_point=zo), so, out, zo)


def _torch_nearest(call, args, kwargs, slot, xc: Tensor, info) -> Tensor | None:
    """int64 centred codes ``xc`` selected as the float model selects its values: torch's own
    kernel on the codes as float32 (exact for codes of up to 24 bits), in the input's layout
    (float64 codes would read other pixels on some sizes: ``numerics.torch_nearest``). None
    (the float fallback) for wider codes."""
    if max(-info.dtype.qmin, info.dtype.qmax) + abs(info.zero_point) > 1 << 24:
        return None
    a2, kw2 = list(args), dict(kwargs)
    A.put(a2, kw2, slot, xc.to(torch.float32))
    return call.func(*a2, **kw2).to(torch.int64)


def _area(sim, call, plan, args, kwargs, info, v: dict, rq):
    """``F.interpolate(mode="area")``: torch computes it as adaptive average pooling to the
    output size, and so does fixed mode, by the pool's integer kernel on platforms that sum
    windows exactly (``AvgPoolRule.INTEGER_SUM``); None (the float fallback) elsewhere."""
    from quantlab.capture import OpCall
    from quantlab.simulate.fixed_pool import pool_op

    x = A.get(args, kwargs, plan.acts[0])
    if sim.platform.avg_pool_rule is not AvgPoolRule.INTEGER_SUM or x.dim() not in (3, 4):
        return None
    outs, _ = _output_sizes(tuple(x.shape[2:]), v)
    pool = F.adaptive_avg_pool2d if x.dim() == 4 else F.adaptive_avg_pool1d
    call2 = OpCall(call.name, pool.__name__, call.category, call.module, call.call_index,
                   pool, (x, outs), {})  # fmt: skip
    return pool_op(sim, call2, A.ArgPlan([("a", 0)]), [x, outs], {}, [info], None, rq)


def keeps_input_quantization(call, platform) -> bool:
    """Whether ``call`` is an ``F.interpolate`` the platform runs as one of LiteRT's resize
    kernels (``ResizeRule`` LITERT or LITERT_XNNPACK), whose output holds its input's scale and
    zero point (the converter gives the two the same quantization): fake mode quantizes it
    there too."""
    if platform.resize not in _LITERT or call.op_type != "interpolate":
        return False
    mode = A.named(call.args, call.kwargs, _INTERPOLATE_ARGS)["mode"] or "nearest"
    return mode in _NEAREST + _LINEAR


def _output_sizes(sizes: tuple, v: dict) -> tuple[tuple, tuple]:
    """(output sizes, the scale factors torch maps positions by, None where it maps by the
    sizes) of ``F.interpolate`` called with ``v`` (its arguments by name) on spatial
    ``sizes``."""
    nd = len(sizes)
    size, factor = v["size"], v["scale_factor"]
    if size is not None:
        outs = (size,) * nd if isinstance(size, int) else tuple(int(s) for s in size)
        return outs, (None,) * nd
    fs = (factor,) * nd if isinstance(factor, (int, float)) else tuple(factor)
    outs = tuple(math.floor(float(n * f)) for n, f in zip(sizes, fs, strict=True))
    mapped = not v["recompute_scale_factor"]  # torch maps by the factor itself
    return outs, (tuple(float(f) for f in fs) if mapped else (None,) * nd)


def _ort_nearest(xc: Tensor, v: dict) -> Tensor | None:
    """``xc`` [N, C, *spatial] selected as onnxruntime's nearest Resize of the exported node
    selects (``numerics.ort_resize``: by the call's scale factor where the export writes it,
    else by the sizes); None for more than 2 spatial dims or antialiasing."""
    sizes = tuple(xc.shape[2:])
    if len(sizes) not in (1, 2) or v["antialias"]:
        return None
    outs, scales = _output_sizes(sizes, v)
    for axis, (n_in, n_out, f) in enumerate(zip(sizes, outs, scales, strict=True)):
        xc = xc.index_select(2 + axis, ort_nearest_indices(n_in, n_out, f))
    return xc


def _ort_bilinear(sim, call, args, kwargs, plan, info, v: dict, rq):
    """(value, QInfo) of a bilinear interpolate of a 4-d input as onnxruntime runs its exported
    Resize between DequantizeLinear and QuantizeLinear: the input's codes dequantized, the
    linear Resize of ``numerics.ort_resize`` (by the call's factor where the export writes it,
    else by the sizes), quantized at the op's output; None (the float fallback) for other
    ranks and antialiasing."""
    x = A.get(args, kwargs, plan.acts[0])
    if x.dim() != 4 or v["antialias"]:
        return None
    outs, scales = _output_sizes(tuple(x.shape[2:]), v)
    align = bool(v["align_corners"])

    def fn(value):
        return ort_resize_bilinear(value, outs, align, scales)

    out, so, zo = rq.output_dtype, fc.out_scale(sim, call, rq), fc.out_zero_point(sim, call, rq)
    xc = fc.codes(args, kwargs, plan.acts[0], info)
    codes = fc.dequantize_quantize(
        fn, [(xc, info.scale, info.zero_point)], so, out, zo, sim.platform
    )
    return fc.emit(codes, so, out, zo)


def _bilinear_codes(sim, xc: Tensor, v: dict) -> Tensor | None:
    """int64 codes of the bilinear (``xc`` [N, C, H, W]) or linear (``xc`` [N, C, L], taken as
    one row) resize of centred codes ``xc`` as ``F.interpolate`` is called (``v``: its
    arguments by name), at the input's scale; None for what the sampler does not model
    (antialiasing, another rank)."""
    nd = xc.dim() - 2
    if nd not in (1, 2) or v["antialias"]:
        return None
    outs, scales = _output_sizes(tuple(xc.shape[2:]), v)
    if nd == 1:  # one row: the height maps 1 -> 1, position 0 in every mapping
        xc, outs, scales = xc.unsqueeze(2), (1, *outs), (None, *scales)
    p = sim.platform
    codes = resize_bilinear_fixed(
        xc,
        DType.INT32,
        outs,
        bool(v["align_corners"]),
        scales,
        weight_frac_bits=p.grid_weight_frac_bits,
        coord_round=p.grid_round,
        out_rounding=p.grid_round,
    ).to(torch.int64)
    return codes.squeeze(2) if nd == 1 else codes


def _litert_resize(x: Tensor, info, v: dict, mode: str, rule: ResizeRule):
    """(value, QInfo) of LiteRT's RESIZE_NEAREST_NEIGHBOR (nearest; nearest-exact with
    half-pixel centres) or RESIZE_BILINEAR (linear, bilinear) of ``x``'s stored codes (int8 or
    int16, zero point included) to the output size ``F.interpolate`` gives (LiteRT maps
    positions by the size ratio, whatever factor the call names), at the input's scale, zero
    point and dtype, as the converter requires; a 1-d input is one row. Bilinear: LiteRT's own
    kernel, or XNNPACK's for int8 codes under LITERT_XNNPACK. None for antialiasing, another
    rank or other codes."""
    nd = x.dim() - 2
    if nd not in (1, 2) or v["antialias"] or info.dtype not in (DType.INT8, DType.INT16):
        return None
    outs, _ = _output_sizes(tuple(x.shape[2:]), v)
    codes = info.codes_of(x)
    if nd == 1:
        codes, outs = codes.unsqueeze(2), (1, *outs)
    align = bool(v["align_corners"])
    if mode in _NEAREST:
        y = tflite_resize_nearest(codes, outs, half_pixel_centers=mode == "nearest-exact")
    elif rule is ResizeRule.LITERT_XNNPACK and info.dtype is DType.INT8:
        y = xnnpack_resize_bilinear(codes, outs, align, half_pixel_centers=not align)
    else:
        y = tflite_resize_bilinear(codes, info.dtype, outs, align, half_pixel_centers=not align)
    y = y.squeeze(2) if nd == 1 else y
    return fc.emit(y, info.scale, info.dtype, info.zero_point)


def grid_sample_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    """F.grid_sample at the input's scale and zero point: on J6, the fixed-point sampler of
    ``numerics.grid_sample`` on the input's centred codes and the grid quantized to the
    platform's grid format; where the platform leaves it in float
    (``FloatIslands.ONNXRUNTIME_QDQ``), ``_runtime_grid_sample``. None (the float fallback)
    for what neither models."""
    p = sim.platform
    info = in_infos[0]
    ginfo = in_infos[1] if len(in_infos) > 1 else None
    if p.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        return _runtime_grid_sample(args, kwargs, plan, info, ginfo, p)
    if (
        not fc.zp_info(info)
        or not p.grid_dtype.is_int
        or (ginfo is not None and ginfo.dtype.is_float)
    ):
        return None
    x = A.get(args, kwargs, plan.acts[0])
    grid = A.get(args, kwargs, plan.acts[1])
    mode, padding, align = A.grid_sample_options(args, kwargs)
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
    zx = info.zero_point  # sampled on the centred codes: padding "zeros" is the value 0
    codes = G.grid_sample_fixed(
        info.codes_of(x) - zx,
        info.scale,
        DType.INT32 if zx else info.dtype,
        qg,
        G.SampleMode[mode.upper()],
        G.Padding.ZEROS,
        align,
        out_rounding=p.grid_round,
        weight_frac_bits=p.grid_weight_frac_bits,
        coord_round=p.grid_round,
    )
    if zx:
        codes = (codes.to(torch.int64) + zx).clamp(info.dtype.qmin, info.dtype.qmax)
    return fc.emit(codes, info.scale, info.dtype, zx)


def _runtime_grid_sample(args, kwargs, plan, info, ginfo, p):
    """F.grid_sample as onnxruntime runs GridSample in a QDQ graph: the input's codes
    dequantized, fl32(s * (c - z)), and the grid's (its float32 value where it has no codes),
    sampled by ``numerics.ort_grid_sample``, then quantized back to the input's scale, zero
    point and dtype, rne(fl32(v / s)) + z saturated. None (the float fallback) for an input
    without codes, a grid of another rank, bicubic sampling and reflection padding (which
    onnxruntime applies to integer indices, unlike torch)."""
    x = A.get(args, kwargs, plan.acts[0])
    grid = A.get(args, kwargs, plan.acts[1])
    mode, padding, align = A.grid_sample_options(args, kwargs)
    if (
        not fc.zp_info(info)
        or x.dim() != 4
        or mode not in TORCH_MODES
        or padding not in TORCH_PADDINGS
    ):
        return None
    if fc.zp_info(ginfo):
        gc = fc.codes(args, kwargs, plan.acts[1], ginfo)
        gv = dequantize(gc, ginfo.scale, zero_point=ginfo.zero_point)
    else:
        gv = grid.detach().to(torch.float32)
    sample, pad = G.SampleMode[mode.upper()], G.Padding[padding.upper()]

    def fn(xv):
        return ort_grid_sample(xv, gv, sample, pad, align)

    xc, zx = fc.codes(args, kwargs, plan.acts[0], info), info.zero_point
    codes = fc.dequantize_quantize(fn, [(xc, info.scale, zx)], info.scale, info.dtype, zx, p)
    return fc.emit(codes, info.scale, info.dtype, zx)
