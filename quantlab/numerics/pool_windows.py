"""Exact window sums and window counts of average pools whose windows hold different numbers
of values: ``avg_pool2d`` with padding (``count_include_pad``), ``ceil_mode`` or a
``divisor_override``, and ``adaptive_avg_pool2d`` to sizes that do not divide the input.

An integer average pool (``AvgPoolRule.INTEGER_SUM``) sums each window's centred codes
``c - z`` exactly and requantizes the sum with the ratio of scales over the window's count, so
a pool whose windows differ needs each window's sum and count. Both follow torch's CPU kernels
(``aten/src/ATen/native/cpu/AvgPoolKernel.cpp``, ``AdaptiveAvgPoolKernel.cpp``):

- ``avg_pool2d``, per axis of size ``n``, output ``i``: ``start = i s - p``,
  ``end = min(start + k, n + p)``; the padded extent is ``end - start``; the window reads
  ``[max(start, 0), min(end, n))``. The count is the padded extents' product when
  ``count_include_pad``, else the read extents' product, and ``divisor_override`` when given.
- ``adaptive_avg_pool2d``, per axis: ``start = floor(i n / o)``, ``end = ceil((i + 1) n / o)``;
  the count is the extents' product.

Sums are formed in float64 from int64 codes; they are exact while every partial sum stays
below 2**53 in magnitude, which ``window_sums`` checks (a window of 2**20 int16 codes is at
most 2**35). Padding adds centred code 0 (the value 0), so it changes no sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_EXACT = 1 << 53  # float64 holds every integer below this


def avg_pool_counts(
    size: int, out: int, kernel: int, stride: int, padding: int, include_pad: bool
) -> Tensor:
    """Per-output counts (int64, (out,)) along one axis of ``avg_pool2d`` (module doc)."""
    start = torch.arange(out, dtype=torch.int64) * stride - padding
    end = torch.clamp(start + kernel, max=size + padding)
    if include_pad:
        return end - start
    return torch.clamp(end, max=size) - torch.clamp(start, min=0)


def adaptive_bounds(size: int, out: int) -> tuple[Tensor, Tensor]:
    """(start, end) per output (int64, (out,)) along one axis of ``adaptive_avg_pool2d``."""
    i = torch.arange(out, dtype=torch.int64)
    return (i * size) // out, ((i + 1) * size + out - 1) // out


def window_sums(
    codes: Tensor,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    ceil_mode: bool,
    include_pad: bool,
    divisor: int | None,
) -> tuple[Tensor, Tensor]:
    """(sums int64 (N, C, Ho, Wo), counts int64 (Ho, Wo)) of ``avg_pool2d`` over centred
    integer codes (N, C, H, W): each window's exact sum and the count torch divides it by."""
    _check_exact(codes, kernel[0] * kernel[1])
    sums = F.avg_pool2d(
        codes.to(torch.float64), kernel, stride, padding, ceil_mode, True, divisor_override=1
    )
    ho, wo = sums.shape[-2:]
    if divisor is not None:
        counts = torch.full((ho, wo), int(divisor), dtype=torch.int64)
    else:
        h, w = codes.shape[-2:]
        ch = avg_pool_counts(h, ho, kernel[0], stride[0], padding[0], include_pad)
        cw = avg_pool_counts(w, wo, kernel[1], stride[1], padding[1], include_pad)
        counts = ch[:, None] * cw[None, :]
    return sums.to(torch.int64), counts


def adaptive_window_sums(codes: Tensor, output_size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """(sums int64 (N, C, Ho, Wo), counts int64 (Ho, Wo)) of ``adaptive_avg_pool2d`` over
    centred integer codes (N, C, H, W)."""
    h, w = codes.shape[-2:]
    ho, wo = output_size
    (sh, eh), (sw, ew) = adaptive_bounds(h, ho), adaptive_bounds(w, wo)
    _check_exact(codes, int((eh - sh).max()) * int((ew - sw).max()))
    rows = _window_matrix(sh, eh, h)  # (Ho, H): 1 where output row i reads input row r
    cols = _window_matrix(sw, ew, w)
    sums = torch.einsum("ih,nchw,jw->ncij", rows, codes.to(torch.float64), cols)
    counts = (eh - sh)[:, None] * (ew - sw)[None, :]
    return sums.to(torch.int64), counts


def _window_matrix(start: Tensor, end: Tensor, size: int) -> Tensor:
    pos = torch.arange(size, dtype=torch.int64)
    return ((pos[None, :] >= start[:, None]) & (pos[None, :] < end[:, None])).to(torch.float64)


def _check_exact(codes: Tensor, window: int) -> None:
    peak = int(codes.abs().max()) if codes.numel() else 0
    if peak * max(window, 1) >= _EXACT:
        raise ValueError(
            f"window sums of codes up to {peak} over {window} values may exceed 2**53: "
            "not exact in float64"
        )
