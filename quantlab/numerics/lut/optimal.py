"""OPTIMAL: the dividing points with the smallest maximum output error, certified over a stated
candidate set.

Claim. For the fixed outer points d_0, d_T of the table range (the same for every strategy:
input_range with its range rules, observed range and symmetric mode), OPTIMAL returns inner
points that minimise ``max_i C(d_i, d_{i+1})``, the largest |LUT output - saturate(f)| over the
input codes of the tables, measured through the integer evaluation itself (entries, index
multipliers, interpolation rounding and saturation as built; segment_cost.py). The tails depend
on d_0 and d_T only, so the same points minimise the error over every input code. The minimum
is exact (a certified DP, point_dp.py) over:
  * every increasing point set, when the table range holds at most ``exhaustive_codes`` codes
    (every int8 input): the global optimum for these ends;
  * otherwise over the union of (a) every increasing point set drawn from the grid G: the
    ``grid_points`` equal quantiles of a density half uniform, half sqrt|second difference of
    f| at code resolution (de Boor's density for linear pieces), codes at
    ``end_points_per_octave`` geometric steps from both ends, and the points of EVENLY,
    CURVATURE, SQRT_CURVATURE and MINIMAX's built table (its refined points); and (b) the
    refinement boxes: each inner d_k within ``window`` steps of the incumbent's, the step
    starting at G's local spacing / ``window`` and shrinking by 2 ``window`` per box (each box
    spans at least half the previous step each side) down to one code, then one-code boxes
    re-centred on the incumbent until it stops moving (at most ``polish_rounds`` moves).
    ``SearchResult.box_radius`` > 0 then certifies that no point set with every inner point
    within that many codes of the result's is better.
Hence OPTIMAL's max error is never above that of EVENLY, CURVATURE, SQRT_CURVATURE or MINIMAX
(their points lie in G), and equals the brute-force optimum on small ranges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quantlab.numerics.lut.point_dp import DpResult, Layers, Objective, solve
from quantlab.numerics.lut.segment_cost import SegmentCosts


@dataclass(frozen=True)
class CandidateSearch:
    """The candidate set of OPTIMAL and DATA (module docstring)."""

    exhaustive_codes: int = 320
    grid_points: int = 96
    end_points_per_octave: int = 2
    window: int = 3
    polish_rounds: int = 4

    def __post_init__(self) -> None:
        for name in ("exhaustive_codes", "grid_points", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"CandidateSearch.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("end_points_per_octave", "polish_rounds"):
            if getattr(self, name) < 0:
                raise ValueError(f"CandidateSearch.{name} must be >= 0, got {getattr(self, name)}")


DEFAULT_SEARCH = CandidateSearch()


@dataclass(frozen=True)
class SearchResult:
    """A certified point set: ``value`` is the objective over the tables (exact; OPTIMAL: max
    error in output LSBs), ``exhaustive`` whether every code was a candidate, ``candidates`` the
    size of G, ``box_radius`` the radius (codes) of the final local certificate (0: none),
    ``exact_pairs`` / ``pairs`` the DP work."""

    points: tuple[int, ...]
    value: float
    table_max: tuple[float, ...]
    table_sum: tuple[float, ...]
    exhaustive: bool
    candidates: int
    box_radius: int
    pairs: int
    exact_pairs: int


def curvature_density(costs: SegmentCosts) -> np.ndarray:
    """sqrt|second difference| of the saturated target (output LSB per code^2) on the codes
    ``first..last`` of the table range, normalised to sum 1 (uniform where f is straight)."""
    p = costs.problem
    e = costs.e_pos[p.first - p.fold_min : p.last - p.fold_min + 1]
    d2 = np.zeros(e.size)
    if e.size >= 3:
        d2[1:-1] = np.sqrt(np.abs(e[2:] - 2 * e[1:-1] + e[:-2]))
    total = d2.sum()
    return d2 / total if total > 0 else np.full(e.size, 1.0 / e.size)


def quantile_codes(first: int, density: np.ndarray, count: int) -> np.ndarray:
    """``count`` codes at equal quantiles of ``density`` (one value per code from ``first``)."""
    cum = np.cumsum(density)
    q = np.arange(1, count) / count * cum[-1]
    return first + np.searchsorted(cum, q)


def end_codes(first: int, last: int, per_octave: int) -> np.ndarray:
    """Codes at geometric distances 2^(i / per_octave) from both ends, inside the range."""
    span = last - first
    if per_octave == 0:
        return np.zeros(0, dtype=np.int64)
    steps = np.unique(np.round(np.exp2(np.arange(per_octave * math.log2(span) + 1) / per_octave)))
    steps = steps[(steps >= 1) & (steps < span)].astype(np.int64)
    return np.concatenate([first + steps, last - steps])


def searched_points(
    costs: SegmentCosts,
    objective: Objective,
    density: np.ndarray,
    seeds: list[tuple[int, ...]],
    bound: float = np.inf,
    search: CandidateSearch = DEFAULT_SEARCH,
) -> SearchResult:
    """The staged exact search of the module docstring for either objective. ``density``: one
    value per code of the range (the grid's quantile density); ``seeds``: point sets whose codes
    join G; the best admissible one (or, for SUM, the first, which must be feasible) seeds the
    DP's refinement threshold."""
    p = costs.problem
    tables = min(p.fmt.tables, p.last - p.first)
    seeds = [tuple(int(c) for c in s) for s in seeds]
    if p.last - p.first + 1 <= search.exhaustive_codes:
        every = np.arange(p.first, p.last + 1)
        layers = Layers.every_set(every, tables)
        res = solve(costs, layers, objective, bound, _incumbent(costs, seeds, tables, objective))
        return _result(res, True, len(every), 0)
    grid = np.concatenate(
        [
            [p.first, p.last],
            quantile_codes(p.first, density, search.grid_points),
            end_codes(p.first, p.last, search.end_points_per_octave),
            *[np.asarray(s, dtype=np.int64) for s in seeds],
        ]
    )
    grid = np.unique(grid[(grid >= p.first) & (grid <= p.last)])
    incumbent = _incumbent(costs, seeds, tables, objective)
    best = solve(costs, Layers.every_set(grid, tables), objective, bound, incumbent)
    pairs, exact_pairs = best.pairs, best.exact_pairs
    spacing = _local_spacing(grid, best.points)
    radius = 0
    steps = [max(1, math.ceil(s / search.window)) for s in spacing]
    polish = 0
    while True:
        windows = [
            np.arange(c - search.window * s, c + search.window * s + 1, s)
            for c, s in zip(best.points[1:-1], steps)
        ]
        layers = Layers.boxes(p.first, p.last, windows)
        res = solve(costs, layers, objective, bound, best.points)
        pairs += res.pairs
        exact_pairs += res.exact_pairs
        moved = res.points != best.points and res.value < best.value
        if moved:
            best = res
        if all(s == 1 for s in steps):
            if not moved:
                radius = search.window
                break
            polish += 1
            if polish > search.polish_rounds:
                break
        steps = [max(1, math.ceil(s / (2 * search.window))) for s in steps]
    return SearchResult(
        points=best.points,
        value=best.value,
        table_max=best.table_max,
        table_sum=best.table_sum,
        exhaustive=False,
        candidates=len(grid),
        box_radius=radius,
        pairs=pairs,
        exact_pairs=exact_pairs,
    )


def _local_spacing(grid: np.ndarray, points: tuple[int, ...]) -> list[int]:
    """Per inner point: the larger gap to its neighbours in ``grid`` (codes the grid left out)."""
    out = []
    for c in points[1:-1]:
        i = int(np.searchsorted(grid, c))
        lo = grid[i - 1] if i > 0 else c
        hi = grid[i + 1] if i + 1 < len(grid) else c
        out.append(int(max(c - lo, hi - c, 1)))
    return out


def _incumbent(
    costs: SegmentCosts, seeds: list[tuple[int, ...]], tables: int, objective: Objective
) -> tuple[int, ...] | None:
    """The seed with the lowest exact objective among those with ``tables`` increasing points
    and indexable tables; for SUM the first admissible seed (the caller's feasible set)."""
    best, best_value = None, np.inf
    for s in seeds:
        if len(s) != tables + 1 or any(b <= a for a, b in zip(s[:-1], s[1:])):
            continue
        c = costs.exact(np.asarray(s[:-1]), np.asarray(s[1:]))
        if not np.all(np.isfinite(c.max)):
            continue
        if objective is Objective.SUM:
            return s
        if c.max.max() < best_value:
            best, best_value = s, float(c.max.max())
    return best


def _result(res: DpResult, exhaustive: bool, candidates: int, radius: int) -> SearchResult:
    return SearchResult(
        points=res.points,
        value=res.value,
        table_max=res.table_max,
        table_sum=res.table_sum,
        exhaustive=exhaustive,
        candidates=candidates,
        box_radius=radius,
        pairs=res.pairs,
        exact_pairs=res.exact_pairs,
    )


def optimal_points(
    costs: SegmentCosts, seeds: list[tuple[int, ...]], search: CandidateSearch = DEFAULT_SEARCH
) -> SearchResult:
    """OPTIMAL's points for ``costs.problem`` (module docstring); ``seeds``: the EVENLY,
    CURVATURE and SQRT_CURVATURE points as codes."""
    uniform = 1.0 / (costs.problem.last - costs.problem.first + 1)
    density = 0.5 * curvature_density(costs) + 0.5 * uniform
    return searched_points(costs, Objective.MAX, density, seeds, search=search)
