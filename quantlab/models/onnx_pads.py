"""Pads of an ONNX graph written so that onnx2torch converts them as ONNX means them:
``auto_pad`` SAME_UPPER / SAME_LOWER as explicit pads, and pool pads that differ at the two
ends (TensorFlow's SAME, Caffe's ceil rounding) as an edge or zero Pad before the pool, or as
torch's ceil mode."""

from __future__ import annotations

import copy
import math

from quantlab.models.onnx_nodes import graph_opset

_AUTO_PAD_OPS = ("Conv", "MaxPool", "AveragePool")


def _same_auto_pad(node) -> bytes | None:
    """A Conv, MaxPool or AveragePool node's ``auto_pad`` where it is SAME_UPPER or SAME_LOWER
    (None for any other node or mode)."""
    if node.op_type not in _AUTO_PAD_OPS:
        return None
    modes = [a.s for a in node.attribute if a.name == "auto_pad"]
    return modes[0] if modes and modes[0] in (b"SAME_UPPER", b"SAME_LOWER") else None


def same_pads(
    size: int | None, kernel: int, stride: int, dilation: int, upper: bool
) -> tuple[int, int] | None:
    """ONNX's ``auto_pad`` SAME pads (begin, end) of one axis of ``size``: a total of
    (ceil(size / stride) - 1) stride + (kernel - 1) dilation + 1 - size, negative where the
    stride exceeds the window (onnxruntime then cuts the input's ends), half of it rounded
    toward zero at the beginning (SAME_UPPER), or half of the total plus one (SAME_LOWER). With
    stride 1 the total, (kernel - 1) dilation, needs no size; None where it needs one and
    ``size`` is None."""
    if stride == 1:
        total = (kernel - 1) * dilation
    elif size is None:
        return None
    else:
        total = (-(-size // stride) - 1) * stride + (kernel - 1) * dilation + 1 - size
    head = math.trunc((total if upper else total + 1) / 2)
    return head, total - head


def _explicit_auto_pads(model):
    """``model`` with the pads ONNX defines for its Conv, MaxPool and AveragePool nodes of
    ``auto_pad`` SAME_UPPER / SAME_LOWER written out (onnx2torch converts explicit pads, not
    these): per spatial axis ``same_pads``, none where their total is negative. The input size
    comes from shape inference; with stride 1 the pads need none. A node whose sizes are
    not known stays as it is (and is refused by onnx2torch, naming its auto_pad)."""
    from onnx import helper

    if not any(_same_auto_pad(n) for n in model.graph.node):
        return model
    model = copy.deepcopy(model)
    sizes = _inferred_sizes(model)
    weights = {i.name: list(i.dims) for i in model.graph.initializer}
    for node in model.graph.node:
        mode = _same_auto_pad(node)
        if mode is None:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        kernel = attrs.get("kernel_shape") or weights.get(node.input[1], [None, None])[2:]
        rank = len(kernel)
        if not rank:  # a computed weight: its kernel is not known here
            continue
        strides = attrs.get("strides") or [1] * rank
        dilations = attrs.get("dilations") or [1] * rank
        spatial = (sizes.get(node.input[0]) or [None] * (rank + 2))[2:]
        heads, tails = [], []
        for n, k, st, d in zip(spatial, kernel, strides, dilations, strict=True):
            pads = same_pads(n, k, st, d, mode == b"SAME_UPPER")
            if pads is None:
                break
            head, tail = pads if sum(pads) >= 0 else (0, 0)  # no negative pads here
            heads.append(head)
            tails.append(tail)
        if len(heads) != rank:
            continue
        for a in list(node.attribute):
            if a.name in ("auto_pad", "pads"):
                node.attribute.remove(a)
        node.attribute.extend([helper.make_attribute("pads", heads + tails)])
    return model


def _inferred_sizes(model) -> dict[str, list[int | None]]:
    """Each input's and inferred value's dimensions by name (ONNX shape inference; None where
    a dimension is not known)."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model).graph
    return {
        v.name: [d.dim_value or None for d in v.type.tensor_type.shape.dim]
        for v in (*inferred.input, *inferred.value_info)
    }


def _uneven_pool_pads(node) -> tuple[str, list[int], dict] | None:
    """(pad mode, the full Pad pads, the node's attributes) of a MaxPool or AveragePool whose
    pads differ at the two ends, with unit dilations, floor rounding and every pad narrower
    than the window (no window of padding alone); None for any other node."""
    from onnx import helper

    if node.op_type not in ("MaxPool", "AveragePool"):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    pads = list(attrs.get("pads", []))
    r = len(pads) // 2
    plain = attrs.get("auto_pad", b"NOTSET") == b"NOTSET" and not attrs.get("ceil_mode", 0)
    unit = all(d == 1 for d in attrs.get("dilations", [1] * r))
    kernel = list(attrs.get("kernel_shape", []))
    narrow = len(kernel) == r and all(p < k for p, k in zip(pads, kernel * 2))
    if not (pads and pads[:r] != pads[r:] and plain and unit and narrow):
        return None
    mode = "edge" if node.op_type == "MaxPool" else "constant"
    return mode, [0, 0, *pads[:r], 0, 0, *pads[r:]], attrs


def _ceil_mode_pads(node, attrs: dict, sizes: dict) -> list[int] | None:
    """For an AveragePool that leaves its pads out of each window's count
    (``count_include_pad`` 0), pads at the end no smaller than at the start: the symmetric
    pads of the start where torch's ``ceil_mode`` then makes the same windows (torch counts
    only the pixels inside the input too), else None. ONNX has floor((n + b + e - k) / s) + 1
    windows starting at -b; torch with padding b and ceil_mode has ceil((n + 2b - k) / s) + 1,
    one fewer where the last would start past n + b; b must be at most k / 2."""
    pads = list(attrs["pads"])
    r = len(pads) // 2
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides") or [1] * r)
    spatial = (sizes.get(node.input[0]) or [None] * (r + 2))[2:]
    for n, k, st, b, e in zip(spatial, kernel, strides, pads[:r], pads[r:], strict=True):
        if n is None or e < b or 2 * b > k:
            return None
        onnx_out = (n + b + e - k) // st + 1
        torch_out = -(-(n + 2 * b - k) // st) + 1
        torch_out -= (torch_out - 1) * st >= n + b
        if onnx_out != torch_out:
            return None
    return pads[:r] * 2


def _padded_pools(model):
    """``model`` with each MaxPool and AveragePool whose pads differ at the two ends (which
    onnx2torch pads with -inf in a tensor, or refuses) written so that torch pools as ONNX
    does: a max pool preceded by an edge Pad of them (every window that reaches into the
    padding also holds the edge pixel repeated there, so the maxima are the same and no
    infinity enters the graph), an average pool that counts its pads (``count_include_pad``
    1) preceded by a zero Pad, and one that does not given torch's ``ceil_mode`` with the
    start's pads where that makes the same windows (``_ceil_mode_pads``; otherwise it stays
    and onnx2torch refuses it)."""
    import numpy as np
    from onnx import helper, numpy_helper

    if not any(_uneven_pool_pads(n) for n in model.graph.node):
        return model
    model = copy.deepcopy(model)
    sizes = _inferred_sizes(model)
    opset = graph_opset(model)
    nodes = []
    for i, node in enumerate(model.graph.node):
        found = _uneven_pool_pads(node)
        if found is None:
            nodes.append(node)
            continue
        mode, full, attrs = found
        if node.op_type == "AveragePool" and not attrs.get("count_include_pad", 0):
            symmetric = _ceil_mode_pads(node, attrs, sizes)
            if symmetric is not None:
                for a in [a for a in node.attribute if a.name in ("pads", "ceil_mode")]:
                    node.attribute.remove(a)
                node.attribute.extend(
                    [
                        helper.make_attribute("pads", symmetric),
                        helper.make_attribute("ceil_mode", 1),
                    ]
                )
            nodes.append(node)
            continue
        padded = f"{node.input[0]}/{mode}_pad{i}"
        if opset >= 11:
            pads = numpy_helper.from_array(np.array(full, dtype=np.int64), f"{padded}/pads")
            model.graph.initializer.append(pads)
            nodes.append(helper.make_node("Pad", [node.input[0], pads.name], [padded], mode=mode))
        else:
            nodes.append(helper.make_node("Pad", [node.input[0]], [padded], mode=mode, pads=full))
        node.input[0] = padded
        for attr in [a for a in node.attribute if a.name == "pads"]:
            node.attribute.remove(attr)
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def explicit_pads(model):
    """``model`` with auto_pad SAME written as pads and uneven pool pads as torch takes them
    (``_explicit_auto_pads``, ``_padded_pools``)."""
    return _padded_pools(_explicit_auto_pads(model))
