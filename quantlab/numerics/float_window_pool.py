"""ONNX Runtime's QLinearAveragePool (CPU), the kernel a QDQ graph's DequantizeLinear ->
AveragePool -> QuantizeLinear is fused into: every code dequantized in float32,
fl32(s_x * (c - z_x)); each window summed in float32 from 0, row by row, padding skipped; the
sum divided in float32 by the kernel's size (count_include_pad) or by the number of the
window's positions inside the input (count_include_pad=0); then
nearbyint(fl32(fl32(y / s_y) + z_y)) (the zero point added in float32 before rounding half to
even), saturated to the code range. Codes are held as the runtime holds them: quantlab's codes
plus ``held_offset`` (128 for int8 codes held as uint8), which changes the float32 rounding of
the last step. Pure functions on integer tensors.

``global_mean_in_range``: the scales QLinearGlobalAveragePool (an integer sum, requantized once)
accepts: 2**-32 <= fl32(s_x / fl32(s_y * N)) < 256; it refuses to run others ("parameter out of
computation range"), so such a mean stays a float ReduceMean.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import dequantize
from quantlab.numerics.rounding import Round, round_float


def float_window_avg_pool2d(
    codes: Tensor,
    x_scale: Tensor,
    x_zero_point: int,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    y_scale: Tensor,
    y_zero_point: int,
    out: DType,
    held_offset: int = 0,
    count_include_pad: bool = True,
) -> Tensor:
    """Output codes (int64, quantlab's: without ``held_offset``) of an average pool over
    (N, C, H, W) ``codes``; the divisor counts the zero padding when ``count_include_pad``,
    else only the window's positions inside the input."""
    x = dequantize(codes, x_scale, zero_point=x_zero_point)  # float32: fl32(s * (c - z))
    ph, pw = padding
    if ph or pw:  # padded positions add +0.0: the running float32 sums are unchanged
        x = F.pad(x, (pw, pw, ph, ph))
    kh, kw = kernel
    sh, sw = stride
    ho = (x.shape[-2] - kh) // sh + 1
    wo = (x.shape[-1] - kw) // sw + 1
    acc = torch.zeros(*x.shape[:-2], ho, wo, dtype=torch.float32)
    for i in range(kh):  # the window row by row, each row left to right: the runtime's order
        for j in range(kw):
            acc += x[..., i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw]
    if count_include_pad:
        count = torch.tensor(float(kh * kw), dtype=torch.float32)
    else:  # the kernel's (min(start + k, size) - max(start, 0)) per axis, multiplied
        rows = _inside(ho, sh, ph, kh, x.shape[-2] - 2 * ph)
        cols = _inside(wo, sw, pw, kw, x.shape[-1] - 2 * pw)
        count = (rows[:, None] * cols[None, :]).to(torch.float32)
    y = acc / count
    zy = torch.tensor(float(y_zero_point + held_offset), dtype=torch.float32)
    q = round_float(y / y_scale.to(torch.float32) + zy, Round.HALF_EVEN)
    lo, hi = out.qmin + held_offset, out.qmax + held_offset
    return q.clamp(lo, hi).to(torch.int64) - held_offset


def _inside(n_out: int, stride: int, pad: int, k: int, size: int) -> Tensor:
    """Per output position along one axis: how many of its window's k positions lie inside
    the input of ``size`` (int64)."""
    start = torch.arange(n_out, dtype=torch.int64) * stride - pad
    return (start + k).clamp_max(size) - start.clamp_min(0)


def global_mean_in_range(x_scale, y_scale, count: int) -> bool:
    """Whether QLinearGlobalAveragePool runs a mean of ``count`` values from ``x_scale`` to
    ``y_scale`` (float32 scales): 2**-32 <= fl32(x_scale / fl32(y_scale * count)) < 256."""
    sx = torch.as_tensor(x_scale, dtype=torch.float32)
    ratio = sx / (torch.as_tensor(y_scale, dtype=torch.float32) * float(count))
    return bool(2.0**-32 <= float(ratio) < 256.0)
