"""Fixed-point kernels of the simulator: integer codes in, integer codes out.

Each kernel takes the op's activation codes (from the side table), calls the arithmetic of
``quantlab.numerics`` with the platform's fields, and returns ``(value, QInfo)`` where
``value == codes * scale`` exactly. A kernel returns None when its integer form does not apply
(float16 operands, an argument combination it does not model); the simulator then evaluates the
op's float function on the exact dequantized inputs and quantizes the output once
(``float_fallback`` in the op-support table).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from quantlab.capture import out_of_place_name
from quantlab.numerics.code_bounds import CONSTANT_DTYPE, bound_codes, constant_codes
from quantlab.numerics.dtypes import DType
from quantlab.numerics.float_window_pool import global_mean_in_range
from quantlab.numerics.ort_reduce import onnxruntime_reduce
from quantlab.numerics.quantize import dequantize
from quantlab.op_kinds import WHERE_PARAMS, OpCategory
from quantlab.platforms import (
    AddRule,
    AvgPoolRule,
    ConcatRule,
    FloatIslands,
    ResizeRule,
    SoftmaxRule,
    TensorDivRule,
)
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.fixed_div import reciprocal_table_div
from quantlab.simulate.fixed_embedding import embedding_op
from quantlab.simulate.fixed_gemm import gemm_op
from quantlab.simulate.fixed_log_softmax import log_softmax_op
from quantlab.simulate.fixed_lut import lut_op
from quantlab.simulate.fixed_norm import COMPOSITE_TYPES, norm_op
from quantlab.simulate.fixed_pool import pool_op
from quantlab.simulate.fixed_sampling import grid_sample_op, resample_op
from quantlab.simulate.fixed_softmax import softmax_op

_KERNELS = {
    OpCategory.GEMM: "integer",
    OpCategory.ADD: "integer",
    OpCategory.MUL: "integer",
    OpCategory.DIV: "integer (scalar divisor); float_fallback (tensor divisor)",
    OpCategory.PASS_THROUGH: "pass_through",
    OpCategory.REQUANT: "integer",
    OpCategory.LUT: "lut",
    OpCategory.REDUCE: "integer",
    OpCategory.POOL: "integer (window sums over each window's count)",
    OpCategory.SOFTMAX: "lut (exp, reciprocal)",
    OpCategory.LOG_SOFTMAX: "lut (softmax's exp and reciprocal, then log)",
    OpCategory.NORM: "float_fallback",
    OpCategory.EMBEDDING: "integer (gather)",
    OpCategory.RESAMPLE: (
        "integer (nearest, nearest-exact, linear, bilinear); float_fallback (other modes)"
    ),
    OpCategory.GRID_SAMPLE: "integer",
}


_LITERT_RESIZE = {
    ResizeRule.LITERT: "LiteRT's RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR (10-bit positions)",
    ResizeRule.LITERT_XNNPACK: (
        "LiteRT's RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR (int8: XNNPACK's 11-bit weights; "
        "int16: 10-bit positions)"
    ),
}

NOT_MODELLED = "float (not modelled by quantlab)"
# an op whose output dtype is a float one (float16 on J6H/P) computes in it (the ops table)
FLOAT_OUTPUT = "its output dtype: computed in float"
NOT_SUPPORTED = "float (not supported on this platform)"


def kernel_name(op_type: str, category: OpCategory | None, sim) -> str:
    """How the op runs in fixed mode on ``sim.platform`` (the op-support table's column): an op
    quantlab does not model (``category`` None) and an op the platform does not support both
    run in float, and the column says which of the two it is."""
    if category is None:
        return NOT_MODELLED
    if not sim.supported(op_type, category):
        return NOT_SUPPORTED
    if op_type == "pow" and category is OpCategory.MUL:
        return f"x * x (the exponent 2) as mul: {_supported_kernel('mul', category, sim)}"
    return _supported_kernel(op_type, category, sim)


def _supported_kernel(op_type: str, category: OpCategory, sim) -> str:
    if op_type in COMPOSITE_TYPES and sim.platform.norm_composite:
        return "integer (mean, variance, rsqrt lut, affine)"
    if category is OpCategory.SOFTMAX and sim.platform.softmax_rule is SoftmaxRule.FLOAT_EXP_TABLE:
        return "float32 exp table (8-bit); float_fallback (16-bit)"
    if op_type in A.TRANSPOSED and sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        return "float between dequantize and quantize"
    if op_type == "batch_norm" and sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        return "float between dequantize and quantize (BatchNormalization's float32 steps)"
    if op_type == "batch_norm":  # one no GEMM absorbs (a fused one is "fused into" its GEMM)
        return "integer per-channel affine (x * a_c + b_c, as a depthwise 1x1 convolution)"
    if op_type == "layer_norm" and sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        return "float between dequantize and quantize (LayerNormalization's float32 steps)"
    if op_type == "group_norm" and sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        return (
            "float between dequantize and quantize (LayerNormalization's float32 steps per "
            "group, then Mul and Add per channel)"
        )
    if op_type == "instance_norm" and sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        return (
            "float between dequantize and quantize (LayerNormalization's float32 steps per "
            "channel, then Mul and Add); integer per-channel affine (running statistics)"
        )
    if (
        category is OpCategory.GRID_SAMPLE
        and sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ
    ):
        return (
            "float between dequantize and quantize (GridSample's float32 steps; bilinear, "
            "nearest; zeros, border)"
        )
    if category is OpCategory.RESAMPLE and sim.platform.resize in _LITERT_RESIZE:
        return (
            f"integer (nearest, nearest-exact, linear, bilinear: "
            f"{_LITERT_RESIZE[sim.platform.resize]}, at the input's scale); float_fallback "
            "(other modes)"
        )
    if category is OpCategory.RESAMPLE and sim.platform.resize is ResizeRule.ONNXRUNTIME:
        return (
            "integer (nearest by onnxruntime's Resize indices, nearest-exact); float between "
            "dequantize and quantize (linear, bilinear: onnxruntime's float32 Resize steps)"
        )
    if category is OpCategory.POOL and sim.platform.avg_pool_rule is AvgPoolRule.FLOAT_WINDOW_SUM:
        return "float32 window sums; integer (a global mean)"
    if category is OpCategory.REDUCE and sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        return "float between dequantize and quantize; integer (a global mean)"
    elementwise = (OpCategory.ADD, OpCategory.MUL, OpCategory.DIV)
    if category in elementwise and sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        if op_type in ("add", "mul"):
            return "integer (two 8-bit tensors); float between dequantize and quantize otherwise"
        return "float between dequantize and quantize"
    if (
        category is OpCategory.DIV
        and sim.platform.tensor_div_rule is TensorDivRule.RECIPROCAL_TABLE
    ):
        return "integer (scalar divisor; tensor divisor: times its reciprocal lut)"
    return _KERNELS[category]


def run_fixed(sim, call, plan, args, kwargs, in_infos, wq, rq, quant_out, clamp=None) -> Any:
    """(value, QInfo) of one op in fixed mode, or None to use the float fallback. ``clamp``:
    bounds of a relu6/clamp fused into this GEMM (applied to its output codes)."""
    if not quant_out or call.category is OpCategory.PASS_THROUGH:
        return None
    if call.category is OpCategory.GEMM:
        return gemm_op(sim, call, plan, args, kwargs, in_infos, wq, rq, clamp)
    fn = _DISPATCH.get(call.category)
    if fn is None:
        return None
    return fn(sim, call, plan, args, kwargs, in_infos, wq, rq)


# --------------------------------------------------------------------------- elementwise


def _reversed(call) -> bool:
    return getattr(call.func, "__name__", "") in ("__rsub__", "rsub", "__rtruediv__", "__rdiv__")


def _swapped(fn):
    return lambda x, y: fn(y, x)


def _add(sim, call, plan, args, kwargs, in_infos, wq, rq):
    p = sim.platform
    if not rq.output_dtype.is_int or len(plan.acts) != 2 or kwargs.get("alpha", 1) != 1:
        return None
    # codes in their own dtype: every add rule widens them itself (and bounds them by it)
    a = fc.operand(args, kwargs, plan.acts[0], in_infos[0], zero_point=True, native=True)
    b = fc.operand(args, kwargs, plan.acts[1], in_infos[1], zero_point=True, native=True)
    litert = p.add_rule in (AddRule.LEFT_SHIFT, AddRule.SHARED_SHIFT)
    if not litert:  # x + 0 (a branch left empty): the add of a zero code at x's scale
        a = _zero_operand(args, kwargs, plan.acts[0], a, b)
        b = _zero_operand(args, kwargs, plan.acts[1], b, a)
    if a is None or b is None:
        return None
    out = rq.output_dtype
    # a LiteRT constant is 8-bit: under TFLite's reference ADD and XNNPACK's add alike
    if litert and out.bits == 8:
        a = _constant_at(args, kwargs, plan.acts[0], a, DType.INT8)
        b = _constant_at(args, kwargs, plan.acts[1], b, DType.INT8)
    (xc, xs, zx), (yc, ys, zy) = a, b
    so = fc.out_scale(sim, call, rq)
    zo = fc.out_zero_point(sim, call, rq)
    dtypes = [fc.operand_dtype(args, kwargs, s, i) for s, i in zip(plan.acts, in_infos)]
    if fc.runs_in_float(p, call.op_type, dtypes, out):
        fn = torch.add if call.op_type != "sub" else torch.sub
        if _reversed(call):  # c - x
            fn = _swapped(fn)
        codes = fc.dequantize_quantize(fn, (a, b), so, out, zo, p)
        return fc.emit(codes, so, out, zo)
    k = fc.inter_add_constants(sim, call.name, xs, ys, so, out)
    if call.op_type != "sub":
        codes = fc.add_codes(p, xc, xs, yc, ys, so, out, (zx, zy, zo), k)
    elif _reversed(call):  # c - x: the add of -x and c, in this operand order (-(-128): int64)
        codes = fc.add_codes(p, -xc.to(torch.int64), xs, yc, ys, so, out, (-zx, zy, zo), k)
    else:
        codes = fc.sub_codes(p, xc, xs, yc, ys, so, out, (zx, zy, zo), k)
    return fc.emit(codes, so, out, zo)


def _zero_operand(args, kwargs, slot, operand, other):
    """``operand`` as is, unless it is the number 0 and ``other`` a tensor operand: then code 0
    at ``other``'s scale (any scale holds 0 exactly; sharing it keeps the add rule's
    intermediate scale that of the tensor)."""
    v = A.get(args, kwargs, slot)
    if operand is not None or other is None or isinstance(v, (Tensor, bool)) or v != 0:
        return operand
    return torch.zeros((), dtype=torch.int64), other[1], 0


def _constant_at(args, kwargs, slot, operand, dtype: DType):
    """``operand`` as is for a tensor; a scalar constant re-encoded as code +-qmax of ``dtype``.
    A LiteRT model holds a constant as an 8-bit tensor (assumed symmetric here: the converter's
    own encoding is not modelled); the int16 constant's 32767 << 20 would wrap int32 (TFLite's
    reference ADD), as would its product with XNNPACK's 20-bit multiplier."""
    v = A.get(args, kwargs, slot)
    if isinstance(v, Tensor):
        return operand
    return (*constant_codes(float(v), dtype), 0)


