"""Constant shape arguments of a converted ONNX graph as Python numbers in its code.

onnx2torch's modules take a Reshape's shape, a Slice's starts, ends, axes and steps, a Split's
sizes, an Expand's and a ConstantOfShape's shape and a Resize's scales and sizes as tensors, and
read their values in Python (``Tensor.tolist``, ``if torch.any(shape == 0)``, ``.item()``).
torch dynamo cannot trace such a read as part of one graph, so a steady loop's program
(``quantlab.simulate.program``), whose guards come from dynamo's trace of ``forward``, was
never built for most exported graphs. ``constant_shape_args`` gives each such node whose
arguments are constants (a Constant node or an initializer) their values as Python lists,
literals of the graph's code, and its module a twin taking them (``OnnxListReshape``,
``OnnxListSlice``, ``OnnxListSplit``, ``OnnxListExpand``, ``OnnxListConstantOfShape``,
``onnx_resize.OnnxListResize``) under the same name: the same torch call on the same numbers,
so the same ops, names and bits. An argument computed from tensors' shapes alone (``Shape``
nodes, constants and arithmetic on them: ``F.interpolate(x, size=...)``, ``x.reshape(n, -1)``,
BERT's position and token-type ids as torch exports them) is taken from runs on the graph's own
input shapes, where no dimension but the batch varies, at two batches
(``_values_from_shapes``): an entry that follows the batch is written as the input's own
dimension where ONNX has a word for it (a Resize's None, a Reshape's 0), else as the graph's
batch read per call (``batch_size`` of its first input, a node of the code).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, fx, nn

from quantlab.models.onnx_constants import constant_node_value
from quantlab.models.onnx_resize import OnnxCheckedResize, OnnxListResize, OnnxNearestResize

Listed = Tensor | list | None  # a shape argument: a tensor, or its values as a list


def _ints(values: Listed) -> list[int] | None:
    if values is None:
        return None
    return [int(v) for v in (values.tolist() if isinstance(values, Tensor) else values)]


class OnnxListReshape(nn.Module):
    """onnx2torch's ``OnnxReshape`` call (a 0 copies the input's dimension) on a shape given
    as a list as well as a tensor."""

    def forward(self, x: Tensor, shape: Listed) -> Tensor:
        dims = _ints(shape)
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        return torch.reshape(x, torch.Size(dims))


class OnnxListSlice(nn.Module):
    """onnx2torch's ``OnnxSlice`` call, its flips and index lists made once from constant
    starts, ends, axes and steps (onnx2torch's ``_get_slices``), as Python ints."""

    def __init__(self, starts: list, ends: list, axes: list | None, steps: list | None) -> None:
        super().__init__()
        from onnx2torch.node_converters.slice import _get_slices

        as_tensor = None if axes is None else torch.tensor(axes)
        flips, pos, neg = _get_slices(
            starts, ends, as_tensor, None if steps is None else torch.tensor(steps)
        )
        self.flip_dims = [int(d) for d in flips]
        self.pos_axes_slices = [_plain_slice(s) for s in pos]
        self.neg_axes_slices = [_plain_slice(s) for s in neg]

    def forward(self, x: Tensor) -> Tensor:
        from onnx2torch.node_converters.slice import _do_slice

        return _do_slice(x, self.flip_dims, self.pos_axes_slices, self.neg_axes_slices)


def _plain_slice(s):
    """A slice (or Ellipsis) with Python ints."""
    if not isinstance(s, slice):
        return s
    return slice(*(None if v is None else int(v) for v in (s.start, s.stop, s.step)))


class OnnxListSplit(nn.Module):
    """onnx2torch's ``OnnxSplit13`` call on split sizes given as a list as well as a tensor."""

    def __init__(self, num_splits: int, axis: int) -> None:
        super().__init__()
        self.num_splits, self.axis = num_splits, axis

    def forward(self, x: Tensor, split: Listed = None):
        if split is None:
            return torch.split(x, x.shape[self.axis] // self.num_splits, dim=self.axis)
        return torch.split(x, _ints(split), dim=self.axis)


class OnnxListExpand(nn.Module):
    """onnx2torch's ``OnnxExpand`` call (the product with ones of the target shape: ONNX's
    two-way broadcast) on a shape given as a list as well as a tensor."""

    def forward(self, x: Tensor, shape: Listed) -> Tensor:
        return x * torch.ones(torch.Size(_ints(shape)), dtype=x.dtype, device=x.device)


class OnnxListConstantOfShape(nn.Module):
    """onnx2torch's ``OnnxConstantOfShape`` call on a shape given as a list as well as a
    tensor, its fill value held as a Python number (read once, not per call)."""

    def __init__(self, value: Tensor) -> None:
        super().__init__()
        fill = value.item()
        self.fill, self.dtype = (int(fill) if isinstance(fill, bool) else fill), value.dtype

    def forward(self, shape: Listed) -> Tensor:
        return torch.full(torch.Size(_ints(shape)), self.fill, dtype=self.dtype)


def batch_size(x: Tensor) -> int:
    """The graph's batch: its first input's first dimension (``constant_shape_args``)."""
    return x.shape[0]


BATCH = "batch"  # an entry of a shape argument that is the graph's batch (``_values_from_shapes``)

_ARGS = {  # onnx2torch module -> its forward's argument names
    "OnnxResize": ("input_tensor", "roi", "scales", "sizes"),
    "OnnxResizeV10": ("input_tensor", "scales"),
    "OnnxReshape": ("input_tensor", "shape"),
    "OnnxReshapeAllowZero": ("input_tensor", "shape"),  # quantlab's, taking lists itself
    "OnnxSlice": ("input_tensor", "starts", "ends", "axes", "steps"),
    "OnnxSplit13": ("input_tensor", "split"),
    "OnnxExpand": ("input_tensor", "shape"),
    "OnnxConstantOfShape": ("shape",),
}
_TAKES_BATCH = ("OnnxReshape", "OnnxExpand", "OnnxConstantOfShape")  # lists read per call


def _kind(module: nn.Module) -> str | None:
    """The ``_ARGS`` key of a node's module (quantlab's Resize wrappers: onnx2torch's Resize
    they call), or None."""
    if isinstance(module, (OnnxNearestResize, OnnxCheckedResize)):
        inner = type(module.torch_resize).__name__
        return "OnnxResize" if inner == "OnnxResize" else None
    kind = type(module).__name__
    return kind if kind in _ARGS else None


def _bound(node: fx.Node, kind: str) -> dict:
    """A node's arguments by the names of its module's forward (``_ARGS``)."""
    return dict(zip(_ARGS[kind], node.args)) | dict(node.kwargs)


def constant_shape_args(gm: nn.Module, examples: list[tuple] = ()) -> int:
    """Rewrite the converted graph ``gm`` as the module docstring says; ``examples``: inputs
    of the graph's own shapes, at one batch or two (none: take no value from a run). Returns
    how many nodes changed."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        return 0
    from_shapes = _values_from_shapes(gm, list(examples)) if examples else {}
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        module = gm.get_submodule(node.target)
        kind = _kind(module)
        if kind is None:
            continue
        bound = _bound(node, kind)
        values = {k: v for k, v in bound.items() if k != "input_tensor"}
        listed = {}
        for k, v in values.items():
            listed[k] = _constant(gm, v) if isinstance(v, fx.Node) else v
            if listed[k] is None and isinstance(v, fx.Node):
                listed[k] = from_shapes.get((node, k))
        if any(v is None and isinstance(values[k], fx.Node) for k, v in listed.items()):
            continue  # a value computed from tensors' values
        twin = _twin(module, kind, listed)
        if twin is None:
            continue
        node.args = (bound["input_tensor"],) if "input_tensor" in bound else ()
        node.kwargs = {} if kind == "OnnxSlice" else _with_batch(graph, listed)
        if isinstance(module, (OnnxNearestResize, OnnxCheckedResize)):
            module.torch_resize = twin
        elif kind == "OnnxResizeV10":
            module._resize = twin
        elif twin is not module:
            gm.add_submodule(node.target, twin)
        count += 1
    if count:
        graph.eliminate_dead_code()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return count


def _with_batch(graph: fx.Graph, listed: dict) -> dict:
    """``listed`` with each ``BATCH`` entry the node of ``batch_size`` of the graph's first
    input (added after it once)."""
    if not any(isinstance(v, list) and BATCH in v for v in listed.values()):
        return listed
    first = next(n for n in graph.nodes if n.op == "placeholder")
    batch = next((u for u in first.users if u.target is batch_size), None)
    if batch is None:
        with graph.inserting_after(first):
            batch = graph.call_function(batch_size, (first,))
    return {
        k: [batch if e == BATCH else e for e in v] if isinstance(v, list) else v
        for k, v in listed.items()
    }


def _twin(module: nn.Module, kind: str, listed: dict) -> nn.Module | None:
    """The list-taking module in place of onnx2torch's (for the Resize wrappers: of the one
    they call); None where there is none."""
    if kind == "OnnxResize":
        inner = getattr(module, "torch_resize", module)
        return OnnxListResize.of(inner)
    if kind == "OnnxResizeV10":
        return OnnxListResize.of(module._resize)
    if kind == "OnnxReshape":
        return OnnxListReshape()
    if kind == "OnnxReshapeAllowZero":
        return module
    if kind == "OnnxSplit13":
        return OnnxListSplit(module.num_splits, module.axis)
    if kind == "OnnxExpand":
        return OnnxListExpand()
    if kind == "OnnxConstantOfShape":
        return OnnxListConstantOfShape(module.value)
    starts, ends = listed.get("starts"), listed.get("ends")
    if starts is None or ends is None:
        return None
    return OnnxListSlice(starts, ends, listed.get("axes"), listed.get("steps"))


def _constant(gm: nn.Module, node: fx.Node) -> list | None:
    """The values (``Tensor.tolist``) a graph node always gives: an initializer (``get_attr``)
    or onnx2torch's ``OnnxConstant`` module (a Constant node); None for any other node."""
    if node.op == "get_attr":
        value = functools.reduce(getattr, node.target.split("."), gm)
    else:
        value = constant_node_value(gm, node)
    return value.tolist() if isinstance(value, Tensor) else None


def _values_from_shapes(gm: fx.GraphModule, examples: list[tuple]) -> dict[tuple, list]:
    """(node, argument) -> values, for the shape arguments of ``gm``'s nodes (``_ARGS``; not
    a Split's) that depend on the graph's inputs only through ``Shape`` nodes, from runs on
    each of ``examples`` (the graph's own input shapes, at one batch or at two). An entry that
    differs between the runs is the batch: a Resize's first size becomes None (the input's
    own), a Reshape's entry 0 (ONNX: copy the input's dimension) where it equals that
    dimension in every run, else, for a Reshape, Expand or ConstantOfShape, ``BATCH`` where it
    equals the graph's batch in every run; any other difference leaves the argument out."""
    wanted: dict[tuple, fx.Node] = {}
    kinds: dict[fx.Node, str] = {}  # each node of ``wanted``: its ``_ARGS`` key
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        kind = _kind(gm.get_submodule(node.target))
        if kind is None or kind in ("OnnxSplit13", "OnnxReshapeAllowZero"):
            continue
        args = _bound(node, kind)
        for key in _ARGS[kind][1:] if _ARGS[kind][0] == "input_tensor" else _ARGS[kind]:
            arg = args.get(key)
            if isinstance(arg, fx.Node) and _constant(gm, arg) is None and _shapes_only(gm, arg):
                wanted[node, key] = arg
                kinds[node] = kind
    if not wanted:
        return {}
    users = set(kinds)
    batches = [int(e[0].shape[0]) for e in examples]
    runs: list[dict] = []

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node):
            if n in users and n.args and isinstance(self.env.get(n.args[0]), Tensor):
                seen[n, "input"] = list(self.env[n.args[0]].shape)
            out = super().run_node(n)
            for (user, key), arg in wanted.items():
                if arg is n and isinstance(out, Tensor):
                    seen[user, key] = out.tolist()
            return out

    for example in examples:
        seen: dict[tuple, list] = {}
        try:
            with torch.no_grad():
                _Recorder(gm).run(*example)
        except Exception:  # a graph that does not run at this batch: no value from runs
            return {}
        runs.append(seen)
    out = {}
    for user, key in wanted:
        values = [r.get((user, key)) for r in runs]
        shapes = [r.get((user, "input")) for r in runs]
        if any(v is None for v in values) or len({len(v) for v in values}) != 1:
            continue
        folded = []
        for i, entries in enumerate(zip(*values)):
            if len(set(entries)) == 1 and not (key == "sizes" and i == 0):
                folded.append(entries[0])
            elif key == "sizes" and i == 0:
                folded.append(None)
            elif (
                kinds[user] == "OnnxReshape"
                and None not in shapes
                and all(i < len(s) and e == s[i] for e, s in zip(entries, shapes))
            ):
                folded.append(0)
            elif kinds[user] in _TAKES_BATCH and list(entries) == batches:
                folded.append(BATCH)
            else:
                break
        else:
            out[user, key] = folded
    return out


def _shapes_only(gm: nn.Module, node: fx.Node) -> bool:
    """Whether ``node``'s value depends on the graph's inputs only through ``Shape`` nodes (its
    ancestors reach no input but through one)."""
    stack, visited = [node], set()
    while stack:
        n = stack.pop()
        if n in visited:
            continue
        visited.add(n)
        if n.op == "placeholder":
            return False
        if n.op == "call_module" and type(gm.get_submodule(n.target)).__name__ == "OnnxShape":
            continue
        stack.extend(n.all_input_nodes)
    return True
