"""The exact error of one candidate table, for any pair of dividing points: what a DP over
dividing points needs, measured through the integer evaluation itself.

Decomposition (why a per-table cost is exact). For fixed outer points d_0 and d_T every input
code is answered by one region: a tail (decided by d_0 or d_T alone: anchor, slope and
intercept depend only on that point and the spec, or on the adjacent table when the point is the
input range's end, where the tail then holds no code), or table i, whose entries, index
multiplier and hence outputs depend only on (d_i, d_{i+1}). In symmetric mode a negative code x
is answered as ``saturate(-y(min(-x, qmax)))``, so it belongs to the region of its folded code.
Hence, for dividing points d_0 < ... < d_T, the error over every input code is
``max(tails, max_i C(d_i, d_{i+1}))`` and a histogram-weighted error is
``tails + sum_i S(d_i, d_{i+1})``, where C and S are the max and the weighted sum of
``|output - saturate(f)|`` over the codes whose folded code lies in ``[d_i, d_{i+1})`` (the last
table: ``[d_{T-1}, d_T]``). Errors are in output LSBs against the same saturated target as
``analysis.max_error_lsb``.

``SegmentCosts.exact`` evaluates every code of a table (or, for the max of a table whose output
changes less often than its codes, e.g. int8 outputs, reads the same max from its runs of
constant output, segment_runs.py); ``SegmentCosts.bounds`` evaluates a subset of codes and
returns lower bounds (max over the subset; for the weighted sum, the rounding floor
``dist(f, integers)`` of every code plus the measured excess on the subset; sums are float64, so
"exact" holds up to their rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.formats import LutFormat
from quantlab.numerics.lut.segment_runs import RangeExtremum, run_counts, run_max_errors
from quantlab.numerics.lut.segments import TargetFn, index_multipliers, interpolate, target_values
from quantlab.numerics.lut.table_store import TableStore

QUANTILE_SAMPLES_MAX = 128  # bound passes up to this size put half their codes at quantiles
RUNS_CHECK_SAMPLES = 1024  # bound passes this large check whether exact-by-runs is cheaper
RUN_COST = 4  # a run (segment_runs.py) costs about this many codes; by runs when cheaper
EXACT_CHUNK = 1 << 15  # codes per vectorised chunk (cache-sized: 3x faster than 2^20, measured)


@dataclass(frozen=True)
class SegmentProblem:
    """A table range and everything that decides its tables' integer outputs except the
    dividing points: target g (float64, finite), dtypes, scales, format, symmetric mode, and the
    fixed outer points ``first`` = d_0 < ``last`` = d_T (input codes)."""

    target: TargetFn
    in_dtype: DType
    in_scale: float
    out_dtype: DType
    out_scale: float
    fmt: LutFormat
    symmetric: bool
    first: int
    last: int

    def __post_init__(self) -> None:
        lowest = 0 if self.symmetric else self.in_dtype.qmin
        if not lowest <= self.first < self.last <= self.in_dtype.qmax:
            raise ValueError(
                f"table range [{self.first}, {self.last}] must be increasing input codes in "
                f"[{lowest}, {self.in_dtype.qmax}]"
            )

    @property
    def fold_min(self) -> int:
        """Lowest folded code (0 in symmetric mode, else qmin)."""
        return 0 if self.symmetric else self.in_dtype.qmin

    def fold(self, codes: np.ndarray) -> np.ndarray:
        """The folded code of every input code (symmetric: ``min(-x, qmax)`` for x < 0)."""
        c = np.asarray(codes, dtype=np.int64)
        if not self.symmetric:
            return c
        return np.where(c < 0, np.minimum(-c, self.in_dtype.qmax), c)


def saturated_target_lsb(p: SegmentProblem) -> np.ndarray:
    """``clamp(g(q s_in), qmin s_out, qmax s_out) / s_out`` for every input code q ascending
    (float64), the same IEEE operations as ``analysis.exact_lsb`` (in numpy)."""
    codes = np.arange(p.in_dtype.qmin, p.in_dtype.qmax + 1, dtype=np.int64)
    lo, hi = p.out_dtype.qmin * p.out_scale, p.out_dtype.qmax * p.out_scale
    g = target_values(p.target, codes.astype(np.float64) * p.in_scale)
    return np.clip(g, lo, hi) / p.out_scale  # numpy: no intra-op threads for 65536 codes


def table_store(p: SegmentProblem) -> TableStore:
    """An empty store of the candidate tables of ``p``."""
    return TableStore(p.target, p.in_scale, p.out_scale, p.out_dtype, p.fmt)


@dataclass(frozen=True)
class PairCosts:
    """Per pair: max error (LSB), weighted error sum, whether both are exact (else lower
    bounds), and where the largest error was found. ``inf`` marks a table too narrow for the
    index multiplier."""

    max: np.ndarray
    sum: np.ndarray
    exact: np.ndarray
    arg: np.ndarray  # bounds: offset (from a) of the largest error found; exact costs: 0


class SegmentCosts:
    """Exact (and lower-bound) errors of candidate tables of one problem (module docstring).

    ``code_weights``: optional non-negative weight of every input code (ascending from qmin);
    sums are ``sum_c w(c) |output(c) - target(c)|`` over the codes of a table, 0 without weights.
    Exact results are cached per pair. ``store``: the entries of this problem's candidate tables
    computed so far (table_store.py), shared between costs of the same problem (e.g. OPTIMAL's
    and DATA's); a new one by default.
    """

    def __init__(
        self,
        problem: SegmentProblem,
        code_weights: np.ndarray | None = None,
        store: TableStore | None = None,
    ):
        p = self.problem = problem
        self.store = store if store is not None else table_store(problem)
        qmin, qmax = p.in_dtype.qmin, p.in_dtype.qmax
        if self.store.saturated is None:
            self.store.saturated = saturated_target_lsb(p)
            self.store.saturated.setflags(write=False)
        target = self.target = self.store.saturated  # every input code, ascending
        weights = np.zeros_like(target) if code_weights is None else np.asarray(code_weights)
        if weights.shape != target.shape or not np.all(np.isfinite(weights) & (weights >= 0)):
            raise ValueError(
                f"code weights must be {target.size} finite non-negative values (one per input "
                "code)"
            )
        n = qmax - p.fold_min + 1
        folded = np.arange(p.fold_min, qmax + 1)
        self.e_pos = target[folded - qmin]
        self.w_pos = weights[folded - qmin].astype(np.float64)
        # negative codes of symmetric mode: -a for a >= 1, and qmin (folds to qmax). Their
        # error is max(yn - e_neg_lo, e_neg_hi - yn) for yn = saturate(-y): |yn - e| for one
        # code, the larger of two at qmax, -inf where there is none (a = 0, asymmetric mode).
        self.e_neg_lo = np.full(n, np.inf)
        self.e_neg_hi = np.full(n, -np.inf)
        self.e_neg = np.zeros(n)
        self.w_neg = np.zeros(n)
        self.e_edge = self.w_edge = 0.0
        if p.symmetric:
            self.e_neg[1:] = target[-folded[1:] - qmin]
            self.w_neg[1:] = weights[-folded[1:] - qmin]
            self.e_edge, self.w_edge = float(target[0]), float(weights[0])
            self.e_neg_lo[1:] = self.e_neg_hi[1:] = self.e_neg[1:]
            self.e_neg_lo[-1] = min(self.e_neg[-1], self.e_edge)
            self.e_neg_hi[-1] = max(self.e_neg[-1], self.e_edge)
        self.weighted = code_weights is not None
        floor = self.w_pos * _dist_to_integer(self.e_pos) + self.w_neg * _dist_to_integer(
            self.e_neg
        )
        floor[-1] += self.w_edge * _dist_to_integer(np.array([self.e_edge]))[0]
        self.floor = floor  # weighted rounding floor per folded code (a lower bound)
        self.floor_prefix = np.concatenate([[0.0], np.cumsum(floor)])
        self._cache: dict[tuple[int, int], tuple[float, float, int]] = {}
        self._ext: dict[str, RangeExtremum] | None = None
        self._dens: np.ndarray | None = None

    def _extrema(self) -> dict[str, RangeExtremum]:
        """Range min/max tables of the folded targets (built on first use)."""
        if self._ext is None:
            self._ext = {
                "pos_min": RangeExtremum(self.e_pos, np.minimum),
                "pos_max": RangeExtremum(self.e_pos, np.maximum),
            }
            if self.problem.symmetric:  # else no code is mirrored: its terms are -inf
                self._ext["neg_min"] = RangeExtremum(self.e_neg_lo, np.minimum)
                self._ext["neg_max"] = RangeExtremum(self.e_neg_hi, np.maximum)
        return self._ext

    def _widths(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Codes in each table: ``b - a``, plus the end code for the last table."""
        return b - a + (b == self.problem.last)

    # ------------------------------------------------------------------ evaluation
    def _evaluate(
        self, a: np.ndarray, b: np.ndarray, offsets: np.ndarray | None, count: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Errors of the tables from ``a`` to ``b`` over every code (``offsets`` None; ``count``
        the widths) or over the code offsets ``offsets`` (``count[p]`` consecutive, distinct
        entries per table). Returns per table: max error, weighted sum, rounding-floor sum of
        the evaluated codes, and the offset of the (first) largest error. Tables too narrow for
        the index multiplier get inf."""
        p, fmt = self.problem, self.problem.fmt
        n, f = fmt.entries, fmt.index_frac_bits
        mult, shift, ok = index_multipliers(b - a, n, f, fmt.slope_bits)
        mx = np.full(len(a), np.inf)
        sm = np.full(len(a), np.inf)
        fl = np.zeros(len(a))
        arg = np.zeros(len(a), dtype=np.int64)
        live = ok & (count > 0)
        if not live.any():
            return mx, sm, fl, arg
        idx_live = np.flatnonzero(live)
        tables = self.store.entries(a[idx_live], b[idx_live])
        flat = np.concatenate([tables, tables[:, -1:]], axis=1).reshape(-1)
        row = np.full(len(a), -1, dtype=np.int64)
        row[idx_live] = np.arange(len(idx_live)) * (n + 1)
        every = offsets is None  # all codes: offsets are 0..w-1
        first_offset = np.cumsum(count) - count
        if every and not self.weighted:  # tables whose output changes rarely: by runs
            runs = run_counts(tables, fmt) * RUN_COST < count[idx_live]
            if runs.any():
                sel, tabs = idx_live[runs], tables[runs]
                n_runs = np.cumsum(run_counts(tabs, fmt))
                start = 0
                while start < len(sel):  # chunks of about EXACT_CHUNK runs
                    base_runs = n_runs[start - 1] if start else 0
                    stop = start + max(
                        1, int(np.searchsorted(n_runs[start:] - base_runs, EXACT_CHUNK, "right"))
                    )
                    s_ = sel[start:stop]
                    mx[s_] = run_max_errors(
                        tabs[start:stop], a[s_], mult[s_], shift[s_], count[s_], fmt,
                        p.out_dtype, p.fold_min, self._extrema(),
                    )  # fmt: skip
                    start = stop
                sm[sel] = 0.0
                keep = ~runs
                idx_live, tables = idx_live[keep], tables[keep]
                flat = np.concatenate([tables, tables[:, -1:]], axis=1).reshape(-1)
                row[idx_live] = np.arange(len(idx_live)) * (n + 1)
        base_a = a - p.fold_min
        pos = 0
        while pos < len(idx_live):  # chunks of about EXACT_CHUNK codes
            total = np.cumsum(count[idx_live[pos:]])
            stop = pos + max(1, int(np.searchsorted(total, EXACT_CHUNK, side="right")))
            sel = idx_live[pos:stop]
            pos = stop
            c = count[sel]
            pid = np.repeat(sel, c)
            r = _ranges(c)
            if not every:
                r = offsets[first_offset[pid] + r]
            idx = np.minimum((r * mult[pid]) >> shift[pid], (n - 1) << f)
            base = row[pid] + (idx >> f)
            y = interpolate(flat[base], flat[base + 1], idx & ((1 << f) - 1), fmt, p.out_dtype)
            i = base_a[pid] + r
            e = np.abs(y - self.e_pos[i])
            if p.symmetric:
                yn = np.minimum(-y, p.out_dtype.qmax)
                e = np.maximum(e, np.maximum(yn - self.e_neg_lo[i], self.e_neg_hi[i] - yn))
            seg = np.cumsum(c) - c
            m = np.maximum.reduceat(e, seg)
            mx[sel] = m
            if not every:  # where the largest error is (the focus pass starts there)
                at_max = np.where(e == np.repeat(m, c), np.arange(e.size), e.size)
                arg[sel] = r[np.minimum.reduceat(at_max, seg)]
            if self.weighted:
                s = self.w_pos[i] * np.abs(y - self.e_pos[i])
                if p.symmetric:
                    s += self.w_neg[i] * np.abs(yn - self.e_neg[i])
                    edge = i == len(self.e_pos) - 1
                    s += np.where(edge, self.w_edge * np.abs(yn - self.e_edge), 0.0)
                sm[sel] = np.add.reduceat(s, seg)
                if not every:
                    fl[sel] = np.add.reduceat(self.floor[i], seg)
            else:
                sm[sel] = 0.0
        return mx, sm, fl, arg

    # ------------------------------------------------------------------ exact
    def exact(self, a: np.ndarray, b: np.ndarray) -> PairCosts:
        """Exact max and weighted sum of the tables ``[a, b)`` (``[a, b]`` when b = last)."""
        a = np.asarray(a, dtype=np.int64).reshape(-1)
        b = np.asarray(b, dtype=np.int64).reshape(-1)
        mx = np.empty(len(a))
        sm = np.empty(len(a))
        arg = np.zeros(len(a), dtype=np.int64)
        keys = list(zip(a.tolist(), b.tolist()))
        todo = []
        for k, key in enumerate(keys):
            hit = self._cache.get(key)
            if hit is None:
                todo.append(k)
            else:
                mx[k], sm[k], arg[k] = hit
        if todo:
            t = np.asarray(todo)
            w = self._widths(a[t], b[t])
            m, s, _, g = self._evaluate(a[t], b[t], None, w)
            mx[t], sm[t], arg[t] = m, s, g
            for k, vm, vs, vg in zip(t.tolist(), m.tolist(), s.tolist(), g.tolist()):
                self._cache[keys[k]] = (vm, vs, vg)
        return PairCosts(mx, sm, np.ones(len(a), dtype=bool), arg)

    # ------------------------------------------------------------------ bounds
    def bounds(
        self,
        a: np.ndarray,
        b: np.ndarray,
        samples: int,
        centre: np.ndarray | None = None,
        radius: np.ndarray | None = None,
    ) -> PairCosts:
        """Lower bounds of max and weighted sum over a subset of each table's codes:
        ``samples`` codes chosen by ``_sample_offsets``; or, with ``centre``/``radius`` (offsets,
        per table), ``samples`` codes spread evenly over the window
        ``[centre - radius, centre + radius]`` clipped to the table. Tables whose subset is every
        code are exact. The sum bound is the rounding floor of every code plus the measured
        excess on the subset."""
        p = self.problem
        a = np.asarray(a, dtype=np.int64).reshape(-1)
        b = np.asarray(b, dtype=np.int64).reshape(-1)
        widths = self._widths(a, b)
        if centre is None:
            whole = widths <= samples
        else:
            lo = np.clip(np.asarray(centre) - radius, 0, widths - 1)
            span = np.minimum(np.asarray(centre) + radius, widths - 1) - lo + 1
            whole = (span >= widths) & (widths <= samples)
        if not self.weighted and samples >= RUNS_CHECK_SAMPLES:  # exact by runs when cheaper
            rest = np.flatnonzero(~whole)
            tabs = self.store.entries(a[rest], b[rest])
            whole[rest] = run_counts(tabs, p.fmt) * RUN_COST <= samples
        mx = np.empty(len(a))
        sm = np.empty(len(a))
        arg = np.zeros(len(a), dtype=np.int64)
        if whole.any():
            c = self.exact(a[whole], b[whole])
            mx[whole], sm[whole], arg[whole] = c.max, c.sum, c.arg
        big = np.flatnonzero(~whole)
        if big.size:
            ab, bb, wb = a[big], b[big], widths[big]
            if centre is None:
                offsets, count = self._sample_offsets(ab, wb, samples)
            else:
                k = np.minimum(span[big], samples)
                j = _ranges(k)
                rep = np.repeat(np.arange(big.size), k)
                offsets = lo[big][rep] + (j * (span[big][rep] - 1)) // np.maximum(k[rep] - 1, 1)
                count = k
            m, s, fl, g = self._evaluate(ab, bb, offsets, count)
            floor_all = (
                self.floor_prefix[bb - p.fold_min + (bb == p.last)]
                - self.floor_prefix[ab - p.fold_min]
            )
            mx[big], arg[big] = m, g
            sm[big] = np.where(np.isfinite(s), floor_all + s - fl, np.inf)
        return PairCosts(mx, sm, whole, arg)

    def _sample_offsets(
        self, a: np.ndarray, widths: np.ndarray, samples: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Distinct sorted code offsets per table (flattened) and their counts: samples // 2
        spread evenly, the rest at quantiles of the sampling density (all spread evenly above
        QUANTILE_SAMPLES_MAX samples, where even spacing already finds narrow features)."""
        p = self.problem
        n_even = max(2, samples // 2) if samples <= QUANTILE_SAMPLES_MAX else samples
        k = np.arange(n_even)
        even = (k[None, :] * (widths[:, None] - 1)) // (n_even - 1)
        n_q = samples - n_even
        if n_q == 0:  # distinct by construction (every table holds more than ``samples`` codes)
            return even.reshape(-1), np.full(len(a), n_even)
        parts = [even]
        if n_q > 0:
            cum = self._density_prefix()
            i0 = a - p.fold_min
            c0, c1 = cum[i0], cum[i0 + widths]
            q = c0[:, None] + (np.arange(n_q)[None, :] + 0.5) / n_q * (c1 - c0)[:, None]
            pos = np.searchsorted(cum, q, side="right") - 1 - i0[:, None]
            parts.append(np.clip(pos, 0, widths[:, None] - 1))
        allo = np.sort(np.concatenate(parts, axis=1), axis=1)
        keep = np.ones(allo.shape, dtype=bool)
        keep[:, 1:] = allo[:, 1:] != allo[:, :-1]
        return allo[keep], keep.sum(axis=1)

    def _density_prefix(self) -> np.ndarray:
        """Prefix sums over folded codes of the sampling density ``|second difference of the
        target| + 1e-3`` (output LSB per code^2; the constant keeps straight parts sampled)."""
        if self._dens is None:
            e = self.e_pos
            d2 = np.zeros(e.size)
            if e.size >= 3:
                d2[1:-1] = np.abs(e[2:] - 2 * e[1:-1] + e[:-2])
            d2 = np.minimum(d2, 1e6) + 1e-3
            self._dens = np.concatenate([[0.0], np.cumsum(d2)])
        return self._dens

    def code_errors(self, outputs: np.ndarray) -> np.ndarray:
        """|output - saturate(f)| (output LSB) of every input code, ascending, given a built
        table's output codes for them (``evaluate_codes_int`` over ``all_codes``)."""
        return np.abs(np.asarray(outputs) - self.target)


def _ranges(counts: np.ndarray) -> np.ndarray:
    """0..counts[p]-1 for every p, concatenated (int64)."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def _dist_to_integer(v: np.ndarray) -> np.ndarray:
    """|v - nearest integer| (float64): no integer output can be closer to v."""
    return np.abs(v - np.round(v))
