"""``to_onnx_qdq``: a calibrated Simulator -> an ONNX QDQ model (opset 21).

The graph is written from one recorded fixed-mode run of the Simulator: every captured op
becomes its ONNX node(s), so each quantized op output is a graph tensor named exactly after the
op (``features.3.conv.2:conv2d#0``) holding the integer codes quantlab computes there. Scales
are the Simulator's: activations per tensor, weights per output channel, int32 biases at
``x_scale * w_scale``; each op's int8/int16 choice comes from its resolved qconfig. Ops
quantlab runs in float stay float. Shapes are static (those of ``example_inputs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from torch import Tensor
from torch.utils._pytree import tree_flatten

from quantlab.export import emit_gemm as G
from quantlab.export import emit_layout as L
from quantlab.export import emit_logic as B
from quantlab.export import emit_norm as N
from quantlab.export import emit_ops as E
from quantlab.export import emit_pool_reduce as P
from quantlab.export.context import ExportContext, Value
from quantlab.export.graph import (
    IR_VERSION,
    OPSET,
    TORCH_TO_ONNX,
    ActivationEncoding,
    GraphBuilder,
    UnsupportedOpError,
)
from quantlab.export.trace_adapter import ConstRef, InputRef, OpRef, RecordedOp, record_run
from quantlab.op_kinds import OpCategory
from quantlab.report.io import atomic_write_bytes
from quantlab.simulate import args as sim_args

Emitter = Callable[[ExportContext, RecordedOp], None]

EMITTERS: dict[str, Emitter] = {
    "conv1d": G.emit_conv,
    "conv2d": G.emit_conv,
    "conv_transpose1d": G.emit_conv_transpose,
    "conv_transpose2d": G.emit_conv_transpose,
    "linear": G.emit_linear,
    "matmul": G.emit_matmul,
    "add": E.emit_binary,
    "sub": E.emit_binary,
    "mul": E.emit_binary,
    "div": E.emit_binary,
    "pow": E.emit_pow,
    "relu6": E.emit_clip,
    "clamp": E.emit_clip,
    "max_pool1d": P.emit_max_pool,
    "max_pool2d": P.emit_max_pool,
    "adaptive_max_pool1d": P.emit_adaptive_max_pool,
    "adaptive_max_pool2d": P.emit_adaptive_max_pool,
    "amax": P.emit_reduce_extreme,
    "topk": P.emit_topk,
    "amin": P.emit_reduce_extreme,
    "interpolate": E.emit_interpolate,
    "grid_sample": E.emit_grid_sample,
    "avg_pool1d": P.emit_avg_pool,
    "avg_pool2d": P.emit_avg_pool,
    "adaptive_avg_pool1d": P.emit_avg_pool,
    "adaptive_avg_pool2d": P.emit_avg_pool,
    "mean": P.emit_reduce,
    "sum": P.emit_reduce,
    "softmax": E.emit_softmax,
    "layer_norm": N.emit_layer_norm,
    "group_norm": N.emit_group_norm,
    "instance_norm": N.emit_instance_norm,
    "batch_norm": N.emit_batch_norm,
    "cat": E.emit_cat,
    "stack": E.emit_cat,
    "reshape": L.emit_reshape,
    "view": L.emit_reshape,
    "flatten": L.emit_reshape,
    "unflatten": L.emit_reshape,
    "squeeze": L.emit_reshape,
    "unsqueeze": L.emit_reshape,
    "view_as": L.emit_reshape,
    "reshape_as": L.emit_reshape,
    "transpose": L.emit_transpose,
    "permute": L.emit_transpose,
    "t": L.emit_transpose,
    "contiguous": L.emit_identity,
    "clone": L.emit_identity,
    "detach": L.emit_identity,
    "dropout": L.emit_identity,
    "getitem": L.emit_getitem,
    "chunk": L.emit_pieces,
    "split": L.emit_pieces,
    "unbind": L.emit_pieces,
    "narrow": L.emit_pieces,
    "select": L.emit_pieces,
    "flip": L.emit_flip,
    "expand": L.emit_expand,
    "expand_as": L.emit_expand,
    "repeat": L.emit_expand,
    "tile": L.emit_tile,
    "roll": L.emit_roll,
    "index_select": L.emit_gather,
    "gather": L.emit_gather,
    "repeat_interleave": L.emit_repeat_interleave,
    "tril": L.emit_trilu,
    "triu": L.emit_trilu,
    "movedim": L.emit_movedim,
    "pixel_shuffle": L.emit_pixel_shuffle,
    "pixel_unshuffle": L.emit_pixel_shuffle,
    "channel_shuffle": L.emit_channel_shuffle,
    "native_channel_shuffle": L.emit_channel_shuffle,
    **dict.fromkeys(L.CAST_TYPES, L.emit_cast),
    "embedding": E.emit_embedding,
    "pad": L.emit_pad,
    **{t: E.emit_unary for t in (*E._UNARY, *E.COMPOSED_UNARY)},
    **B.EMITTERS,
}

SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(EMITTERS))


def emitter(op: RecordedOp) -> Emitter | None:
    """The emitter of a recorded call: an uncaptured call's own (integer arithmetic and
    sums: ``emit_logic.UNCAPTURED_EMITTERS``) before the op type's; ``emit_value`` for a call
    on constants of the model alone that has no ONNX form (``_folded``)."""
    if _folded(op):
        return emit_value
    if not op.captured and op.op_type in B.UNCAPTURED_EMITTERS:
        return B.UNCAPTURED_EMITTERS[op.op_type]
    return EMITTERS.get(op.op_type)


def _folded(op: RecordedOp) -> bool:
    """A call whose tensor arguments are all constants of the model (parameters, buffers,
    tensors it made) and which has no emitter, or is indexing by a tensor (Swin's relative
    position bias: a parameter indexed by a buffer): its value is a constant too."""
    leaves = tree_flatten((op.args, op.kwargs))[0]
    if any(isinstance(v, (InputRef, OpRef)) for v in leaves):
        return False
    if op.op_type not in EMITTERS:
        return True
    index = op.args[1] if op.op_type == "getitem" and len(op.args) > 1 else None
    return isinstance(index, list) or any(isinstance(v, ConstRef) for v in tree_flatten(index)[0])


def emit_value(ctx: ExportContext, op: RecordedOp) -> None:
    """The call's output as fixed mode computed it, as a constant (then quantized where the
    fixed run quantized it: its values lie on that grid, so the codes are the run's)."""
    names = []
    for j, t in enumerate(op.outputs):
        names.append(ctx.graph.const(f"{op.name}/value{j}", t.detach().clone()))
    ctx.set_outputs(op, names)


