"""Run an exported QDQ model in onnxruntime (CPU, default graph optimizations) and read which
kernel onnxruntime chose for each quantlab op from the optimized graph it saves."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx

# onnxruntime kernels that compute on integer codes (MLAS / contrib QLinear ops)
INTEGER_KERNELS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "MatMulIntegerToFloat",
        "QLinearAdd",
        "QLinearMul",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearSoftmax",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearConcat",
        "QLinearWhere",
    }
)
# nodes that only move or select values (exact in any dtype)
MOVING_KERNELS = frozenset(
    {
        "Transpose",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Slice",
        "Identity",
        "MaxPool",
        "NhwcMaxPool",
        "Pad",
        "Gather",
        "Expand",
        "Concat",
        "Cast",
    }
)
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
_TOKEN = re.compile(r"_token_\d+$")


def session(path: Path | str | bytes, optimized_path: Path | str | None = None, threads: int = 1):
    """An onnxruntime CPU session with the default graph optimizations, ``threads`` intra-op
    threads and no spinning, of the model file at ``path`` (or a serialized model's bytes);
    ``optimized_path``: also save the optimized graph there."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def run(sess, input_names: list[str], inputs: tuple, output_names: list[str] | None = None):
    """Outputs (numpy) of ``sess`` on torch ``inputs`` (handed over as contiguous arrays)."""
    feeds = {n: np.ascontiguousarray(t.detach().cpu().numpy()) for n, t in zip(input_names, inputs)}
    return sess.run(output_names, feeds)


def _op_of(node_name: str) -> tuple[str, str]:
    """(op name, role) of an exported node name ``node:<op>[/role]`` as onnxruntime keeps it
    (a fused node carries its target's name and a ``_token_N`` suffix)."""
    base = _TOKEN.sub("", node_name)
    base = base[len("node:") :] if base.startswith("node:") else base
    roles = ("/float", "/codes", "/clip", "/unclamped", "/nd", "/flat", "/2d", "/sqrt", "/sigmoid")
    roles += ("/acc",)  # a wide GEMM's ConvInteger / MatMulInteger, its bias Add and Cast
    roles += ("/group",)  # a group norm's Reshapes, LayerNormalization and Mul before its last
    for role in roles:
        cut = base.find(role)
        if cut > 0:
            return base[:cut], role[1:]
    return base, ""


ON_CODES = "(codes)"  # suffix of a kernel the exporter wrote on integer codes (a Pad, a Clip)


def kernels_by_op(optimized: Path | str, op_names: list[str]) -> dict[str, list[str]]:
    """For each op, the onnxruntime kernels (op types, domain-qualified when not ONNX) that
    compute it in the optimized graph, in graph order, Q/DQ nodes left out; a node the
    exporter wrote on the op's integer codes (role ``codes``) is named ``<type>(codes)``."""
    model = onnx.load(str(optimized), load_external_data=False)
    wanted = set(op_names)
    out: dict[str, list[str]] = {n: [] for n in op_names}
    for node in model.graph.node:
        if node.op_type in _QDQ:
            continue
        op, role = _op_of(node.name)
        if op in wanted:
            out[op].append(node.op_type + (ON_CODES if role == "codes" else ""))
    return out


def kernel_counts(optimized: Path | str) -> dict[str, int]:
    """How many nodes of each op type the optimized graph has."""
    model = onnx.load(str(optimized), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def computes_in_float(kernels: list[str]) -> bool:
    """Whether onnxruntime evaluates the op in float32 between Dequantize and Quantize."""
    return any(
        k not in INTEGER_KERNELS and k not in MOVING_KERNELS and not k.endswith(ON_CODES)
        for k in kernels
    )


def codes_from_runtime(values: np.ndarray, offset: bool) -> np.ndarray:
    """Integer codes (int64) of a runtime tensor; ``offset``: uint8 written as code + 128."""
    v = values.astype(np.int64)
    return v - 128 if offset else v
