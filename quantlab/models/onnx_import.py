"""``model=onnx``: an ONNX graph converted to an eager module (onnx2torch), simulated as any other.

Graphs exported with dynamic spatial sizes (Paddle's p2o exports, for instance) cannot be
converted as they are: the dynamic dimensions other than the batch are fixed first (from
``model.input_shape`` or the data's size) and the graph is folded with onnxslim, keeping the
batch dimension free. onnx2torch imports torchvision only for its NMS and RoiAlign converters;
torchvision does not load beside the CPU torch quantlab pins, so a stand-in that raises on use is
put in place while onnx2torch is imported (graphs with those two ops do not convert). Its Slice
module indexes with a list, which torch 2.13 accepts with a deprecation warning on every call;
that one warning is silenced once onnx2torch is imported. LSTM, GRU and RNN nodes, which
onnx2torch does not convert, become torch's layers (``onnx_recurrent``); GridSample, Gelu, Mish,
GroupNormalization, SpaceToDepth, Upsample, GlobalMaxPool, Pad, Max, Min, Sum and Mean the
torch calls they are (``onnx_functional``), and so are CastLike, Size, Trilu, Swish,
ThresholdedRelu, Shrink, DepthToSpace in both modes and RMSNormalization (``onnx_added_ops``),
LpNormalization, LpPool, MeanVarianceNormalization, Hardmax and Col2Im (``onnx_norm_pool_ops``);
and the operator versions of opsets 16 to 24 that onnx2torch lacks convert as the versions
before them where they mean the same (``onnx_versions``); a graph below opset 13 that does not
convert is carried to 13 by ONNX's version converter, and kept where it computes what
onnxruntime computes on the original (``_converted_folded``).
``auto_pad`` SAME_UPPER / SAME_LOWER, which onnx2torch refuses, is written out as pads first,
and a max pool's uneven pads as an edge Pad (``onnx_pads``). A Mul or Div by a one-value
constant multiplies by the number, as the PyTorch code it was exported from (``onnx_constants``).
The outputs are the values the graph names, each with its batch axis (``onnx_outputs``).
A graph quantized already is refused: quantlab takes the float model.

The bundle also carries the original graph under onnxruntime (fp32, CPU) as an external
reference for the converted module's float run.
"""

from __future__ import annotations

import copy
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from quantlab.models import packages
from quantlab.models.onnx_constants import parameter_of, scalar_operands
from quantlab.models.onnx_nodes import graph_opset
from quantlab.models.onnx_outputs import outputs_by_name, restore_batch_axis
from quantlab.models.onnx_pads import explicit_pads
from quantlab.models.onnx_reference import onnxruntime_runner
from quantlab.models.onnx_refusals import refuse_control_flow, refuse_quantized
from quantlab.models.onnx_shape_args import constant_shape_args


@dataclass
class OnnxModel:
    """A converted graph: ``module`` (eval), each input's shape without the batch dimension,
    the graph's metadata and an onnxruntime fp32 runner of the original file."""

    module: nn.Module
    input_shapes: tuple[tuple[int, ...], ...]
    metadata: dict[str, str]
    reference: Callable[..., object]
    fixed_batch: int | None = None  # the batch it runs, where the graph fixes one (_fixed_batch)
    probe_inputs: tuple[Tensor, ...] = ()  # one input of the graph's own shapes (_declared)


def _graph_inputs(model) -> list:
    initializers = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def static_shapes(path: str | Path) -> list[list[int | None]]:
    """Each graph input's dimensions after the batch one; None where the graph leaves a
    dimension dynamic."""

    model = _read(Path(path))
    out = []
    for inp in _graph_inputs(model):
        dims = inp.type.tensor_type.shape.dim
        out.append([d.dim_value if d.dim_value > 0 else None for d in list(dims)[1:]])
    return out


def refuse_unbatched(path: str | Path) -> None:
    """ValueError naming the input when a graph input cannot be fed batch-first, as the
    experiments feed every input (its first dimension the batch): a scalar, or an input whose
    batch dimension (the name the first input's first dimension has) lies further in (a
    recurrent state of shape [layers, batch, hidden]). ``load_onnx`` converts such graphs."""
    path = Path(path)
    inputs = _graph_inputs(_read(path))
    dims = [list(i.type.tensor_type.shape.dim) for i in inputs]
    batch = dims[0][0].dim_param if dims and dims[0] else ""
    for inp, d in zip(inputs, dims, strict=True):
        shown = "[" + ", ".join(x.dim_param or str(x.dim_value) for x in d) + "]"
        if not d and inp.type.tensor_type.HasField("shape"):
            why = "is a scalar"
        elif batch and d[0].dim_param != batch and any(x.dim_param == batch for x in d[1:]):
            k = next(j for j, x in enumerate(d) if x.dim_param == batch)
            why = f"has shape {shown}, its batch dimension {batch!r} at position {k}"
        else:
            continue
        raise ValueError(
            f"model.path: input {inp.name!r} of {path} {why}; quantlab feeds every input "
            "batch-first (the batch as its first dimension): export the graph with that input "
            "batch-first or as a constant, or wrap it in a model=custom module that supplies it"
        )


