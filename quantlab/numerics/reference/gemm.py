"""Integer GEMM references: numpy int64 sums (no BLAS, no floats), loops where needed, and the
accumulator contract on Python ints."""

from __future__ import annotations

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.reference.arrays import as_numpy, as_tuple


def int_matmul(a, b, zero_point: int = 0) -> np.ndarray:
    """(a - zero_point) @ b in numpy int64 (numpy's integer matmul is a plain loop, exact
    below 2**63)."""
    return np.matmul(as_numpy(a).astype(np.int64) - zero_point, as_numpy(b).astype(np.int64))


def int_linear(x, w, zero_point: int = 0) -> np.ndarray:
    """(x - zero_point) @ w.T in numpy int64."""
    return int_matmul(x, as_numpy(w).T, zero_point)


def int_conv2d(
    x, w, stride=1, padding=0, dilation=1, groups: int = 1, zero_point: int = 0
) -> np.ndarray:
    """conv2d of (x - zero_point) in numpy int64, x padded with ``zero_point`` (a padded tap
    adds w * 0): a loop over groups and kernel taps, each tap an int64 einsum of a strided
    input slice with one weight column."""
    return _conv2d_loops(
        as_numpy(x).astype(np.int64),
        as_numpy(w).astype(np.int64),
        stride,
        padding,
        dilation,
        groups,
        zero_point,
    )


def _conv2d_loops(x, w, stride, padding, dilation, groups, zero_point=0):
    """The tap loop on arrays of any exact dtype (int64, or object holding Python ints)."""
    squeeze = x.ndim == 3
    if squeeze:
        x = x[None]
    sh, sw = as_tuple(stride, 2)
    ph, pw = as_tuple(padding, 2)
    dh, dw = as_tuple(dilation, 2)
    n, cin, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    cout_g = cout // groups
    xp = np.full((n, cin, h + 2 * ph, wd + 2 * pw), zero_point, dtype=x.dtype)
    xp[:, :, ph : ph + h, pw : pw + wd] = x
    xp = xp - zero_point
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, cout, ho, wo), dtype=x.dtype)
    for g in range(groups):
        xs = xp[:, g * cin_g : (g + 1) * cin_g]
        wg = w[g * cout_g : (g + 1) * cout_g]
        for i in range(kh):
            for j in range(kw):
                tap = xs[
                    :,
                    :,
                    i * dh : i * dh + sh * (ho - 1) + 1 : sh,
                    j * dw : j * dw + sw * (wo - 1) + 1 : sw,
                ]
                out[:, g * cout_g : (g + 1) * cout_g] += np.einsum(
                    "nchw,oc->nohw", tap, wg[:, :, i, j]
                )
    return out[0] if squeeze else out


def int_conv1d(x, w, stride=1, padding=0, dilation=1, groups: int = 1) -> np.ndarray:
    """conv1d as conv2d over a height-1 image (numpy int64)."""
    x = as_numpy(x)
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
    out = int_conv2d(
        x[:, :, None, :],
        as_numpy(w)[:, :, None, :],
        (1, as_tuple(stride, 1)[0]),
        (0, as_tuple(padding, 1)[0]),
        (1, as_tuple(dilation, 1)[0]),
        groups,
    )[:, :, 0, :]
    return out[0] if squeeze else out


def accumulate(acc, dtype: DType = DType.INT32, saturate: bool = True) -> tuple[np.ndarray, int]:
    """Saturate or two's-complement wrap Python ints to ``dtype``; count those outside."""
    lo, hi = dtype.qmin, dtype.qmax
    vals = [int(v) for v in as_numpy(acc).ravel()]
    count = sum(1 for v in vals if v < lo or v > hi)
    if saturate:
        out = [min(max(v, lo), hi) for v in vals]
    else:
        out = [((v - lo) % (1 << dtype.bits)) + lo for v in vals]
    return np.array(out, dtype=np.int64).reshape(as_numpy(acc).shape), count


def int_conv_transpose2d(
    x, w, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1, zero_point: int = 0
) -> np.ndarray:
    """conv_transpose2d of (x - zero_point) in numpy int64, by its definition: input pixel
    (i, j) of channel c adds x * w[c, o, u, v] to output (i * sh - ph + u * dh, j * sw - pw +
    v * dw) of channel o of c's group (positions outside the output are dropped); a loop over
    groups and kernel taps, each an int64 einsum scattered on a strided output slice."""
    x = as_numpy(x).astype(np.int64) - zero_point
    w = as_numpy(w).astype(np.int64)
    squeeze = x.ndim == 3
    if squeeze:
        x = x[None]
    sh, sw = as_tuple(stride, 2)
    ph, pw = as_tuple(padding, 2)
    oph, opw = as_tuple(output_padding, 2)
    dh, dw = as_tuple(dilation, 2)
    n, cin, h, wd = x.shape
    _, cout_g, kh, kw = w.shape
    cin_g = cin // groups
    ho = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    wo = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    # the full (uncropped) output, then the crop by the padding
    full = np.zeros((n, groups * cout_g, ho + 2 * ph, wo + 2 * pw), dtype=np.int64)
    for g in range(groups):
        xs = x[:, g * cin_g : (g + 1) * cin_g]
        wg = w[g * cin_g : (g + 1) * cin_g]
        for u in range(kh):
            for v in range(kw):
                part = np.einsum("nchw,co->nohw", xs, wg[:, :, u, v])
                r0, c0 = u * dh, v * dw
                rows = slice(r0, r0 + sh * (h - 1) + 1, sh)
                cols = slice(c0, c0 + sw * (wd - 1) + 1, sw)
                hh, ww = full[:, :, rows, cols].shape[2:]
                full[:, g * cout_g : (g + 1) * cout_g, rows, cols] += part[:, :, :hh, :ww]
    out = full[:, :, ph : ph + ho, pw : pw + wo]
    return out[0] if squeeze else out


def int_conv_transpose1d(
    x, w, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1, zero_point: int = 0
) -> np.ndarray:
    """conv_transpose1d as conv_transpose2d over a height-1 image (numpy int64)."""
    x = as_numpy(x)
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
    out = int_conv_transpose2d(
        x[:, :, None, :],
        as_numpy(w)[:, :, None, :],
        (1, as_tuple(stride, 1)[0]),
        (0, as_tuple(padding, 1)[0]),
        (0, as_tuple(output_padding, 1)[0]),
        groups,
        (1, as_tuple(dilation, 1)[0]),
        zero_point,
    )[:, :, 0, :]
    return out[0] if squeeze else out
