"""One-value constants of an ONNX graph's Mul and Div as the Python numbers they were.

``torch.onnx.export`` writes ``x * 0.5`` and ``x / 6`` with their number as a one-value
initializer or Constant (shape ``[]`` or ``[1, ...]``), and onnx2torch turns it into a tensor
operand, which quantlab would then quantize as a second activation, and divide by through the
reciprocal table of a tensor divisor. The PyTorch code it came from multiplies by the number
(a division by a number is the product with its reciprocal, as deployment toolchains fold it),
and so does quantlab's fixed mode for such a product (``fixed_ops._mul``). ``scalar_operands``
gives each such node back its number (``OnnxScalarMath``), so a model's products and quotients
by numbers are simulated alike from PyTorch and from its ONNX export
(tests/models/test_onnx_constants.py: the same codes in fake and fixed mode).

Add and Sub keep a one-value constant as a tensor operand, quantized like an activation (int8
at |c| / 127 by default; that an ONNX toolchain does so is assumed). Under J6's add rule (a
shared scale of max(sx, sy) / 2**14, j6-numerics s.7, assumed) such a constant is exact to a
small fraction of the other operand's step, where quantlab's encoding of a Python number (an
int16 code at |c| / 32767, ``numerics.code_bounds.CONSTANT_DTYPE``, assumed) is not: its
multiplier round(sy / inter) is small, and the number is off by up to one step of the other
operand on every value. With its Add constants as numbers, PP-OCRv4's recognizer read 25 of
222 characters in fixed mode otherwise than float did; with them as tensors, none.

Left as they are too: a constant of more than one value (a per-channel scale is a tensor
operand in PyTorch as well), a number divided by a tensor, and a node whose operands are both
constants. The result keeps ONNX's broadcast shape: a ``[1, 1]`` constant times a 1-d tensor
gives ``[1, n]``. Float results equal onnxruntime's, except where torch divides by a number as
the product with its reciprocal (within an ulp).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class OnnxScalarMath(nn.Module):
    """``x * value``, ``value * x`` (``constant_first``) or ``x / value`` with ``value`` a
    Python float, as the exported PyTorch code computed it; ``rank``: the constant's number
    of dims, which the result's shape keeps (ONNX broadcasting)."""

    def __init__(self, op: str, value: float, constant_first: bool, rank: int) -> None:
        super().__init__()
        self.op, self.value, self.constant_first, self.rank = op, value, constant_first, rank

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() < self.rank:
            x = x.reshape((1,) * (self.rank - x.dim()) + tuple(x.shape))
        if self.op == "mul":
            return self.value * x if self.constant_first else x * self.value
        return x / self.value

    def extra_repr(self) -> str:
        return f"op={self.op}, value={self.value}, constant_first={self.constant_first}"


def _op_of(module: nn.Module) -> str | None:
    """mul / div for onnx2torch's Mul and Div modules, else None."""
    if type(module).__name__ != "OnnxBinaryMathOperation":
        return None
    fn = getattr(module, "math_op_function", None)
    if fn is torch.mul:
        return "mul"
    return "div" if getattr(fn, "__name__", "") == "_onnx_div" else None


def parameter_of(gm: nn.Module, arg) -> Tensor | None:
    """The float parameter a ``get_attr`` node reads (an initializer, once
    ``onnx_import._initializers_as_parameters`` has made it one), or None."""
    if getattr(arg, "op", None) != "get_attr":
        return None
    try:
        value = gm.get_parameter(arg.target)
    except AttributeError:
        return None
    return value if value.is_floating_point() else None


def constant_node_value(gm: nn.Module, arg) -> object:
    """The value of onnx2torch's ``OnnxConstant`` module a node calls (a Constant node), or
    None for any other node or argument."""
    if getattr(arg, "op", None) != "call_module" or arg.args or arg.kwargs:
        return None
    module = gm.get_submodule(arg.target)
    return getattr(module, "value", None) if type(module).__name__ == "OnnxConstant" else None


def _one_value(gm: nn.Module, arg) -> Tensor | None:
    """The float constant of one value a node gives: an initializer (``parameter_of``), or
    onnx2torch's ``OnnxConstant`` module (a Constant node)."""
    value = parameter_of(gm, arg)
    if value is None:
        value = constant_node_value(gm, arg)
    if not isinstance(value, Tensor) or not value.is_floating_point() or value.numel() != 1:
        return None
    return value


def scalar_operands(gm: nn.Module) -> int:
    """Replace every Mul and Div node of the converted graph ``gm`` whose one operand
    is a float constant of one value and whose other is not a constant by ``OnnxScalarMath``
    under the node's name (a division only where the constant divides). Returns how many."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        return 0
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_module" or len(node.args) != 2 or node.kwargs:
            continue
        op = _op_of(gm.get_submodule(node.target))
        if op is None:
            continue
        first, second = (_one_value(gm, a) for a in node.args)
        if (first is None) == (second is None):  # no constant, or two
            continue
        if op == "div" and first is not None:  # a number divided by a tensor
            continue
        const = first if first is not None else second
        x = node.args[1] if first is not None else node.args[0]
        scalar = OnnxScalarMath(op, float(const.item()), first is not None, const.dim())
        gm.add_submodule(node.target, scalar)
        node.args = (x,)
        count += 1
    if count:
        graph.eliminate_dead_code()
        gm.recompile()
    return count
