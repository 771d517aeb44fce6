"""Exact choice of dividing points over a candidate set: a layered dynamic programme whose table
costs start as cheap lower bounds and are refined, only where they could matter, until the
optimum is certified.

Graph. Candidates are sorted input codes ``G`` with ``G[0] = d_0`` and ``G[-1] = d_T``; layer
k (k = 0..T) allows the codes of ``masks[k]`` for the point d_k. A point set is a path
d_0 < d_1 < ... < d_T through the layers; table i costs ``C(d_i, d_{i+1})`` (max error) and
``S(d_i, d_{i+1})`` (weighted error sum) from ``SegmentCosts`` (segment_cost.py: exact per
table, because no table's outputs depend on another's points).

Objectives. MAX: minimise ``max_i C``. SUM: minimise ``sum_i S`` subject to ``C <= bound`` for
every table.

Certification. Every cost starts as a lower bound (``SegmentCosts.bounds``, EVEN_SAMPLES[0]
codes per table). Each round solves the DP on the current costs (lower bounds or exact values,
so its value never exceeds the true optimum; an unproven feasibility counts as feasible), makes
the chosen path's costs exact, and refines by one pass (more sampled codes, then every code)
the costs of the pairs that could still complete a path better than the best exact one found
(for MAX, past CHEAP_PASSES, only the pair that is the bottleneck of such a path). It stops when
the DP value reaches the best exact value, or when the chosen path's costs are all exact; in
both cases the best exact path is optimal over the candidates.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from quantlab.numerics.lut.segment_cost import SegmentCosts

EVEN_SAMPLES = (16, 128, 1024, 4096)  # MAX bound passes: codes per table spread evenly
FOCUS_STEPS = 2  # MAX: then every code within this many table steps of the largest error found
CHEAP_PASSES = 1  # MAX: every pair that could lie on a better path gets the first passes
SUM_SAMPLES = 16  # SUM: one bound pass (it mainly proves tables above the bound), then exact


class Objective(enum.Enum):
    """What a point set's tables are scored by (module docstring)."""

    MAX = "max"
    SUM = "sum"


@dataclass(frozen=True)
class Layers:
    """Sorted unique candidate codes and, per point d_0..d_T, the mask of allowed candidates."""

    codes: np.ndarray
    masks: tuple[np.ndarray, ...]

    @classmethod
    def every_set(cls, codes: np.ndarray, tables: int) -> Layers:
        """Every increasing point set from ``codes`` (d_0 = codes[0], d_T = codes[-1])."""
        codes = np.unique(np.asarray(codes, dtype=np.int64))
        inner = np.ones(len(codes), dtype=bool)
        inner[[0, -1]] = False
        ends = [np.zeros(len(codes), dtype=bool) for _ in range(2)]
        ends[0][0] = ends[1][-1] = True
        return cls(codes, (ends[0], *([inner] * (tables - 1)), ends[1]))

    @classmethod
    def boxes(cls, first: int, last: int, windows: list[np.ndarray]) -> Layers:
        """Point sets with d_k drawn from ``windows[k-1]`` (k = 1..T-1), ends fixed."""
        inner = [np.asarray(w, dtype=np.int64) for w in windows]
        inner = [w[(w > first) & (w < last)] for w in inner]
        codes = np.unique(np.concatenate([[first, last], *inner]).astype(np.int64))
        masks = [codes == first]
        masks += [np.isin(codes, w) for w in inner]
        masks.append(codes == last)
        return cls(codes, tuple(masks))

    @property
    def tables(self) -> int:
        return len(self.masks) - 1


@dataclass(frozen=True)
class DpResult:
    """The certified optimum over the candidates: points, objective value (exact, over the
    tables only), exact per-table max and weighted sum, and work counters."""

    points: tuple[int, ...]
    value: float
    table_max: tuple[float, ...]
    table_sum: tuple[float, ...]
    pairs: int
    exact_pairs: int
    rounds: int


