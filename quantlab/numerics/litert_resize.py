"""LiteRT's integer resize kernels, bit for bit: its own RESIZE_NEAREST_NEIGHBOR and
RESIZE_BILINEAR (int8 and int16 codes), and XNNPACK's bilinear one (int8), which its default
interpreter delegates int8 bilinear resizes to (XNNPACK takes no nearest resize).

All work on the stored codes, zero point included, and keep the input's scale and zero point.

``tflite_nearest_indices``, per axis: ``r = fl32(n_in) / fl32(n_out)`` (align_corners:
``fl32(n_in - 1) / fl32(n_out - 1)``), output index ``i`` reads
``min(floor(fl32(fl32(i + o) r)), n_in - 1)`` with ``o`` 0.5 for half-pixel centres, else 0
(align_corners: rounded half away from zero instead of floored), at least 0 with half-pixel
centres. torch's "nearest" maps by its scale factor where the call names one, and its
"nearest-exact" differs from half-pixel centres on some sizes: LiteRT's mapping is by size.

``tflite_resize_bilinear``, per axis of ``n_in`` input and ``n_out`` output pixels, in
integers:

- ``scale_10 = (1024 n_in + n_out // 2) // n_out`` (the ratio with 10 fraction bits, rounded
  half up), or with align_corners ``(1024 (n_in - 1) + (n_out - 1) // 2) // (n_out - 1)``
  (when n_out > 1);
- output index ``i`` reads position ``p = i scale_10`` (in 1/1024 pixels), or with half-pixel
  centres ``p = i scale_10 + scale_10 // 2 - 512``;
- neighbours ``lo = max(trunc(p / 1024), 0)`` and ``hi = min(trunc((p + 1023) / 1024),
  n_in - 1)`` (C division truncates toward zero), weights ``1024 - (p - 1024 lo)`` and
  ``p - 1024 lo`` (the second is negative left of the first pixel centre, where lo = hi);
- the four products code x weight_y x weight_x summed exactly (int64), then divided by 2^20
  rounding half away from zero: ``trunc((s + sign(s) 2^19) / 2^20)``, ``sign(0) = -1``.

The source is LiteRT's ``reference_ops::ResizeBilinearInteger``, which its builtin kernel
also runs for int8 and int16. torch's ``align_corners=False`` is ``half_pixel_centers=True``.

``xnnpack_resize_bilinear`` (int8), per axis, in float32: the ratio ``r = fl32(n_in / n_out)``
(align_corners: ``(n_in - 1) / (n_out - 1)``); position ``x = fl32(fl32(i r) + fl32(0.5 r -
0.5))`` clamped to [0, n_in - 1] with half-pixel centres, ``fl32(i r)`` otherwise;
``lo = trunc(x)``, ``hi = min(lo + 1, n_in - 1)``, the weight of ``hi``
``a = lrint(fl32(x - lo) * 2048)`` (half to even). The codes combine exactly,
``S = t_lo (2048 - a_x)(2048 - a_y) + ...``, and ``floor((S + 2^21) / 2^22)`` is the output
(half up).

``tests/runtime/test_litert_resize.py`` matches LiteRT with all three, on every code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType

_ONE = 1 << 10  # one pixel in the kernel's positions


def axis_positions(
    n_in: int, n_out: int, align_corners: bool, half_pixel_centers: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """int64 [n_out] each: (lo, hi, weight of lo, weight of hi) along one axis (weights in
    1/1024, summing to 1024)."""
    if align_corners and half_pixel_centers:
        raise ValueError("RESIZE_BILINEAR takes align_corners or half_pixel_centers, not both")
    if n_in < 1 or n_out < 1:
        raise ValueError(f"sizes must be positive, got n_in={n_in}, n_out={n_out}")
    if align_corners and n_out > 1:
        scale = (_ONE * (n_in - 1) + (n_out - 1) // 2) // (n_out - 1)
    else:
        scale = (_ONE * n_in + n_out // 2) // n_out
    i = torch.arange(n_out, dtype=torch.int64)
    p = i * scale + (scale // 2 - _ONE // 2 if half_pixel_centers else 0)
    lo = torch.div(p, _ONE, rounding_mode="trunc").clamp_min(0)
    hi = torch.div(p + _ONE - 1, _ONE, rounding_mode="trunc").clamp_max(n_in - 1)
    if int(lo[-1]) > n_in - 1:  # scale_10 rounded up, summed over > 1000 outputs per input
        raise ValueError(
            f"resizing {n_in} to {n_out} pixels: LiteRT's kernel would read past the input "
            f"(position {int(p[-1])} / 1024 of {n_in} pixels)"
        )
    frac = p - _ONE * lo
    return lo, hi, _ONE - frac, frac


def tflite_resize_bilinear(
    codes: Tensor,
    dtype: DType,
    out_hw: tuple[int, int],
    align_corners: bool = False,
    half_pixel_centers: bool = True,
) -> Tensor:
    """Codes [N, C, Ho, Wo] in ``dtype`` (INT8 or INT16) of LiteRT's RESIZE_BILINEAR of the
    stored codes [N, C, H, W] (zero point included), at the input's scale and zero point
    (module docstring)."""
    if dtype not in (DType.INT8, DType.INT16):
        raise ValueError(f"RESIZE_BILINEAR takes int8 or int16 codes, got {dtype.name}")
    if codes.dim() != 4:
        raise ValueError(f"codes must be [N, C, H, W], got shape {tuple(codes.shape)}")
    h, w = codes.shape[2:]
    y0, y1, wy0, wy1 = axis_positions(h, out_hw[0], align_corners, half_pixel_centers)
    x0, x1, wx0, wx1 = axis_positions(w, out_hw[1], align_corners, half_pixel_centers)
    c = codes.to(torch.int64)
    top = c[:, :, y0, :] * wy0[:, None]  # rows y0 and y1, weighted per output row
    bottom = c[:, :, y1, :] * wy1[:, None]
    s = (top[..., x0] * wx0 + bottom[..., x0] * wx0) + (top[..., x1] * wx1 + bottom[..., x1] * wx1)
    half = torch.where(s > 0, 1 << 19, -(1 << 19))
    out = torch.div(s + half, 1 << 20, rounding_mode="trunc")
    return out.to(dtype.torch_dtype)


_Q11 = 1 << 11  # XNNPACK's weights: 11 fraction bits


def _float32_ratio(n_in: int, n_out: int, align_corners: bool) -> Tensor:
    """fl32(n_in) / fl32(n_out), or with align_corners (and more than one output)
    fl32(n_in - 1) / fl32(n_out - 1): the float32 size ratio LiteRT's nearest kernel and
    XNNPACK's bilinear one map positions by."""
    if n_in < 1 or n_out < 1:
        raise ValueError(f"sizes must be positive, got n_in={n_in}, n_out={n_out}")
    adjust = int(align_corners and n_out > 1)
    f32 = torch.float32
    return torch.tensor(float(n_in - adjust), dtype=f32) / torch.tensor(float(n_out - adjust))


