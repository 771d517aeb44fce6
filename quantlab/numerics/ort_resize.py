"""onnxruntime's Resize (CPU) as quantlab exports ``F.interpolate``: nearest index for index,
bilinear bit for bit.

Nearest (coordinate_transformation_mode "asymmetric", nearest_mode "floor"), which input pixel
each output pixel reads along one axis:

- the scale ``s``: the node's ``scales`` value where it has one (torch's scale factor, which
  the exporter writes), else ``fl32(n_out) / fl32(n_in)`` from the sizes;
- output index ``i`` reads ``floor(fl32(i / s))``, clamped to [0, n_in - 1];
- an axis whose output has the input's size is read one to one (measured: a scale of 1.3 on 2
  pixels gives 2 pixels, the second reading the second, where ``floor(1 / 1.3)`` is 0).

torch maps by ``i * fl32(n_in / n_out)`` (or ``i * (1 / factor)``), which reads another pixel
for some sizes (14 -> 4, 21 -> 6: 32 of 1711 size pairs up to 29 -> 59 pixels).

torch's nearest-exact is exported as a Gather per axis of the pixels torch reads
(``numerics.torch_nearest``), not as Resize: its natural node (half_pixel,
round_prefer_ceil) has no rule here that matches onnxruntime 1.32 on every size. Measured on
one row, opsets 13 to 21, graph optimizations on or off: the float32 steps of its source,
``std::round(fl32(fl32(i + 0.5) / s) - 0.5)``, read another pixel on 14 of the 1711 size pairs
above (14 -> 1 reads pixel 7 where those steps give 6.4999995) and on 43 of 799 cases by a
scale factor (0.3 on 17 pixels reads 15 at 14.499999); by size its pixels equal the exact
half-pixel rounding, by factor no form tried (float64, a reciprocal, a fused product)
matches.

Bilinear of a 4-d input (its UpsampleBilinear), every step one float32 operation: per axis,
the position ``p = fl32(fl32(i + 0.5) / s) - 0.5`` (half_pixel; align_corners:
``fl32(i * fl32(n_in - 1)) / fl32(n_out - 1)``, 0 for one output; ``i`` itself where
``s == 1``) clamped to [0, n_in - 1]; ``lo = trunc(p)``, ``hi = min(lo + 1, n_in - 1)``,
``d_lo = |p - lo|``, ``d_hi = |p - hi|`` (both 0.5 where lo = hi); then
``dx_hi dy_hi x11 + dx_lo dy_hi x21 + dx_hi dy_lo x12 + dx_lo dy_lo x22``, each product formed
left to right and the sum left to right. torch's float bilinear sums in another order: half of
the values of one probe differed in the last bit.

The onnxruntime profiles select and interpolate by this module; ``tests/runtime/
test_ort_resize.py`` matches onnxruntime on every nearest size pair up to 29 -> 59, on ten
scale factors, and on random bilinear sizes and factors, both coordinate modes.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _node_scale(n_in: int, n_out: int, scale: float | None) -> Tensor:
    """The float32 scale onnxruntime maps an axis by: the node's ``scale``, or
    fl32(n_out) / fl32(n_in) where the node gives sizes (None)."""
    f32 = torch.float32
    if scale is None:
        return torch.tensor(float(n_out), dtype=f32) / torch.tensor(float(n_in), dtype=f32)
    return torch.tensor(scale, dtype=f32)


def ort_nearest_indices(n_in: int, n_out: int, scale: float | None = None) -> Tensor:
    """int64 [n_out]: the input index each output index reads along an axis of ``n_in``
    pixels resized to ``n_out`` (module docstring); ``scale``: the node's scale for the axis
    (None: from the sizes)."""
    if n_in < 1 or n_out < 1:
        raise ValueError(f"sizes must be positive, got n_in={n_in}, n_out={n_out}")
    if n_out == n_in:
        return torch.arange(n_in, dtype=torch.int64)
    s = _node_scale(n_in, n_out, scale)
    idx = torch.floor(torch.arange(n_out, dtype=torch.float32) / s)
    return idx.to(torch.int64).clamp(0, n_in - 1)


def _bilinear_axis(n_in: int, n_out: int, align_corners: bool, scale: float | None):
    """(lo, hi, d_lo, d_hi) along one axis as onnxruntime's UpsampleBilinear sets them up
    (module docstring): int64 and float32 [n_out]."""
    f32 = torch.float32
    s = _node_scale(n_in, n_out, scale)
    i = torch.arange(n_out, dtype=f32)
    if float(s) == 1.0:
        p = i
    elif align_corners:
        top = torch.tensor(float(n_in - 1), dtype=f32)
        p = torch.zeros(n_out) if n_out == 1 else i * top / torch.tensor(float(n_out - 1))
    else:
        p = (i + 0.5) / s - 0.5
    p = p.clamp(0.0, float(n_in - 1))
    lo = p.to(torch.int64).clamp_max(n_in - 1)
    hi = (lo + 1).clamp_max(n_in - 1)
    same = lo == hi
    half = torch.tensor(0.5, dtype=f32)
    d_lo = torch.where(same, half, (p - lo.to(f32)).abs())
    d_hi = torch.where(same, half, (p - hi.to(f32)).abs())
    return lo, hi, d_lo, d_hi


def ort_resize_bilinear(
    x: Tensor,
    out_hw: tuple[int, int],
    align_corners: bool = False,
    scales: tuple[float | None, float | None] = (None, None),
) -> Tensor:
    """float32 [N, C, Ho, Wo]: onnxruntime's linear Resize of float32 ``x`` [N, C, H, W]
    (half_pixel, or align_corners), by the node's ``scales`` per axis where it has them (None:
    from the sizes), every step one float32 operation in its kernel's order (module
    docstring)."""
    if x.dim() != 4:
        raise ValueError(f"x must be [N, C, H, W], got shape {tuple(x.shape)}")
    x = x.to(torch.float32)
    h, w = x.shape[2:]
    y1, y2, dy1, dy2 = _bilinear_axis(h, out_hw[0], align_corners, scales[0])
    x1, x2, dx1, dx2 = _bilinear_axis(w, out_hw[1], align_corners, scales[1])
    top, bottom = x[:, :, y1], x[:, :, y2]
    x11, x21, x12, x22 = top[..., x1], top[..., x2], bottom[..., x1], bottom[..., x2]
    dy1, dy2 = dy1[:, None], dy2[:, None]
    return dx2 * dy2 * x11 + dx1 * dy2 * x21 + dx2 * dy1 * x12 + dx1 * dy1 * x22
