"""onnxruntime's nearest Resize (CPU) as quantlab exports ``F.interpolate(mode="nearest")``
(coordinate_transformation_mode "asymmetric", nearest_mode "floor"), index for index: which
input pixel each output pixel reads along one axis.

- the scale ``s``: the node's ``scales`` value where it has one (torch's scale factor, which
  the exporter writes), else ``fl32(n_out) / fl32(n_in)`` from the sizes;
- output index ``i`` reads ``floor(fl32(i / s))``, clamped to [0, n_in - 1];
- an axis whose output has the input's size is read one to one (measured: a scale of 1.3 on 2
  pixels gives 2 pixels, the second reading the second, where ``floor(1 / 1.3)`` is 0).

torch maps by ``i * fl32(n_in / n_out)`` (or ``i * (1 / factor)``), which reads another pixel
for some sizes (14 -> 4, 21 -> 6: 32 of 1711 size pairs up to 29 -> 59 pixels), so the
onnxruntime profiles select codes by this module; ``tests/runtime/test_ort_resize.py``
matches onnxruntime on every size pair up to 29 -> 59 and on ten scale factors.
"""

from __future__ import annotations

import torch
from torch import Tensor


def ort_nearest_indices(n_in: int, n_out: int, scale: float | None = None) -> Tensor:
    """int64 [n_out]: the input index each output index reads along an axis of ``n_in``
    pixels resized to ``n_out`` (module docstring); ``scale``: the node's scale for the axis
    (None: from the sizes)."""
    if n_in < 1 or n_out < 1:
        raise ValueError(f"sizes must be positive, got n_in={n_in}, n_out={n_out}")
    if n_out == n_in:
        return torch.arange(n_in, dtype=torch.int64)
    f32 = torch.float32
    if scale is None:
        s = torch.tensor(float(n_out), dtype=f32) / torch.tensor(float(n_in), dtype=f32)
    else:
        s = torch.tensor(scale, dtype=f32)
    idx = torch.floor(torch.arange(n_out, dtype=f32) / s)
    return idx.to(torch.int64).clamp(0, n_in - 1)