def _mul(sim, call, plan, args, kwargs, in_infos, wq, rq, const_inv: bool = False):
    if not rq.output_dtype.is_int:
        return None
    if call.op_type == "pow":  # the exponent 2 (op_kinds.pow_exponent): x * x
        return _square(sim, call, plan, args, kwargs, in_infos, rq)
    if len(plan.acts) != 2:
        return None
    a = fc.operand(args, kwargs, plan.acts[0], in_infos[0], zero_point=True, native=True)
    bv = A.get(args, kwargs, plan.acts[1])
    if const_inv:
        if isinstance(bv, Tensor) or _reversed(call) or not isinstance(bv, (int, float)):
            return None
        if bv == 0 or kwargs.get("rounding_mode") is not None:
            return None
        b = (*fc.const(1.0 / float(bv)), 0)
    else:
        b = fc.operand(args, kwargs, plan.acts[1], in_infos[1], zero_point=True, native=True)
    if a is None or b is None:
        return None
    x_dtype = fc.operand_dtype(args, kwargs, plan.acts[0], in_infos[0])
    y_dtype = (
        CONSTANT_DTYPE if const_inv else fc.operand_dtype(args, kwargs, plan.acts[1], in_infos[1])
    )
    # a scalar constant's code is +-CONSTANT_DTYPE.qmax (constant_codes); its scale is new
    # every call, so its constants are kept by the scalar's value
    x_const = not isinstance(A.get(args, kwargs, plan.acts[0]), Tensor)
    y_const = const_inv or not isinstance(bv, Tensor)
    bound = fc.centred_bound(in_infos, 0, a[2], x_const)
    bound *= fc.centred_bound(in_infos, 1, b[2], y_const)
    xk = ("const", float(A.get(args, kwargs, plan.acts[0]))) if x_const else a[1]
    yk = ("const", const_inv, float(bv)) if y_const else b[1]
    return fc.product(sim, call, rq, a, b, (x_dtype, y_dtype), bound, (xk, yk))


