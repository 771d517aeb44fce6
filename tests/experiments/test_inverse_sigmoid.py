"""inverse_sigmoid experiment on tiny configs: columns, regions, bound, model-level rows."""

import math

import pytest

from experiments.inverse_sigmoid import COMPOSITE, InverseSigmoidExp, run
from quantlab.experiment import RunContext
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import Strategy
from quantlab.platforms import PlatformConfig


def _ctx(tmp_path):
    return RunContext(PlatformConfig(), None, None, 0, tmp_path)


def test_op_level_covers_every_strategy_dtype_eps_and_region(tmp_path):
    exp = InverseSigmoidExp(
        strategies=[Strategy.CURVATURE, Strategy.EVENLY],
        in_dtypes=[DType.INT8],
        eps_values=[1e-5, 1e-3],
        model_level=False,
        profile_bins=16,
    )
    res = run(exp, _ctx(tmp_path))
    t = res.table
    for col in ("impl", "strategy", "in_dtype", "eps", "region", "max_err", "max_err_lsb"):
        assert col in t.columns
    combos = set(zip(t["strategy"], t["in_dtype"], t["eps"]))
    assert combos == {
        (s, "INT8", e) for s in ("CURVATURE", "EVENLY", COMPOSITE) for e in (1e-5, 1e-3)
    }
    assert set(t["region"]) == {"near 0", "middle", "near 1", "all"}
    assert (t["max_err"] >= t["mean_err"]).all()
    # the composite cannot reach the float bound: log floor -10 below
    comp = t[(t["strategy"] == COMPOSITE) & (t["region"] == "all") & (t["eps"] == 1e-5)]
    assert float(comp["out_min"].iloc[0]) >= -10.0 - 1e-3
    b = res.tables["output_bound"].iloc[0]
    assert b["computed_bound"] == pytest.approx(math.log((1 - 1e-5) / 1e-5))
    assert round(b["computed_bound"], 4) == 11.5129
    assert res.findings and "11.5129 is right" in res.findings[0]
    assert "same digits reordered" in res.findings[0]
    assert {"dividing_points", "error_profile", "summary"} <= set(res.tables)


def test_model_level_rows_for_each_strategy_and_clamp_variant(tmp_path):
    exp = InverseSigmoidExp(
        strategies=[Strategy.EVENLY],
        in_dtypes=[DType.INT16],
        eps_values=[1e-5],
        composite=False,
        train_samples=8,
        eval_samples=4,
        batch=4,
        train_steps=2,
        finetune_steps=1,
        profile_bins=8,
        decoder_layers=1,
    )
    res = run(exp, _ctx(tmp_path))
    m = res.tables["model_level"]
    assert set(m["variant"]) == {"inverse_sigmoid", "clamped_logit"}
    assert set(m["mode"]) == {"float", "fake", "fixed"}
    fl = m[m["mode"] == "float"]
    assert (fl["box_l1_vs_float"] == 0).all() and (fl["iou_vs_float"] == 1).all()
    q = m[m["mode"] != "float"]
    assert (q["box_l1_vs_float"] >= 0).all() and (q["iou_vs_float"] <= 1).all()


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="exp.eps_values"):
        InverseSigmoidExp(eps_values=[0.0])
    with pytest.raises(ValueError, match="INT8 or INT16"):
        InverseSigmoidExp(in_dtypes=[DType.INT32])
