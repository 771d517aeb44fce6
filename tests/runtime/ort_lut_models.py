"""ONNX graphs DequantizeLinear -> float op(s) -> QuantizeLinear on every 8-bit code, the ops
quantlab's exporter writes for a table op (silu: Sigmoid then Mul; rsqrt: Sqrt then
Reciprocal), with nonzero zero points, and their cases.

Sessions run single-threaded with onnxruntime's default graph optimizations, as users run
them: the Sigmoid group becomes com.microsoft QLinearSigmoid (a 256-entry lookup table), the
others stay float32 between DequantizeLinear and QuantizeLinear.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import scipy.special
from onnx import TensorProto, helper, numpy_helper

OPS = {
    "sigmoid": ("Sigmoid",),
    "tanh": ("Tanh",),
    "exp": ("Exp",),
    "erf": ("Erf",),
    "silu": ("Sigmoid", "Mul"),
    "log": ("Log",),
    "sqrt": ("Sqrt",),
    "rsqrt": ("Sqrt", "Reciprocal"),
    "reciprocal": ("Reciprocal",),
    "sin": ("Sin",),
    "cos": ("Cos",),
    "gelu": ("Gelu",),
    "hardsigmoid": ("HardSigmoid",),
    "hardswish": ("HardSwish",),
    "leaky_relu": ("LeakyRelu",),
    "elu": ("Elu",),
    "softplus": ("Softplus",),
}
# torch's, as the exporter writes them (leaky_relu, elu: torch's default slope and alpha,
# LutSpec's defaults)
ATTRS = {
    "HardSigmoid": {"alpha": 1.0 / 6.0, "beta": 0.5},
    "LeakyRelu": {"alpha": 0.01},
    "Elu": {"alpha": 1.0},
}
# float64 twins, only to choose output scales as an observer would (finite values' max |y|)
_F64 = {
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "tanh": np.tanh,
    "exp": np.exp,
    "erf": scipy.special.erf,
    "silu": lambda v: v / (1 + np.exp(-v)),
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda v: 1 / np.sqrt(v),
    "reciprocal": lambda v: 1 / v,
    "sin": np.sin,
    "cos": np.cos,
    "gelu": lambda v: 0.5 * v * (1 + scipy.special.erf(v / np.sqrt(2.0))),
    "hardsigmoid": lambda v: np.clip(v + 3, 0, 6) / 6,
    "hardswish": lambda v: v * np.clip(v + 3, 0, 6) / 6,
    "leaky_relu": lambda v: np.where(v >= 0, v, 0.01 * v),
    "elu": lambda v: np.where(v >= 0, v, np.expm1(np.minimum(v, 0))),
    "softplus": lambda v: np.logaddexp(0.0, v),
}
_ONNX_TYPE = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}


@dataclass(frozen=True)
class LutCase:
    """Every code ``x`` of the dtype through ``op`` (a key of OPS) at (sx, zx) -> (sy, zy)."""

    op: str
    x: np.ndarray
    sx: np.float32
    zx: int
    sy: np.float32
    zy: int


def lut_case(seed: int, op: str, dtype) -> LutCase:
    """Random zero points; by seed % 4: random scales (0, 1), power-of-two scales (2: exact
    ties), or the output scale an observer sets, fl32(max |y| / 127.5), over inputs wide enough
    to saturate tanh and sigmoid (3: their extreme outputs land on ties of +-127.5)."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = np.arange(info.min, info.max + 1).astype(dtype)
    zx, zy = (int(rng.integers(info.min, info.max + 1)) for _ in range(2))
    kind = seed % 4
    if kind == 2:
        sx = np.float32(2.0 ** -int(rng.integers(3, 7)))
    else:
        sx = np.float32(rng.uniform(0.005, 0.08) if kind < 2 else rng.uniform(0.05, 0.15))
    with np.errstate(all="ignore"):
        y = _F64[op]((x.astype(np.float64) - zx) * float(sx))
    finite = np.abs(y[np.isfinite(y)])
    amax = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    if kind == 2:
        sy = np.float32(2.0 ** np.floor(np.log2(amax / 127.0)))
    elif kind == 3:
        sy = np.float32(np.float32(amax) / np.float32(127.5))
    else:
        sy = np.float32(amax / rng.uniform(20.0, 127.0))
    return LutCase(op, x, sx, zx, sy, zy)


def _model(c: LutCase) -> onnx.ModelProto:
    t = _ONNX_TYPE[c.x.dtype]
    inits = [
        numpy_helper.from_array(np.array(c.sx, np.float32), "sx"),
        numpy_helper.from_array(np.array(c.zx, c.x.dtype), "zx"),
        numpy_helper.from_array(np.array(c.sy, np.float32), "sy"),
        numpy_helper.from_array(np.array(c.zy, c.x.dtype), "zy"),
    ]
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["v0"])]
    for i, op in enumerate(OPS[c.op]):
        args = ["v0", f"v{i}"] if op == "Mul" else [f"v{i}"]
        nodes.append(helper.make_node(op, args, [f"v{i + 1}"], **ATTRS.get(op, {})))
    nodes.append(helper.make_node("QuantizeLinear", [f"v{len(OPS[c.op])}", "sy", "zy"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", t, list(c.x.shape))],
        [helper.make_tensor_value_info("y", t, list(c.x.shape))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


def run_lut(c: LutCase, optimized_path=None) -> np.ndarray:
    """onnxruntime's output codes of the case (default optimizations, one thread);
    ``optimized_path``: where to write the optimized graph."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    sess = ort.InferenceSession(
        _model(c).SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    return sess.run(None, {"x": c.x})[0]
