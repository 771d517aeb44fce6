"""The converted module's outputs as the ONNX graph names them, each with its batch axis.

``outputs_by_name``: a graph output that is one of a node's several outputs (a Split's part, an
LSTM's state) is returned as that value. ``restore_batch_axis``: a graph that fixes its batch
at 1 may drop that axis on the way out (a Squeeze; chython's reaction mapper returns its
(L, L) attention); every experiment takes dim 0 of an output for its items (task metrics and
their intervals count items there, runs concatenate there), so such an output gets its axis
back: each run is then one item, where 4 runs of an (L, L) output counted 4 L items.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def outputs_by_name(gm, names: list[str]) -> None:
    """Make the converted module return the graph's outputs ``names``, in order. onnx2torch
    returns the whole result of a node with several outputs (an LSTM's Y and Y_h, a Split's
    parts) where a graph output is one of them, and that once per node; here each output is the
    value it names (``getitem`` of its node's result). Left as it is when an output is not
    found among the converted nodes' outputs (``onnx_mapping``)."""
    import operator

    made: dict[str, tuple] = {}
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        mapping = getattr(gm.get_submodule(node.target), "onnx_mapping", None)
        if mapping is None:
            continue
        several = len(mapping.outputs) > 1
        for i, name in enumerate(mapping.outputs):
            made[name] = (node, i if several else None)
    if not names or any(n not in made for n in names):
        return
    if not any(made[n][1] is not None for n in names):
        return  # every output is a node's only one: onnx2torch returned them as they are
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = []
    with gm.graph.inserting_before(out):
        for name in names:
            node, index = made[name]
            values.append(node if index is None else gm.graph.call_function(
                operator.getitem, (node, index)))  # fmt: skip
    out.args = (values[0] if len(values) == 1 else tuple(values),)
    gm.graph.lint()
    gm.recompile()


def restore_batch_axis(gm: nn.Module, batch: int | None, example: list[Tensor]) -> tuple[int, ...]:
    """For a graph that fixes its ``batch`` at 1: run ``gm`` (a torch.fx GraphModule) on
    ``example`` (inputs of batch 1) and put a leading axis of 1 (``torch.unsqueeze(x, 0)``
    before the graph's output) on every output tensor whose first dim is not 1, or that has
    none. Returns those outputs' positions in the graph's output order (for the onnxruntime
    reference, which gives them the same axis); () where nothing changed."""
    graph = getattr(gm, "graph", None)
    if batch != 1 or graph is None:
        return ()
    with torch.no_grad():
        result = gm(*example)
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    missing = tuple(
        i for i, o in enumerate(outs) if isinstance(o, Tensor) and (o.dim() == 0 or o.shape[0] != 1)
    )
    out = next(n for n in graph.nodes if n.op == "output")
    values = out.args[0]
    single = not isinstance(values, (tuple, list))
    nodes = [values] if single else list(values)
    if not missing or len(nodes) != len(outs):  # nothing to do, or a nest of outputs
        return ()
    with graph.inserting_before(out):
        for i in missing:
            nodes[i] = graph.call_function(torch.unsqueeze, (nodes[i], 0))
    out.args = (nodes[0] if single else type(values)(nodes),)
    graph.lint()
    gm.recompile()
    return missing
