"""The state of one export: recorded values -> ONNX tensor names, and the rules that put
QuantizeLinear/DequantizeLinear where quantlab's fixed run quantizes (op inputs, op outputs)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from quantlab.export.graph import TORCH_TO_ONNX, GraphBuilder, QParams, UnsupportedOpError
from quantlab.export.trace_adapter import ConstRef, InputRef, OpRef, RecordedOp, RecordedRun
from quantlab.simulate import args as sim_args


@dataclass
class Value:
    """One tensor in the graph: ``name`` holds its (float32 or integer) values; a quantized
    value also has its integer ``codes`` tensor and ``quant`` (value == dequantized codes)."""

    name: str
    shape: tuple
    dtype: torch.dtype
    quant: QParams | None = None
    codes: str | None = None


@dataclass
class ExportContext:
    """Everything the per-op emitters share."""

    graph: GraphBuilder
    run: RecordedRun
    env: dict = field(default_factory=dict)  # InputRef / OpRef -> Value
    op_tensors: dict = field(default_factory=dict)  # op name -> its output tensor name
    fused: dict = field(default_factory=dict)  # GEMM name -> ops fused into it, in order
    quant_of: dict = field(default_factory=dict)  # op codes tensor -> its QParams

    # ------------------------------------------------------------------ reading arguments
    def value(self, ref, base: str = "const") -> Value:
        """The Value of an argument reference (a constant becomes an initializer)."""
        if isinstance(ref, (InputRef, OpRef)):
            if ref not in self.env:
                raise UnsupportedOpError(f"tensor {ref} is used before it is produced")
            return self.env[ref]
        if isinstance(ref, ConstRef):
            t = ref.value.detach()
            if t.dtype not in TORCH_TO_ONNX:
                raise UnsupportedOpError(f"constant of dtype {t.dtype} in {base}")
            return Value(self.graph.const(base, t), tuple(t.shape), t.dtype)
        raise TypeError(f"not a tensor reference: {ref!r}")

    @staticmethod
    def arg(op: RecordedOp, pos: int, kw: str, default=None):
        if pos < len(op.args):
            return op.args[pos]
        return op.kwargs.get(kw, default)

    def _operand(self, op: RecordedOp, i: int) -> tuple[Value, QParams | None] | None:
        """Activation ``i``'s Value and the quantization the fixed run applied to it as the
        op's input (``in_quant``; None: float); None for a Python scalar."""
        ref = sim_args.get(op.args, op.kwargs, op.acts[i])
        if not isinstance(ref, (InputRef, OpRef, ConstRef)):
            return None
        v = self.value(ref, f"{op.name}/in{i}/const")
        want = op.in_quant[i] if i < len(op.in_quant) else None
        if want is None:
            return v, None
        return v, QParams.of(want.dtype, want.scale, zero_point=want.zero_point)

    def act(self, op: RecordedOp, i: int) -> str | None:
        """Float32 name of activation ``i`` as the op computes with it: requantized at the op's
        input scale when the fixed run did (``in_quant``); None for a Python scalar."""
        held = self._operand(op, i)
        if held is None:
            return None
        v, q = held
        if q is None or q.same_as(v.quant):
            return v.name
        codes = self.graph.quantize(v.name, q, base=f"{op.name}/in{i}")
        return self.graph.dequantize(codes, q)

    def act_codes(self, op: RecordedOp, i: int) -> tuple[str, QParams] | None:
        """(integer codes tensor, its quantization) of activation ``i`` as the op computes with
        it; None when the fixed run kept it float."""
        held = self._operand(op, i)
        if held is None or held[1] is None:
            return None
        v, q = held
        if q.same_as(v.quant) and v.codes is not None:
            return v.codes, q
        return self.graph.quantize(v.name, q, base=f"{op.name}/in{i}/codes"), q

    def act_quant(self, op: RecordedOp, i: int) -> QParams:
        """The integer quantization of activation ``i`` (UnsupportedOpError when float)."""
        want = op.in_quant[i] if i < len(op.in_quant) else None
        if want is None:
            raise UnsupportedOpError(
                f"op {op.name} ({op.op_type}): input {i} is not integer-quantized in the fixed "
                "run; the exporter writes integer GEMMs only"
            )
        return QParams.of(want.dtype, want.scale, zero_point=want.zero_point)

    def shape_of(self, op: RecordedOp, i: int) -> tuple:
        ref = sim_args.get(op.args, op.kwargs, op.acts[i])
        if isinstance(ref, ConstRef):
            return tuple(ref.value.shape)
        return self.env[ref].shape

    def float_const(self, base: str, v: float) -> str:
        return self.graph.const(base, np.asarray(v, dtype=np.float32))

    # ------------------------------------------------------------------ writing outputs
    def set_outputs(self, op: RecordedOp, names: list[str]) -> None:
        """Bind the op's output leaves: quantized leaves get QuantizeLinear (their codes tensor
        is named after the op) and DequantizeLinear for the consumers."""
        for j, (name, t) in enumerate(zip(names, op.outputs)):
            q = op.out_quant[j] if j < len(op.out_quant) else None
            label = op.name if len(op.outputs) == 1 else f"{op.name}[{j}]"
            if q is None or not t.is_floating_point():
                self.env[OpRef(op.name, j)] = Value(name, tuple(t.shape), t.dtype)
                self.op_tensors.setdefault(label, name)
                continue
            qp = QParams.of(q.dtype, q.scale, zero_point=q.zero_point)
            codes = self.graph.quantize(name, qp, output=label)
            dq = self.graph.dequantize(codes, qp)
            self.env[OpRef(op.name, j)] = Value(dq, tuple(t.shape), t.dtype, qp, codes)
            self.op_tensors[label] = codes
            self.quant_of[codes] = qp

    def set_codes(self, op: RecordedOp, codes: str, q: QParams) -> None:
        """Bind the op's one output to integer ``codes`` at ``q`` (already its output
        quantization) and their DequantizeLinear for the consumers."""
        t = op.outputs[0]
        dq = self.graph.dequantize(codes, q)
        self.env[OpRef(op.name, 0)] = Value(dq, tuple(t.shape), t.dtype, q, codes)
        self.op_tensors[op.name] = codes
        self.quant_of[codes] = q

    def alias(self, op: RecordedOp, source: Value) -> None:
        """The op's output is its input as it is (no node)."""
        t = op.outputs[0]
        self.env[OpRef(op.name, 0)] = Value(
            source.name, tuple(t.shape), t.dtype, source.quant, source.codes
        )
        self.op_tensors[op.name] = source.codes or source.name
        if source.codes is not None:
            self.quant_of[source.codes] = source.quant


def int_list(v, n: int) -> list[int]:
    """An int or int sequence argument (kernel size, stride, padding) as a list of ints; an
    int stands for ``n`` equal values."""
    return [int(v)] * n if isinstance(v, int) else [int(t) for t in v]


def as_tensor(v) -> Tensor:
    return v.value if isinstance(v, ConstRef) else v
