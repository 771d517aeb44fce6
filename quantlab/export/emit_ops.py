"""Every non-GEMM op that computes values as ONNX: elementwise arithmetic, activations,
clamps, concatenation, resampling, softmax and embedding lookups (pooling, reductions and
topk: ``emit_pool_reduce``; ops that only move values: ``emit_layout``). Each emitter writes
the float op on the (dequantized) inputs; the exporter quantizes its output where quantlab
does."""

from __future__ import annotations

import math

import numpy as np
import torch

from quantlab.export.context import ExportContext, as_tensor
from quantlab.export.graph import QParams, UnsupportedOpError
from quantlab.export.trace_adapter import ConstRef, InputRef, OpRef, RecordedOp
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.functions import SOFTPLUS_ONNX_MIN_THRESHOLD, softplus_in_onnx
from quantlab.numerics.ort_grid_sample import TORCH_MODES, TORCH_PADDINGS
from quantlab.numerics.torch_nearest import torch_nearest_indices
from quantlab.op_kinds import scalar_exponent
from quantlab.simulate import args as sim_args

CONST_DTYPE = DType.INT16  # scalar operands of integer kernels: code +-32767 at |c| / 32767


def is_ref(v) -> bool:
    return isinstance(v, (InputRef, OpRef, ConstRef))


def _scalar_operand(ctx: ExportContext, op: RecordedOp, c: float, integer: bool) -> str:
    """A Python scalar operand: as quantlab's integer kernels hold it (an int16 code
    +-32767 at scale |c| / 32767, dequantized) or as a float32 constant (float evaluation)."""
    if not integer or c == 0:
        return ctx.float_const(f"{op.name}/scalar", c)
    q = QParams.of(CONST_DTYPE, torch.tensor(abs(c) / CONST_DTYPE.qmax, dtype=torch.float32))
    code = np.asarray(CONST_DTYPE.qmax if c > 0 else -CONST_DTYPE.qmax, dtype=np.int16)
    return ctx.graph.const_dq(f"{op.name}/scalar", code, q)


def _int_kernel(op: RecordedOp) -> bool:
    """Whether quantlab runs this elementwise op with an integer kernel (int output and no
    unquantized tensor operand) rather than evaluating its float function."""
    if not op.out_quant or op.out_quant[0] is None or op.qconfig is None:
        return False
    for i, slot in enumerate(op.acts):
        v = sim_args.get(op.args, op.kwargs, slot)
        if is_ref(v) and (i >= len(op.in_quant) or op.in_quant[i] is None):
            return False
    return True


def emit_binary(ctx: ExportContext, op: RecordedOp) -> None:
    if op.kwargs.get("alpha", 1) != 1:
        raise UnsupportedOpError(f"op {op.name} ({op.op_type}): alpha != 1")
    integer = _int_kernel(op)
    names = []
    vals = [sim_args.get(op.args, op.kwargs, s) for s in op.acts]
    if (
        op.op_type == "div"
        and not is_ref(vals[1])
        and integer
        and op.func_name
        not in (
            "__rtruediv__",
            "__rdiv__",
        )
    ):  # quantlab multiplies by the constant 1 / c
        if op.kwargs.get("rounding_mode") is not None:
            raise UnsupportedOpError(f"op {op.name}: div with rounding_mode")
        x = ctx.act(op, 0)
        c = _scalar_operand(ctx, op, 1.0 / float(vals[1]), True)
        ctx.set_outputs(op, [ctx.graph.node("Mul", [x, c], f"{op.name}/float")])
        return
    for i, v in enumerate(vals):
        if is_ref(v):
            names.append(ctx.act(op, i))
        elif isinstance(v, (int, float)):
            names.append(_scalar_operand(ctx, op, float(v), integer and op.op_type != "div"))
        else:
            raise UnsupportedOpError(f"op {op.name}: operand {i} is {type(v).__name__}")
    if op.func_name in ("__rsub__", "rsub", "__rtruediv__", "__rdiv__"):
        names.reverse()
    onnx_op = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}[op.op_type]
    ctx.set_outputs(op, [ctx.graph.node(onnx_op, names, f"{op.name}/float")])


def emit_pow(ctx: ExportContext, op: RecordedOp) -> None:
    """pow with a scalar exponent: Mul(x, x) for the exponent 2 (the product the simulator
    computes, an integer QLinearMul in onnxruntime), Pow(x, e) otherwise (float between
    dequantize and quantize, the LUT op's table)."""
    e = ctx.arg(op, 1, "exponent")
    e = scalar_exponent(e.value if isinstance(e, ConstRef) else e)
    if e is None:
        raise UnsupportedOpError(f"op {op.name}: pow with an exponent other than one number")
    x = ctx.act(op, 0)
    if e == 2.0:
        y = ctx.graph.node("Mul", [x, x], f"{op.name}/float")
    else:
        y = ctx.graph.node("Pow", [x, ctx.float_const(f"{op.name}/e", e)], f"{op.name}/float")
    ctx.set_outputs(op, [y])


