"""Building LUTs: vendor defaults, dividing-point rules, range narrowing, clamps, bad requests."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import (
    FUNCTIONS,
    J6_FORMAT,
    InputHistogram,
    LutFormat,
    LutSpec,
    Strategy,
    build_lut,
    default_spec,
    get_function,
    lut_fake,
    max_error_lsb,
    mean_error_lsb,
)
from quantlab.numerics.lut.analysis import sample_scales
from quantlab.numerics.lut.segment import all_codes
from quantlab.numerics.lut.segments import target_values
from quantlab.numerics.lut.strategies import curvature_points, evenly_points
from quantlab.platforms import PlatformConfig, load_platform

I8, I16 = DType.INT8, DType.INT16


def test_vendor_defaults():
    d = default_spec
    assert d("sigmoid").strategy is Strategy.EVENLY and not d("sigmoid").symmetric
    assert d("tanh").strategy is Strategy.EVENLY and d("tanh").symmetric
    assert d("exp").strategy is Strategy.CURVATURE
    assert d("log").symmetric and d("log").log_floor == -10.0
    for f in ("reciprocal", "sqrt", "rsqrt", "sin"):
        assert d(f).strategy is Strategy.CURVATURE and d(f).symmetric, f
    assert d("reciprocal").gradients == (0.0, None)
    assert d("cos").strategy is Strategy.CURVATURE and not d("cos").symmetric
    assert d("silu").strategy is Strategy.CURVATURE
    assert d("gelu").dividing_points == (-5.0, -3.0, -2.0, -1.0, -0.75, 0.0, 5.5, math.inf)
    assert d("inverse_sigmoid").eps == 1e-5
    assert set(FUNCTIONS) >= {
        "sigmoid", "tanh", "exp", "log", "reciprocal", "sqrt", "rsqrt", "sin", "cos", "silu",
        "gelu", "inverse_sigmoid",
    }  # fmt: skip


# Worked example of the vendor's curvature rule (horizon-plugin.md s.1.4), int16, s_in = 8/32767.5
@pytest.mark.parametrize(
    "func,lo,hi,expected",
    [
        ("sigmoid", -8, 8, [-8, -2.31, -1.31, 0.06, 1.31, 2.31, 8]),
        ("tanh", 0, 8, [0, 0.44, 0.66, 0.88, 1.16, 1.53, 8]),
        ("exp", -12, 0, [-12, -1.78, -1.08, -0.66, -0.38, -0.14, 0]),
        ("sin", 0, 8, [0, 1.44, 2.38, 4.28, 5.16, 7.09, 8]),
    ],
)
def test_curvature_matches_the_worked_example(func, lo, hi, expected):
    fn = get_function(func)
    pts = curvature_points(lambda x: fn.fn(x, default_spec(func)), lo, hi, 6)
    assert len(pts) == 7
    assert pts == pytest.approx(expected, abs=0.011)


def test_evenly_points():
    assert evenly_points(-8, 8, 6) == pytest.approx([-8 + 16 * i / 6 for i in range(7)])


def test_points_are_input_codes_and_gelu_inf_is_qmax():
    s_in = 8 / 32767.5
    lut = build_lut("gelu", I16, s_in, I16, 8 / 32767.5)
    assert lut.points == tuple(round(p / s_in) for p in (-5, -3, -2, -1, -0.75, 0, 5.5))
    assert lut.dividing_points_float == tuple(p * s_in for p in lut.points)
    narrow = build_lut("gelu", I16, 4 / 32767.5, I16, 8 / 32767.5)  # -5 and 5.5 outside
    assert narrow.points[0] == -32768 and narrow.points[-1] == 32767
    assert all(b > a for a, b in zip(narrow.points, narrow.points[1:]))


def test_range_rules():
    s16 = 1 / 32767.5
    exp = build_lut("exp", I16, 10 * s16, I16, 4 * s16)
    assert exp.table_range[1] == pytest.approx(math.log(32767 * 4 * s16))
    rec = build_lut("reciprocal", I16, 16 * s16, I16, 64 * s16)
    assert rec.table_range == pytest.approx((1 / (32767 * 64 * s16), 32767 * 16 * s16))
    log = build_lut("log", I16, 16 * s16, I16, 8 * s16)  # out_lo = -8 > floor
    assert log.table_range[0] == pytest.approx(math.exp(-32768 * 8 * s16))
    log10 = build_lut("log", I16, 16 * s16, I16, 12 * s16)  # out_lo = -12: the floor -10 wins
    assert log10.table_range[0] == pytest.approx(math.exp(-10))
    tanh = build_lut("tanh", I16, 8 * s16, I16, s16, observed_range=(-3.0, 2.0))
    assert tanh.table_range == pytest.approx((0.0, 3.0))  # symmetric: [0, max |x|]
    far = build_lut("exp", I16, 10 * s16, I16, 4 * s16, observed_range=(5.0, 6.0))
    assert far.table_range == exp.table_range  # beyond the exp cap: the data cannot narrow it
    tiny = build_lut("tanh", I16, 8 * s16, I16, s16, observed_range=(1.0, 1.0 + 1e-6))
    assert tiny.table_range == pytest.approx((0.0, 32767 * 8 * s16))  # < 1 code: ignored
    sig = build_lut("sigmoid", I16, 8 * s16, I16, s16, LutSpec(input_range=(-4.0, None)))
    assert sig.table_range == pytest.approx((-4.0, 32767 * 8 * s16))
    assert sig.points[0] == round(-4.0 / (8 * s16))


@pytest.mark.parametrize("func", sorted(FUNCTIONS))
def test_undefined_regions_are_clamped_never_nan(func):
    """Non-symmetric specs over ranges through 0 and beyond [0, 1]: tables are finite, outputs
    saturate, the fake counterpart is finite."""
    spec = replace(default_spec(func), symmetric=False)
    s_in = 2 / 32767.5
    lut = build_lut(func, I16, s_in, I16, 16 / 32767.5, spec)
    assert lut.tables.dtype.kind == "i"
    y = lut.evaluate(all_codes(I16).to(torch.int16))
    assert int(y.min()) >= -32768 and int(y.max()) <= 32767
    x = torch.tensor([-2.0, -1e-30, 0.0, 1e-30, 0.5, 1.0, 2.0, 1e6, -1e6])
    assert torch.isfinite(lut_fake(x, func, I16, 16 / 32767.5, spec=spec)).all()
    assert torch.isfinite(get_function(func).target(x.double(), spec)).all()


def test_an_inverse_rule_that_leaves_no_code_does_not_narrow_the_table():
    """reciprocal of inputs in [0, 0.99998] at an output scale saturating at 1: 1 / x
    saturates everywhere, so the rule (no entries where 1 / x saturates) would leave nothing;
    the table covers the input range and gives the saturated code throughout."""
    s_in = 1 / 32768
    lut = build_lut("reciprocal", I16, s_in, I16, 1 / 32767)
    codes = torch.arange(1, 32768, 97, dtype=torch.int16)
    assert set(lut.evaluate(codes).tolist()) == {32767}
    # with room for it, the rule narrows the table as before
    wide = build_lut("reciprocal", I16, 4 / 32768, I16, 1 / 32767)
    assert wide.points[0] > 0


def test_impossible_requests_raise():
    s = 1 / 32767.5
    with pytest.raises(ValueError, match="zero or negative width"):
        LutSpec(input_range=(1.0, 1.0))
    with pytest.raises(ValueError, match="gradients"):
        LutSpec(gradients=(math.inf, None))
    with pytest.raises(ValueError, match="NaN"):
        LutSpec(input_range=(math.nan, 1.0))
    with pytest.raises(ValueError, match="strategy must be a Strategy"):
        LutSpec(strategy="evenly")
    with pytest.raises(ValueError, match="narrower than one input code"):
        build_lut("sigmoid", I16, s, I16, s, LutSpec(input_range=(0.5, 0.5 + s / 4)))
    with pytest.raises(ValueError, match="observed_range"):
        build_lut("sigmoid", I16, s, I16, s, observed_range=(0.2, 0.2))
    with pytest.raises(ValueError, match="entries"):
        LutFormat(entries=1)
    with pytest.raises(ValueError, match="tables"):
        LutFormat(tables=0)
    with pytest.raises(ValueError, match="unknown LUT function 'lgamma'; allowed"):
        build_lut("lgamma", I16, s, I16, s)
    with pytest.raises(ValueError, match="in_dtype must be INT8 or INT16"):
        build_lut("exp", DType.FLOAT16, s, I16, s)
    with pytest.raises(ValueError, match="out_scale must be finite and > 0"):
        build_lut("exp", I16, s, I16, 0.0)
    with pytest.raises(ValueError, match="exactly when strategy is MANUAL"):
        LutSpec(Strategy.MANUAL)
    with pytest.raises(ValueError, match="non-decreasing"):
        LutSpec(Strategy.MANUAL, dividing_points=(0, 2, 1, 3, 4, 5, 6))
    with pytest.raises(ValueError, match="tables \\+ 1 = 7"):
        build_lut("tanh", I16, s, I16, s, LutSpec(Strategy.MANUAL, dividing_points=(0, 1)))
    with pytest.raises(ValueError, match="collapse to one input code"):
        pts = (5.0,) * 7
        build_lut("tanh", I16, 1 / 32767.5, I16, s, LutSpec(Strategy.MANUAL, dividing_points=pts))
    with pytest.raises(ValueError, match="cannot index"):
        fmt = LutFormat(tables=6, entries=4097, index_frac_bits=10)
        build_lut("tanh", I8, 8 / 127.5, I16, s, LutSpec(Strategy.EVENLY), fmt)
    with pytest.raises(ValueError, match="inverse_sigmoid needs LutSpec.eps > 0"):
        build_lut("inverse_sigmoid", I16, s, I16, s, LutSpec(eps=0.0))


def test_format_from_platform():
    assert PlatformConfig().lut_format() == J6_FORMAT
    p = PlatformConfig(lut_tables=4, lut_entries=32, lut_index_frac_bits=6)
    assert p.lut_format() == LutFormat(tables=4, entries=32, index_frac_bits=6)


def test_platform_lut_spec_follows_its_default_strategy():
    """The J6 profiles keep the vendor's per-op specs; a profile with its own table geometry
    (LiteRT's 512 x 2) replaces every op's strategy, so gelu's fixed J6 points never reach it."""
    j6m, tflite = load_platform("j6m"), load_platform("tflite")
    for func in ("gelu", "tanh", "exp"):
        assert j6m.lut_spec(func) == default_spec(func)
        spec = tflite.lut_spec(func)
        assert spec.strategy is Strategy.EVENLY and spec.dividing_points is None
        assert spec.symmetric == default_spec(func).symmetric
    table = build_lut("gelu", DType.INT16, 8 / 32767, DType.INT16, 8 / 32767,
                      tflite.lut_spec("gelu"), tflite.lut_format())  # fmt: skip
    assert len(table.points) == tflite.lut_tables + 1
    with pytest.raises(ValueError, match="platform.lut_default_strategy.*allowed: EVENLY"):
        PlatformConfig(lut_default_strategy=Strategy.MANUAL)


def test_build_is_cached():
    s = 8 / 32767.5
    assert build_lut("silu", I16, s, I16, s) is build_lut("silu", I16, s, I16, s)


@pytest.mark.parametrize("func", sorted(FUNCTIONS))
def test_minimax_never_worse_than_both_vendor_rules(func):
    s_in, s_out = sample_scales(func, I16, I16)
    base = default_spec(func)
    err = {
        st: max_error_lsb(
            build_lut(func, I16, s_in, I16, s_out, replace(base, strategy=st, dividing_points=None))
        )
        for st in (Strategy.EVENLY, Strategy.CURVATURE, Strategy.MINIMAX)
    }
    assert err[Strategy.MINIMAX] <= min(err[Strategy.EVENLY], err[Strategy.CURVATURE])


def test_build_and_analysis_never_change_the_thread_count(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    lut = build_lut("gelu", I16, 6.5 / 32767.5, I16, 6.3 / 32767.5)  # not built before
    max_error_lsb(lut)
    assert calls == []


def test_searched_builds_never_change_the_thread_count(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    hist = InputHistogram(-4.0, 4.0, (1.0, 3.0, 5.0, 2.0))
    for st in (Strategy.OPTIMAL, Strategy.DATA):  # not built before (unusual scales)
        spec = replace(default_spec("tanh"), strategy=st, dividing_points=None)
        lut = build_lut("tanh", I8, 4.1 / 127.5, I16, 1.01 / 32767.5, spec, histogram=hist)
        mean_error_lsb(lut, hist.code_weights(I8, lut.in_scale))
    assert calls == []


@pytest.mark.parametrize("threads", [2, 7])
def test_table_targets_do_not_depend_on_the_thread_count(threads):
    # torch splits an op above its parallel grain (32768) into one chunk per thread, each with
    # a scalar remainder loop that differs from the vector kernel by an ulp for sigmoid
    fn, spec = get_function("sigmoid"), default_spec("sigmoid")
    n = threads * 32768 + 64
    x = torch.rand(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 16 - 8
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = fn.target(x, spec).numpy()  # the vector kernel everywhere (n % 64 == 0)
        torch.set_num_threads(threads)
        chunked = target_values(lambda t: fn.target(t, spec), x)
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(chunked, serial), np.flatnonzero(chunked != serial)[:10]
