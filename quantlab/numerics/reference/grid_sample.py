"""grid_sample reference: Python ints and Fractions, a loop per output pixel."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample import GridCoord, Padding, QGrid, SampleMode
from quantlab.numerics.reference.rounding import round_fraction
from quantlab.numerics.rounding import Round


def grid_sample_reference(
    x_codes: Tensor,
    x_dtype: DType,
    qgrid: QGrid,
    mode: SampleMode = SampleMode.BILINEAR,
    padding_mode: Padding = Padding.ZEROS,
    out_rounding: Round = Round.HALF_UP,
    weight_frac_bits: int = 8,
    coord_round: Round = Round.HALF_UP,
    nearest_round: Round = Round.HALF_EVEN,
) -> Tensor:
    """Slow, obviously correct twin of ``grid_sample_fixed``: Python ints and Fractions, loops.

    Position: the exact rational ``unnormalize(code * scale)`` (Fraction) rounded to P bits;
    ABSOLUTE codes are taken as they are. Then the textbook bilinear/nearest formula per pixel.
    """
    xs = x_codes.to(torch.int64).numpy()
    codes = qgrid.codes.to(torch.int64).numpy()
    n, ch, h, w = xs.shape
    _, ho, wo, _ = codes.shape
    out = np.zeros((n, ch, ho, wo), dtype=np.int64)
    if qgrid.coord is GridCoord.ABSOLUTE:
        p = qgrid.frac_bits
    else:
        p = weight_frac_bits
    one = 1 << p

    def position(code: int, scale: float, size: int) -> int:
        if qgrid.coord is GridCoord.ABSOLUTE:
            return code
        g = Fraction(code) * Fraction(scale)
        if qgrid.align_corners:
            pos = (g + 1) / 2 * (size - 1)
        else:
            pos = ((g + 1) * size - 1) / 2
        return round_fraction(pos * one, coord_round)

    def pixel(b: int, c: int, iy: int, ix: int) -> int:
        if padding_mode is Padding.BORDER:
            iy, ix = min(max(iy, 0), h - 1), min(max(ix, 0), w - 1)
        elif not (0 <= iy < h and 0 <= ix < w):
            return 0
        return int(xs[b, c, iy, ix])

    for b in range(n):
        for i in range(ho):
            for j in range(wo):
                px = position(int(codes[b, i, j, 0]), qgrid.scale_x, w)
                py = position(int(codes[b, i, j, 1]), qgrid.scale_y, h)
                for c in range(ch):
                    if mode is SampleMode.NEAREST:
                        ix = round_fraction(Fraction(px, one), nearest_round)
                        iy = round_fraction(Fraction(py, one), nearest_round)
                        v = pixel(b, c, iy, ix)
                    else:
                        x0, y0 = px // one, py // one
                        fx, fy = px - x0 * one, py - y0 * one
                        acc = (
                            pixel(b, c, y0, x0) * (one - fy) * (one - fx)
                            + pixel(b, c, y0, x0 + 1) * (one - fy) * fx
                            + pixel(b, c, y0 + 1, x0) * fy * (one - fx)
                            + pixel(b, c, y0 + 1, x0 + 1) * fy * fx
                        )
                        v = round_fraction(Fraction(acc, one * one), out_rounding)
                    out[b, c, i, j] = min(max(v, x_dtype.qmin), x_dtype.qmax)
    return torch.from_numpy(out).to(x_dtype.torch_dtype)