def _square(sim, call, plan, args, kwargs, in_infos, rq):
    """pow(x, 2) as the platform's product of x with itself, the vendor's Pow for the
    exponent 2 (horizon-plugin: a FloatFunctional mul)."""
    if len(plan.acts) != 1:
        return None
    a = fc.operand(args, kwargs, plan.acts[0], in_infos[0], zero_point=True, native=True)
    if a is None:
        return None
    dt = fc.operand_dtype(args, kwargs, plan.acts[0], in_infos[0])
    bound = fc.centred_bound(in_infos, 0, a[2], False) ** 2
    return fc.product(sim, call, rq, a, a, (dt, dt), bound, (a[1], a[1]))


def _div(sim, call, plan, args, kwargs, in_infos, wq, rq):
    if len(plan.acts) == 2 and isinstance(A.get(args, kwargs, plan.acts[1]), Tensor):
        if sim.platform.tensor_div_rule is TensorDivRule.RECIPROCAL_TABLE:
            return reciprocal_table_div(sim, call, plan, args, kwargs, in_infos, rq)
        return None
    return _mul(sim, call, plan, args, kwargs, in_infos, wq, rq, const_inv=True)


# ops of several inputs that requantize each to their output scale, then merge or select
_SELECTS = frozenset(("cat", "stack", "where", "maximum", "minimum"))


