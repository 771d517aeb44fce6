import math

import pytest
import torch

from experiments.sincos_period import SincosPeriodExp, sincos_period
from quantlab.analysis.sincos import Treatment, WrappedPosEnc, error_sources, wrapped_inputs
from quantlab.experiment import RunContext
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import LutFormat, Strategy
from quantlab.platforms import PlatformConfig


def _ctx(tmp_path):
    return RunContext(PlatformConfig(name="j6m"), None, None, 0, tmp_path)


@pytest.fixture(scope="module")
def op_result(tmp_path_factory):
    exp = SincosPeriodExp(
        periods=[1, 16, 256, 1024],
        report_periods=[1, 16, 256],
        in_dtypes=[DType.INT16],
        strategies=[Strategy.CURVATURE],
        funcs=["sin"],
        samples=8192,
        workloads=False,
        model=False,
    )
    return sincos_period(exp, _ctx(tmp_path_factory.mktemp("sc")))


def test_columns(op_result):
    df = op_result.table
    for col in (
        "func",
        "periods",
        "in_dtype",
        "strategy",
        "treatment",
        "a_max",
        "b_max",
        "total_max",
        "qat_gap_max",
        "reduced",
    ):
        assert col in df.columns
    assert len(df) == 4 * 3
    rp = op_result.tables["report_periods"]
    assert sorted(set(rp.periods)) == [1, 16, 256] and len(rp) == 9


def test_period_reduction_stops_table_error_growing(op_result):
    df = op_result.table.set_index(["treatment", "periods"])
    ex = [df.loc[("EXPORTER", p), "a_max"] for p in (16, 256, 1024)]
    assert all(df.loc[("EXPORTER", p), "reduced"] for p in (16, 256, 1024))
    assert max(ex) <= 1.2 * min(ex) and max(ex) < 5e-4  # ~3 output LSB of int16, flat
    none = [df.loc[("NONE", p), "a_max"] for p in (1, 16, 256, 1024)]
    assert none[-1] > 100 * none[0]
    # the exporter does not fix the input error (b); the float wrap fixes both
    assert df.loc[("EXPORTER", 1024), "b_max"] > 0.05
    assert df.loc[("WRAP", 1024), "total_max"] < 5e-4


def test_report_states_a_b_total_at_1_16_256(op_result):
    text = " ".join(op_result.findings)
    for tr in ("NONE", "EXPORTER", "WRAP"):
        assert all(f"P={p}:" in text for p in (1, 16, 256)) and tr in text


def test_error_sources_int8_direct_table_matches_qat():
    x = (torch.rand(4096, dtype=torch.float64) * 2 - 1) * 3 * math.pi
    r = error_sources(
        "sin", x, Treatment.NONE, DType.INT8, DType.INT8, Strategy.CURVATURE, LutFormat()
    )
    assert r["qat_gap_max"] == 0.0  # the direct table is exactly QAT's fake-quantized sin
    assert r["a_max"] <= 0.5 / 127.5 + 1e-9


def test_wrapped_posenc_equals_posenc_in_float():
    from quantlab.models import build_model

    b = build_model("posenc")
    (coords,) = b.example_inputs(2, 0)
    w = WrappedPosEnc(b.module)
    with torch.no_grad():
        diff = (w(*wrapped_inputs(b.module, coords)) - b.module(coords)).abs().max()
    assert float(diff) < 1e-4


def test_toy_model_ranks(tmp_path):
    exp = SincosPeriodExp(
        periods=[4],
        report_periods=[4],
        in_dtypes=[DType.INT16],
        strategies=[Strategy.EVENLY, Strategy.CURVATURE],
        funcs=["sin"],
        samples=256,
        workloads=False,
        model_batch=2,
        model_calib_batches=1,
        model_eval_batches=1,
        strategy_eval_batches=2,
        resamples=200,
    )
    res = sincos_period(exp, _ctx(tmp_path))
    mt = res.tables["toy_model"].set_index("treatment")
    assert list(mt.index) == ["NONE", "EXPORTER", "WRAP"]
    assert mt.loc["NONE", "fixed_sincos_best_rank"] == 1
    assert mt.loc["WRAP", "fixed_sqnr_db"] > mt.loc["NONE", "fixed_sqnr_db"] + 10
    assert mt.loc["EXPORTER", "gap_sqnr_db"] > mt.loc["NONE", "gap_sqnr_db"] + 10
    for key in ("fake_sqnr_db", "fixed_sqnr_db", "gap_sqnr_db"):  # each with its interval
        assert (mt[f"{key}_n"] == 2).all()
        assert (mt[f"{key}_ci_low"] <= mt[key]).all() and (mt[key] <= mt[f"{key}_ci_high"]).all()
    toy = next(f for f in res.findings if f.startswith("PosEnc toy model"))
    assert "95% CIs over n=2 items" in toy and toy.count(" dB (95% CI ") == 9
    # the model once per (treatment, strategy): SQNR with its interval over the 4 items
    ms = res.tables["model_strategies"]
    assert len(ms) == 3 * 2 * 2
    assert set(zip(ms.treatment, ms.strategy)) == {
        (t, s) for t in ("NONE", "EXPORTER", "WRAP") for s in ("EVENLY", "CURVATURE")
    }
    assert (ms.output_sqnr_db_n == 4).all()
    assert (ms.output_sqnr_db_ci_low <= ms.output_sqnr_db).all()
    assert (ms.output_sqnr_db <= ms.output_sqnr_db_ci_high).all()
    fx = ms[ms["mode"] == "fixed"].set_index(["treatment", "strategy"]).output_sqnr_db
    for st in ("EVENLY", "CURVATURE"):
        assert fx[("WRAP", st)] > fx[("NONE", st)] + 10
    text = " ".join(res.findings)
    assert "PosEnc per strategy" in text and "n=4 items" in text
    assert any(p.name == "model_sqnr_by_strategy" for p in res.plots)


def test_strategy_runs_leave_out_data_under_the_exporter():
    from experiments.sincos_period import _strategy_jobs

    exp = SincosPeriodExp(strategies=[Strategy.OPTIMAL, Strategy.DATA])
    jobs = {(t.name, s.name) for t, s in _strategy_jobs(exp)}
    assert ("EXPORTER", "DATA") not in jobs
    assert {("NONE", "DATA"), ("WRAP", "DATA"), ("EXPORTER", "OPTIMAL")} <= jobs
    assert len(jobs) == 5


def test_bad_config():
    with pytest.raises(ValueError, match="sin or cos"):
        SincosPeriodExp(funcs=["tan"])
    with pytest.raises(ValueError, match="> 0"):
        SincosPeriodExp(periods=[0])


def test_error_sources_data_follows_the_table_inputs_own_histogram():
    """DATA weighs the table's own inputs: on inputs crowded near 0 (the range set by two far
    samples) its mean table error is below OPTIMAL's, which ignores where the inputs lie."""
    g = torch.Generator().manual_seed(2)
    x = torch.cat(
        [
            torch.randn(8192, generator=g, dtype=torch.float64) * 0.2,
            torch.tensor([-3.0, 3.0], dtype=torch.float64),
        ]
    )
    r = {
        st: error_sources("sin", x, Treatment.NONE, DType.INT16, DType.INT16, st, LutFormat())
        for st in (Strategy.DATA, Strategy.OPTIMAL)
    }
    assert r[Strategy.DATA]["a_mean"] < r[Strategy.OPTIMAL]["a_mean"]
