"""Bilinear resize in fixed point, on grid_sample's integer sampler (**assumed**: the J6 AAE
runs resize and warping, j6-numerics s.4 and seeds-summary; no vendor document gives its
resize arithmetic).

Each output pixel's source position along an axis is the exact rational of torch's mapping,
rounded once to ``P`` fractional bits with ``coord_round``: ``d (in - 1) / (out - 1)`` with
``align_corners`` (0 for one output pixel), else ``(d + 1/2) r - 1/2`` clamped at 0, where
``r`` is ``1 / scale`` for a scale factor torch maps by (the float's exact value) and
``in / out`` otherwise. The four neighbours' codes (the edge pixel repeated past the last
one, as torch clamps its second index) are weighted ``(2^P - f, f)`` per axis, summed exactly
in int64 (2P fractional bits) and rounded once to the input's codes with ``out_rounding``:
``grid_sample.grid_sample_fixed`` on that grid of absolute positions.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample import GridCoord, Padding, QGrid, SampleMode, grid_sample_fixed
from quantlab.numerics.rounding import Round, round_rational


@functools.lru_cache(maxsize=256)
def _positions(out: int, size: int, align: bool, scale: float | None, p: int, rnd: Round):
    if align:
        if out == 1:
            return (0,) * out
        exact = [Fraction(d * (size - 1), out - 1) for d in range(out)]
    else:
        r = Fraction(size, out) if scale is None else 1 / Fraction(scale)
        exact = [max((d + Fraction(1, 2)) * r - Fraction(1, 2), Fraction(0)) for d in range(out)]
    return tuple(round_rational(v * (1 << p), rnd) for v in exact)


def source_positions(
    out: int,
    size: int,
    align_corners: bool,
    scale: float | None = None,
    frac_bits: int = 8,
    coord_round: Round = Round.HALF_UP,
) -> Tensor:
    """int64 source positions of ``out`` output pixels over an axis of ``size`` input pixels,
    with ``frac_bits`` fractional bits (module docstring); ``scale``: the scale factor torch
    maps by (None: the size ratio; unused with ``align_corners``)."""
    if out < 1 or size < 1:
        raise ValueError(f"resize sizes must be >= 1, got out={out}, size={size}")
    if not 0 <= frac_bits <= 15:
        raise ValueError(f"frac_bits must be in [0, 15], got {frac_bits}")
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    key = None if align_corners or scale is None else float(scale)
    pos = _positions(out, size, bool(align_corners), key, frac_bits, coord_round)
    return torch.tensor(pos, dtype=torch.int64)


def resize_bilinear_fixed(
    codes: Tensor,
    dtype: DType,
    size: tuple[int, int],
    align_corners: bool,
    scales: tuple[float | None, float | None] = (None, None),
    weight_frac_bits: int = 8,
    coord_round: Round = Round.HALF_UP,
    out_rounding: Round = Round.HALF_UP,
) -> Tensor:
    """Integer bilinear resize of ``codes`` [N, C, H, W] (``dtype``) to ``size`` (Ho, Wo);
    returns codes in ``dtype`` at the input's scale (module docstring). ``scales``: (H, W)
    scale factors torch maps by (None: the size ratio). A convex combination of input codes,
    so no code leaves the input's range."""
    if codes.dim() != 4:
        raise ValueError(f"codes must have shape [N, C, H, W], got {tuple(codes.shape)}")
    n, _, h, w = codes.shape
    ho, wo = size
    p = weight_frac_bits
    px = source_positions(wo, w, align_corners, scales[1], p, coord_round)
    py = source_positions(ho, h, align_corners, scales[0], p, coord_round)
    grid = torch.stack(torch.broadcast_tensors(px[None, :], py[:, None]), -1)
    qgrid = QGrid(
        codes=grid.expand(n, ho, wo, 2),
        coord=GridCoord.ABSOLUTE,
        dtype=DType.INT32,
        in_h=h,
        in_w=w,
        align_corners=align_corners,
        frac_bits=p,
    )
    return grid_sample_fixed(
        codes,
        1.0,
        dtype,
        qgrid,
        SampleMode.BILINEAR,
        Padding.BORDER,
        align_corners,
        out_rounding=out_rounding,
        weight_frac_bits=p,
        coord_round=coord_round,
    )
