"""onnx2torch converters for ONNX ops it lacks that are one torch call or a layout change:
GridSample (opset 16, 20, 22), Gelu (20), Mish (18), GroupNormalization (18, 21),
SpaceToDepth (1, 13), Upsample (7, 9) and GlobalMaxPool (1, 22: ``amax`` over the spatial axes);
Clip (11, 12, 13) in place of onnx2torch's, which took the empty name of a bound left out
(``x.clamp(min=0.1)`` exports as ``Clip(x, min, '')``) for a computed bound and refused both
(a computed bound is a ``torch.clamp`` by tensors here);
and Pad (2, 11, 13, and through ``onnx_versions`` 18 on) in place of onnx2torch's, which pads
in reflect or edge mode only a 3-d to 5-d input whose first two axes are not padded (a 2-d
signal, as an STFT's framing pads it, failed).
Each becomes the torch function a PyTorch model calls (``F.grid_sample``, ``F.gelu``,
``F.mish``, ``F.group_norm``, ``F.interpolate``, ``F.pad``) or the reshapes and permute the op
is, so quantlab captures and simulates it as in a torch model (a grid_sample with its
fixed-point kernel, a table for gelu and mish, its group norm, resampling, padding, layout ops
for SpaceToDepth). Max, Min, Sum and Mean of any number of inputs (numpy broadcasting) are
``torch.maximum`` / ``torch.minimum`` / ``+`` folded left to right, Mean that sum divided by the
input count, in place of onnx2torch's, which broadcasts every input to the output's shape (an
expanded copy of a constant operand), stacks them and reduces the stack. Pad's edge and wrap
modes are ``F.pad``'s replicate and circular.
GroupNormalization's scale and bias are per group in opset 18 (repeated over each group's
channels) and per channel in 21; a computed scale or bias, or a ``stash_type`` other than
float32, is refused.

GridSample's ``mode`` is bilinear / nearest / bicubic (opset 20 names them linear / nearest /
cubic), ``padding_mode`` zeros / border / reflection, and ``align_corners`` 0 / 1, as
``F.grid_sample`` takes them; opset 20's volumetric (5-D) form is torch's too. SpaceToDepth
puts each ``blocksize`` x ``blocksize`` block's pixels in channels block row, block column,
then input channel (ONNX's order; torch's ``pixel_unshuffle`` orders channel first). Float
results match onnxruntime's to rounding.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantlab.models.onnx_nodes import add_missing, attribute_text, converted, refuse, replace

_GRID_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest",
               "bicubic": "bicubic", "cubic": "bicubic"}  # fmt: skip


class OnnxGridSample(nn.Module):
    def __init__(self, mode: str, padding_mode: str, align_corners: bool) -> None:
        super().__init__()
        self.mode, self.padding_mode, self.align_corners = mode, padding_mode, align_corners

    def forward(self, x: Tensor, grid: Tensor) -> Tensor:
        return F.grid_sample(
            x, grid, self.mode, self.padding_mode, align_corners=self.align_corners
        )


class OnnxGelu(nn.Module):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)


class OnnxMish(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.mish(x)


class OnnxGroupNorm(nn.Module):
    """ONNX GroupNormalization as ``F.group_norm``: ``scale`` and ``bias`` per channel (opset
    21), or per group (opset 18: each repeated over its group's channels)."""

    def __init__(self, groups: int, eps: float, scale: Tensor, bias: Tensor) -> None:
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(scale.float(), requires_grad=False)
        self.bias = nn.Parameter(bias.float(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        w, b = self.weight, self.bias
        if w.numel() != x.shape[1]:  # per group
            per = x.shape[1] // self.groups
            w, b = w.repeat_interleave(per), b.repeat_interleave(per)
        return F.group_norm(x, self.groups, w, b, self.eps)


class OnnxUpsample(nn.Module):
    """ONNX Upsample (opsets 7 and 9) over the spatial axes. nearest: output pixel i takes
    input pixel floor(i / scale), ``F.interpolate(mode="nearest")``'s index for a given scale.
    linear (integer scales): output pixel i samples the input at i / scale (ONNX's asymmetric
    coordinates, which ``F.interpolate`` has not), between the pixel below and the next one, the
    last pixel repeated past the end; that is the input padded with one repeated pixel at the
    end of each axis, resized with ``align_corners=True`` to scale * size + 1 pixels (output i
    at i * size / (scale * size) = i / scale), without its last output pixel."""

    def __init__(self, scales: list[float], mode: str = "nearest") -> None:
        super().__init__()
        self.scales, self.mode = scales, mode

    def forward(self, x: Tensor, scales: Tensor | None = None) -> Tensor:
        if self.mode == "nearest":
            return F.interpolate(x, scale_factor=self.scales, mode="nearest")
        axes = len(self.scales)
        padded = F.pad(x, (0, 1) * axes, mode="replicate")
        size = [int(s) * n + 1 for s, n in zip(self.scales, x.shape[2:])]
        y = F.interpolate(padded, size=size, mode=_LINEAR_MODES[axes], align_corners=True)
        return y[(..., *[slice(0, -1)] * axes)]


_LINEAR_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}  # by spatial axes


class OnnxSpaceToDepth(nn.Module):
    def __init__(self, blocksize: int) -> None:
        super().__init__()
        self.blocksize = blocksize

    def forward(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        b = self.blocksize
        blocks = x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
        return blocks.reshape(n, c * b * b, h // b, w // b)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}


class OnnxVariadic(nn.Module):
    """ONNX Max / Min / Sum / Mean of one or more inputs: ``torch.maximum`` / ``torch.minimum`` /
    ``+`` of each next input and the result so far, Mean then divided by the input count (one
    input: that input); the values and rounding of torch's elementwise ops."""

    _PAIRS = {"Max": torch.maximum, "Min": torch.minimum, "Sum": operator.add}

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op

    def forward(self, *xs: Tensor) -> Tensor:
        out, pair = xs[0], self._PAIRS.get(self.op, operator.add)
        for y in xs[1:]:
            out = pair(out, y)
        return out / len(xs) if self.op == "Mean" and len(xs) > 1 else out

    def extra_repr(self) -> str:
        return self.op


class OnnxGlobalMaxPool(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.amax(tuple(range(2, x.dim())), keepdim=True)


def torch_pads(onnx_pads: list[int], rank: int, mode: str) -> list[int]:
    """ONNX's pads (every axis's begin, then every axis's end) as ``F.pad``'s (begin, end) per
    axis from the innermost out. ``F.pad``'s constant mode takes any axes; its reflect,
    replicate and circular modes take the 1 to 3 innermost axes of an input of 1 or 2 more
    (batch and channel, or channel only), so the pairs are cut or filled with zeros to the
    fewest such axes that hold every padded one (NotImplementedError where none does)."""
    half = len(onnx_pads) // 2
    pairs = [(onnx_pads[i], onnx_pads[i + half]) for i in reversed(range(half))]
    if mode != "constant":
        need = max((k + 1 for k, p in enumerate(pairs) if any(p)), default=0)
        fits = [k for k in (rank - 2, rank - 1) if 1 <= k <= 3 and k >= need]
        if not fits:
            raise NotImplementedError(
                f"ONNX Pad in {mode} mode of {need} innermost axes of a rank-{rank} input is "
                "not converted (torch pads 1 to 3 innermost axes, of an input of 1 or 2 more)"
            )
        pairs = (pairs + [(0, 0)] * 3)[: fits[0]]
    return [v for pair in pairs for v in pair]


class OnnxPad(nn.Module):
    """ONNX Pad as ``F.pad`` (``torch_pads``), its pads and fill value from the node's inputs
    (opset 11 on) or attributes (2)."""

    def __init__(self, mode: str, pads: list[int] | None = None, value: float = 0.0) -> None:
        super().__init__()
        self.mode, self.pads, self.value = mode, pads, value

    def forward(self, x: Tensor, pads: Tensor | None = None, value: Tensor | None = None):
        onnx_pads = self.pads if pads is None else [int(p) for p in pads.tolist()]
        fill = self.value if value is None else float(value)
        torch_mode = _PAD_MODES[self.mode]
        padding = torch_pads(onnx_pads, x.dim(), torch_mode)
        if torch_mode != "constant":
            return F.pad(x, padding, mode=torch_mode)
        return F.pad(x, padding, value=fill)


def _grid_sample(node, graph):
    a = node.attributes
    mode = attribute_text(a.get("mode"), "bilinear")
    if mode not in _GRID_MODES:
        refuse(node, f"mode={mode}")
    padding = attribute_text(a.get("padding_mode"), "zeros")
    module = OnnxGridSample(_GRID_MODES[mode], padding, bool(a.get("align_corners", 0)))
    return converted(node, module)


def _gelu(node, graph):
    return converted(node, OnnxGelu(attribute_text(node.attributes.get("approximate"), "none")))


def _mish(node, graph):
    return converted(node, OnnxMish())


def _group_norm(node, graph):
    names = node.input_values
    if any(n not in graph.initializers for n in names[1:3]):
        refuse(node, "a computed scale or bias")
    if int(node.attributes.get("stash_type", 1)) != 1:
        refuse(node, "stash_type other than float32")
    scale, bias = (graph.initializers[n].to_torch() for n in names[1:3])
    groups = int(node.attributes["num_groups"])
    module = OnnxGroupNorm(groups, float(node.attributes.get("epsilon", 1e-5)), scale, bias)
    return converted(node, module, first_input_only=True)


def _upsample(node, graph):
    from onnx2torch.utils.common import get_const_value

    mode = attribute_text(node.attributes.get("mode"), "nearest")
    if mode not in ("nearest", "linear"):
        refuse(node, f"mode={mode}")
    if "scales" in node.attributes:  # opset 7
        scales = [float(v) for v in node.attributes["scales"]]
    else:
        try:
            scales = [float(v) for v in get_const_value(node.input_values[1], graph).tolist()]
        except KeyError:
            refuse(node, "computed scales")
    if len(scales) < 3 or scales[0] != 1 or scales[1] != 1:
        refuse(node, f"scales={scales} (batch and channels must keep their size)")
    spatial = scales[2:]
    if mode == "linear" and (len(spatial) > 3 or any(s != int(s) or s < 1 for s in spatial)):
        refuse(node, f"mode=linear and scales={scales} (integer scales over 1 to 3 axes)")
    return converted(node, OnnxUpsample(spatial, mode), first_input_only=True)


def _pad(node, graph):
    a = node.attributes
    mode = attribute_text(a.get("mode"), "constant")
    if mode not in _PAD_MODES:
        refuse(node, f"mode={mode}")
    if "pads" in a:  # opset 2
        return converted(node, OnnxPad(mode, list(a["pads"]), float(a.get("value", 0.0))))
    return converted(node, OnnxPad(mode))


class OnnxClipComputed(nn.Module):
    """Clip with a bound computed in the graph: ``torch.clamp`` of the input by tensor bounds
    (a bound left out: None), as ``x.clamp(min=y.mean())`` is in the PyTorch code."""

    def forward(self, x: Tensor, lo: Tensor | None = None, hi: Tensor | None = None) -> Tensor:
        return torch.clamp(x, lo, hi)


def _clip(node, graph):
    """Clip 11 on: constant bounds (an empty input name: no bound) as onnx2torch's module for
    them (ReLU, ReLU6 or a clamp by numbers); a bound computed in the graph as
    ``OnnxClipComputed``."""
    from onnx2torch.node_converters.clip import _create_torch_module
    from onnx2torch.utils.common import get_const_value

    names = [node.input_values[i] if len(node.input_values) > i else "" for i in (1, 2)]
    try:
        bounds = [float(get_const_value(n, graph)) if n else None for n in names]
    except KeyError:  # a computed bound
        return converted(node, OnnxClipComputed())
    return converted(node, _create_torch_module(*bounds), first_input_only=True)


def _variadic(node, graph):
    return converted(node, OnnxVariadic(node.operation_type))


def _global_max_pool(node, graph):
    return converted(node, OnnxGlobalMaxPool())


def _space_to_depth(node, graph):
    return converted(node, OnnxSpaceToDepth(int(node.attributes["blocksize"])))


CONVERTERS = {
    "GridSample": ((16, 20, 22), _grid_sample),
    "Gelu": ((20,), _gelu),
    "Mish": ((18, 22), _mish),
    "GroupNormalization": ((18, 21), _group_norm),
    "SpaceToDepth": ((1, 13), _space_to_depth),
    "Upsample": ((7, 9), _upsample),
    "GlobalMaxPool": ((1, 22), _global_max_pool),
}


VARIADIC = {"Max": (8, 12, 13), "Min": (8, 12, 13), "Sum": (8, 13), "Mean": (8, 13)}
"""The variadic elementwise ops and the versions onnx2torch converts (``OnnxVariadic``)."""


def register() -> None:
    """Add these converters to onnx2torch's registry (versions it has none for), and Pad, Clip
    and the variadic ops in place of its own."""
    for op, (versions, convert) in CONVERTERS.items():
        add_missing(op, versions, convert)
    replace("Pad", (2, 11, 13), _pad)
    replace("Clip", (11, 12, 13), _clip)
    for op, versions in VARIADIC.items():
        replace(op, versions, _variadic)
