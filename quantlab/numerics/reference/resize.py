"""Bilinear resize reference: Python ints and Fractions, a loop per output pixel."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.reference.rounding import round_fraction
from quantlab.numerics.rounding import Round


def _positions(out: int, size: int, align: bool, scale: float | None, p: int, rnd: Round):
    pos = []
    for d in range(out):
        if align:
            v = Fraction(0) if out == 1 else Fraction(d * (size - 1), out - 1)
        else:
            r = Fraction(size, out) if scale is None else 1 / Fraction(scale)
            v = max((d + Fraction(1, 2)) * r - Fraction(1, 2), Fraction(0))
        pos.append(round_fraction(v * 2**p, rnd))
    return pos


def resize_bilinear_reference(
    codes: Tensor,
    dtype: DType,
    size: tuple[int, int],
    align_corners: bool,
    scales: tuple[float | None, float | None] = (None, None),
    weight_frac_bits: int = 8,
    coord_round: Round = Round.HALF_UP,
    out_rounding: Round = Round.HALF_UP,
) -> np.ndarray:
    """Slow, obviously correct twin of ``numerics.resize.resize_bilinear_fixed`` (int64): per
    output pixel the exact rational source position rounded to P bits, neighbours x0 and
    x0 + 1 (the last pixel past the edge), weights (2^P - f, f), the exact sum rounded at 2P
    bits, clamped to ``dtype``."""
    v = codes.tolist()
    n, c, h, w = codes.shape
    ho, wo = size
    p = weight_frac_bits
    one = 1 << p
    px = _positions(wo, w, align_corners, scales[1], p, coord_round)
    py = _positions(ho, h, align_corners, scales[0], p, coord_round)
    out = np.zeros((n, c, ho, wo), dtype=np.int64)
    for i in range(ho):
        y0, fy = divmod(py[i], one)
        for j in range(wo):
            x0, fx = divmod(px[j], one)
            for b in range(n):
                for k in range(c):
                    acc = 0
                    for dy, wy in ((0, one - fy), (1, fy)):
                        for dx, wx in ((0, one - fx), (1, fx)):
                            acc += v[b][k][min(y0 + dy, h - 1)][min(x0 + dx, w - 1)] * wy * wx
                    r = round_fraction(Fraction(acc, one * one), out_rounding)
                    out[b, k, i, j] = min(max(r, dtype.qmin), dtype.qmax)
    return out
