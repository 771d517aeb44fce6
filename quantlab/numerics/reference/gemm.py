"""Integer GEMM references: numpy int64 sums (no BLAS, no floats), loops where needed, and the
accumulator contract on Python ints."""

from __future__ import annotations

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.reference.arrays import as_numpy, as_tuple


def int_matmul(a, b) -> np.ndarray:
    """a @ b in numpy int64 (numpy's integer matmul is a plain loop, exact below 2**63)."""
    return np.matmul(as_numpy(a).astype(np.int64), as_numpy(b).astype(np.int64))


def int_linear(x, w) -> np.ndarray:
    """x @ w.T in numpy int64."""
    return int_matmul(x, as_numpy(w).T)


def int_conv2d(x, w, stride=1, padding=0, dilation=1, groups: int = 1) -> np.ndarray:
    """Zero-padded conv2d in numpy int64: a loop over groups and kernel taps, each tap an
    int64 einsum of a strided input slice with one weight column."""
    return _conv2d_loops(
        as_numpy(x).astype(np.int64),
        as_numpy(w).astype(np.int64),
        stride,
        padding,
        dilation,
        groups,
    )


def _conv2d_loops(x, w, stride, padding, dilation, groups):
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
    xp = np.zeros((n, cin, h + 2 * ph, wd + 2 * pw), dtype=x.dtype)
    xp[:, :, ph : ph + h, pw : pw + wd] = x
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