def _requant_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    out = rq.output_dtype
    if not out.is_int or not in_infos or not all(fc.zp_info(i) for i in in_infos):
        return None
    so = fc.out_scale(sim, call, rq)
    zo = fc.out_zero_point(sim, call, rq)
    if call.op_type in _SELECTS:  # each input requantized to the output
        parts = []
        for i, (slot, info) in enumerate(zip(plan.acts, in_infos)):
            codes = fc.centred(args, kwargs, slot, info)
            if sim.platform.concat_rule is ConcatRule.DEQUANTIZE_QUANTIZE:
                v = dequantize(codes, info.scale)
                parts.append(sim.platform.quantize_codes(v, so, out, zo))
                continue
            parts.append(fc.rescale(sim, call.name, codes, info.scale, so, out, 1, zo, i))
        if call.op_type == "where":
            cond = A.named(args, kwargs, WHERE_PARAMS)["condition"]
            return fc.emit(torch.where(cond, *parts), so, out, zo)
        if call.op_type in ("maximum", "minimum"):
            fn = torch.maximum if call.op_type == "maximum" else torch.minimum
            return fc.emit(fn(*parts), so, out, zo)
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        fn = torch.cat if call.op_type == "cat" else torch.stack
        return fc.emit(fn(parts, dim), so, out, zo)
    info = in_infos[0]
    xc = fc.codes(args, kwargs, plan.acts[0], info).to(torch.int64)
    if call.op_type == "relu6":
        lo, hi = 0.0, 6.0
    elif getattr(call.func, "__name__", "") == "hardtanh":
        lo = kwargs.get("min_val", args[1] if len(args) > 1 else -1.0)
        hi = kwargs.get("max_val", args[2] if len(args) > 2 else 1.0)
    else:
        name = out_of_place_name(call.func)
        lo = kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = kwargs.get("max", args[2] if len(args) > 2 else None)
        if name == "clamp_max":
            lo, hi = None, lo
        if isinstance(lo, Tensor) or isinstance(hi, Tensor):
            return None
    # requantize to the output scale, then clamp there at the bounds' output codes (the
    # platform's bound rule, as a fused clamp): a clip of the dequantized values at the real
    # bounds, then quantized (rounding is monotone, so the clip commutes with it). A runtime
    # that clips between dequantize and quantize (float_islands) requantizes so too.
    if sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        v = dequantize(xc, info.scale, zero_point=info.zero_point)
        yc = sim.platform.quantize_codes(v, so, out, zo).to(torch.int64)
    else:
        yc = fc.rescale(sim, call.name, xc - info.zero_point, info.scale, so, out, zero_point=zo)
    lo_c, hi_c = bound_codes(lo, hi, so, out, zero_point=zo, rule=sim.platform.bound_rule)
    return fc.emit(yc.clamp_min(lo_c).clamp_max(hi_c), so, out, zo)


