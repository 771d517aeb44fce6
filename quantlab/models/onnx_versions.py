"""onnx2torch converters for the operator versions of opsets 16 to 24 it stops short of:
torch's exporters write opset 20 by default (``torch.onnx.export(..., dynamo=False)``) and 18
(the dynamo exporter), and ONNX's own version converter and newer toolchains write 22 to 24.

Versions that only add tensor types take the converter of the version before (``TYPE_ONLY``;
bfloat16 in 16 and 22, float8 in 19, int4 in 21, float4 and others in 23 and 24, bool for
ReduceMax / ReduceMin in 20; ScatterND 18 also names max and min reductions, which the older
converter refuses as it does every reduction). Versions that moved an attribute or added one
are converted where the node means what the older version meant, and refused by name
otherwise:

- the reductions (ReduceMean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare) 18:
  ``axes`` is an input, read when it is a constant (``noop_with_empty_axes`` kept);
- AveragePool 19, 22: without ``dilations`` other than 1;
- Pad 18, 19, 21, 23, 24: without the ``axes`` input (all axes padded); 19's ``wrap`` mode is
  ``F.pad``'s circular one (``onnx_functional.OnnxPad``);
- Resize 18, 19: without ``antialias``, ``axes``, a ``keep_aspect_ratio_policy`` other than
  stretch, or 19's ``half_pixel_symmetric`` coordinates;
- Split 18: by its ``split`` input, or into ``num_outputs`` parts of ceil(length / parts)
  values, the last one smaller (``OnnxSplit``);
- Reshape 14 on with ``allowzero=1``, which the dynamo exporter writes and onnx2torch refuses:
  ``torch.reshape``, whose reading of 0 and -1 it is (``OnnxReshapeAllowZero``).

Cast 24 (a rounding mode for float8) is not taken: no converter for it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from quantlab.models.onnx_nodes import (
    add_missing,
    attribute_text,
    converted,
    refuse,
    registry_key,
    wrap_held,
)

_BFLOAT16_22 = ("Acos", "Asin", "Atan", "Conv", "ConvTranspose", "Cos", "Dropout", "Elu",
                "EyeLike", "GlobalAveragePool", "HardSigmoid", "HardSwish",
                "InstanceNormalization", "MaxPool", "Round", "Selu", "Sin", "Softplus",
                "Softsign", "Tan")  # fmt: skip
TYPE_ONLY = {
    "Reshape": (19, 21, 23, 24),
    "Shape": (19, 21, 23, 24),
    "Cast": (19, 21, 23),
    "Constant": (19, 21, 23, 24),
    "ConstantOfShape": (20, 21, 23, 24),
    "Identity": (19, 21, 23, 24),
    "Squeeze": (23, 24),
    "Unsqueeze": (21, 23, 24),
    "Flatten": (21, 23, 24),
    "Transpose": (21, 23, 24),
    "Equal": (19,),
    "IsInf": (20,),
    "IsNaN": (20,),
    "GreaterOrEqual": (16,),
    "LessOrEqual": (16,),
    "ScatterND": (18,),
    "TopK": (24,),
    **{op: (22,) for op in _BFLOAT16_22},
}
"""Each op's versions that take the converter of the version before (module docstring)."""
REDUCTIONS = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")  # fmt: skip


_REDUCE = {
    "ReduceMean": lambda x, dims, keep: x.mean(dims, keepdim=keep),
    "ReduceMax": lambda x, dims, keep: x.amax(dims, keepdim=keep),
    "ReduceMin": lambda x, dims, keep: x.amin(dims, keepdim=keep),
    "ReduceSumSquare": lambda x, dims, keep: (x * x).sum(dims, keepdim=keep),
    "ReduceL1": lambda x, dims, keep: x.abs().sum(dims, keepdim=keep),
    "ReduceL2": lambda x, dims, keep: (x * x).sum(dims, keepdim=keep).sqrt(),
    "ReduceLogSum": lambda x, dims, keep: x.sum(dims, keepdim=keep).log(),
    "ReduceLogSumExp": lambda x, dims, keep: torch.logsumexp(x, dims, keepdim=keep),
}


class OnnxReduction(nn.Module):
    """An ONNX reduction over ``axes`` (negative ones counted from the input's rank; none: all
    axes, or the input itself with ``noop_with_empty_axes``)."""

    def __init__(self, op: str, axes: list[int] | None, keepdims: bool, noop: bool) -> None:
        super().__init__()
        self.op, self.axes, self.keepdims, self.noop = op, axes, keepdims, noop

    def forward(self, x: Tensor) -> Tensor:
        if not self.axes and self.noop:
            return x
        dims = sorted({a % x.dim() for a in self.axes} if self.axes else range(x.dim()))
        if self.op != "ReduceProd":
            return _REDUCE[self.op](x, dims, self.keepdims)
        for d in reversed(dims):  # torch's prod takes one dim at a time
            x = x.prod(d, keepdim=self.keepdims)
        return x


