"""onnxruntime's QLinearConv and QLinearMatMul (CPU, MLAS) restated in numpy.

Sources (microsoft/onnxruntime): ``core/providers/cpu/quantization/qlinearconv.cc``
(``ComputeOutputScale``: ``X_scale * W_scale[i] / Y_scale`` in float32; the symmetric-weight
ConvSym kernels fold ``-zx * sum(w)`` into the bias), ``core/providers/cpu/math/
quantize_linear_matmul.cc``, ``core/mlas/lib/quantize.cpp`` (``MlasRequantizeOutput``:
``cvtepi32_ps``, ``mul_ps``, clamp, ``cvtps_epi32`` in round-to-nearest-even).

Rule (uint8 or int8 activations, any zero points):
acc = int32 (wrapping) sum (x - zx) * (w - zw) + bias, the input padded with zx;
M = fl32(fl32(sx * sw) / sy) per output channel (column); y = clamp(rne(fl32(fl32(acc) * M))
+ zy, qmin, qmax) in the output dtype: one float32 product, ties to even.
"""

from __future__ import annotations

import numpy as np
from oracle_ops import conv_sums, round_half_even, wrap_int32


def conv_acc(c) -> np.ndarray:
    """Exact int32 accumulators (N, O, OH, OW) of a QLinearConvCase, bias included."""
    x = np.transpose(c.x.astype(np.int64), (0, 2, 3, 1))
    w = np.transpose(c.w.astype(np.int64) - c.zw, (0, 2, 3, 1))
    h, wd = c.x.shape[2:]
    kh, kw = c.w.shape[2:]
    out_hw = tuple(
        (n + c.pads[i] + c.pads[i + 2] - c.dilation[i] * (k - 1) - 1) // c.stride[i] + 1
        for i, (n, k) in enumerate(((h, kh), (wd, kw)))
    )
    acc = conv_sums(x, c.zx, w, c.stride, c.dilation, c.pads[:2], out_hw)
    if c.bias is not None:
        acc = acc + c.bias.astype(np.int64)
    return wrap_int32(np.transpose(acc, (0, 3, 1, 2)))


def matmul_acc(c) -> np.ndarray:
    """Exact int32 accumulators (..., M, N) of a QLinearMatMulCase."""
    a = c.a.astype(np.int64) - c.za
    b = c.b.astype(np.int64) - np.asarray(c.zb, np.int64).reshape(1, -1)
    return wrap_int32(a @ b)


def requantize(acc, sx, sw, sy, zy: int, dtype, axis: int) -> np.ndarray:
    """y = clamp(rne(fl32(fl32(acc) * fl32(fl32(sx * sw) / sy))) + zy) along ``axis``."""
    m = (np.float32(sx) * np.asarray(sw, np.float32).reshape(-1)) / np.float32(sy)
    shape = [1] * acc.ndim
    shape[axis] = m.size
    f = acc.astype(np.float32) * m.reshape(shape)
    info = np.iinfo(dtype)
    return np.clip(round_half_even(f.astype(np.float64)) + zy, info.min, info.max).astype(dtype)


def qlinearconv(c) -> np.ndarray:
    """Output codes of onnxruntime's QLinearConv for a QLinearConvCase."""
    return requantize(conv_acc(c), c.sx, c.sw, c.sy, c.zy, c.x.dtype, 1)


def qlinearmatmul(c) -> np.ndarray:
    """Output codes of onnxruntime's QLinearMatMul for a QLinearMatMulCase."""
    return requantize(matmul_acc(c), c.sa, c.sb, c.sy, c.zy, c.a.dtype, -1)