# --------------------------------------------------------------------------- reductions


def _reduce(sim, call, plan, args, kwargs, in_infos, wq, rq):
    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    if not fc.zp_info(info) or not out.is_int or kwargs.get("dtype") is not None:
        return None
    x = A.get(args, kwargs, plan.acts[0])
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 else False)
    so = fc.out_scale(sim, call, rq)
    zo = fc.out_zero_point(sim, call, rq)
    if sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ and not _global_mean(
        call, x, dim, info.scale, so
    ):
        v = dequantize(info.codes_of(x), info.scale, zero_point=info.zero_point)  # ReduceSum /
        mean = call.op_type == "mean"  # ReduceMean in float32, in onnxruntime's order
        r = onnxruntime_reduce(v, dim, mean=mean, keepdim=bool(keepdim))
        codes = sim.platform.quantize_codes(r, so, out, zo)
        return fc.emit(codes, so, out, zo)
    xc = info.codes_of(x) - info.zero_point
    if dim is None:
        acc, n = xc.sum(), xc.numel()
    else:
        acc = xc.sum(dim=dim, keepdim=keepdim)
        n = xc.numel() // max(acc.numel(), 1) if not keepdim else xc.numel() // acc.numel()
    count = 1 if call.op_type == "sum" else n
    return fc.emit(fc.rescale(sim, call.name, acc, info.scale, so, out, count, zo), so, out, zo)


def _global_mean(call, x: Tensor, dim, x_scale, y_scale) -> bool:
    """A mean over the two spatial axes of an (N, C, H, W) tensor whose scales
    QLinearGlobalAveragePool (an integer sum) takes: a GlobalAveragePool in ONNX."""
    if call.op_type != "mean" or x.dim() != 4 or dim is None:
        return False
    dims = [dim] if isinstance(dim, int) else list(dim)
    n = x.shape[-2] * x.shape[-1]
    return sorted(d % 4 for d in dims) == [2, 3] and global_mean_in_range(x_scale, y_scale, n)


_DISPATCH = {
    OpCategory.ADD: _add,
    OpCategory.MUL: _mul,
    OpCategory.DIV: _div,
    OpCategory.REQUANT: _requant_op,
    OpCategory.LUT: lut_op,
    OpCategory.SOFTMAX: softmax_op,
    OpCategory.LOG_SOFTMAX: log_softmax_op,
    OpCategory.REDUCE: _reduce,
    OpCategory.POOL: pool_op,
    OpCategory.RESAMPLE: resample_op,
    OpCategory.GRID_SAMPLE: grid_sample_op,
    OpCategory.NORM: norm_op,
    OpCategory.EMBEDDING: embedding_op,
}