def _reduction(node, graph):
    """A reduction of opset 18 or 20: its constant ``axes`` input as the older attribute."""
    from onnx2torch.utils.common import get_const_value

    axes = None
    if len(node.input_values) > 1 and node.input_values[1]:
        try:
            axes = [int(a) for a in get_const_value(node.input_values[1], graph).tolist()]
        except KeyError:
            refuse(node, "computed axes")
    keepdims = bool(node.attributes.get("keepdims", 1))
    noop = bool(node.attributes.get("noop_with_empty_axes", 0))
    module = OnnxReduction(node.operation_type, axes, keepdims, noop)
    return converted(node, module, first_input_only=True)


class OnnxReshapeAllowZero(nn.Module):
    """ONNX Reshape with ``allowzero=1`` (the dynamo exporter writes it): a 0 in the shape is a
    dimension of size 0 and -1 takes the rest, exactly ``torch.reshape``'s reading."""

    def forward(self, x: Tensor, shape: Tensor | list) -> Tensor:
        values = shape.tolist() if isinstance(shape, Tensor) else shape  # a list: onnx_shape_args
        return torch.reshape(x, [int(s) for s in values])


def _reshape(older):
    """A Reshape converter: ``older`` for ``allowzero=0`` (a 0 copies the input's dimension),
    ``OnnxReshapeAllowZero`` for 1 (onnx2torch refuses it)."""

    def convert(node, graph):
        if not node.attributes.get("allowzero", 0):
            return older(node, graph)
        return converted(node, OnnxReshapeAllowZero())

    return convert


def _checked(check, older):
    """A converter that refuses what ``check`` names, then converts as ``older`` does."""

    def convert(node, graph):
        check(node)
        return older(node, graph)

    return convert


def _pad_check(node) -> None:
    if len(node.input_values) > 3 and node.input_values[3]:
        refuse(node, "the axes input")


def _average_pool_check(node) -> None:
    dilations = node.attributes.get("dilations")
    if dilations is not None and any(int(d) != 1 for d in dilations):
        refuse(node, f"dilations={list(dilations)}")


def _resize_check(node) -> None:
    a = node.attributes
    if a.get("antialias", 0):
        refuse(node, "antialias=1")
    if a.get("axes") is not None:
        refuse(node, "axes")
    policy = attribute_text(a.get("keep_aspect_ratio_policy"))
    if policy not in (None, "stretch"):
        refuse(node, f"keep_aspect_ratio_policy={policy}")
    if attribute_text(a.get("coordinate_transformation_mode")) == "half_pixel_symmetric":
        refuse(node, "coordinate_transformation_mode=half_pixel_symmetric")


class OnnxSplit(nn.Module):
    """ONNX Split 18 along ``axis``: by the ``split`` sizes when given, else into ``parts``
    chunks of ceil(length / parts) values, the last one smaller where the length does not
    divide (``torch.split`` by that size)."""

    def __init__(self, axis: int, parts: int) -> None:
        super().__init__()
        self.axis, self.parts = axis, parts

    def forward(self, x: Tensor, split: Tensor | None = None):
        if split is not None:
            return torch.split(x, split.tolist(), dim=self.axis)
        return torch.split(x, -(-x.shape[self.axis] // self.parts), dim=self.axis)


def _split(node, graph):
    parts = int(node.attributes.get("num_outputs", len(node.output_values)))
    if parts != len(node.output_values):
        refuse(node, f"num_outputs={parts} for {len(node.output_values)} outputs")
    return converted(node, OnnxSplit(int(node.attributes.get("axis", 0)), parts))


def register() -> None:
    """Add these versions to onnx2torch's registry (those it has no converter for)."""
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY

    def older(op: str, version: int):
        have = [d.version for d in _CONVERTER_REGISTRY if d.operation_type == op and d.domain == ""]
        below = [v for v in have if v < version]
        return _CONVERTER_REGISTRY[registry_key(op, max(below))] if below else None

    for op, versions in TYPE_ONLY.items():
        for v in versions:
            base = older(op, v)
            if base is not None:
                add_missing(op, (v,), base)
    for op in REDUCTIONS:
        add_missing(op, (18,), _reduction)
    add_missing("ReduceMax", (20,), _reduction)
    add_missing("ReduceMin", (20,), _reduction)
    wrap_held("Reshape", (14, 19, 21, 23, 24), _reshape)  # its allowzero (14 on)
    add_missing("Split", (18,), _split)
    for op, versions, check in (
        ("Pad", (18, 19, 21, 23, 24), _pad_check),
        ("Resize", (18, 19), _resize_check),
        ("AveragePool", (19, 22), _average_pool_check),
    ):
        base = older(op, versions[0])
        if base is not None:
            add_missing(op, versions, _checked(check, base))
