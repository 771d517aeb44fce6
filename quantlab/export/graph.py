"""An ONNX graph under construction: nodes, initializers, unique names, QuantizeLinear /
DequantizeLinear pairs at quantlab's scales (zero point 0 today; one per tensor by design)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper

from quantlab.export.encoding import ActivationEncoding
from quantlab.numerics.dtypes import DType

OPSET = 21  # int16 QuantizeLinear / DequantizeLinear need opset 21
IR_VERSION = 10

ONNX_INT = {DType.INT8: TensorProto.INT8, DType.INT16: TensorProto.INT16}
NUMPY_INT = {DType.INT8: np.int8, DType.INT16: np.int16}
TORCH_TO_ONNX = {
    torch.float32: TensorProto.FLOAT,
    torch.float64: TensorProto.DOUBLE,
    torch.int64: TensorProto.INT64,
    torch.int32: TensorProto.INT32,
    torch.int16: TensorProto.INT16,
    torch.int8: TensorProto.INT8,
    torch.uint8: TensorProto.UINT8,
    torch.bool: TensorProto.BOOL,
}


class UnsupportedOpError(ValueError):
    """An op the ONNX QDQ exporter cannot write (the message names it and lists what is)."""


@dataclass(frozen=True)
class QParams:
    """Quantization of one tensor: integer ``dtype``, float32 ``scale`` (a scalar, or one per
    channel along ``axis``) and integer ``zero_point`` (0 for every quantlab profile today)."""

    dtype: DType
    scale: np.ndarray
    zero_point: int = 0
    axis: int | None = None

    @staticmethod
    def of(dtype: DType, scale, axis: int | None = None, zero_point: int = 0) -> QParams:
        s = np.asarray(torch.as_tensor(scale, dtype=torch.float32).detach().numpy(), np.float32)
        if axis is None:
            s = s.reshape(())
        if dtype not in ONNX_INT and dtype is not DType.INT32:
            raise UnsupportedOpError(
                f"QDQ export quantizes to INT8, INT16 or INT32 (bias); got {dtype.name}"
            )
        return QParams(dtype, s, zero_point, axis)

    def same_as(self, other: QParams | None) -> bool:
        return (
            other is not None
            and self.dtype is other.dtype
            and self.zero_point == other.zero_point
            and self.axis == other.axis
            and self.scale.shape == other.scale.shape
            and bool(np.array_equal(self.scale.view(np.int32), other.scale.view(np.int32)))
        )


class GraphBuilder:
    """Nodes and initializers of one graph; every name handed out is unique."""

    def __init__(self, encoding: ActivationEncoding = ActivationEncoding.SIGNED) -> None:
        self.encoding = encoding
        self.nodes: list = []
        self.initializers: list = []
        self._names: set[str] = set()
        self._qparam_names: dict[tuple, tuple[str, str]] = {}

    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self._names:
            name = f"{base}~{k}"
            k += 1
        self._names.add(name)
        return name

    def reserve(self, name: str) -> None:
        if name in self._names:
            raise ValueError(f"tensor name {name!r} used twice")
        self._names.add(name)

    def const(self, base: str, value) -> str:
        """An initializer holding ``value`` (numpy array or tensor, dtype kept)."""
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        name = self.unique(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op_type: str, inputs: list[str], base: str, n_out: int = 1, **attrs):
        """Add one node; returns its output name (or names when ``n_out`` > 1)."""
        outs = [self.unique(base if i == 0 else f"{base}:{i}") for i in range(n_out)]
        self.nodes.append(
            helper.make_node(op_type, inputs, outs, name=self.unique(f"node:{outs[0]}"), **attrs)
        )
        return outs[0] if n_out == 1 else outs

    def named_node(self, op_type: str, inputs: list[str], output: str, **attrs) -> str:
        """Add one node whose output has exactly the name ``output``."""
        self.reserve(output)
        self.nodes.append(
            helper.make_node(op_type, inputs, [output], name=self.unique(f"node:{output}"), **attrs)
        )
        return output

    def offset(self, q: QParams, activation: bool = True) -> bool:
        """Whether ``q`` is written as uint8 with its zero point moved by 128."""
        return (
            activation
            and q.dtype is DType.INT8
            and q.axis is None
            and self.encoding is ActivationEncoding.UNSIGNED_OFFSET
        )

    def code_const(self, base: str, code: int, q: QParams, activation: bool = True) -> str:
        """A scalar code of quantlab's at ``q`` as the graph writes it: its dtype, moved by 128
        where ``offset``."""
        if self.offset(q, activation):
            return self.const(base, np.asarray(code + 128, dtype=np.uint8))
        return self.const(base, np.asarray(code, dtype=NUMPY_INT[q.dtype]))

    def zero_point_of(self, codes: str, q: QParams, activation: bool = True) -> str:
        """A scalar zero point of codes tensor ``codes`` written with ``q`` (an integer
        kernel's x_zero_point / w_zero_point input), in the dtype the codes are written in."""
        return self.code_const(f"{codes}/zero_point", q.zero_point, q, activation)

    def _qparam_inputs(self, q: QParams, activation: bool = True) -> tuple[str, str]:
        unsigned = self.offset(q, activation)
        key = (q.dtype, q.zero_point, q.scale.shape, q.scale.tobytes(), unsigned)
        hit = self._qparam_names.get(key)
        if hit is None:
            n = len(self._qparam_names)
            zdt = np.int32 if q.dtype is DType.INT32 else NUMPY_INT[q.dtype]
            zp = np.full(q.scale.shape, q.zero_point, dtype=zdt)
            if unsigned:
                zp = (zp.astype(np.int32) + 128).astype(np.uint8)
            hit = (self.const(f"scale{n}", q.scale), self.const(f"zero_point{n}", zp))
            self._qparam_names[key] = hit
        return hit

    def quantize(self, x: str, q: QParams, output: str | None = None, base: str = "") -> str:
        """QuantizeLinear(x) -> codes (named ``output`` when given)."""
        s, z = self._qparam_inputs(q)
        attrs = {"axis": q.axis} if q.axis is not None else {}
        if output is not None:
            return self.named_node("QuantizeLinear", [x, s, z], output, **attrs)
        return self.node("QuantizeLinear", [x, s, z], base or f"{x}/q", **attrs)

    def dequantize(self, codes: str, q: QParams, base: str = "", activation: bool = True) -> str:
        """DequantizeLinear(codes) -> float32 values codes * scale."""
        s, z = self._qparam_inputs(q, activation)
        attrs = {"axis": q.axis} if q.axis is not None else {}
        return self.node("DequantizeLinear", [codes, s, z], base or f"{codes}/dq", **attrs)

    def const_dq(self, base: str, codes, q: QParams) -> str:
        """A constant integer tensor (weight, bias) and its DequantizeLinear."""
        return self.dequantize(self.const(base, codes), q, base=f"{base}/dq", activation=False)

    def live(self, outputs: list[str]) -> tuple[list, list]:
        """(nodes, initializers) that ``outputs`` depend on, in their order: an emitter may
        leave a node whose output no other node reads (the DequantizeLinear of a value only
        a Pad of its codes reads), which onnxruntime would still run."""
        need, nodes = set(outputs), []
        for n in reversed(self.nodes):
            if any(o in need for o in n.output):
                nodes.append(n)
                need.update(i for i in n.input if i)
        inits = [t for t in self.initializers if t.name in need]
        return nodes[::-1], inits

    def int64s(self, base: str, values) -> str:
        return self.const(base, np.asarray(list(values), dtype=np.int64))
