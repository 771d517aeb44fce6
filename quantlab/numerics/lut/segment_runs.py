"""The exact max error of candidate tables from their runs of constant output, without visiting
every input code (segment_cost.py uses it where a table's output changes less often than its
codes do, e.g. int8 outputs).

Within table step j (index ``j 2^F + w``, w in [0, 2^F)), the output
``y(w) = round((T_j 2^F + (T_{j+1} - T_j) w) / 2^F)`` is monotone in w for every rounding mode,
and the index ``min((rel m) >> r, (n - 1) 2^F)`` is monotone in the code offset rel. So the codes
of a table split into runs of consecutive codes with one output Y: the value thresholds of w
are found by binary search on the exact ``segments.interpolate``, and the first offset with
index >= I is ``ceil(I 2^r / m)``. Over a run the largest |Y - e| is
``max(Y - min e, max e - Y)``, read from range-extremum tables of the saturated target (and of
the mirrored codes in symmetric mode). This is the same max as evaluating every code.
"""

from __future__ import annotations

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.formats import LutFormat
from quantlab.numerics.lut.segments import interpolate
from quantlab.numerics.rounding import Round


class RangeExtremum:
    """Sparse table answering min or max of ``values[lo..hi]`` (inclusive) in O(1): row k holds
    the extremum of ``values[i .. i + 2^k - 1]`` (padded with the last value)."""

    def __init__(self, values: np.ndarray, op):
        self.op = op
        v = np.asarray(values, dtype=np.float64)
        rows = [v]
        k = 1
        while 2 * k <= len(v):
            prev = rows[-1]
            nxt = prev.copy()
            nxt[:-k] = op(prev[:-k], prev[k:])
            rows.append(nxt)
            k *= 2
        self.table = np.stack(rows)

    def query(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return self.at(*self.cells(lo, hi))

    def cells(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat indices into ``table`` of the two overlapping blocks covering each [lo, hi]
        (the same for every RangeExtremum over as many values: compute once, read many)."""
        k = np.log2(np.maximum(hi - lo + 1, 1)).astype(np.int64)  # floor (exact for 2^j)
        row = k * self.table.shape[1]
        return row + lo, row + hi - (1 << k) + 1

    def at(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """The extremum over the ranges whose ``cells`` are (first, second)."""
        flat = self.table.reshape(-1)
        return self.op(flat[first], flat[second])


def run_counts(tables: np.ndarray, fmt: LutFormat) -> np.ndarray:
    """An upper bound of the runs of each table [P, entries]: one per step plus one per output
    step inside it, plus the clamp run."""
    return np.abs(np.diff(tables, axis=1)).sum(axis=1) + tables.shape[1] + 1


def run_max_errors(
    tables: np.ndarray,
    a: np.ndarray,
    mult: np.ndarray,
    shift: np.ndarray,
    widths: np.ndarray,
    fmt: LutFormat,
    out_dtype: DType,
    fold_min: int,
    extrema: dict[str, RangeExtremum],
) -> np.ndarray:
    """Max |output - target| of the P tables (entries ``tables`` [P, n], first code ``a``, index
    multiplier ``mult``/``shift``, ``widths`` codes) over every code, from their runs.
    ``extrema``: RangeExtremum over folded codes for keys ``pos_min``, ``pos_max`` and, when
    some codes are mirrored (symmetric mode), ``neg_min``, ``neg_max`` (the mirrored codes'
    targets; +inf/-inf where there are none), all over as many values."""
    n, f = fmt.entries, fmt.index_frac_bits
    p_n = len(a)
    t0 = tables[:, :-1].reshape(-1)
    t1 = tables[:, 1:].reshape(-1)
    pid = np.repeat(np.arange(p_n), n - 1)
    j = np.tile(np.arange(n - 1), p_n)
    top = (1 << f) - 1
    y_end = interpolate(t0, t1, np.full(t0.shape, top), fmt, out_dtype)
    steps = np.abs(y_end - t0)  # output values after the first, per step
    sign = np.sign(y_end - t0)
    # thresholds: smallest w with sign (y(w) - t0) >= k, k = 1..steps
    rep = np.repeat(np.arange(len(t0)), steps)
    k = np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps) + 1
    lo = step_thresholds(t0[rep], t1[rep], k, fmt, out_dtype)
    # runs per step: starts 0, w_1..w_K; value t0 + sign i
    counts = steps + 1
    run_step = np.repeat(np.arange(len(t0)), counts)
    first = np.cumsum(counts) - counts
    w_lo = np.zeros(int(counts.sum()), dtype=np.int64)
    mask = np.ones(len(w_lo), dtype=bool)
    mask[first] = False
    w_lo[mask] = lo
    w_hi = np.empty_like(w_lo)
    w_hi[:-1] = w_lo[1:] - 1
    last_of_step = first + counts - 1
    w_hi[last_of_step] = top
    value = t0[run_step] + sign[run_step] * (np.arange(len(w_lo)) - first[run_step])
    run_p = pid[run_step]
    i_lo = j[run_step] * (1 << f) + w_lo
    i_hi = j[run_step] * (1 << f) + w_hi
    # the clamp run: every offset whose raw index reaches (n - 1) 2^F answers T[n - 1]
    clamp_p = np.arange(p_n)
    run_p = np.concatenate([run_p, clamp_p])
    value = np.concatenate([value, tables[:, -1]])
    i_lo = np.concatenate([i_lo, np.full(p_n, (n - 1) << f)])
    i_hi = np.concatenate([i_hi, np.full(p_n, -1)])  # -1: up to the table's last code
    m, r = mult[run_p], shift[run_p]
    rel_lo = ((i_lo << r) + m - 1) // m
    rel_hi = np.where(i_hi < 0, widths[run_p] - 1, (((i_hi + 1) << r) + m - 1) // m - 1)
    rel_hi = np.minimum(rel_hi, widths[run_p] - 1)
    live = rel_lo <= rel_hi  # repeated thresholds give empty runs
    run_p, value, rel_lo, rel_hi = run_p[live], value[live], rel_lo[live], rel_hi[live]
    lo_i = a[run_p] - fold_min + rel_lo
    hi_i = a[run_p] - fold_min + rel_hi
    yv = value.astype(np.float64)
    cells = extrema["pos_min"].cells(lo_i, hi_i)
    q = {key: ext.at(*cells) for key, ext in extrema.items()}
    err = np.maximum(yv - q["pos_min"], q["pos_max"] - yv)
    if "neg_min" in q:
        yn = np.minimum(-value, out_dtype.qmax).astype(np.float64)
        err = np.maximum(err, np.maximum(yn - q["neg_min"], q["neg_max"] - yn))
    out = np.full(p_n, -np.inf)
    np.maximum.at(out, run_p, err)
    return out


def step_thresholds(
    t0: np.ndarray, t1: np.ndarray, k: np.ndarray, fmt: LutFormat, out_dtype: DType
) -> np.ndarray:
    """The smallest fraction w in [0, 2^F) with ``sign (y(w) - t0) >= k`` (k >= 1, at most
    ``|y(2^F - 1) - t0|``), ``y = interpolate(t0, t1, w)``, ``sign = sign(t1 - t0)``.

    HALF_UP (F >= 1): ``y = t0 + floor((d w + h) / 2^F)`` with d = t1 - t0, h = 2^(F-1), and
    y stays between t0 and t1 (no saturation), so the threshold is ``ceil((k 2^F - h) / d)``
    for d > 0 and ``ceil(((k - 1) 2^F + h + 1) / |d|)`` for d < 0 (exact int64). Other roundings:
    binary search on w over the exact ``interpolate`` (y is monotone in w)."""
    f = fmt.index_frac_bits
    top = (1 << f) - 1
    d = t1 - t0
    if f and fmt.interp_round is Round.HALF_UP:
        h = 1 << (f - 1)
        num = np.where(d > 0, (k << f) - h, ((k - 1) << f) + h + 1)
        w = -((-num) // np.maximum(np.abs(d), 1))  # ceil
        return np.clip(w, 0, top)
    sign = np.sign(d)
    lo = np.zeros(len(k), dtype=np.int64)
    hi = np.full(len(k), top, dtype=np.int64)
    for _ in range(f + 1):
        mid = (lo + hi) // 2
        ok = sign * (interpolate(t0, t1, mid, fmt, out_dtype) - t0) >= k
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid + 1)
    return lo