_UNARY = {
    "abs": "Abs",
    "relu": "Relu",
    "sigmoid": "Sigmoid",
    "tanh": "Tanh",
    "exp": "Exp",
    "erf": "Erf",
    "log": "Log",
    "sqrt": "Sqrt",
    "reciprocal": "Reciprocal",
    "sin": "Sin",
    "cos": "Cos",
}


# table ops written as other ONNX ops, or with attributes or a slope tensor (emit_unary)
COMPOSED_UNARY = (
    "rsqrt",
    "silu",
    "gelu",
    "hardsigmoid",
    "hardswish",
    "leaky_relu",
    "prelu",
    "inverse_sigmoid",
    "elu",
    "softplus",
)


def emit_unary(ctx: ExportContext, op: RecordedOp) -> None:
    x = ctx.act(op, 0)
    if op.op_type == "rsqrt":
        y = ctx.graph.node(
            "Reciprocal", [ctx.graph.node("Sqrt", [x], f"{op.name}/sqrt")], f"{op.name}/float"
        )
    elif op.op_type == "silu":
        s = ctx.graph.node("Sigmoid", [x], f"{op.name}/sigmoid")
        y = ctx.graph.node("Mul", [x, s], f"{op.name}/float")
    elif op.op_type == "gelu":
        approx = op.kwargs.get("approximate", "none")
        y = ctx.graph.node("Gelu", [x], f"{op.name}/float", approximate=approx)
    elif op.op_type == "hardsigmoid":  # torch's relu6(x + 3) / 6
        y = ctx.graph.node("HardSigmoid", [x], f"{op.name}/float", alpha=1.0 / 6.0, beta=0.5)
    elif op.op_type == "hardswish":
        y = ctx.graph.node("HardSwish", [x], f"{op.name}/float")
    elif op.op_type == "leaky_relu":
        slope = float(ctx.arg(op, 1, "negative_slope", 0.01))
        y = ctx.graph.node("LeakyRelu", [x], f"{op.name}/float", alpha=slope)
    elif op.op_type == "elu":
        alpha = float(ctx.arg(op, 1, "alpha", 1.0))
        y = ctx.graph.node("Elu", [x], f"{op.name}/float", alpha=alpha)
    elif op.op_type == "softplus":  # ONNX's has no beta and no threshold
        beta, threshold = ctx.arg(op, 1, "beta", 1.0), ctx.arg(op, 2, "threshold", 20.0)
        if not softplus_in_onnx(beta, threshold):
            least = SOFTPLUS_ONNX_MIN_THRESHOLD
            raise UnsupportedOpError(
                f"op {op.name}: softplus with beta={beta}, threshold={threshold}; ONNX's "
                f"Softplus is beta 1 with no threshold (a threshold >= {least:g} gives the same "
                "float32 values)"
            )
        y = ctx.graph.node("Softplus", [x], f"{op.name}/float")
    elif op.op_type == "prelu":  # slopes along axis 1, shaped to broadcast from the right
        w = as_tensor(ctx.arg(op, 1, "weight")).detach().to(torch.float32)
        tail = [1] * max(op.outputs[0].dim() - 2, 0) if w.numel() > 1 else []
        slope = ctx.graph.const(f"{op.name}/slope", w.reshape([-1, *tail]))
        y = ctx.graph.node("PRelu", [x, slope], f"{op.name}/float")
    elif op.op_type == "inverse_sigmoid":  # log(clamp(x, eps) / clamp(1 - x, eps))
        g = ctx.graph
        eps = ctx.float_const(f"{op.name}/eps", float(ctx.arg(op, 1, "eps", 1e-5)))
        x1 = g.node("Clip", [x, eps], f"{op.name}/x1")
        one_minus = g.node("Sub", [ctx.float_const(f"{op.name}/one", 1.0), x], f"{op.name}/1-x")
        x2 = g.node("Clip", [one_minus, eps], f"{op.name}/x2")
        y = g.node("Log", [g.node("Div", [x1, x2], f"{op.name}/ratio")], f"{op.name}/float")
    else:
        y = ctx.graph.node(_UNARY[op.op_type], [x], f"{op.name}/float")
    ctx.set_outputs(op, [y])


