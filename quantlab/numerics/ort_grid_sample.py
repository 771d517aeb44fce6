"""onnxruntime's CPU GridSample (4-d, float32), bit for bit.

What the onnxruntime profiles compute for ``F.grid_sample`` between DequantizeLinear and
QuantizeLinear, and what the exported GridSample node computes there. Every step is one
float32 operation, in the kernel's order (``tests/runtime/test_ort_grid_sample.py`` matches
onnxruntime on random and adversarial grids):

- source position, per axis of length L: ``fl32(fl32(fl32(n + 1) * L) - 1) / 2``, or with
  align_corners ``fl32(fl32(n + 1) / 2) * (L - 1)``;
- bilinear: ``x1 = floor(x)``, ``x2 = x1 + 1``, ``dx1 = x - x1``, ``dx2 = x2 - x`` (so for y);
  a neighbour outside the input reads 0 (zeros) or its clamped index (border). With zeros
  padding and no align_corners the kernel first forms the four weights ``w11 = dy2 * dx2``, ...
  and sums ``w11 p11 + w12 p12 + w21 p21 + w22 p22`` left to right; otherwise it sums
  ``dy2 (dx2 p11 + dx1 p12) + dy1 (dx2 p21 + dx1 p22)``. The two differ in the last bit;
- nearest: the position rounded half to even (``nearbyint``), then the pixel as above.

torch's float grid_sample computes the same values in a different order: 261 of 990 bilinear
outputs differed in the last bit on one random test.

Reflection padding is not here: onnxruntime reflects the integer neighbour indices after
flooring, torch the continuous position before it, which differ by more than rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.grid_sample import Padding, SampleMode

# the F.grid_sample options whose GridSample this module computes (4-d inputs)
TORCH_MODES = ("bilinear", "nearest")
TORCH_PADDINGS = ("zeros", "border")


def _source(n: Tensor, length: int, align_corners: bool) -> Tensor:
    """float32 source positions (in pixels) of normalised coordinates ``n`` on an axis of
    ``length`` pixels, as onnxruntime's GsDenormalize computes them."""
    if align_corners:
        return (n + 1) / 2 * torch.tensor(float(length - 1), dtype=torch.float32)
    return ((n + 1) * torch.tensor(float(length), dtype=torch.float32) - 1) / 2


def _pixels(flat: Tensor, r: Tensor, c: Tensor, h: int, w: int, padding: Padding) -> Tensor:
    """float32 [N, C, P]: ``flat`` [N, C, H*W] read at integer rows ``r`` and columns ``c``
    ([N, P], int64): 0 outside the input (ZEROS), the clamped index (BORDER)."""
    inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)
    idx = (r.clamp(0, h - 1) * w + c.clamp(0, w - 1)).unsqueeze(1).expand(-1, flat.shape[1], -1)
    got = flat.gather(2, idx)
    if padding is Padding.ZEROS:
        got = torch.where(inside.unsqueeze(1), got, torch.zeros((), dtype=got.dtype))
    return got


def ort_grid_sample(
    x: Tensor, grid: Tensor, mode: SampleMode, padding: Padding, align_corners: bool
) -> Tensor:
    """float32 [N, C, Ho, Wo]: onnxruntime's GridSample of float32 ``x`` [N, C, H, W] at the
    finite float32 ``grid`` [N, Ho, Wo, 2] (x, y in [-1, 1] spanning the input), every step
    one float32 operation in the kernel's order (module docstring)."""
    if x.dim() != 4 or grid.dim() != 4 or grid.shape[-1] != 2:
        raise ValueError(f"ort_grid_sample takes x [N, C, H, W] and grid [N, Ho, Wo, 2], got "
                         f"{tuple(x.shape)} and {tuple(grid.shape)}")  # fmt: skip
    if not isinstance(padding, Padding) or not isinstance(mode, SampleMode):
        raise ValueError(f"mode must be a SampleMode and padding a Padding, got {mode!r}, "
                         f"{padding!r}")  # fmt: skip
    n, ch, h, w = x.shape
    ho, wo = grid.shape[1:3]
    x = x.to(torch.float32)
    g = grid.to(torch.float32).reshape(n, ho * wo, 2)
    flat = x.reshape(n, ch, h * w)
    px = _source(g[..., 0], w, align_corners)
    py = _source(g[..., 1], h, align_corners)
    if mode is SampleMode.NEAREST:
        out = _pixels(flat, torch.round(py).long(), torch.round(px).long(), h, w, padding)
        return out.reshape(n, ch, ho, wo)
    fx, fy = torch.floor(px), torch.floor(py)
    x1, y1 = fx.long(), fy.long()
    dx2, dx1 = (x1 + 1).to(torch.float32) - px, px - fx
    dy2, dy1 = (y1 + 1).to(torch.float32) - py, py - fy
    p11 = _pixels(flat, y1, x1, h, w, padding)
    p12 = _pixels(flat, y1, x1 + 1, h, w, padding)
    p21 = _pixels(flat, y1 + 1, x1, h, w, padding)
    p22 = _pixels(flat, y1 + 1, x1 + 1, h, w, padding)
    dx2, dx1, dy2, dy1 = (t.unsqueeze(1) for t in (dx2, dx1, dy2, dy1))
    if padding is Padding.ZEROS and not align_corners:  # the kernel's precomputed plan
        out = (dy2 * dx2) * p11 + (dy2 * dx1) * p12 + (dy1 * dx2) * p21 + (dy1 * dx1) * p22
    else:
        out = dy2 * (dx2 * p11 + dx1 * p12) + dy1 * (dx2 * p21 + dx1 * p22)
    return out.reshape(n, ch, ho, wo)
