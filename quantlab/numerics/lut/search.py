"""The MINIMAX strategy's final steps: keep the best measured candidate, then refine it.

Candidates are built by table.py; errors are measured exactly (integer evaluation of every input
code against the saturated function, quantlab.numerics.lut.analysis).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from quantlab.numerics.lut.segment import SegmentLut, all_codes, evaluate_codes_int
from quantlab.numerics.lut.strategies import Strategy
from quantlab.numerics.rounding import round_scalar

MINIMAX_CANDIDATES = (
    Strategy.MINIMAX,
    Strategy.SQRT_CURVATURE,
    Strategy.EVENLY,
    Strategy.CURVATURE,
)


REFINE_PASSES = 2
REFINE_FRACTIONS = (1 / 8, 1 / 32, 1 / 128)


def refine(lut: SegmentLut, err: float, make: Callable, exact: np.ndarray) -> SegmentLut:
    """Coordinate descent on the measured integer max error: move each inner dividing point by
    1/8, 1/32, 1/128 of a neighbouring table's width (at least one code) while that lowers the
    error (REFINE_PASSES sweeps). Moving point k only changes the codes of its two tables (and
    a tail whose slope may follow the adjacent table), so only those are re-evaluated. The
    result is never worse than ``lut``."""
    codes_t = all_codes(lut.in_dtype)
    codes = codes_t.numpy()
    folded = codes
    if lut.symmetric:
        folded = np.where(codes < 0, np.minimum(-codes, lut.in_dtype.qmax), codes)
    cur = np.abs(evaluate_codes_int(lut, codes_t).numpy() - exact)
    best, best_err = lut, err
    last = len(lut.points) - 2
    for _ in range(REFINE_PASSES):
        improved = False
        for k in range(1, len(best.points) - 1):
            for frac in REFINE_FRACTIONS:
                for sign in (-1, 1):
                    pts = list(best.points)
                    width = pts[k + 1] - pts[k] if sign > 0 else pts[k] - pts[k - 1]
                    new = pts[k] + sign * max(1, round_scalar(width * frac))
                    if not pts[k - 1] < new < pts[k + 1]:
                        continue
                    lo, hi = pts[k - 1], pts[k + 1]
                    pts[k] = new
                    cand = make([p * lut.in_scale for p in pts], best.chosen_strategy)
                    if tuple(cand.points) != tuple(pts):
                        continue
                    sel = (folded >= lo) & (folded <= hi)
                    if k == 1:
                        sel |= folded < pts[0]
                    if k == last:
                        sel |= folded > pts[-1]
                    sub = torch.from_numpy(codes[sel])  # numpy mask: no intra-op threads
                    e_sel = np.abs(evaluate_codes_int(cand, sub).numpy() - exact[sel])
                    rest = cur[~sel]
                    cand_err = max(float(e_sel.max()), float(rest.max()) if rest.size else 0.0)
                    if cand_err < best_err:
                        best, best_err, improved = cand, cand_err, True
                        cur[sel] = e_sel
        if not improved:
            break
    return best
