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
        strategies=[Strategy.EVENLY, Strategy.DATA],
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
    assert (q["box_l1_vs_float_ci_low"] <= q["box_l1_vs_float"]).all()
    assert (q["box_l1_vs_float"] <= q["box_l1_vs_float_ci_high"]).all()
    assert (q["box_l1_vs_float_n"] == 4).all()
    assert set(m[m["variant"] == "inverse_sigmoid"]["strategy"]) == {"-", "EVENLY", "DATA"}
    assert any(f.startswith("Decoder, fixed mode, DATA") and "EVENLY" in f for f in res.findings)
    # the lowest box L1 and the clamped-logit verdict say what the intervals allow
    (lowest,) = [f for f in res.findings if f.startswith("Decoder, fixed vs float")]
    assert "lowest box L1" in lowest and "95% CI" in lowest and "n=4" in lowest
    assert "of the other 1 strategies'" in lowest
    (fix,) = [f for f in res.findings if f.startswith("The clamped-logit fix")]
    assert "95% intervals, n=4" in fix
    assert any(w in fix for w in ("is not resolved here", "pays here", "does not pay here"))


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="exp.eps_values"):
        InverseSigmoidExp(eps_values=[0.0])
    with pytest.raises(ValueError, match="INT8 or INT16"):
        InverseSigmoidExp(in_dtypes=[DType.INT32])


def test_data_beats_optimal_under_the_decoders_calibrated_histogram():
    """On the inputs the trained decoder's inverse_sigmoid ops really see (calibrated as in the
    experiment), DATA's table has a mean error under the op's calibrated histogram no larger
    than OPTIMAL's (layers 1, 3 and 5 of the six)."""
    from dataclasses import replace

    import numpy as np

    from experiments.inverse_sigmoid import BOX_CHAIN
    from quantlab.analysis.train import fit, synthetic_boxes
    from quantlab.models import build_model
    from quantlab.numerics.lut import InputHistogram, build_lut, default_spec
    from quantlab.numerics.lut.analysis import mean_error_lsb
    from quantlab.qconfig import OpQConfig, QConfigSpec
    from quantlab.simulate import Simulator
    from quantlab.simulate.profiles import platform_config

    train = synthetic_boxes(64, seed=0)
    model = build_model("detr_decoder", seed=0).module
    fit(model, train.batches(32), train.targets(32), 20, seed=0)
    chain = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)
    isig = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16, lut_strategy="DATA")
    spec = QConfigSpec(by_type={"inverse_sigmoid": isig} | {t: chain for t in BOX_CHAIN})
    sim = Simulator(model, platform_config("j6m"), spec)
    calib = train.batches(32)[:1]
    sim.calibrate(calib, progress=False)
    names = list(sim.ops[sim.ops["op_type"] == "inverse_sigmoid"]["name"])
    assert len(names) == 6
    fmt = sim.platform.lut_format()
    gains = []
    for name in names[::2]:
        edges, counts = sim.histogram(name, 0)
        hist = InputHistogram(float(edges[0]), float(edges[-1]), tuple(counts.tolist()))
        rq = sim.qconfig_of(name)
        xs = float(sim.act_scale(name, "in0", DType.INT16, rq))
        so = float(sim.act_scale(name, "out", DType.INT16, rq))
        observed = sim.observed_range(name, "in0")
        w = hist.code_weights(DType.INT16, xs)
        err = {}
        for st in (Strategy.DATA, Strategy.OPTIMAL):
            lut_spec = replace(default_spec("inverse_sigmoid"), strategy=st, dividing_points=None)
            lut = build_lut(
                "inverse_sigmoid", DType.INT16, xs, DType.INT16, so, lut_spec, fmt, observed, hist
            )
            err[st] = mean_error_lsb(lut, w)
        assert np.isfinite(err[Strategy.DATA]) and err[Strategy.DATA] <= err[Strategy.OPTIMAL]
        gains.append(err[Strategy.OPTIMAL] - err[Strategy.DATA])
    assert max(gains) > 0.0  # on some layer the data changes the table for the better


def test_the_vendor_advice_is_judged_only_where_the_intervals_separate():
    from experiments.inverse_sigmoid import _advice_verdict
    from quantlab.analysis.confidence import Estimate

    curvature = Estimate(8.2e-4, 7.6e-4, 8.9e-4, 32)
    assert _advice_verdict(Estimate(6.4e-4, 5.9e-4, 7.0e-4, 32), curvature) == "holds"
    assert _advice_verdict(Estimate(9.9e-4, 9.2e-4, 1.1e-3, 32), curvature) == "does not hold"
    said = _advice_verdict(Estimate(8.1e-4, 7.5e-4, 8.8e-4, 32), curvature)
    assert said == "is not resolved (overlapping 95% intervals, n=32)"


def test_clamped_logit_verdict_follows_the_intervals():
    from experiments.inverse_sigmoid import _fix_verdict
    from quantlab.analysis.confidence import Estimate

    low, high = Estimate(1.0, 0.9, 1.1, 32), Estimate(2.0, 1.9, 2.1, 32)
    assert _fix_verdict(low, high) == "pays"  # lower box L1, intervals apart
    assert _fix_verdict(high, low) == "does not pay"
    assert _fix_verdict(Estimate(1.5, 1.0, 2.0, 32), high) == "is not resolved"
