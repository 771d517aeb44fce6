"""Candidate-table costs: the bulk construction and the per-table errors equal what a built table
does, code for code; the bounds never exceed the exact costs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import (
    J6_FORMAT,
    LutFormat,
    LutSpec,
    Strategy,
    build_lut,
    default_spec,
    get_function,
)
from quantlab.numerics.lut import segment_cost as sc
from quantlab.numerics.lut.analysis import exact_lsb, sample_scales
from quantlab.numerics.lut.segment import all_codes, evaluate_codes_int
from quantlab.numerics.lut.segment_cost import SegmentCosts, SegmentProblem
from quantlab.numerics.lut.segments import index_multipliers, target_values
from quantlab.numerics.lut.table import _index_multiplier
from quantlab.numerics.rounding import Round

I8, I16 = DType.INT8, DType.INT16
SMALL = LutFormat(tables=3, entries=9, index_frac_bits=5, direct_int8=False)


@pytest.mark.parametrize("entries,frac,bits", [(64, 8, 16), (9, 5, 16), (513, 7, 16), (64, 8, 8)])
def test_index_multipliers_match_the_scalar_rule(entries, frac, bits):
    g = np.random.default_rng(entries)
    widths = np.unique(np.concatenate([np.arange(1, 3000), g.integers(1, 65536, 3000)]))
    mult, shift, ok = index_multipliers(widths, entries, frac, bits)
    for w, m, r, good in zip(widths.tolist(), mult.tolist(), shift.tolist(), ok.tolist()):
        try:
            expected = _index_multiplier(w, entries, frac, bits)
        except ValueError:
            assert not good, w
            continue
        assert good and (m, r) == expected, (w, m, r, expected)


@pytest.mark.parametrize("func", ["sigmoid", "silu"])
def test_target_values_do_not_depend_on_the_batch(func):
    # torch's scalar remainder loop differs from its vector kernel by an ulp for these two
    fn, spec = get_function(func), default_spec(func)
    x = torch.rand(4099, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 16 - 8
    whole = target_values(lambda t: fn.target(t, spec), x)
    start = 0
    for size in (1, 3, 5, 7, 8, 13, 64, 65, 100):
        part = target_values(lambda t: fn.target(t, spec), x[start : start + size])
        assert_bits_equal(torch.from_numpy(part), torch.from_numpy(whole[start : start + size]))
        start += size


CASES = [  # func, in, out, format, spec changes
    ("sigmoid", I16, I16, J6_FORMAT, {}),
    ("tanh", I16, I8, J6_FORMAT, {}),  # symmetric, int8 output (tables by runs)
    ("rsqrt", I16, I16, SMALL, {}),  # symmetric, steep near 0, small format
    ("exp", I8, I16, LutFormat(interp_round=Round.HALF_EVEN), {}),
    ("sin", I16, I8, LutFormat(index_frac_bits=3, interp_round=Round.FLOOR), {}),
    ("gelu", I16, I16, J6_FORMAT, {"input_range": (-3.0, 2.0)}),  # tails on both sides
]


def _problem(func, in_dt, out_dt, fmt, changes, points):
    s_in, s_out = sample_scales(func, in_dt, out_dt)
    spec = replace(default_spec(func), strategy=Strategy.EVENLY, dividing_points=None, **changes)
    fn = get_function(func)
    prob = SegmentProblem(
        lambda x: fn.target(x, spec), in_dt, s_in, out_dt, s_out, fmt, spec.symmetric,
        points[0], points[-1],
    )  # fmt: skip
    return prob, spec, s_in, s_out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_table_costs_equal_the_built_table_errors(case, monkeypatch):
    func, in_dt, out_dt, fmt, changes = case
    s_in, s_out = sample_scales(func, in_dt, out_dt)
    spec = replace(default_spec(func), strategy=Strategy.EVENLY, dividing_points=None, **changes)
    base = build_lut(func, in_dt, s_in, out_dt, s_out, spec, fmt)
    lo, hi = base.points[0], base.points[-1]
    g = np.random.default_rng(len(func))
    codes = all_codes(in_dt)
    weights = g.random(codes.numel())
    for trial in range(3):
        inner = np.sort(g.choice(np.arange(lo + 1, hi), fmt.tables - 1, replace=False))
        pts = (lo, *inner.tolist(), hi)
        manual = LutSpec(
            Strategy.MANUAL, spec.symmetric, tuple(p * s_in for p in pts), spec.input_range,
            spec.gradients, spec.eps, spec.log_floor, spec.range_rule,
        )  # fmt: skip
        lut = build_lut(func, in_dt, s_in, out_dt, s_out, manual, fmt)
        assert lut.points == pts
        prob, *_ = _problem(func, in_dt, out_dt, fmt, changes, pts)
        err = np.abs(evaluate_codes_int(lut, codes).numpy() - exact_lsb(lut))
        folded = prob.fold(codes.numpy())
        region = np.searchsorted(np.asarray(pts), folded, side="right") - 1
        region[folded == pts[-1]] = len(pts) - 2
        for runs in (False, True):  # per code, and by runs of constant output where cheaper
            monkeypatch.setattr(sc, "RUN_COST", 10**9 if not runs else 0)
            costs = SegmentCosts(prob)
            got = costs.exact(np.asarray(pts[:-1]), np.asarray(pts[1:])).max
            want = [err[(region == i) & (folded >= lo)].max() for i in range(len(pts) - 1)]
            assert got.tolist() == want, (trial, runs, pts)
        weighted = SegmentCosts(prob, weights)
        c = weighted.exact(np.asarray(pts[:-1]), np.asarray(pts[1:]))
        assert c.max.tolist() == want
        sums = [(weights * err)[(region == i) & (folded >= lo)].sum() for i in range(3)]
        np.testing.assert_allclose(c.sum[:3], sums, rtol=1e-12)


@pytest.mark.parametrize("case", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_bounds_never_exceed_exact_costs(case):
    func, in_dt, out_dt, fmt, changes = case
    s_in, s_out = sample_scales(func, in_dt, out_dt)
    spec = replace(default_spec(func), strategy=Strategy.EVENLY, dividing_points=None)
    ends = build_lut(func, in_dt, s_in, out_dt, s_out, spec, fmt).points
    prob, *_ = _problem(func, in_dt, out_dt, fmt, changes, (ends[0], ends[-1]))
    g = np.random.default_rng(1)
    weights = g.random(all_codes(in_dt).numel())
    costs = SegmentCosts(prob, weights)
    a = g.integers(prob.first, prob.last - 1, 300)
    b = np.minimum(a + g.integers(1, 20000, 300), prob.last)
    exact = costs.exact(a, b)
    for samples in (16, 128, 1024):
        lb = costs.bounds(a, b, samples)
        assert np.all(lb.max <= exact.max)
        assert np.all(lb.sum <= exact.sum * (1 + 1e-9))  # float sums: up to rounding
        assert np.array_equal(lb.max[lb.exact], exact.max[lb.exact])
    win = costs.bounds(a, b, 41, lb.arg, np.full(a.size, 20))  # every code around the peak
    assert np.all(win.max <= exact.max)
    assert np.all(win.max[~lb.exact] >= lb.max[~lb.exact])  # (exact costs carry no peak)


def test_bad_problems_raise():
    fn, spec = get_function("tanh"), default_spec("tanh")
    with pytest.raises(ValueError, match="table range"):
        SegmentProblem(lambda x: fn.target(x, spec), I16, 1e-3, I16, 1e-3, J6_FORMAT, True, -5, 9)
    prob = SegmentProblem(lambda x: fn.target(x, spec), I8, 0.05, I16, 1e-3, SMALL, True, 0, 90)
    with pytest.raises(ValueError, match="code weights"):
        SegmentCosts(prob, np.ones(10))