def solve(
    costs: SegmentCosts,
    layers: Layers,
    objective: Objective,
    bound: float = np.inf,
    incumbent: tuple[int, ...] | None = None,
) -> DpResult:
    """The optimum over ``layers`` (module docstring). ``incumbent``: a point set in the layers
    whose exact value seeds the refinement threshold (needed for SUM: a feasible set). Raises
    ValueError when no point set of the layers is admissible (every path has a table too narrow
    to index, or, for SUM, exceeds ``bound``)."""
    g = layers.codes
    k_n = len(g)
    t_n = layers.tables
    allowed = np.zeros((k_n, k_n), dtype=bool)
    for k in range(t_n):
        allowed |= np.outer(layers.masks[k], layers.masks[k + 1])
    allowed &= np.triu(np.ones((k_n, k_n), dtype=bool), 1)
    ia, ib = np.nonzero(allowed)
    pid = np.full((k_n, k_n), -1, dtype=np.int64)
    pid[ia, ib] = np.arange(len(ia))
    pairs = _PairState(costs, g[ia], g[ib], objective)
    combine = np.maximum if objective is Objective.MAX else np.add

    def path_value(ids: np.ndarray) -> float:
        if np.any(pairs.max[ids] > bound):
            return np.inf
        if objective is Objective.MAX:
            return float(pairs.max[ids].max())
        return float(pairs.sum[ids].sum())

    best, best_path = np.inf, None
    if incumbent is not None:
        pos = np.searchsorted(g, incumbent)
        if len(pos) != t_n + 1 or not np.array_equal(g[np.clip(pos, 0, k_n - 1)], incumbent):
            raise ValueError(f"incumbent {incumbent} is not a point set of the layers")
        ids = pid[pos[:-1], pos[1:]]
        if np.all(ids >= 0):
            pairs.promote(ids, exact=True)
            best, best_path = path_value(ids), ids
    rounds = 0
    while True:
        rounds += 1
        m = np.full((k_n, k_n), np.inf)
        ok = pairs.max <= bound
        m[ia[ok], ib[ok]] = pairs.max[ok] if objective is Objective.MAX else pairs.sum[ok]
        fwd, bwd, arg = _sweep(m, layers.masks, combine)
        if not np.isfinite(fwd[-1][-1]):
            raise ValueError(
                "no admissible set of dividing points among the candidates (every set has a "
                "table too narrow to index or above the error bound)"
            )
        if fwd[-1][-1] >= best:  # no point set can beat the best exact one: it is optimal
            break
        ids = _backtrack(arg, pid, k_n)
        certified = bool(np.all(pairs.level[ids] == pairs.exact_level))
        pairs.promote(ids, exact=True)
        value = path_value(ids)
        if value < best or (certified and value <= best):
            best, best_path = value, ids
        if certified:
            break
        # promote one pass the pairs that could still complete a path better than the best;
        # for MAX, beyond the cheap sampled passes, only the bottleneck of such a path
        key = m[ia, ib]
        promote = np.zeros(len(ia), dtype=bool)
        for k in range(t_n):
            side = combine(fwd[k][ia], bwd[k + 1][ib])
            through = combine(side, key) < best
            if objective is Objective.MAX:
                through &= (key >= side) | (pairs.level < CHEAP_PASSES)
            promote |= through
        pairs.promote(np.flatnonzero(promote & (pairs.level < pairs.exact_level)), exact=False)
    pts = [int(g[ia[best_path[0]]])] + [int(g[ib[i]]) for i in best_path]
    return DpResult(
        points=tuple(pts),
        value=best,
        table_max=tuple(float(v) for v in pairs.max[best_path]),
        table_sum=tuple(float(v) for v in pairs.sum[best_path]),
        pairs=len(ia),
        exact_pairs=int((pairs.level == pairs.exact_level).sum()),
        rounds=rounds,
    )


class _PairState:
    """Current cost (bound or exact) of every candidate pair, refined pass by pass: level 0 is
    the first pass, ``self.exact_level`` an exact cost."""

    def __init__(self, costs: SegmentCosts, a: np.ndarray, b: np.ndarray, objective: Objective):
        self.costs, self.a, self.b = costs, a, b
        if objective is Objective.MAX:
            self.passes = [*EVEN_SAMPLES, None]  # None: the focus pass
        else:
            self.passes = [SUM_SAMPLES]
        self.exact_level = len(self.passes)
        c = costs.bounds(a, b, self.passes[0])
        self.max, self.sum, self.arg = c.max.copy(), c.sum.copy(), c.arg.copy()
        self.level = np.where(c.exact, self.exact_level, 0)
        step = np.ceil((b - a) / (costs.problem.fmt.entries - 1)).astype(np.int64)
        self.radius = FOCUS_STEPS * np.maximum(step, 1)

    def promote(self, sel: np.ndarray, exact: bool) -> None:
        """Apply the next pass (or the exact one) to the pairs ``sel`` not yet exact."""
        sel = sel[self.level[sel] < self.exact_level]
        if not sel.size:
            return
        nxt = np.full(sel.size, self.exact_level) if exact else self.level[sel] + 1
        for lv in np.unique(nxt):
            s = sel[nxt == lv]
            a, b = self.a[s], self.b[s]
            if lv == self.exact_level:
                c = self.costs.exact(a, b)
            elif self.passes[lv] is not None:
                c = self.costs.bounds(a, b, self.passes[lv])
            else:  # focus: every code near the largest error found so far
                r = self.radius[s]
                c = self.costs.bounds(a, b, int(2 * r.max() + 1), self.arg[s], r)
            # every bound is a valid lower bound: keep the larger (exact replaces)
            grow = c.max > self.max[s]
            self.arg[s] = np.where(grow, c.arg, self.arg[s])
            done = lv == self.exact_level
            self.max[s] = c.max if done else np.maximum(self.max[s], c.max)
            self.sum[s] = c.sum if done else np.maximum(self.sum[s], c.sum)
            self.level[s] = np.where(c.exact, self.exact_level, lv)


def _sweep(m: np.ndarray, masks: tuple[np.ndarray, ...], combine):
    """Forward values F_k (best prefix to each candidate as d_k), backward values B_k (best
    suffix from it), and the forward argmins."""
    t_n = len(masks) - 1
    inf = np.inf
    fwd = [np.where(masks[0], 0.0, inf)]
    arg = []
    m_t = np.ascontiguousarray(m.T)  # row j: the costs into candidate j (argmin along rows)
    cols = np.arange(len(m))
    for k in range(t_n):
        cand = combine(fwd[-1][None, :], m_t)  # [j, i]: through i into j
        a = cand.argmin(axis=1)  # the first best i, as along the columns of m
        f = cand[cols, a]
        fwd.append(np.where(masks[k + 1], f, inf))
        arg.append(a)
    bwd = [np.where(masks[t_n], 0.0, inf)]
    for k in range(t_n - 1, -1, -1):
        b = combine(m, bwd[0][None, :]).min(axis=1)
        bwd.insert(0, np.where(masks[k], b, inf))
    return fwd, bwd, arg


def _backtrack(arg: list[np.ndarray], pid: np.ndarray, k_n: int) -> np.ndarray:
    b = k_n - 1
    ids = []
    for a_of in reversed(arg):
        a = int(a_of[b])
        ids.append(pid[a, b])
        b = a
    return np.asarray(ids[::-1], dtype=np.int64)
