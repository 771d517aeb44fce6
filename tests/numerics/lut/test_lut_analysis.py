"""Error analysis: analytic bound per table, fake counterpart, region split."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import Strategy, analyze, build_lut, default_spec, profile
from quantlab.numerics.lut.analysis import sample_scales

I8, I16 = DType.INT8, DType.INT16
SMOOTH = ("sigmoid", "tanh", "exp", "sin", "cos", "silu", "gelu", "log", "reciprocal", "rsqrt")


@pytest.mark.parametrize("strategy", [Strategy.EVENLY, Strategy.CURVATURE, Strategy.MINIMAX])
@pytest.mark.parametrize("func", SMOOTH)
def test_interpolation_error_within_bound_plus_one_lsb(func, strategy):
    s_in, s_out = sample_scales(func, I16, I16)
    spec = replace(default_spec(func), strategy=strategy, dividing_points=None)
    rows = analyze(build_lut(func, I16, s_in, I16, s_out, spec))
    tables = rows[rows.region.str.startswith("table")]
    assert len(tables) >= 1
    slack = tables.interp_max_err_lsb - (tables.bound_lsb + 1.0)
    assert (slack <= 1e-6).all(), tables[["region", "interp_max_err_lsb", "bound_lsb"]]


@pytest.mark.parametrize("func", ["sigmoid", "exp", "inverse_sigmoid"])
def test_fake_counterpart_is_half_an_lsb_and_regions_cover_every_code(func):
    for in_dt, out_dt in ((I16, I16), (I8, I16), (I8, I8)):
        s_in, s_out = sample_scales(func, in_dt, out_dt)
        lut = build_lut(func, in_dt, s_in, out_dt, s_out)
        rows = analyze(lut)
        parts = rows[rows.region != "all"]
        assert parts.codes.sum() == 1 << in_dt.bits
        everything = rows[rows.region == "all"].iloc[0]
        assert everything.fake_max_err_lsb <= 0.5 + 1e-9
        assert everything.max_err_lsb == pytest.approx(parts.max_err_lsb.max())
        assert everything.max_err == pytest.approx(everything.max_err_lsb * s_out)
        if lut.direct:  # the direct table is the fake counterpart: no gap
            assert everything.gap_max_lsb == 0


def test_profile_arrays_are_consistent():
    s_in, s_out = sample_scales("tanh", I16, I16)
    lut = build_lut("tanh", I16, s_in, I16, s_out)
    p = profile(lut)
    assert p.codes.shape == p.fixed.shape == p.exact.shape == (65536,)
    assert np.array_equal(
        p.fixed,
        lut.evaluate_reference(
            __import__("torch").from_numpy(p.codes).to(__import__("torch").int16)
        ).numpy(),
    )
    assert set(np.unique(p.region)) <= {"mirror edge"} | {f"table {i}" for i in range(6)}
