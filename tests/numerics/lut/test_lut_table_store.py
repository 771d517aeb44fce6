"""Candidate-table entries computed once (TableStore) change nothing: the store returns what
``table_entries`` computes, and OPTIMAL and DATA built through the shared store pick the same
points and tables as the search that recomputes every candidate's entries on every pass."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import Strategy, build_lut, default_spec, get_function
from quantlab.numerics.lut.analysis import sample_scales
from quantlab.numerics.lut.data_weighted import data_points
from quantlab.numerics.lut.formats import J6_FORMAT
from quantlab.numerics.lut.optimal import optimal_points
from quantlab.numerics.lut.segment import all_codes, evaluate_codes_int
from quantlab.numerics.lut.segment_cost import SegmentCosts, SegmentProblem
from quantlab.numerics.lut.segments import table_entries
from quantlab.numerics.lut.table import SEED_STRATEGIES, clear_build_cache
from quantlab.numerics.lut.table_store import TableStore

I8, I16 = DType.INT8, DType.INT16


class _RecomputingStore(TableStore):
    """The search before the store: every request evaluates the target again."""

    def entries(self, d0, d1):
        return table_entries(
            self.target, d0, d1, self.fmt, self.in_scale, self.out_scale, self.out_dtype
        )


def test_store_returns_table_entries_once_per_pair():
    func, spec = "tanh", default_spec("tanh")
    s_in, s_out = sample_scales(func, I16, I16)
    fn = get_function(func)
    g = lambda x: fn.target(x, spec)  # noqa: E731
    store = TableStore(g, s_in, s_out, I16, J6_FORMAT)
    rng = np.random.default_rng(3)
    a = rng.integers(0, 30000, 300)
    b = a + rng.integers(1, 2000, 300)
    a, b = np.concatenate([a, a[:50]]), np.concatenate([b, b[:50]])  # repeats in one call
    want = table_entries(g, a, b, J6_FORMAT, s_in, s_out, I16)
    assert np.array_equal(store.entries(a, b), want)
    assert len(store) == len(set(zip(a.tolist(), b.tolist())))
    k = rng.permutation(len(a))[:120]  # a later call: every pair from the store
    assert np.array_equal(store.entries(a[k], b[k]), want[k])
    assert len(store) == len(set(zip(a.tolist(), b.tolist())))
    c, d = np.array([-5, 7]), np.array([9, 30000])  # new pairs beside known ones
    both_a, both_b = np.concatenate([c, a[:3]]), np.concatenate([d, b[:3]])
    assert np.array_equal(
        store.entries(both_a, both_b), table_entries(g, both_a, both_b, J6_FORMAT, s_in, s_out, I16)
    )


def _reference_points(func, in_dt, out_dt, strategy, histogram=None):
    """OPTIMAL's or DATA's points as table.py finds them, every candidate's entries recomputed
    on every pass and a fresh problem for DATA's search."""
    base = replace(default_spec(func), dividing_points=None)
    s_in, s_out = sample_scales(func, in_dt, out_dt)
    seeds = [
        build_lut(func, in_dt, s_in, out_dt, s_out, replace(base, strategy=st)).points
        for st in SEED_STRATEGIES
    ]
    fn = get_function(func)

    def costs(weights=None):
        prob = SegmentProblem(
            lambda x: fn.target(x, base), in_dt, s_in, out_dt, s_out, J6_FORMAT, base.symmetric,
            seeds[0][0], seeds[0][-1],
        )  # fmt: skip
        store = _RecomputingStore(prob.target, s_in, s_out, out_dt, J6_FORMAT)
        return SegmentCosts(prob, weights, store)

    opt = optimal_points(costs(), seeds).points
    if strategy is Strategy.OPTIMAL:
        return opt
    c = costs(histogram.code_weights(in_dt, s_in))
    opt_lut = build_lut(func, in_dt, s_in, out_dt, s_out, replace(base, strategy=Strategy.OPTIMAL))
    assert opt_lut.points == opt
    worst = float(c.code_errors(evaluate_codes_int(opt_lut, all_codes(in_dt)).numpy()).max())
    return data_points(c, opt, base.data_error_factor * worst, seeds).points


CASES = [  # function, dtypes, strategy: plain and symmetric, int8/int16 in and out
    ("sigmoid", I16, I8, Strategy.OPTIMAL),
    ("exp", I16, I16, Strategy.OPTIMAL),
    ("tanh", I16, I16, Strategy.DATA),
    ("reciprocal", I8, I16, Strategy.DATA),
]


@pytest.mark.parametrize("func,in_dt,out_dt,strategy", CASES, ids=[c[0] for c in CASES])
def test_shared_store_builds_the_same_tables_as_recomputing(func, in_dt, out_dt, strategy):
    from experiments.lut_error import LutErrorExp, data_histogram

    exp = LutErrorExp()
    hist = data_histogram(func, exp.data_sigma_fraction, exp.data_bins)
    want = _reference_points(func, in_dt, out_dt, strategy, hist)
    clear_build_cache()
    s_in, s_out = sample_scales(func, in_dt, out_dt)
    spec = replace(default_spec(func), strategy=strategy, dividing_points=None)
    lut = build_lut(func, in_dt, s_in, out_dt, s_out, spec, histogram=hist)
    assert lut.points == want
    fn, pts = get_function(func), np.asarray(want)
    tables = table_entries(
        lambda x: fn.target(x, spec), pts[:-1], pts[1:], J6_FORMAT, s_in, s_out, out_dt
    )
    assert np.array_equal(lut.tables, tables)
