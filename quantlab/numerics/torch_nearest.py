"""Which input pixel each output pixel of torch's nearest and nearest-exact ``F.interpolate``
reads, per spatial axis, as the float model (float32, standard contiguous layout) reads it.

torch's index arithmetic follows its input's dtype: the same call on float64 values reads
other pixels than on float32 ones on some sizes (measured with torch 2.13 on one row: 2 -> 82
pixels nearest, 2 -> 61 nearest-exact; 59 and 126 of the 7021 size pairs up to 59 -> 119). It
also depends on the layout (a channels-last input's nearest-exact reads other pixels on a few
sizes) and, in two dimensions, on the other axis (2 x 2 -> 82 x 82 nearest differs between
the two dtypes where 2 x 2 -> 3 x 82 does not). So the indices here are taken from torch
itself: each axis's index ramp (float32, exact below 2^24) interpolated by the call's own
arguments on a contiguous tensor of the input's spatial shape. The result of a nearest
interpolate of a contiguous float32 input ``x`` is ``x`` indexed by these lists axis by axis.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

NEAREST_MODES = ("nearest", "nearest-exact")
_F32_EXACT = 1 << 24


def _as_key(v):
    """A size or scale-factor argument as a hashable value (lists to tuples)."""
    if isinstance(v, (list, tuple)):
        return tuple(float(e) if isinstance(e, float) else int(e) for e in v)
    return v


@functools.lru_cache(maxsize=256)
def _indices(spatial: tuple, mode: str, size, scale_factor, recompute) -> tuple[Tensor, ...]:
    shape = (1, 1, *spatial)
    out = []
    for axis, n in enumerate(spatial):
        view = [1] * len(shape)
        view[2 + axis] = n
        ramp = torch.arange(n, dtype=torch.float32).view(view).expand(shape).contiguous()
        y = F.interpolate(
            ramp, size=size, scale_factor=scale_factor, mode=mode,
            recompute_scale_factor=recompute,
        )  # fmt: skip
        pick = [0] * y.dim()
        pick[2 + axis] = slice(None)
        out.append(y[tuple(pick)].to(torch.int64))
    return tuple(out)


def torch_nearest_indices(
    spatial: tuple[int, ...],
    mode: str,
    size=None,
    scale_factor=None,
    recompute_scale_factor: bool | None = None,
) -> tuple[Tensor, ...]:
    """int64 index list per spatial axis (module docstring) of ``F.interpolate(x, size,
    scale_factor, mode, recompute_scale_factor=...)`` on an input whose spatial sizes are
    ``spatial`` (1 to 3 axes). Raises ValueError for another mode, or an axis of 2^24 or more
    pixels (its float32 ramp would not be exact)."""
    if mode not in NEAREST_MODES:
        raise ValueError(f"mode must be one of {NEAREST_MODES}, got {mode!r}")
    spatial = tuple(int(n) for n in spatial)
    if not 1 <= len(spatial) <= 3 or min(spatial) < 1 or max(spatial) >= _F32_EXACT:
        raise ValueError(f"spatial sizes must be 1 to 3 axes of 1 to 2^24 - 1, got {spatial}")
    got = _indices(
        spatial, mode, _as_key(size), _as_key(scale_factor),
        None if recompute_scale_factor is None else bool(recompute_scale_factor),
    )  # fmt: skip
    return tuple(t.clone() for t in got)