def xnnpack_axis(n_in: int, n_out: int, align_corners: bool, half_pixel_centers: bool):
    """int64 [n_out] each: (lo, hi, weight of hi in 1/2048) along one axis, as XNNPACK's q11
    indirection computes them (module docstring)."""
    f32 = torch.float32
    ratio = _float32_ratio(n_in, n_out, align_corners)
    i = torch.arange(n_out, dtype=f32)
    if half_pixel_centers and not align_corners:
        offset = ratio * 0.5 - 0.5
        x = (i * ratio + offset).clamp(0.0, float(n_in - 1))
    else:
        x = i * ratio
    lo = x.to(torch.int64)  # truncation; x >= 0
    hi = (lo + 1).clamp_max(n_in - 1)
    a = torch.round((x - lo.to(f32)) * _Q11).to(torch.int64)  # lrintf: half to even
    return lo, hi, a


def xnnpack_resize_bilinear(
    codes: Tensor,
    out_hw: tuple[int, int],
    align_corners: bool = False,
    half_pixel_centers: bool = True,
) -> Tensor:
    """int8 codes [N, C, Ho, Wo] of XNNPACK's int8 bilinear resize of the stored codes
    [N, C, H, W] (zero point included), at the input's scale and zero point (module
    docstring)."""
    if codes.dim() != 4:
        raise ValueError(f"codes must be [N, C, H, W], got shape {tuple(codes.shape)}")
    h, w = codes.shape[2:]
    y0, y1, ay = xnnpack_axis(h, out_hw[0], align_corners, half_pixel_centers)
    x0, x1, ax = xnnpack_axis(w, out_hw[1], align_corners, half_pixel_centers)
    c = codes.to(torch.int64)
    top = c[:, :, y0, :] * (_Q11 - ay)[:, None]
    bottom = c[:, :, y1, :] * ay[:, None]
    rows = top + bottom
    s = rows[..., x0] * (_Q11 - ax) + rows[..., x1] * ax
    out = torch.div(s + (1 << 21), 1 << 22, rounding_mode="floor")
    return out.to(torch.int8)


def tflite_nearest_indices(
    n_in: int, n_out: int, align_corners: bool = False, half_pixel_centers: bool = False
) -> Tensor:
    """int64 [n_out]: the input index each output index reads along one axis, as LiteRT's
    RESIZE_NEAREST_NEIGHBOR computes it (module docstring)."""
    ratio = _float32_ratio(n_in, n_out, align_corners)
    i = torch.arange(n_out, dtype=torch.float32) + (0.5 if half_pixel_centers else 0.0)
    v = i * ratio
    idx = torch.floor(v)
    if align_corners:  # TfLiteRound: half away from zero (v >= 0; v - floor(v) is exact)
        idx = torch.where(v - idx == 0.5, idx + 1, torch.round(v))
    idx = idx.to(torch.int64).clamp_max(n_in - 1)
    return idx.clamp_min(0) if half_pixel_centers else idx


def tflite_resize_nearest(
    codes: Tensor,
    out_hw: tuple[int, int],
    align_corners: bool = False,
    half_pixel_centers: bool = False,
) -> Tensor:
    """Codes [N, C, Ho, Wo] (``codes``' dtype) of LiteRT's RESIZE_NEAREST_NEIGHBOR of the codes
    [N, C, H, W]: a selection, at the input's scale and zero point."""
    if codes.dim() != 4:
        raise ValueError(f"codes must be [N, C, H, W], got shape {tuple(codes.shape)}")
    h, w = codes.shape[2:]
    iy = tflite_nearest_indices(h, out_hw[0], align_corners, half_pixel_centers)
    ix = tflite_nearest_indices(w, out_hw[1], align_corners, half_pixel_centers)
    return codes[:, :, iy, :][:, :, :, ix]
