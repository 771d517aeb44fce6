"""The slope of a built segment table: the gradient a deployment-aware QAT trains with.

A ``SegmentLut`` is a piecewise-linear function of the input code (linear interpolation between
table entries, linear tails outside the dividing points, a 256-entry table in direct mode); its
own slope per input code is what a straight-through estimator of the deployed table passes back
(the rounding of each output to an integer code is ignored, as QAT ignores any rounding).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.lut.segment import SegmentLut, segment_position


def segment_slope(lut: SegmentLut, codes: Tensor) -> Tensor:
    """d(output code)/d(input code) of ``lut``'s piecewise-linear function at each input code
    (any integer dtype; float64 result, same shape).

    Inner tables: (T[j+1] - T[j]) * index_mult / 2**(index_shift + frac_bits) (one table step
    per 2**frac_bits index units); tails: k / 2**rshift; direct mode: the central difference of
    the 256-entry table (one-sided at its ends). Where the unclipped output lies beyond the
    output dtype's range the slope is 0 (the output saturates). Symmetric tables mirror codes
    below 0 (odd function: the same slope).
    """
    x = codes.detach().cpu().numpy().astype(np.int64)
    if lut.direct:
        t = lut.direct_table.astype(np.float64)
        d = np.gradient(t)
        return torch.from_numpy(d[x + 128]).reshape(codes.shape)
    fmt = lut.fmt
    omin, omax = lut.out_dtype.qmin, lut.out_dtype.qmax
    _, a, i, raw = segment_position(lut, x)
    d = np.asarray(lut.points, dtype=np.int64)
    mult = np.asarray(lut.index_mult, dtype=np.float64)[i]
    shift = np.asarray(lut.index_shift, dtype=np.int64)[i]
    f = fmt.index_frac_bits
    idx = np.clip(raw, 0, None)
    j = np.minimum(idx >> f, fmt.entries - 2)
    t0 = lut.tables[i, j].astype(np.float64)
    t1 = lut.tables[i, j + 1].astype(np.float64)
    slope = (t1 - t0) * mult / np.exp2(shift + f)
    y = t0 + (t1 - t0) * (idx - (j << f)) / float(1 << f)
    for tail, mask in ((lut.left, a < d[0]), (lut.right, a > d[-1])):
        k = tail.k / 2.0**tail.rshift
        ty = (a * tail.k + float(tail.b) * 2.0**tail.lshift) / 2.0**tail.rshift
        slope = np.where(mask, k, slope)
        y = np.where(mask, ty, y)
    slope = np.where((y < omin) | (y > omax), 0.0, slope)
    return torch.from_numpy(slope).reshape(codes.shape)