def live_ops(ops: list[RecordedOp], output) -> list[RecordedOp]:
    """``ops`` without the uncaptured calls no output depends on (a comparison feeding only
    Python control flow); every captured op stays."""
    by_name = {op.name: op for op in ops}
    todo = [r.name for r in tree_flatten(output)[0] if isinstance(r, OpRef)]
    todo += [op.name for op in ops if op.captured]
    live: set[str] = set()
    while todo:
        name = todo.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        op = by_name[name]
        todo += [r.name for r in tree_flatten((op.args, op.kwargs))[0] if isinstance(r, OpRef)]
    return [op for op in ops if op.name in live]


@dataclass
class QDQExport:
    """What ``to_onnx_qdq`` wrote: the file, the graph's input and output names, and for every
    captured op the graph tensor holding its output (integer codes when quantized; without
    ``probe``, the graph keeps only the nodes its outputs depend on, so an op whose value no
    output needs names a tensor the graph does not hold)."""

    path: Path
    input_names: list[str]
    output_names: list[str]
    op_tensors: dict[str, str] = field(default_factory=dict)
    probe_outputs: list[str] = field(default_factory=list)  # op tensors exposed as outputs
    encoding: ActivationEncoding = ActivationEncoding.SIGNED
    offset_tensors: set = field(default_factory=set)  # codes tensors written as code + 128
    tensor_quant: dict = field(default_factory=dict)  # codes tensor -> its QParams
    # one LSB of each output, shaped to broadcast against it: its scale, or a GEMM's wide
    # output's accumulator scale (per channel for a weight); None for other float outputs
    output_scales: list = field(default_factory=list)


def _output_scale(v: Value, op: RecordedOp | None, by_name: dict):
    """The scale of one model output's LSB, shaped to broadcast against it: its quantization's,
    or a GEMM's wide output's (``emit_gemm.wide_output_scale``), also moved by layout ops when
    it is one value; None for a float output of any other op, and for a per-channel one moved
    by layout ops (its channels no longer lie along one axis)."""
    if v.quant is not None:
        return v.quant.scale
    moved = False  # through layout ops that move a wide output as it is
    while op is not None:
        if op.fused_into:  # a clamp fused into a GEMM: the GEMM's output
            op = by_name.get(op.fused_into)
        elif op.category is OpCategory.PASS_THROUGH and op.acts and op.in_quant[0] is None:
            ref = sim_args.get(op.args, op.kwargs, op.acts[0])
            op, moved = by_name.get(getattr(ref, "name", None)), True
        else:
            break
    if op is None or op.category is not OpCategory.GEMM:
        return None
    s = G.wide_output_scale(op)
    if s is None or (moved and s.dim() > 0):  # one LSB per channel, laid out otherwise now
        return None
    return s.numpy().astype(np.float32)


def _unsupported(op: RecordedOp) -> UnsupportedOpError:
    return UnsupportedOpError(
        f"op {op.name} (type {op.op_type!r}) cannot be exported to ONNX QDQ; supported op types: "
        + ", ".join(SUPPORTED_OPS)
    )


