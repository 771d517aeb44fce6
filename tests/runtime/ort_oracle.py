"""onnxruntime's QLinearConv and QLinearMatMul (CPU, MLAS) restated in numpy.

Sources (microsoft/onnxruntime): ``core/providers/cpu/quantization/qlinearconv.cc``
(``ComputeOutputScale``: ``X_scale * W_scale[i] / Y_scale`` in float32; the symmetric-weight
ConvSym kernels fold ``-zx * sum(w)`` into the bias), ``core/providers/cpu/math/
quantize_linear_matmul.cc``, ``core/mlas/lib/quantize.cpp`` (``MlasRequantizeOutput``:
``cvtepi32_ps``, ``mul_ps``, clamp, ``cvtps_epi32`` in round-to-nearest-even).

Rule (uint8 or int8 activations, any zero points):
acc = int32 (wrapping) sum (x - zx) * (w - zw) + bias, the input padded with zx;
on a machine whose onnxruntime saturates uint8 x int8 product pairs (x86 without VNNI,
``quantlab.export.ort_host``) a uint8 x int8 sum is instead sum' x w - zw sum x - zx sum w
+ K zx zw, sum' adding adjacent raw-code products (K in (row, column, channel) order for a
convolution, zero-padded to even) each clamped to int16; depthwise convolutions stay exact;
M = fl32(fl32(sx * sw) / sy) per output channel (column); y = clamp(rne(fl32(fl32(acc) * M))
+ zy, qmin, qmax) in the output dtype: one float32 product, ties to even.
"""

from __future__ import annotations

import numpy as np
from oracle_ops import conv_sums, round_half_even, wrap_int32


def _pairs(x_dtype, w_dtype) -> bool:
    from quantlab.export.ort_host import onnxruntime_saturates_u8s8

    u8s8 = np.dtype(x_dtype) == np.uint8 and np.dtype(w_dtype) == np.int8
    return u8s8 and onnxruntime_saturates_u8s8()


def _pair_sums(a: np.ndarray, b: np.ndarray, za: int, zb) -> np.ndarray:
    """sum' a b - zb sum a - za sum b + K za zb over the last axis of a (..., K) and b (K, N)
    (zb scalar or per column)."""
    k = a.shape[-1]
    a2, b2 = a.astype(np.int64), b.astype(np.int64)
    if k % 2:
        a2 = np.concatenate([a2, np.zeros(a2.shape[:-1] + (1,), np.int64)], -1)
        b2 = np.concatenate([b2, np.zeros((1, b2.shape[1]), np.int64)], 0)
    prod = a2[..., :, None] * b2  # (..., K, N)
    pairs = np.clip(prod[..., 0::2, :] + prod[..., 1::2, :], -32768, 32767).sum(-2)
    zb = np.asarray(zb, np.int64).reshape(1, -1)
    rows = a.astype(np.int64).sum(-1, keepdims=True)
    return pairs - zb * rows - za * b.astype(np.int64).sum(0) + k * za * zb


def _conv_pair_acc(c) -> np.ndarray:
    """The pair-saturated sums (N, O, OH, OW) of a uint8 x int8 QLinearConvCase."""
    x = c.x.astype(np.int64)
    n, ch, h, wd = x.shape
    t, left, bottom, right = c.pads
    xp = np.full((n, ch, h + t + bottom, wd + left + right), c.zx, np.int64)
    xp[:, :, t : t + h, left : left + wd] = x
    o, cg, kh, kw = c.w.shape
    (dh, dw), (sh, sw) = c.dilation, c.stride
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    og = o // c.group
    acc = np.zeros((n, o, oh, ow), np.int64)
    for g in range(c.group):
        xg = xp[:, g * cg : (g + 1) * cg]
        taps = np.stack(
            [
                xg[
                    :,
                    :,
                    i * dh : i * dh + sh * (oh - 1) + 1 : sh,
                    j * dw : j * dw + sw * (ow - 1) + 1 : sw,
                ]
                for i in range(kh)
                for j in range(kw)
            ],
            -1,
        )  # (N, Cg, OH, OW, KH * KW)
        cols = np.moveaxis(taps, 1, -1).reshape(n, oh, ow, -1)  # K order (row, column, channel)
        wg = np.transpose(c.w[g * og : (g + 1) * og], (2, 3, 1, 0)).reshape(-1, og)
        acc[:, g * og : (g + 1) * og] = np.moveaxis(_pair_sums(cols, wg, c.zx, c.zw), -1, 1)
    return acc


def conv_acc(c) -> np.ndarray:
    """int32 accumulators (N, O, OH, OW) of a QLinearConvCase, bias included (exact, or pair
    saturated where this machine's onnxruntime saturates)."""
    o, cg = c.w.shape[:2]
    if _pairs(c.x.dtype, c.w.dtype) and not (cg == 1 and o == c.group == c.x.shape[1]):
        acc = _conv_pair_acc(c)
        if c.bias is not None:
            acc = acc + c.bias.astype(np.int64).reshape(1, -1, 1, 1)
        return wrap_int32(acc)
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
    """int32 accumulators (..., M, N) of a QLinearMatMulCase (exact, or pair saturated)."""
    if _pairs(c.a.dtype, c.b.dtype):
        return wrap_int32(_pair_sums(c.a, c.b, int(c.za), c.zb))
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
