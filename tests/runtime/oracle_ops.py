"""Exact integer building blocks shared by the runtime oracles (numpy int64, no quantlab).

The oracles in ``tflite_oracle``, ``xnnpack_oracle`` and ``ort_oracle`` restate each runtime's
integer rules from its sources; these helpers hold what they share: exact sums of
``w * (x - zero_point)`` for NHWC conv, depthwise and fully connected layers, two's complement
wrapping, and C's rounding functions written out so that every tie is explicit.
"""

from __future__ import annotations

import numpy as np
from litert_models import ConvCase, FullyConnectedCase, conv_output_size, same_padding_before

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


def wrap_int32(v: np.ndarray) -> np.ndarray:
    """Two's complement wrap of int64 values to int32 (what an int32 accumulator does)."""
    v = np.asarray(v, dtype=np.int64)
    return ((v - INT32_MIN) % (1 << 32)) + INT32_MIN


def c_div(num: np.ndarray, den: int) -> np.ndarray:
    """C integer division (truncates toward zero) of int64 values by a positive ``den``."""
    num = np.asarray(num, dtype=np.int64)
    return np.where(num >= 0, num // den, -((-num) // den))


def round_half_away(v: np.ndarray) -> np.ndarray:
    """C ``round`` / ``roundf``: nearest integer, ties away from zero, as float64.

    Exact for every float64 input: ``v - trunc(v)`` is exact, so the tie test sees the true
    fraction (``floor(v + 0.5)`` would round 0.49999999999999994 up).
    """
    v = np.asarray(v, dtype=np.float64)
    t = np.trunc(v)
    return t + np.sign(v) * (np.abs(v - t) >= 0.5)


def round_half_even(v: np.ndarray) -> np.ndarray:
    """``lrintf`` / ``cvtps2dq`` in the default mode: nearest integer, ties to even."""
    return np.rint(np.asarray(v))


def conv_sums(x, zx, w, stride, dilation, pad_before, out_hw) -> np.ndarray:
    """Exact sum over (ky, kx, ci) of w[o, ky, kx, ci] * (x - zx) for a TFLite CONV_2D.

    x: (N, H, W, C) codes; w: (O, KH, KW, C / groups) codes (groups = C / w.shape[3]); taps
    that fall outside the input contribute nothing (TFLite skips them; a runtime that pads
    with ``zx`` adds w * 0). Returns int64 (N, OH, OW, O).
    """
    x = np.asarray(x, np.int64) - int(zx)
    w = np.asarray(w, np.int64)
    n, h, wd, c = x.shape
    o, kh, kw, cg = w.shape
    groups = c // cg
    og = o // groups
    oh, ow = out_hw
    acc = np.zeros((n, oh, ow, o), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = _tap(
                x,
                ky * dilation[0] - pad_before[0],
                kx * dilation[1] - pad_before[1],
                stride,
                out_hw,
            )
            for g in range(groups):
                xs = patch[..., g * cg : (g + 1) * cg]
                ws = w[g * og : (g + 1) * og, ky, kx, :]
                acc[..., g * og : (g + 1) * og] += np.einsum("nhwc,oc->nhwo", xs, ws)
    return acc


def depthwise_sums(x, zx, w, multiplier, stride, dilation, pad_before, out_hw) -> np.ndarray:
    """Exact sums of a TFLite DEPTHWISE_CONV_2D: output channel ic * multiplier + m sees input
    channel ic only. w: (1, KH, KW, C * multiplier). Returns int64 (N, OH, OW, C * mult)."""
    x = np.asarray(x, np.int64) - int(zx)
    w = np.asarray(w, np.int64)[0]
    kh, kw, o = w.shape
    xin = np.repeat(x, multiplier, axis=3)  # channel ic*m + j reads input channel ic
    oh, ow = out_hw
    acc = np.zeros((x.shape[0], oh, ow, o), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = _tap(
                xin,
                ky * dilation[0] - pad_before[0],
                kx * dilation[1] - pad_before[1],
                stride,
                out_hw,
            )
            acc += patch * w[ky, kx]
    return acc


def _tap(x, oy, ox, stride, out_hw) -> np.ndarray:
    """x[n, oy + i*sy, ox + j*sx, :] for every output (i, j); zero where outside the input."""
    n, h, w, c = x.shape
    oh, ow = out_hw
    ys = oy + stride[0] * np.arange(oh)
    xs = ox + stride[1] * np.arange(ow)
    vy = (ys >= 0) & (ys < h)
    vx = (xs >= 0) & (xs < w)
    out = x[:, np.clip(ys, 0, h - 1)][:, :, np.clip(xs, 0, w - 1)]
    return out * (vy[:, None] & vx[None, :])[None, :, :, None]


def fc_sums(x, zx, w, zw=0) -> np.ndarray:
    """Exact sums (x - zx) @ (w - zw).T for x (B, K), w (units, K). Returns int64 (B, units)."""
    return (np.asarray(x, np.int64) - int(zx)) @ (np.asarray(w, np.int64) - int(zw)).T


def conv_acc(c: ConvCase) -> np.ndarray:
    """Exact bias + sum w*(x - zx) of a ConvCase (int64, NHWC; before any accumulator width)."""
    hw = c.x.shape[1:3]
    k = c.w.shape[1:3]
    out_hw = conv_output_size(hw, k, c.stride, c.dilation, c.padding)
    pads = same_padding_before(hw, k, c.stride, c.dilation, c.padding)
    if c.depth_multiplier:
        acc = depthwise_sums(
            c.x, c.xq.zero_point, c.w, c.depth_multiplier, c.stride, c.dilation, pads, out_hw
        )
    else:
        acc = conv_sums(c.x, c.xq.zero_point, c.w, c.stride, c.dilation, pads, out_hw)
    return acc + c.bias.astype(np.int64)


def fc_acc(c: FullyConnectedCase) -> np.ndarray:
    """Exact bias + sum w*(x - zx) of a FullyConnectedCase (int64, (B, units))."""
    acc = fc_sums(c.x, c.xq.zero_point, c.w)
    return acc if c.bias is None else acc + c.bias.astype(np.int64)
