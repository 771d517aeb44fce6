"""DATA: dividing points that minimise the error weighted by an op's input histogram, with the
worst case over every input code bounded by a factor of OPTIMAL's.

Objective. With ``p(q)`` the probability that an input quantizes to code q (``InputHistogram``:
the histogram's density, uniform inside each bin, integrated over each code's rounding cell;
mass beyond the input range saturates to the end codes), DATA minimises the mean error
``sum_q p(q) |LUT(q) - saturate(f(q s_in))|`` (output LSBs) subject to
``max_q |LUT(q) - saturate(f)| <= factor x`` OPTIMAL's max error (``LutSpec.data_error_factor``),
over the same kind of candidate set as OPTIMAL (optimal.py, with DATA_SEARCH: exhaustive for
ranges of at most ``exhaustive_codes`` codes; else every point set from a grid of quantiles of a
density in equal parts uniform, curvature and the data's mass, plus OPTIMAL's points, and the
refinement boxes around the incumbent). The tails depend only on d_0 and d_T, so the table
costs decide both objective and constraint (segment_cost.py). OPTIMAL's points are candidates
and satisfy the constraint (factor >= 1), hence DATA's weighted error is never above
OPTIMAL's, and its max error is at most ``factor`` times OPTIMAL's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.optimal import (
    CandidateSearch,
    SearchResult,
    curvature_density,
    searched_points,
)
from quantlab.numerics.lut.point_dp import Objective
from quantlab.numerics.lut.segment_cost import SegmentCosts

DATA_SEARCH = CandidateSearch(grid_points=32, end_points_per_octave=0, window=2)
"""DATA's candidates: fewer than OPTIMAL's, as a weighted sum is certified by evaluating every
code of each table that could lie on a better point set."""


@dataclass(frozen=True)
class InputHistogram:
    """Counts of an op's inputs in ``len(counts)`` equal-width bins over ``[lo, hi]`` (float
    input units), e.g. a calibration observer's histogram. Frozen and hashable (a built table is
    cached on it)."""

    lo: float
    hi: float
    counts: tuple[float, ...]

    def __post_init__(self) -> None:
        lo, hi = float(self.lo), float(self.hi)
        if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
            raise ValueError(f"InputHistogram needs finite lo < hi, got [{self.lo}, {self.hi}]")
        counts = tuple(float(c) for c in np.asarray(self.counts, dtype=np.float64).reshape(-1))
        if not counts or any(not math.isfinite(c) or c < 0 for c in counts) or sum(counts) <= 0:
            raise ValueError(
                "InputHistogram.counts must be finite, non-negative and not all zero "
                f"({len(counts)} bins given)"
            )
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "counts", counts)

    def code_weights(self, in_dtype: DType, in_scale: float) -> np.ndarray:
        """Probability of every input code of ``in_dtype`` (ascending from qmin, float64, sum 1):
        the histogram mass in each code's rounding cell ``[(q - 1/2) s, (q + 1/2) s)``, the end
        codes taking everything beyond them."""
        counts = np.asarray(self.counts)
        edges = np.linspace(self.lo, self.hi, len(counts) + 1)
        cum = np.concatenate([[0.0], np.cumsum(counts)])
        cells = (np.arange(in_dtype.qmin, in_dtype.qmax + 2) - 0.5) * float(in_scale)
        mass = np.interp(cells, edges, cum)
        mass[0], mass[-1] = 0.0, cum[-1]
        return np.diff(mass) / cum[-1]


def data_density(costs: SegmentCosts) -> np.ndarray:
    """Quantile density of DATA's grid on the codes of the table range: equal parts uniform,
    curvature (optimal.curvature_density) and the data's probability of each folded code."""
    p = costs.problem
    sl = slice(p.first - p.fold_min, p.last - p.fold_min + 1)
    mass = costs.w_pos[sl] + costs.w_neg[sl]
    mass = mass / mass.sum() if mass.sum() > 0 else np.full(mass.size, 1.0 / mass.size)
    return (curvature_density(costs) + mass + 1.0 / mass.size) / 3.0


def data_points(
    costs: SegmentCosts,
    optimal: tuple[int, ...],
    bound: float,
    seeds: list[tuple[int, ...]],
    search: CandidateSearch = DATA_SEARCH,
) -> SearchResult:
    """DATA's points (module docstring) for ``costs`` built with the code weights: ``optimal``
    are OPTIMAL's points (feasible, the first seed), ``bound`` the largest allowed table error
    (factor x OPTIMAL's max error over every code)."""
    if not costs.weighted:
        raise ValueError("DATA needs costs built with code weights (the input histogram)")
    return searched_points(costs, Objective.SUM, data_density(costs), [optimal], bound, search)