def emit_clip(ctx: ExportContext, op: RecordedOp) -> None:
    from quantlab.export.trace_adapter import fused_clamp_bounds

    lo, hi = fused_clamp_bounds(op) or (None, None)
    if op.func_name == "clamp_min":
        lo, hi = ctx.arg(op, 1, "min"), None
    elif op.func_name == "clamp_max":
        lo, hi = None, ctx.arg(op, 1, "max")
    x = ctx.act(op, 0)
    ins = [x, ctx.float_const(f"{op.name}/min", -np.inf if lo is None else float(lo))]
    ins.append(ctx.float_const(f"{op.name}/max", np.inf if hi is None else float(hi)))
    ctx.set_outputs(op, [ctx.graph.node("Clip", ins, f"{op.name}/float")])


_RESIZE_MODES = {"nearest": "nearest", "bilinear": "linear", "linear": "linear"}


def emit_interpolate(ctx: ExportContext, op: RecordedOp) -> None:
    """F.interpolate as Resize: by the call's scale factor (torch's coordinate mapping), or to
    the output's size; nearest as torch's (floor of the asymmetric source coordinate, which
    onnxruntime computes in float32 by its own steps: ``numerics.ort_resize``), linear /
    bilinear with torch's align_corners (half_pixel otherwise); nearest-exact as one Gather
    per spatial axis of the pixels torch reads (``numerics.torch_nearest``: no Resize node
    reads them on every size). Other modes and antialiasing are refused."""
    mode = ctx.arg(op, 3, "mode", "nearest")
    antialias = ctx.arg(op, 6, "antialias", False)
    if mode == "nearest-exact" and not antialias:
        _emit_nearest_by_gathers(ctx, op, mode)
        return
    if mode not in _RESIZE_MODES or antialias:
        raise UnsupportedOpError(
            f"op {op.name}: interpolate mode={mode!r} (antialias={antialias}); exported modes: "
            "nearest, nearest-exact, linear, bilinear without antialiasing"
        )
    attrs: dict = {"mode": _RESIZE_MODES[mode]}
    if mode == "nearest":
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        align = bool(ctx.arg(op, 4, "align_corners", False))
        attrs["coordinate_transformation_mode"] = "align_corners" if align else "half_pixel"
    sf = ctx.arg(op, 2, "scale_factor", None)
    shape = list(op.outputs[0].shape)
    if sf is not None and not ctx.arg(op, 5, "recompute_scale_factor", None):
        # torch maps coordinates with the given factor, not output / input size: so does
        # Resize given ``scales`` (the output size is floor(input size x scale) in both)
        nsp = len(shape) - 2
        factors = [float(sf)] * nsp if isinstance(sf, (int, float)) else [float(f) for f in sf]
        scales = ctx.float_const(f"{op.name}/scales", np.array([1.0, 1.0, *factors], np.float32))
        ins = [ctx.act(op, 0), "", scales]
    else:
        ins = [ctx.act(op, 0), "", "", ctx.graph.int64s(f"{op.name}/sizes", shape)]
    y = ctx.graph.node("Resize", ins, f"{op.name}/float", **attrs)
    ctx.set_outputs(op, [y])


def _emit_nearest_by_gathers(ctx: ExportContext, op: RecordedOp, mode: str) -> None:
    """A nearest interpolate as a Gather per spatial axis of the constant indices torch reads
    on a contiguous input (a channels-last input, whose kernel reads other pixels on some
    sizes, is refused)."""
    out = op.outputs[0]
    if not out.is_contiguous():
        raise UnsupportedOpError(
            f"op {op.name}: interpolate mode={mode!r} on a tensor that is not contiguous "
            "(channels-last): torch's kernel for it reads other pixels on some sizes; make the "
            "input contiguous to export it"
        )
    shape = list(ctx.shape_of(op, 0))
    indices = torch_nearest_indices(
        tuple(shape[2:]), mode, ctx.arg(op, 1, "size", None), ctx.arg(op, 2, "scale_factor", None),
        ctx.arg(op, 5, "recompute_scale_factor", None),
    )  # fmt: skip
    g, x = ctx.graph, ctx.act(op, 0)
    for k, idx in enumerate(indices):
        name = f"{op.name}/float" if k == len(indices) - 1 else f"{op.name}/{k}"
        x = g.node("Gather", [x, g.const(f"{op.name}/{k}/index", idx)], name, axis=2 + k)
    ctx.set_outputs(op, [x])


