"""ONNX Resize (11, 13; 18 and 19 through ``onnx_versions``) where onnx2torch's
``F.interpolate`` computes something else, which it only warned about:

- nearest: ``F.interpolate`` takes input pixel floor(i / scale) (ONNX's asymmetric coordinates
  and floor rounding). For any other coordinate mode or ``nearest_mode`` the source pixel of
  each output pixel is computed by ONNX's rule (``nearest_indices``); where it is torch's for
  every pixel (an integer upscale in half-pixel coordinates, say) the resize stays
  ``F.interpolate``, else it is an ``index_select`` per axis, the same selection of pixels;
- linear and cubic: ``F.interpolate`` computes half-pixel (and, upscaling, align-corners)
  coordinates with the cubic coefficient -0.75, so a node with asymmetric or
  ``tf_half_pixel_for_nn`` coordinates, another ``cubic_coeff_a``, ``exclude_outside``, an
  align-corners downscale or a pytorch-half-pixel output of one pixel is refused by name.

A Resize whose scales or sizes are constants of the graph gets them as Python lists
(``onnx_shape_args``), and its ``F.interpolate`` call runs in ``OnnxListResize``, onnx2torch's
call taking those lists.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantlab.models.onnx_nodes import attribute_text, converted, refuse, wrap_held

_ROUNDING = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def source_coordinates(n_in: int, n_out: int, scale: float, mode: str) -> np.ndarray:
    """ONNX Resize's input coordinate of each of ``n_out`` output pixels (float64)."""
    x = np.arange(n_out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if mode == "align_corners":
        return x * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    raise ValueError(f"coordinate_transformation_mode={mode}")


def nearest_indices(n_in: int, n_out: int, scale: float, mode: str, rounding: str) -> np.ndarray:
    """The input pixel ONNX's nearest Resize takes for each output pixel (int64)."""
    src = _ROUNDING[rounding](source_coordinates(n_in, n_out, scale, mode))
    return np.clip(src, 0, n_in - 1).astype(np.int64)


Values = Tensor | list | None  # a Resize's scales or sizes: a tensor, or its values as a list


def _listed(values: Values) -> list | None:
    """``values`` as a list of Python numbers (``Tensor.tolist``); None when absent or empty."""
    if values is None:
        return None
    out = values.tolist() if isinstance(values, Tensor) else list(values)
    return out or None


def _spatial(x: Tensor, scales: Values, sizes: Values) -> list[tuple[int, float]]:
    """(output size, scale) of each spatial axis: from ``sizes`` (scale out / in) or from
    ``scales`` (size floor(in * scale)); batch and channels must keep their size."""
    n_in = list(x.shape)
    listed = _listed(sizes)
    if listed is not None:
        _check_batch_channels(listed, n_in)
        out = [int(s) for s in listed[2:]]
        return [(o, o / i) for o, i in zip(out, n_in[2:])]
    s = [float(v) for v in _listed(scales)]
    _check_unscaled_batch_channels(s)
    return [(math.floor(i * v), v) for i, v in zip(n_in[2:], s[2:])]


def _check_batch_channels(sizes: list, shape: list) -> None:
    """A Resize's sizes keep the input's batch and channels (an entry None: the input's own,
    as ``onnx_shape_args`` writes the batch it takes from runs on the graph's shapes)."""
    if any(s is not None and int(s) != d for s, d in zip(sizes[:2], shape[:2])):
        raise NotImplementedError("Resize of the batch or channel axis is not converted")


def _check_unscaled_batch_channels(scales: list) -> None:
    """A Resize's scales keep the batch and channels (1 and 1)."""
    if scales[:2] != [1, 1]:
        raise NotImplementedError("Resize of the batch or channel axis is not converted")


class OnnxListResize(nn.Module):
    """onnx2torch's ``OnnxResize`` call, ``F.interpolate`` with its torch mode and
    align_corners, taking scales and sizes as lists of numbers as well as tensors."""

    def __init__(self, onnx_mode: str, align_corners, ignore_roi: bool, ignore_bs_ch_size: bool):
        super().__init__()
        self.onnx_mode, self.align_corners = onnx_mode, align_corners
        self.ignore_roi, self.ignore_bs_ch_size = ignore_roi, ignore_bs_ch_size

    @classmethod
    def of(cls, resize: nn.Module) -> OnnxListResize:
        """The list-taking twin of onnx2torch's ``resize``."""
        return cls(resize.onnx_mode, resize.align_corners, resize.ignore_roi,
                   resize.ignore_bs_ch_size)  # fmt: skip

    def forward(self, x: Tensor, roi: Values = None, scales: Values = None, sizes: Values = None):
        from onnx2torch.node_converters.resize import _onnx_mode_to_torch_mode

        if not self.ignore_roi and _listed(roi) is not None:
            raise NotImplementedError("roi logic is not implemented.")
        size, scale_factor = _listed(sizes), _listed(scales)
        if size is not None:
            if not self.ignore_bs_ch_size:
                _check_batch_channels(size, list(x.shape))
            size = size[2:]
        if scale_factor is not None:
            _check_unscaled_batch_channels(scale_factor)
            scale_factor = scale_factor[2:]
        mode = _onnx_mode_to_torch_mode(self.onnx_mode, x.dim() - 2)
        return F.interpolate(
            x, size=size, scale_factor=scale_factor, mode=mode, align_corners=self.align_corners
        )


class OnnxNearestResize(nn.Module):
    """Nearest Resize by ONNX's rule (module docstring); ``torch_resize``: onnx2torch's module,
    used where it selects the same pixels."""

    def __init__(self, mode: str, rounding: str, torch_resize: nn.Module) -> None:
        super().__init__()
        self.mode, self.rounding, self.torch_resize = mode, rounding, torch_resize
        # (input's spatial shape, scales, sizes) given as lists -> picks (``_picks``)
        self._plans: dict[tuple, list[Tensor] | None] = {}

    def forward(self, x, roi=None, scales: Values = None, sizes: Values = None):
        picks = self._picks(x, scales, sizes)
        if picks is None:
            return self.torch_resize(x, roi, scales, sizes)
        for axis, pick in enumerate(picks, start=2):
            x = x.index_select(axis, pick)
        return x

    def _picks(self, x: Tensor, scales: Values, sizes: Values) -> list[Tensor] | None:
        """ONNX's input pixel for each output pixel of each spatial axis (int64 tensors), or
        None where every axis picks torch's pixels; kept per input shape for scales and sizes
        given as lists (so a traced forward reads them without computing them)."""
        key = None
        if not isinstance(scales, Tensor) and not isinstance(sizes, Tensor):
            key = (tuple(x.shape[2:]), tuple(scales or ()), tuple(sizes or ()))
            if key in self._plans:
                return self._plans[key]
        axes = _spatial(x, scales, sizes)
        picks = [
            nearest_indices(n_in, n_out, scale, self.mode, self.rounding)
            for (n_out, scale), n_in in zip(axes, x.shape[2:])
        ]
        torch_picks = [
            nearest_indices(n_in, n_out, scale, "asymmetric", "floor")
            for (n_out, scale), n_in in zip(axes, x.shape[2:])
        ]
        plan = None
        if not all(map(np.array_equal, picks, torch_picks)):
            plan = [torch.from_numpy(p) for p in picks]
        if key is not None:
            self._plans[key] = plan
        return plan


class OnnxCheckedResize(nn.Module):
    """onnx2torch's linear or cubic Resize, refusing at its first run the sizes it resizes
    otherwise than ONNX: an align-corners downscale, a pytorch-half-pixel output of one."""

    def __init__(self, mode: str, torch_resize: nn.Module) -> None:
        super().__init__()
        self.mode, self.torch_resize = mode, torch_resize

    def forward(self, x, roi=None, scales: Tensor | None = None, sizes: Tensor | None = None):
        for n_out, n_in in zip((o for o, _ in _spatial(x, scales, sizes)), x.shape[2:]):
            if self.mode == "align_corners" and n_out < n_in:
                raise NotImplementedError(
                    "ONNX Resize with align_corners coordinates that downscales is not converted"
                )
            if self.mode == "pytorch_half_pixel" and n_out == 1:
                raise NotImplementedError(
                    "ONNX Resize with pytorch_half_pixel coordinates to one pixel is not converted"
                )
        return self.torch_resize(x, roi, scales, sizes)


def checked_resize(older):
    """A Resize 11 on converter: ``older`` (onnx2torch's) where it computes ONNX's resize,
    wrapped as the module docstring says otherwise."""

    def convert(node, graph):
        a = node.attributes
        mode = attribute_text(a.get("mode"), "nearest")
        coords = attribute_text(a.get("coordinate_transformation_mode"), "half_pixel")
        if coords == "tf_crop_and_resize":
            refuse(node, "coordinate_transformation_mode=tf_crop_and_resize")
        result = older(node, graph)
        if mode == "nearest":
            rounding = attribute_text(a.get("nearest_mode"), "round_prefer_floor")
            if coords == "asymmetric" and rounding == "floor":
                return result
            return converted(node, OnnxNearestResize(coords, rounding, result.torch_module))
        if coords in ("asymmetric", "tf_half_pixel_for_nn"):
            refuse(node, f"mode={mode} and coordinate_transformation_mode={coords}")
        if mode == "cubic" and float(a.get("cubic_coeff_a", -0.75)) != -0.75:
            refuse(node, f"cubic_coeff_a={float(a['cubic_coeff_a'])}")
        if int(a.get("exclude_outside", 0)):
            refuse(node, "exclude_outside=1")
        return converted(node, OnnxCheckedResize(coords, result.torch_module))

    return convert


def register() -> None:
    """Resize 11 and 13 in place of onnx2torch's, each wrapping it."""
    wrap_held("Resize", (11, 13), checked_resize)