def _read(path: Path):
    packages.package_dir(packages.ONNX, "model=onnx")
    import onnx

    if not path.is_file():
        raise ValueError(f"model.path: file {path} does not exist")
    try:
        return onnx.load(str(path))
    except Exception as err:  # protobuf decode errors
        raise ValueError(f"model.path: {path} is not a readable ONNX file: {err}") from None


def _onnx2torch_convert() -> Callable:
    packages.package_dir(packages.ONNX2TORCH, "model=onnx")
    if "onnx2torch" not in sys.modules and "torchvision" not in sys.modules:
        tv, ops = types.ModuleType("torchvision"), types.ModuleType("torchvision.ops")

        def unavailable(*args, **kwargs):
            raise NotImplementedError("torchvision.ops (NMS, RoiAlign) is not available")

        ops.nms = ops.roi_align = ops.box_convert = ops.batched_nms = unavailable
        tv.ops = ops
        sys.modules["torchvision"], sys.modules["torchvision.ops"] = tv, ops
        try:
            import onnx2torch  # noqa: F401
        finally:
            del sys.modules["torchvision"], sys.modules["torchvision.ops"]
    import warnings

    from onnx2torch import convert

    from quantlab.models import (
        onnx_added_ops,
        onnx_functional,
        onnx_recurrent,
        onnx_resize,
        onnx_versions,
    )

    onnx_recurrent.register()
    onnx_functional.register()
    onnx_added_ops.register()
    onnx_resize.register()
    onnx_versions.register()
    warnings.filterwarnings(
        "ignore", message="Using a non-tuple sequence for multidimensional indexing"
    )
    return convert


def _fixed(model, shapes: list[list[int]]):
    """A copy of ``model`` whose inputs have the dimensions ``shapes`` after the batch one,
    folded by onnxslim (constant shapes propagated); the batch dimension stays dynamic."""
    packages.package_dir(packages.ONNXSLIM, "model=onnx with dynamic input sizes")
    import onnxslim

    m = copy.deepcopy(model)
    for inp, shape in zip(_graph_inputs(m), shapes):
        dims = list(inp.type.tensor_type.shape.dim)
        for d, size in zip(dims[1:], shape):
            d.dim_value = int(size)
    return onnxslim.slim(m)


def _initializers_as_parameters(module: nn.Module) -> None:
    """onnx2torch holds the graph's initializers as buffers of its ``initializers`` module;
    each float one becomes an ``nn.Parameter`` (no gradient), as a PyTorch model holds its
    weights: a MatMul or Gemm reads it as a weight (quantized per channel), and a call on
    initializers alone makes a constant of the model."""
    holder = getattr(module, "initializers", None)
    if not isinstance(holder, nn.Module):
        return
    for name, buf in list(holder._buffers.items()):
        if buf is not None and buf.is_floating_point():
            del holder._buffers[name]
            holder.register_parameter(name, nn.Parameter(buf, requires_grad=False))


