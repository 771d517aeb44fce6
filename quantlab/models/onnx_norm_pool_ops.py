"""onnx2torch converters for ONNX's normalizations, pools and their kin it has none for, each
the torch call a PyTorch model makes for it where there is one, so quantlab captures and
simulates it as in that model (registered by ``onnx_added_ops.register``):

- LpNormalization (1, 22): x over its p-norm along ``axis``, 0 where that norm is 0, as
  onnxruntime gives it (ONNX divides with no epsilon); p 1 and 2 only (others refused, as
  onnxruntime refuses them). For p = 1 that is ``F.normalize(x, 1, dim=axis)`` with eps the
  dtype's smallest subnormal (a 1-norm is 0 only for a row of zeros; F.normalize's default
  1e-12 would take the place of norms below it). For p = 2 the norm also underflows to 0 on
  rows of values below about 1e-23, where that clamp would divide by eps: written out as
  ``x.norm(2, axis)`` (F.normalize's norm), a division by it where it is not 0 and
  ``torch.where`` giving 0 where it is;
- LpPool (2, 11, 18, 22): ``F.lp_pool1d`` / ``2d`` / ``3d`` of ``|x|`` (of ``x`` for even p:
  torch raises x itself to p, ONNX takes the p-th root of the sum of ``|x|^p``), after a zero
  ``F.pad`` for ``pads``, for ``auto_pad`` SAME_UPPER / SAME_LOWER (onnxruntime's pads from
  the input's size: negative, cutting the input's ends, where the stride exceeds the kernel;
  its ``ceil_mode`` then has no effect) and for ``ceil_mode``'s last windows (zeros add
  nothing to a window's sum; torch's ceil mode would average the partial window over fewer
  values); ``dilations`` other than 1 (torch's average pool takes none) and p below 1 are
  refused;
- MeanVarianceNormalization (9, 13): ``(x - mean) / sqrt(mean((x - mean)^2))`` over ``axes``
  (default [0, 2, 3]), onnxruntime's kernel: no epsilon (a constant slice gives NaN there);
  ONNX's function body computes ``E[x^2] - E[x]^2`` and adds 1e-9 to its root instead (0 for
  a constant slice), the same to rounding elsewhere. Axes beyond the input's rank are left
  out, as onnxruntime leaves them;
- Hardmax (1, 11, 13): ``F.one_hot`` of ``argmax`` (the first of equal maxima, as ONNX) along
  ``axis`` in 13, and in 1 and 11 along each row of the input flattened to 2-D at ``axis``
  (a NaN is the maximum to torch.argmax; onnxruntime passes over one that does not come
  first);
- Col2Im (18): ``F.fold`` of a 2-D image with constant ``image_shape`` and ``block_shape``,
  its dilations and strides as they are; pads differing at an axis's two ends fold onto the
  padded image, then slice it. Other image ranks and computed shapes are refused.

Float results match onnxruntime's to rounding (``tests/models/test_onnx_added_ops.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantlab.models.onnx_nodes import add_missing, attribute_text, converted, refuse
from quantlab.models.onnx_pads import same_pads

_LP_POOLS = {1: F.lp_pool1d, 2: F.lp_pool2d, 3: F.lp_pool3d}


def smallest_subnormal(dtype: torch.dtype) -> float:
    """The least positive value of float ``dtype``: no positive norm lies below it."""
    info = torch.finfo(dtype)
    return info.tiny * info.eps


class OnnxLpNormalization(nn.Module):
    """x over its p-norm along ``axis``; 0 where that norm is 0 (onnxruntime's rule)."""

    def __init__(self, p: int, axis: int) -> None:
        super().__init__()
        self.p, self.axis = p, axis

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 1:  # a 1-norm is 0 only for a row of zeros, which the clamp keeps 0
            return F.normalize(x, 1.0, self.axis, eps=smallest_subnormal(x.dtype))
        norm = x.norm(2, self.axis, keepdim=True)
        zero = norm == 0  # a row of zeros, or of values whose squares all underflow
        return torch.where(zero, 0.0, x / torch.where(zero, 1.0, norm))


def ceil_end(size: int, begin: int, end: int, kernel: int, stride: int) -> int:
    """The end pad of an axis of ``size`` (pads ``begin``, ``end``) for ``ceil_mode``: the zeros
    that complete its last window, or less of the end where that window is dropped. Windows:
    ceil((size + begin + end - kernel) / stride) + 1, less one that would start after the input
    and its begin pad (onnxruntime's count, and torch's); a negative pad cuts the end off."""
    windows = -(-(size + begin + end - kernel) // stride) + 1
    if (windows - 1) * stride >= size + begin:
        windows -= 1
    return (windows - 1) * stride + kernel - size - begin


class OnnxLpPool(nn.Module):
    """The p-th root of each window's sum of ``|x|^p``, windows of ``kernel`` every ``strides``
    over x padded with zeros (``pads``: begins then ends, or ``auto_pad``'s)."""

    def __init__(self, p: int, kernel, strides, pads, auto_pad: str, ceil_mode: bool) -> None:
        super().__init__()
        self.p, self.kernel, self.strides = p, tuple(kernel), tuple(strides)
        self.pads, self.auto_pad, self.ceil_mode = tuple(pads), auto_pad, ceil_mode

    def _pads(self, sizes) -> list[tuple[int, int]]:
        """(begin, end) zeros of each spatial axis of ``sizes``."""
        rank = len(self.kernel)
        if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            upper = self.auto_pad == "SAME_UPPER"
            pads = [
                same_pads(n, k, s, 1, upper) for n, k, s in zip(sizes, self.kernel, self.strides)
            ]
        elif self.auto_pad == "VALID":
            pads = [(0, 0)] * rank
        else:
            pads = list(zip(self.pads[:rank], self.pads[rank:]))
        if self.ceil_mode and self.auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
            pads = [
                (b, ceil_end(n, b, e, k, s))
                for (b, e), n, k, s in zip(pads, sizes, self.kernel, self.strides)
            ]
        return pads

    def forward(self, x: Tensor) -> Tensor:
        y = x if self.p % 2 == 0 else x.abs()
        pads = self._pads(x.shape[2:])
        if any(b or e for b, e in pads):
            y = F.pad(y, [v for pair in reversed(pads) for v in pair])
        rank = len(self.kernel)
        kernel, strides = (self.kernel[0], self.strides[0]) if rank == 1 else (
            self.kernel, self.strides
        )  # fmt: skip
        return _LP_POOLS[rank](y, self.p, kernel, strides)


class OnnxMeanVarianceNorm(nn.Module):
    """(x - mean) / sqrt(mean((x - mean)^2)), the means over ``axes``."""

    def __init__(self, axes) -> None:
        super().__init__()
        self.axes = tuple(axes)

    def forward(self, x: Tensor) -> Tensor:
        dims = sorted({a % x.dim() for a in self.axes if -x.dim() <= a < x.dim()})
        if not dims:
            raise ValueError(
                f"MeanVarianceNormalization axes {list(self.axes)} name no axis of a "
                f"rank-{x.dim()} input"
            )
        centered = x - x.mean(dims, keepdim=True)
        return centered / centered.pow(2).mean(dims, keepdim=True).sqrt()


class OnnxHardmax(nn.Module):
    """1 at the first maximum along ``axis`` (``coerced``: of each row of x flattened to 2-D
    at ``axis``, opsets 1 and 11), 0 elsewhere."""

    def __init__(self, axis: int, coerced: bool) -> None:
        super().__init__()
        self.axis, self.coerced = axis, coerced

    def forward(self, x: Tensor) -> Tensor:
        if self.coerced:
            if not -x.dim() <= self.axis < x.dim():
                raise ValueError(
                    f"Hardmax axis {self.axis} is not an axis of a rank-{x.dim()} input"
                )
            axis = self.axis % x.dim()
            rows = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
            return F.one_hot(rows.argmax(1), rows.shape[1]).to(x.dtype).reshape(x.shape)
        dim = self.axis % x.dim()
        hot = F.one_hot(x.argmax(dim), x.shape[dim]).to(x.dtype)
        return hot.movedim(-1, dim)


class OnnxCol2Im(nn.Module):
    """Each column of x's blocks summed into its place in an ``image`` (H, W): ``F.fold``,
    onto the image padded by ``pads`` (begins then ends), cut back to the image."""

    def __init__(self, image, block, dilations, pads, strides) -> None:
        super().__init__()
        self.image, self.block = tuple(image), tuple(block)
        self.dilations, self.strides = tuple(dilations), tuple(strides)
        self.begins, self.ends = tuple(pads[:2]), tuple(pads[2:])

    def forward(self, x: Tensor) -> Tensor:
        if self.begins == self.ends:
            return F.fold(x, self.image, self.block, self.dilations, self.begins, self.strides)
        padded = [n + b + e for n, b, e in zip(self.image, self.begins, self.ends)]
        y = F.fold(x, padded, self.block, self.dilations, 0, self.strides)
        (top, left), (h, w) = self.begins, self.image
        return y[..., top : top + h, left : left + w]


def _lp_normalization(node, graph):
    p = int(node.attributes.get("p", 2))
    if p not in (1, 2):
        refuse(node, f"p={p}")
    return converted(node, OnnxLpNormalization(p, int(node.attributes.get("axis", -1))))


def _lp_pool(node, graph):
    a = node.attributes
    kernel = list(a["kernel_shape"])
    rank, p = len(kernel), int(a.get("p", 2))
    dilations = list(a.get("dilations", [1] * rank))
    if any(d != 1 for d in dilations):
        refuse(node, f"dilations={dilations}")
    if p < 1:
        refuse(node, f"p={p}")
    if rank not in _LP_POOLS:
        refuse(node, f"a {rank}-D kernel")
    auto_pad = attribute_text(a.get("auto_pad"), "NOTSET")
    module = OnnxLpPool(
        p, kernel, a.get("strides", [1] * rank), a.get("pads", [0] * 2 * rank), auto_pad,
        bool(a.get("ceil_mode", 0)),
    )  # fmt: skip
    return converted(node, module)


def _mean_variance_normalization(node, graph):
    return converted(node, OnnxMeanVarianceNorm(node.attributes.get("axes", [0, 2, 3])))


def _hardmax(node, graph):
    return converted(node, OnnxHardmax(int(node.attributes.get("axis", -1)), coerced=False))


def _hardmax_2d(node, graph):
    """Hardmax 1 and 11: over the input flattened to 2-D at ``axis`` (default 1)."""
    return converted(node, OnnxHardmax(int(node.attributes.get("axis", 1)), coerced=True))


def _col2im(node, graph):
    names = node.input_values
    if names[1] not in graph.initializers or names[2] not in graph.initializers:
        refuse(node, "a computed image_shape or block_shape")
    image = [int(v) for v in graph.initializers[names[1]].to_torch()]
    block = [int(v) for v in graph.initializers[names[2]].to_torch()]
    if len(image) != 2:
        refuse(node, f"a {len(image)}-D image")
    a = node.attributes
    module = OnnxCol2Im(
        image, block, a.get("dilations", [1, 1]), a.get("pads", [0, 0, 0, 0]),
        a.get("strides", [1, 1]),
    )  # fmt: skip
    return converted(node, module, first_input_only=True)


CONVERTERS = {
    "LpNormalization": ((1, 22), _lp_normalization),
    "LpPool": ((2, 11, 18, 22), _lp_pool),
    "MeanVarianceNormalization": ((9, 13), _mean_variance_normalization),
    "Hardmax": ((13,), _hardmax),
    "Col2Im": ((18,), _col2im),
}


def register() -> None:
    """Add these converters to onnx2torch's registry (where it has none)."""
    for op, (versions, convert) in CONVERTERS.items():
        add_missing(op, versions, convert)
    add_missing("Hardmax", (1, 11), _hardmax_2d)