def check_supported(ops: list[RecordedOp]) -> None:
    """Raise UnsupportedOpError naming the first op without an emitter."""
    for op in ops:
        if emitter(op) is None:
            raise _unsupported(op)


def build_model(
    sim,
    example_inputs: tuple,
    probe: bool = False,
    encoding: ActivationEncoding = ActivationEncoding.SIGNED,
) -> tuple[onnx.ModelProto, QDQExport]:
    """The ONNX QDQ ModelProto of ``sim`` on ``example_inputs`` (see the module docstring);
    ``probe``: every op's output tensor is also a graph output (for per-op comparison)."""
    if not getattr(sim, "_calibrated", True):
        raise ValueError("to_onnx_qdq needs a calibrated Simulator (call sim.calibrate first)")
    example_inputs = tuple(example_inputs)
    run = record_run(sim, example_inputs)
    run.ops = live_ops(run.ops, run.output)
    check_supported(run.ops)
    g = GraphBuilder(encoding)
    ctx = ExportContext(g, run)
    for op in run.ops:
        if op.fused_into:
            ctx.fused.setdefault(op.fused_into, []).append(op)
    inputs = []
    for i, t in enumerate(example_inputs):
        if not isinstance(t, Tensor):
            raise UnsupportedOpError(f"example input {i} is {type(t).__name__}; tensors only")
        name = f"input{i}"
        g.reserve(name)
        ctx.env[InputRef(i)] = Value(name, tuple(t.shape), t.dtype)
        inputs.append(helper.make_tensor_value_info(name, TORCH_TO_ONNX[t.dtype], list(t.shape)))
    for op in run.ops:
        if op.fused_into:
            continue  # written by its GEMM
        emitter(op)(ctx, op)
    outputs, out_names, out_scales = [], [], []
    by_name = {op.name: op for op in run.ops}
    refs = [r for r in tree_flatten(run.output)[0] if isinstance(r, (OpRef, InputRef))]
    for k, ref in enumerate(refs):
        v = ctx.env[ref]
        out_scales.append(_output_scale(v, by_name.get(getattr(ref, "name", None)), by_name))
        name = g.node("Identity", [v.name], f"output{k}")
        out_names.append(name)
        outputs.append(helper.make_tensor_value_info(name, TORCH_TO_ONNX[v.dtype], list(v.shape)))
    info = QDQExport(
        Path(),
        [f"input{i}" for i in range(len(example_inputs))],
        out_names,
        dict(ctx.op_tensors),
        encoding=encoding,
        offset_tensors={t for t, q in ctx.quant_of.items() if g.offset(q)},
        tensor_quant=dict(ctx.quant_of),
        output_scales=out_scales,
    )
    if probe:
        seen = set(out_names) | {i.name for i in g.initializers}  # a constant is no op's work
        for tensor in ctx.op_tensors.values():
            if tensor not in seen and not tensor.startswith("input"):
                seen.add(tensor)
                outputs.append(helper.make_tensor_value_info(tensor, 0, None))
                info.probe_outputs.append(tensor)
    nodes, initializers = g.live([o.name for o in outputs])
    graph = helper.make_graph(nodes, "quantlab_qdq", inputs, outputs, initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="quantlab"
    )
    model.ir_version = IR_VERSION
    if probe:  # infer the types of the exposed intermediate tensors
        model = onnx.shape_inference.infer_shapes(model)
        known = {v.name: v for v in model.graph.value_info}
        for o in model.graph.output:
            if o.name in known:
                o.CopyFrom(known[o.name])
    return model, info


def to_onnx_qdq(
    sim,
    path,
    example_inputs,
    probe: bool = False,
    encoding: ActivationEncoding | None = None,
) -> QDQExport:
    """Write ``sim``'s calibrated model as ONNX QDQ to ``path`` (atomically) after
    ``onnx.checker`` (full check); returns the names of its inputs, outputs and op tensors.

    ``example_inputs``: a tuple of the model's inputs (their shapes become the graph's).
    ``probe``: every op's output tensor is also a graph output. ``encoding``: how int8
    activations are written (ActivationEncoding); None: the one the Simulator's profile
    computes with (``platform.qlinear_zero_point`` 128: UNSIGNED_OFFSET, 0: SIGNED).
    Raises UnsupportedOpError naming an op without an ONNX form and listing SUPPORTED_OPS.
    """
    if isinstance(example_inputs, Tensor):
        example_inputs = (example_inputs,)
    if encoding is None:
        encoding = ActivationEncoding.of_zero_point(sim.platform.qlinear_zero_point)
    model, info = build_model(sim, example_inputs, probe, encoding)
    onnx.checker.check_model(model, full_check=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, model.SerializeToString())
    info.path = path
    return info
