"""onnx2torch converters for ONNX ops it has none for, each the torch call a PyTorch model
makes for it, so quantlab captures and simulates it as in that model:

- CastLike (15, 19, 21, 23): ``x.to(like.dtype)``; Size (1, 13, 19, 21, 23, 24): the int64
  element count;
- Trilu (14): ``torch.triu`` / ``torch.tril`` by its ``upper`` attribute, with the diagonal
  offset ``k`` when given (a causal attention mask);
- Swish (24): ``F.silu`` for ``alpha`` = 1, else ``x * sigmoid(alpha x)``;
- ThresholdedRelu (10, 22): ``F.threshold(x, alpha, 0)``;
- Shrink (9): ``F.softshrink`` where ``bias`` = ``lambd``, ``F.hardshrink`` where ``bias`` = 0,
  else ONNX's rule written out with ``torch.where``;
- DepthToSpace (1, 11, 13) in place of onnx2torch's, which refuses the default DCR mode:
  ``F.pixel_shuffle`` for CRD, the reshape, permute and reshape of DCR (depth, column, row: the
  TensorFlow order) otherwise;
- RMSNormalization (23): ``F.rms_norm`` over the axes from ``axis`` on, with its scale held as a
  parameter (a computed scale, or a ``stash_type`` other than float32, is refused);
- CumSum (11, 14) in place of onnx2torch's, which reversed every CumSum whose ``reverse``
  attribute was left out (its default is 0) and whose exclusive form wrote into the wrong
  slices: ``torch.cumsum``, of the input shifted one place along the axis for ``exclusive``,
  flipped before and after for ``reverse``;
- IsInf (10, 20) in place of onnx2torch's, which ignored ``detect_positive`` and
  ``detect_negative``; NonZero (9, 13) in place of its (count, rank) layout: ONNX's (rank,
  count); LayerNormalization (17) with its Mean or InvStdDev output used is refused (onnx2torch
  returned the normalized rows in their place).

LpNormalization, LpPool, MeanVarianceNormalization, Hardmax and Col2Im are in
``onnx_norm_pool_ops``, whose converters ``register`` adds too.

Float results match onnxruntime's to rounding (``tests/models/test_onnx_added_ops.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantlab.models import onnx_norm_pool_ops
from quantlab.models.onnx_nodes import (
    add_missing,
    attribute_text,
    converted,
    refuse,
    replace,
    wrap_held,
)


class OnnxCastLike(nn.Module):
    def forward(self, x: Tensor, like: Tensor) -> Tensor:
        return x.to(like.dtype)


class OnnxSize(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.tensor(x.numel(), dtype=torch.int64)


class OnnxTrilu(nn.Module):
    def __init__(self, upper: bool) -> None:
        super().__init__()
        self.upper = upper

    def forward(self, x: Tensor, k: Tensor | None = None) -> Tensor:
        diagonal = 0 if k is None else int(k)
        return torch.triu(x, diagonal) if self.upper else torch.tril(x, diagonal)


class OnnxSwish(nn.Module):
    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x) if self.alpha == 1.0 else x * torch.sigmoid(self.alpha * x)


class OnnxThresholdedRelu(nn.Module):
    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return F.threshold(x, self.alpha, 0.0)


class OnnxShrink(nn.Module):
    """y = x - bias where x > lambd, x + bias where x < -lambd, else 0."""

    def __init__(self, bias: float, lambd: float) -> None:
        super().__init__()
        self.bias, self.lambd = bias, lambd

    def forward(self, x: Tensor) -> Tensor:
        if self.bias == self.lambd:
            return F.softshrink(x, self.lambd)
        if self.bias == 0.0:
            return F.hardshrink(x, self.lambd)
        zero = torch.zeros_like(x)
        inner = torch.where(x < -self.lambd, x + self.bias, zero)
        return torch.where(x > self.lambd, x - self.bias, inner)


class OnnxDepthToSpace(nn.Module):
    """Channels to ``blocksize`` x ``blocksize`` blocks: CRD takes each output channel's block
    from consecutive channels (``pixel_shuffle``), DCR takes it from channels one output-channel
    count apart."""

    def __init__(self, blocksize: int, mode: str) -> None:
        super().__init__()
        self.blocksize, self.mode = blocksize, mode

    def forward(self, x: Tensor) -> Tensor:
        bs = self.blocksize
        if self.mode == "CRD":
            return F.pixel_shuffle(x, bs)
        b, c, h, w = x.shape
        y = x.reshape(b, bs, bs, c // (bs * bs), h, w).permute(0, 3, 4, 1, 5, 2)
        return y.reshape(b, c // (bs * bs), h * bs, w * bs)


class OnnxRMSNorm(nn.Module):
    def __init__(self, axis: int, eps: float, scale: Tensor) -> None:
        super().__init__()
        self.axis, self.eps = axis, eps
        self.weight = nn.Parameter(scale.float(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape[self.axis % x.dim() :]
        weight = self.weight.expand(shape) if self.weight.shape != shape else self.weight
        return F.rms_norm(x, tuple(shape), weight, self.eps)


class OnnxCumSum(nn.Module):
    def __init__(self, exclusive: bool, reverse: bool) -> None:
        super().__init__()
        self.exclusive, self.reverse = exclusive, reverse

    def forward(self, x: Tensor, axis: Tensor) -> Tensor:
        dim = int(axis) % x.dim()
        if self.reverse:
            x = x.flip(dim)
        if self.exclusive:
            first = torch.zeros_like(x.narrow(dim, 0, 1))
            x = torch.cat([first, x.narrow(dim, 0, x.shape[dim] - 1)], dim)
        y = torch.cumsum(x, dim)
        return y.flip(dim) if self.reverse else y


class OnnxIsInf(nn.Module):
    def __init__(self, positive: bool, negative: bool) -> None:
        super().__init__()
        self.positive, self.negative = positive, negative

    def forward(self, x: Tensor) -> Tensor:
        pos = torch.isposinf(x) if self.positive else torch.zeros_like(x, dtype=torch.bool)
        return pos | torch.isneginf(x) if self.negative else pos


class OnnxNonZero(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.nonzero(x).T


def _is_inf(node, graph):
    a = node.attributes
    module = OnnxIsInf(bool(a.get("detect_positive", 1)), bool(a.get("detect_negative", 1)))
    return converted(node, module)


def _nonzero(node, graph):
    return converted(node, OnnxNonZero())


def _layer_norm(older):
    def convert(node, graph):
        if any(node.output_values[1:]):
            refuse(node, "its Mean or InvStdDev output used")
        return older(node, graph)

    return convert


def _cumsum(node, graph):
    a = node.attributes
    return converted(node, OnnxCumSum(bool(a.get("exclusive", 0)), bool(a.get("reverse", 0))))


def _cast_like(node, graph):
    return converted(node, OnnxCastLike())


def _size(node, graph):
    return converted(node, OnnxSize())


def _trilu(node, graph):
    return converted(node, OnnxTrilu(bool(node.attributes.get("upper", 1))))


def _swish(node, graph):
    return converted(node, OnnxSwish(float(node.attributes.get("alpha", 1.0))))


def _thresholded_relu(node, graph):
    return converted(node, OnnxThresholdedRelu(float(node.attributes.get("alpha", 1.0))))


def _shrink(node, graph):
    a = node.attributes
    return converted(node, OnnxShrink(float(a.get("bias", 0.0)), float(a.get("lambd", 0.5))))


def _depth_to_space(node, graph):
    mode = attribute_text(node.attributes.get("mode"), "DCR")
    if mode not in ("DCR", "CRD"):
        refuse(node, f"mode={mode}")
    return converted(node, OnnxDepthToSpace(int(node.attributes["blocksize"]), mode))


def _rms_normalization(node, graph):
    names = node.input_values
    if names[1] not in graph.initializers:
        refuse(node, "a computed scale")
    if int(node.attributes.get("stash_type", 1)) != 1:
        refuse(node, "stash_type other than float32")
    scale = graph.initializers[names[1]].to_torch()
    a = node.attributes
    module = OnnxRMSNorm(int(a.get("axis", -1)), float(a.get("epsilon", 1e-5)), scale)
    return converted(node, module, first_input_only=True)


CONVERTERS = {
    "CastLike": ((15, 19, 21, 23), _cast_like),
    "Size": ((1, 13, 19, 21, 23, 24), _size),
    "Trilu": ((14,), _trilu),
    "Swish": ((24,), _swish),
    "ThresholdedRelu": ((10, 22), _thresholded_relu),
    "Shrink": ((9,), _shrink),
    "RMSNormalization": ((23,), _rms_normalization),
}


def register() -> None:
    """Add these converters and ``onnx_norm_pool_ops``' to onnx2torch's registry, and
    DepthToSpace, CumSum, IsInf, NonZero and LayerNormalization in place of its own."""

    for op, (versions, convert) in CONVERTERS.items():
        add_missing(op, versions, convert)
    onnx_norm_pool_ops.register()
    replace("DepthToSpace", (1, 11, 13), _depth_to_space)
    replace("CumSum", (11, 14), _cumsum)
    replace("IsInf", (10, 20), _is_inf)
    replace("NonZero", (9, 13), _nonzero)
    wrap_held("LayerNormalization", (17,), _layer_norm)
