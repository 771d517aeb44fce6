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

A Resize whose scales or sizes are constants of the graph (onnxslim folds them for static input
shapes) gets them as Python lists in the converted graph's code (``constant_resize_args``),
and its ``F.interpolate`` call runs in ``OnnxListResize``, onnx2torch's call with those
numbers: the same call, but ``forward`` reads no tensor's values, so torch dynamo traces it as
one graph and a steady loop can run as a traced program (``Tensor.tolist`` of float scales
stopped dynamo).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

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
    if s[:2] != [1.0, 1.0]:
        raise NotImplementedError("Resize of the batch or channel axis is not converted")
    return [(math.floor(i * v), v) for i, v in zip(n_in[2:], s[2:])]


def _check_batch_channels(sizes: list, shape: list) -> None:
    """A Resize's sizes keep the input's batch and channels (an entry None: the input's own,
    as ``constant_resize_args`` writes the batch it folded from the graph's shapes)."""
    if any(s is not None and int(s) != d for s, d in zip(sizes[:2], shape[:2])):
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
            if scale_factor[:2] != [1, 1]:
                raise NotImplementedError("Resize of the batch or channel axis is not converted")
            scale_factor = scale_factor[2:]
        mode = _onnx_mode_to_torch_mode(self.onnx_mode, x.dim() - 2)
        return F.interpolate(
            x, size=size, scale_factor=scale_factor, mode=mode, align_corners=self.align_corners
        )


def constant_resize_args(gm: nn.Module, example: tuple | None = None) -> int:
    """Give every Resize node of the converted graph ``gm`` whose roi, scales and sizes are
    constants their values as Python lists, and its onnx2torch module (the node's own, or the
    one its wrapper calls) ``OnnxListResize``'s call under the same name (module docstring).
    Constants: a Constant node or an initializer; with ``example`` (inputs of the graph's only
    shapes but the batch) also a value computed from tensors' shapes alone (``Shape`` nodes,
    constants and arithmetic on them: ``F.interpolate(x, size=...)`` as torch exports it),
    taken from a run on ``example`` with its batch entry None (the input's own). Returns how
    many nodes changed."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        return 0
    count = 0
    from_shapes = _values_from_shapes(gm, example) if example is not None else {}
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        module = gm.get_submodule(node.target)
        kind = type(module).__name__
        names = ("input_tensor", "roi", "scales", "sizes")
        if kind == "OnnxResizeV10":
            names = ("input_tensor", "scales")
        elif kind != "OnnxResize" and not (
            isinstance(module, (OnnxNearestResize, OnnxCheckedResize))
            and type(module.torch_resize).__name__ == "OnnxResize"
        ):
            continue
        bound = dict(zip(names, node.args)) | dict(node.kwargs)
        values = {k: v for k, v in bound.items() if k != "input_tensor"}
        constants = {k: _constant(gm, v) for k, v in values.items() if isinstance(v, fx.Node)}
        for k, c in constants.items():
            if c is None and values[k] in from_shapes:
                constants[k] = from_shapes[values[k]]
        if any(c is None for c in constants.values()):
            continue  # a value computed from tensors' values
        node.args = (bound["input_tensor"],)
        node.kwargs = {
            k: (constants[k] if k in constants else v) for k, v in values.items()
        }  # fmt: skip
        if kind == "OnnxResize":
            gm.add_submodule(node.target, OnnxListResize.of(module))
        elif kind == "OnnxResizeV10":
            module._resize = OnnxListResize.of(module._resize)
        else:
            module.torch_resize = OnnxListResize.of(module.torch_resize)
        count += 1
    if count:
        graph.eliminate_dead_code()
        gm.recompile()
    return count


def _constant(gm: nn.Module, node: fx.Node) -> list | None:
    """The values (``Tensor.tolist``) a graph node always gives: an initializer (``get_attr``)
    or onnx2torch's ``OnnxConstant`` module (a Constant node); None for any other node."""
    value = None
    if node.op == "get_attr":
        value = functools.reduce(getattr, node.target.split("."), gm)
    elif node.op == "call_module" and not node.args and not node.kwargs:
        module = gm.get_submodule(node.target)
        if type(module).__name__ == "OnnxConstant":
            value = getattr(module, "value", None)
    return value.tolist() if isinstance(value, Tensor) else None


def _values_from_shapes(gm: fx.GraphModule, example: tuple) -> dict[fx.Node, list]:
    """The scales and sizes nodes of the Resize calls in ``gm`` that depend on the graph's
    inputs only through ``Shape`` nodes, with their values in a run on ``example`` (the first,
    batch, entry of a sizes value None)."""
    wanted: dict[fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_module" or "Resize" not in type(gm.get_submodule(node.target)).__name__:
            continue
        args = dict(zip(("input_tensor", "roi", "scales", "sizes"), node.args)) | node.kwargs
        if type(gm.get_submodule(node.target)).__name__ == "OnnxResizeV10":
            args = dict(zip(("input_tensor", "scales"), node.args)) | node.kwargs
        for key in ("scales", "sizes"):
            arg = args.get(key)
            if isinstance(arg, fx.Node) and _shapes_only(gm, arg):
                wanted[arg] = key
    if not wanted:
        return {}
    seen: dict[fx.Node, list] = {}

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node):
            out = super().run_node(n)
            if n in wanted and isinstance(out, Tensor):
                seen[n] = out.tolist()
            return out

    with torch.no_grad():
        _Recorder(gm).run(*example)
    for n, key in wanted.items():
        if key == "sizes" and n in seen and seen[n]:
            seen[n][0] = None
    return seen


def _shapes_only(gm: nn.Module, node: fx.Node) -> bool:
    """Whether ``node``'s value depends on the graph's inputs only through ``Shape`` nodes (its
    ancestors reach no input but through one)."""
    stack, visited = [node], set()
    while stack:
        n = stack.pop()
        if n in visited:
            continue
        visited.add(n)
        if n.op == "placeholder":
            return False
        if n.op == "call_module" and type(gm.get_submodule(n.target)).__name__ == "OnnxShape":
            continue
        stack.extend(n.all_input_nodes)
    return True


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