def emit_grid_sample(ctx: ExportContext, op: RecordedOp) -> None:
    """F.grid_sample as GridSample on the dequantized input and grid (4-d; bilinear as
    "linear", nearest; zeros or border padding; torch's align_corners), quantized at the input's
    scale: what the onnxruntime profiles compute (``numerics.ort_grid_sample``). Bicubic and
    reflection padding (which GridSample applies to integer indices, torch to positions) are
    refused."""
    mode = ctx.arg(op, 2, "mode", "bilinear")
    padding = ctx.arg(op, 3, "padding_mode", "zeros")
    if mode not in TORCH_MODES or padding not in TORCH_PADDINGS or len(ctx.shape_of(op, 0)) != 4:
        raise UnsupportedOpError(
            f"op {op.name}: grid_sample mode={mode!r}, padding_mode={padding!r} on a "
            f"{len(ctx.shape_of(op, 0))}-d input; exported: a 4-d input, modes "
            f"{', '.join(TORCH_MODES)}, padding {', '.join(TORCH_PADDINGS)}"
        )
    align = bool(ctx.arg(op, 4, "align_corners", False))
    y = ctx.graph.node(
        "GridSample",
        [ctx.act(op, 0), ctx.act(op, 1)],
        f"{op.name}/float",
        mode="linear" if mode == "bilinear" else mode,
        padding_mode=padding,
        align_corners=int(align),
    )
    ctx.set_outputs(op, [y])


def emit_softmax(ctx: ExportContext, op: RecordedOp) -> None:
    if op.kwargs.get("dtype") is not None:
        raise UnsupportedOpError(f"op {op.name}: softmax with dtype")
    dim = ctx.arg(op, 1, "dim")
    y = ctx.graph.node("Softmax", [ctx.act(op, 0)], f"{op.name}/float", axis=int(dim))
    ctx.set_outputs(op, [y])


def emit_cat(ctx: ExportContext, op: RecordedOp) -> None:
    """cat as Concat. stack as the Concat of its inputs along an existing axis, reshaped (the
    same elements in the same order; a new last axis: stacked before the last, then the two
    swapped; scalars: each reshaped to [1]). The Unsqueeze of each dequantized input, the
    direct form, makes onnxruntime's optimizer fail to load the model with int8 activations
    (the Q/DQ it moves across the Unsqueeze get a uint8 zero point). cat leaves out inputs
    with no elements (torch also takes a 1-d empty tensor beside tensors of any rank: a key
    cache's first, empty part), which Concat would refuse and which add nothing."""
    out_shape = list(op.outputs[0].shape)
    parts = range(len(op.acts))
    if op.op_type == "cat":
        parts = [i for i in parts if math.prod(ctx.shape_of(op, i)) > 0] or list(parts)[:1]
    xs = [ctx.act(op, i) for i in parts]
    dim = int(ctx.arg(op, 1, "dim", 0)) % len(out_shape)
    if op.op_type == "stack" and len(out_shape) == 1:  # scalars: each reshaped to [1]
        one = ctx.graph.int64s(f"{op.name}/one", [1])
        for i, x in enumerate(xs):  # the codes reshaped, then dequantized: no float node
            held = ctx.act_codes(op, i)  # between DequantizeLinear and Concat
            if held is None:
                xs[i] = ctx.graph.node("Reshape", [x, one], f"{op.name}/r{i}")
            else:
                codes = ctx.graph.node("Reshape", [held[0], one], f"{op.name}/r{i}")
                xs[i] = ctx.graph.dequantize(codes, held[1])
    if op.op_type != "stack" or len(out_shape) == 1:
        if len(xs) == 1:  # one input with elements: the output is that input
            ctx.set_outputs(op, [ctx.graph.node("Identity", xs, f"{op.name}/float")])
            return
        ctx.set_outputs(op, [ctx.graph.node("Concat", xs, f"{op.name}/float", axis=dim)])
        return
    last = dim == len(out_shape) - 1 and dim > 0
    axis = dim - 1 if last else dim
    y = ctx.graph.node("Concat", xs, f"{op.name}/cat", axis=axis)
    shape = out_shape[:axis] + [out_shape[dim], out_shape[axis]] if last else out_shape
    base = f"{op.name}/stacked" if last else f"{op.name}/float"
    y = ctx.graph.node("Reshape", [y, ctx.graph.int64s(f"{op.name}/shape", shape)], base)
    if last:
        perm = [*range(len(out_shape) - 2), len(out_shape) - 1, len(out_shape) - 2]
        y = ctx.graph.node("Transpose", [y], f"{op.name}/float", perm=perm)
    ctx.set_outputs(op, [y])


def emit_embedding(ctx: ExportContext, op: RecordedOp) -> None:
    ids = ctx.value(op.args[0], f"{op.name}/ids")
    w = ctx.value(ctx.arg(op, 1, "weight"), f"{op.name}/weight")
    ctx.set_outputs(op, [ctx.graph.node("Gather", [w.name, ids.name], f"{op.name}/float", axis=0)])