def _matmuls_as_linear(gm: nn.Module) -> None:
    """``MatMul(x, W)`` with an initializer W (K, N), and ``MatMul(x, W) + b`` with a 1-d
    initializer b (N,) (what torch exports for ``nn.Linear`` on an input of more than two
    dims), become an ``nn.Linear`` under the MatMul's name: a GEMM with a per-channel weight
    and its bias, as deployment toolchains fuse the pair (the add alone would quantize the
    bias as an int8 activation and requantize once more). Float results change only in the
    last bits (the bias added inside the product)."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        return
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_module" or type(gm.get_submodule(node.target)).__name__ != "OnnxMatMul":
            continue
        if len(node.args) != 2:
            continue
        w = parameter_of(gm, node.args[1])
        if w is None or w.dim() != 2 or parameter_of(gm, node.args[0]) is not None:
            continue
        b = _bias_added(gm, node, w.shape[1])
        linear = nn.Linear(w.shape[0], w.shape[1], bias=b is not None)  # the MatMul's name
        linear.weight = nn.Parameter(w.detach().t().contiguous(), requires_grad=False)
        if b is not None:
            linear.bias = nn.Parameter(b[1].detach().clone(), requires_grad=False)
            b[0].replace_all_uses_with(node)
            graph.erase_node(b[0])
        gm.add_submodule(node.target, linear)
        node.args = (node.args[0],)
        changed = True
    if changed:
        graph.eliminate_dead_code()
        gm.recompile()


def _bias_added(gm: nn.Module, node, width: int):
    """(the add node, the bias) when ``node``'s only use adds a 1-d initializer of ``width``
    values to it; else None."""
    if len(node.users) != 1:
        return None
    (add,) = node.users
    if add.op != "call_module" or len(add.args) != 2:
        return None
    adder = gm.get_submodule(add.target)
    if getattr(adder, "math_op_function", None) is not torch.add or adder.broadcast:
        return None
    b = parameter_of(gm, add.args[0] if add.args[1] is node else add.args[1])
    return (add, b) if b is not None and b.dim() == 1 and b.shape[0] == width else None


UPGRADE_OPSET = 13
"""A graph of an older opset that does not convert is tried again at this one (ONNX's version
converter): exports of opsets 6 to 12 name ops in versions onnx2torch does not take."""


def _converted_folded(convert, model, shapes: list[list[int]], path: Path) -> nn.Module:
    """The module of ``model`` folded by onnxslim (``_fixed``), or, where that fails and the
    graph's opset is below UPGRADE_OPSET, of the graph carried to that opset and folded, kept
    only where it computes what onnxruntime computes on the original graph (ONNX's version
    converter can change a node's meaning: an Upsample's coordinates). A ValueError names the
    first attempt's error, or the control flow left after folding."""
    errors, folded = [], None
    for attempt in (model, UPGRADE_OPSET):
        try:
            if attempt == UPGRADE_OPSET:
                if graph_opset(model) >= UPGRADE_OPSET:
                    break
                from onnx import version_converter

                attempt = version_converter.convert_version(model, UPGRADE_OPSET)
            folded = _fixed(attempt, shapes)
            module = convert(explicit_pads(folded), attach_onnx_mapping=True)
            if attempt is not model:
                _check_against_onnxruntime(module, model, path, shapes)
            return module
        except Exception as err:
            errors.append(err)
    refuse_control_flow(folded if folded is not None else model, path)
    err = errors[0]
    also = ""
    if len(errors) > 1:
        also = f" (carried to opset {UPGRADE_OPSET}: {str(errors[1]).splitlines()[0]})"
    raise ValueError(
        f"model.path: onnx2torch cannot convert {path}: {type(err).__name__}: {err}{also}"
    ) from None


def _check_against_onnxruntime(module: nn.Module, model, path: Path, shapes) -> None:
    """ValueError unless ``module`` gives onnxruntime's outputs of the graph at ``path`` on
    seeded normal values of its float inputs (zeros of the others), each to 1e-3 of its
    largest magnitude."""
    xs = _declared(model, shapes)
    with torch.no_grad():
        got = module.eval()(*xs)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    try:
        want = onnxruntime_runner(path, [i.name for i in _graph_inputs(model)])(*xs)
    except Exception as err:  # onnxruntime has no kernel for some op versions of old opsets
        raise ValueError(
            f"onnxruntime does not run the opset-{graph_opset(model)} graph to check it against "
            f"({str(err).splitlines()[0]}); give the file carried to a newer opset "
            "(onnx.version_converter.convert_version) once you have checked it"
        ) from None
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    for g, w in zip(got, want, strict=True):
        g, w = g.detach().double().reshape(w.shape), w.double()
        largest = float(w.abs().max()) if w.numel() else 0.0
        if not torch.allclose(g, w, rtol=0, atol=1e-3 * (1 + largest)):
            raise ValueError(
                "it computes otherwise than onnxruntime on the original graph: max |difference| "
                f"{float((g - w).abs().max()):.3g}"
            )


def _fixed_batch(model) -> int | None:
    """The batch the converted module runs, where the graph fixes one: the first input's first
    dimension where it is a number (an exported Reshape then holds it as a constant: the module
    runs that batch size only); else 1 where another input's first dimension is a number (a
    recurrent state, a constant operand: no batch axis, so batches are not merged along it);
    else None (any batch)."""
    firsts = []
    for inp in _graph_inputs(model):
        dims = list(inp.type.tensor_type.shape.dim)
        firsts.append(int(dims[0].dim_value) if dims and dims[0].dim_value > 0 else None)
    if firsts and firsts[0] is not None:
        return firsts[0]
    return 1 if any(d is not None for d in firsts[1:]) else None


