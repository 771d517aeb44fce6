"""What quantlab refuses in an ONNX graph, each refusal a ValueError naming ``model.path``, what
the graph holds and what to give instead: a graph quantized already, and control flow (If,
Loop, Scan) that stays after folding its constants."""

from __future__ import annotations

from pathlib import Path

_QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger",
                  "MatMulInteger", "QGemm", "QAttention", "QOrderedMatMul"}  # fmt: skip


def refuse_quantized(model, path: Path) -> None:
    """ValueError for a graph that is quantized already (Q/DQ pairs, QLinear or integer ops,
    dynamic quantization): quantlab simulates the quantization of a float model."""
    found = sorted(
        {
            n.op_type
            for n in model.graph.node
            if n.op_type in _QUANTIZED_OPS or n.op_type.startswith(("QLinear", "DynamicQuantize"))
        }
    )
    if found:
        raise ValueError(
            f"model.path: {path} is quantized already ({', '.join(found)}): quantlab simulates "
            "the quantization of a float model, so give the float ONNX file it was made from"
        )


_CONTROL_FLOW = ("If", "Loop", "Scan")


def refuse_control_flow(model, path: Path) -> None:
    """ValueError naming the control-flow nodes left after folding (an If on a value computed
    at run time, a Loop, a Scan): quantlab converts graphs without them. The message names the
    inputs of the first one, where ``onnx.utils.extract_model`` can cut the graph."""
    nodes = [n for n in model.graph.node if n.op_type in _CONTROL_FLOW]
    if not nodes:
        return
    first = nodes[0]
    found = ", ".join(f"{n.op_type} {n.name or n.output[0]!r}" for n in nodes)
    raise ValueError(
        f"model.path: {path} has control flow that stays after folding its constants ({found}):"
        " quantlab converts graphs without If, Loop or Scan. Simulate the part before it, e.g. "
        f"onnx.utils.extract_model({str(path)!r}, 'part.onnx', <input names>, <output names "
        f"before it>); the first one takes {', '.join(repr(i) for i in first.input if i)}"
    )