def _zeros(model, shapes: list[list[int]], batch: int | None = None) -> list[Tensor]:
    """Zeros of the graph's input shapes (``shapes`` without the batch) and dtypes, at
    ``batch`` (None: the batch the graph fixes, else 1)."""
    import numpy as np
    from onnx import helper

    batch = batch or _fixed_batch(model) or 1
    xs = []
    for inp, shape in zip(_graph_inputs(model), shapes):
        dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        xs.append(torch.from_numpy(np.zeros((batch, *shape), dtype=dtype)))
    return xs


def _declared(model, shapes: list[list[int]]) -> tuple[Tensor, ...]:
    """Inputs of the shapes the graph declares: each input's own first dimension where it is a
    number (a recurrent state's layer axis, a fixed batch), else the fixed batch or 1; seeded
    normal values for float inputs, zeros for the others (indices, masks)."""
    gen = torch.Generator().manual_seed(0)
    xs = []
    for inp, x in zip(_graph_inputs(model), _zeros(model, shapes)):
        dims = list(inp.type.tensor_type.shape.dim)
        first = dims[0].dim_value if dims and dims[0].dim_value > 0 else x.shape[0]
        x = x.new_zeros((first, *x.shape[1:]))
        xs.append(x.normal_(generator=gen) if x.is_floating_point() else x)
    return tuple(xs)


def _run_on_zeros(module: nn.Module, model, shapes: list[list[int]]) -> None:
    """Run ``module`` once on ``_zeros``: onnx2torch builds some modules from the shapes ONNX's
    shape inference found, and a shape it could not find (a Pad whose pads are computed, say)
    makes a module that fails at its first call (a LayerNorm over no dims); the caller then
    converts the folded graph instead."""
    with torch.no_grad():
        module.eval()(*_zeros(model, shapes))  # eval: a BatchNorm would take the zeros' statistics


def load_onnx(path: str | Path, shapes: list[list[int]] | None = None) -> OnnxModel:
    """Convert the ONNX file ``path``; ``shapes`` (without the batch dimension) fix the inputs'
    dynamic dimensions. Errors name the file, the graph's shapes and what to set."""
    path = Path(path)
    model = _read(path)
    refuse_quantized(model, path)
    graph = static_shapes(path)
    names = [i.name for i in _graph_inputs(model)]
    if shapes is not None:
        if len(shapes) != len(graph):
            raise ValueError(
                f"model.path: {path} takes {len(graph)} inputs ({', '.join(names)}), "
                f"but {len(shapes)} input shapes were given; model.input_shape takes one list "
                "per input, e.g. [[128], [128]]"
            )
        for name, want, have in zip(names, shapes, graph):
            fixed_ok = len(want) == len(have) and all(
                h is None or h == w for w, h in zip(want, have)
            )
            if not fixed_ok:
                raise ValueError(
                    f"model.path: input {name!r} of {path} has shape [N, "
                    f"{', '.join('?' if h is None else str(h) for h in have)}], which "
                    f"input shape {list(want)} does not fit"
                )
    elif any(None in g for g in graph):
        shown = "; ".join(
            f"{n}: [N, {', '.join('?' if h is None else str(h) for h in g)}]"
            for n, g in zip(names, graph)
        )
        raise ValueError(
            f"model.path: {path} has dynamic input sizes ({shown}); give them with "
            "model.input_shape=[C,H,W] (one list per input for several: [[128], [128]]), or "
            "data.size for image data"
        )
    shapes = [list(s) for s in (shapes or graph)]
    convert = _onnx2torch_convert()
    module = None
    if all(None not in g for g in graph):
        try:
            module = convert(explicit_pads(model), attach_onnx_mapping=True)
            _run_on_zeros(module, model, shapes)
        except Exception:  # onnx2torch cannot resolve some shapes: fold them first
            module = None
    if module is None:
        module = _converted_folded(convert, model, shapes, path)
    outputs_by_name(module, [o.name for o in model.graph.output])
    _initializers_as_parameters(module)
    _matmuls_as_linear(module)
    scalar_operands(module)
    fixed_batch = _fixed_batch(model)
    if all(None not in g for g in graph):  # no dim but the batch set at load
        batches = [fixed_batch] if fixed_batch else [1, 2]
        constant_shape_args(module, [tuple(_zeros(model, shapes, b)) for b in batches])
    else:
        constant_shape_args(module)
    try:
        unbatched = restore_batch_axis(module.eval(), fixed_batch, _zeros(model, shapes))
    except Exception:  # a module that cannot run: the first run on the data names why
        unbatched = ()
    metadata = {p.key: p.value for p in model.metadata_props}
    return OnnxModel(
        module,
        tuple(tuple(s) for s in shapes),
        metadata,
        onnxruntime_runner(path, names, unbatched),
        fixed_batch,
        _declared(model, shapes),
    )
