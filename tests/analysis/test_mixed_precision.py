"""Mixed precision: the sensitive-op template, raising through by_name, cost and Pareto front."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from test_sensitivity import FragileSin, _inputs

from quantlab.analysis.mixed_precision import (
    SensitiveTemplate,
    evaluate_mixed,
    pareto_front,
    raise_spec,
    select_sensitive,
)
from quantlab.analysis.sensitivity import (
    Metric,
    SensitiveType,
    sensitivity,
)
from quantlab.numerics.dtypes import DType
from quantlab.platforms import PlatformConfig
from quantlab.simulate import Mode, Simulator


def _table():
    rows = [
        ("a", "activation", 0.9, "INT8"),
        ("b", "weight", 0.8, "INT8"),
        ("c", "activation", 0.5, "INT16"),
        ("d", "activation", 0.3, "INT8"),
        ("e", "weight", 0.1, "INT8"),
    ]
    return pd.DataFrame(
        [
            {
                "op_name": n,
                "sensitive_type": t,
                "op_type": "conv2d",
                "metric": "L1",
                "value": v,
                "quant_dtype": q,
                "flops_share": 0.2,
                "rank": 0,
            }
            for n, t, v, q in rows
        ]
    )


def test_template_counts_activation_and_weight_rows_together():
    t = _table()
    act = SensitiveType.ACTIVATION
    assert select_sensitive(t, SensitiveTemplate(topk=2)) == [("a", act)]
    both = (SensitiveType.ACTIVATION, SensitiveType.WEIGHT)
    assert select_sensitive(t, SensitiveTemplate(topk=2, kinds=both)) == [
        ("a", act),
        ("b", SensitiveType.WEIGHT),
    ]
    # ratio 0.8 of 5 rows = 4 rows: a, b, c (already int16: skipped), d
    assert select_sensitive(t, SensitiveTemplate(ratio=0.8)) == [("a", act), ("d", act)]
    assert select_sensitive(t, SensitiveTemplate(ratio=0.0)) == []
    # SQNR sorts ascending (lower = more sensitive)
    sq = t.assign(metric="SQNR")
    assert select_sensitive(sq, SensitiveTemplate(Metric.SQNR, topk=1, kinds=both)) == [
        ("e", SensitiveType.WEIGHT)
    ]


def test_template_bad_values():
    with pytest.raises(ValueError, match="exactly one of topk and ratio"):
        SensitiveTemplate()
    with pytest.raises(ValueError, match="ratio must be in"):
        SensitiveTemplate(ratio=1.5)
    with pytest.raises(ValueError, match="ACTIVATION, WEIGHT and/or INPUT"):
        SensitiveTemplate(topk=1, kinds=(SensitiveType.FIXED,))
    with pytest.raises(ValueError, match="no COSINE rows"):
        select_sensitive(_table(), SensitiveTemplate(Metric.COSINE, topk=1))


def test_raise_spec_per_platform():
    j6m = PlatformConfig(name="j6m")
    picked = [("a", SensitiveType.ACTIVATION), ("b", SensitiveType.WEIGHT)]
    spec = raise_spec(picked, j6m)
    assert spec.by_name["a"].output_dtype is DType.INT16
    assert spec.by_name["b"].weight_dtype is DType.INT16
    assert spec.by_name["b"].input_dtype is DType.INT8  # no int16 x int16 GEMM on j6m
    j6p = PlatformConfig(
        name="j6p",
        float16_available=True,
        max_int16_gemm_operands=2,
        sensitive_dtype=DType.FLOAT16,
        high_precision_output=DType.FLOAT32,
    )
    spec = raise_spec(picked, j6p)
    assert spec.by_name["a"].output_dtype is DType.FLOAT16
    assert spec.by_name["b"].input_dtype is None


def test_raised_output_drops_its_int8_calibration_rule_when_asked():
    from quantlab.calibration.kinds import ObserverKind
    from quantlab.qconfig import OpQConfig, QConfigSpec

    j6m = PlatformConfig(name="j6m")
    clip = OpQConfig(observer=ObserverKind.PERCENTILE, percentile=99.9)
    base = QConfigSpec(by_name={"a": clip, "c": clip})
    picked = [("a", SensitiveType.ACTIVATION), ("c", SensitiveType.WEIGHT)]
    kept = raise_spec(picked, j6m, base)
    assert kept.by_name["a"].observer is ObserverKind.PERCENTILE
    fresh = raise_spec(picked, j6m, base, recalibrate_raised=True)
    assert fresh.by_name["a"].output_dtype is DType.INT16
    assert (fresh.by_name["a"].observer, fresh.by_name["a"].percentile) == (None, None)
    assert fresh.by_name["c"].observer is ObserverKind.PERCENTILE  # a weight raise: it stays
    fresh = raise_spec([("c", SensitiveType.INPUT)], j6m, base, recalibrate_raised=True)
    assert (fresh.by_name["c"].input_dtype, fresh.by_name["c"].observer) == (DType.INT16, None)
    assert fresh.by_name["a"] == clip  # not raised: its rule stays


def test_float16_platform_raises_gemm_inputs_to_int16():
    from test_sensitivity import ConvHead

    from quantlab.platforms import load_platform

    x = _inputs((4, 3, 8, 8))
    sim = Simulator(ConvHead(), load_platform("j6p"))
    sim.calibrate([x])
    ranking = sensitivity(sim, [x], kinds=["activation", "weight", "input"], progress=False)
    kinds = (SensitiveType.ACTIVATION, SensitiveType.WEIGHT, SensitiveType.INPUT)
    picked = select_sensitive(ranking.table, SensitiveTemplate(ratio=1.0, kinds=kinds))
    assert {k for _, k in picked} == {SensitiveType.WEIGHT, SensitiveType.INPUT}  # no float16 act
    refs = [sim.run(*x, mode=Mode.FLOAT)]
    low = evaluate_mixed(sim, [x], refs, [], [Metric.SQNR])
    inputs = [p for p in picked if p[1] is SensitiveType.INPUT]
    high = evaluate_mixed(sim, [x], refs, inputs, [Metric.SQNR])
    ops = high.ops.set_index("name")
    assert ops.at["c2:conv2d#0", "input_dtype"] == "INT16"
    assert ops.at["c2:conv2d#0", "weight_dtype"] == "INT8"
    assert ops.at["c1:conv2d#0", "output_dtype"] == "FLOAT16"
    assert high.metrics["SQNR"] > low.metrics["SQNR"]
    assert high.cost > low.cost


def test_pareto_front():
    assert pareto_front([1, 2, 3, 4], [0.5, 0.9, 0.8, 0.9], True) == [True, True, False, False]
    assert pareto_front([1, 2], [1.0, 3.0], False) == [True, False]


def test_raising_the_fragile_op_pays_on_the_toy_model():
    x = _inputs((16, 8))
    sim = Simulator(FragileSin(), "j6m")
    sim.calibrate([x])
    ranking = sensitivity(sim, [x], metrics=["l1"]).table
    picked = select_sensitive(ranking, SensitiveTemplate(Metric.L1, topk=1))
    assert picked == [("fc2:linear#0", SensitiveType.ACTIVATION)]
    refs = [sim.run(*x, mode=Mode.FLOAT)]
    metrics = [Metric.SQNR, Metric.L1]
    low = evaluate_mixed(sim, [x], refs, [], metrics, mode=Mode.FAKE)
    high = evaluate_mixed(sim, [x], refs, picked, metrics, mode=Mode.FAKE)
    assert high.metrics["SQNR"] > low.metrics["SQNR"] + 10
    for r in (low, high):  # the output SQNR's estimate: the same figure, with its interval
        assert r.sqnr.value == pytest.approx(r.metrics["SQNR"], rel=1e-9)
        assert r.sqnr.low <= r.sqnr.value <= r.sqnr.high and r.sqnr.n == 16
    assert high.cost > low.cost
    ops = high.ops.set_index("name")
    assert ops.at["fc2:linear#0", "output_dtype"] == "INT16"
    assert ops.at[":sin#0", "input_dtype"] == "INT16"


def test_mixed_precision_experiment_tiny(tmp_path):
    from experiments.mixed_precision import mixed_precision_exp
    from quantlab.config import compose
    from quantlab.experiment import RunContext

    cfg = compose(
        ["+exp=mixed_precision", "model=small_cnn", "data=synthetic"]
        + ["data.num_eval=2", "data.num_calib=1", f"exp.cache_dir={tmp_path}"]
        + ["exp.ratios=[0.0,1.0]", "exp.platforms=[j6m,j6p]"]
    )
    ctx = RunContext(cfg.platform, cfg.model, cfg.data, 0, tmp_path)
    res = mixed_precision_exp(cfg.exp, ctx)
    t = res.table
    assert t.groupby("platform").size().to_dict() == {"j6m": 2, "j6p": 2}
    assert {"cost", "cost_rel", "sqnr_db", "task", "pareto", "raised_ops"} <= set(t.columns)
    assert (t[t.ratio == 0.0].cost_rel == 1.0).all() and (t[t.ratio == 0.0].raised_ops == 0).all()
    assert t.groupby("platform").raised_ops.is_monotonic_increasing.all()
    j6m = t[t.platform == "j6m"]
    assert j6m.cost.iloc[-1] > j6m.cost.iloc[0]
    assert {p.name for p in res.plots} == {"pareto_task", "pareto_sqnr"}
    assert res.findings[0].startswith("j6m: raising")
    # the report's table, and every task figure in the findings with its interval and count
    per_ratio = res.tables["per_ratio"]
    assert list(per_ratio.platform) == list(t.platform) and list(per_ratio.ratio) == list(t.ratio)
    assert {"sqnr_db", "task", "task_ci_low", "task_ci_high", "task_n"} <= set(per_ratio.columns)
    assert {"sqnr_db_ci_low", "sqnr_db_ci_high", "sqnr_db_n"} <= set(per_ratio.columns)
    assert (per_ratio.sqnr_db_n == 2).all()
    for line in res.findings[::2]:  # output SQNR and the task metric at both ends, each with n
        assert line.count("n=2") == 4, line
        assert "dB (95% CI" in line and "the intervals" in line
    for line in res.findings[1::2]:  # the highest output SQNR with its interval
        assert "dB (95% CI" in line and "of the other 1 ratios'" in line


def test_mixed_precision_unknown_platform(tmp_path):
    from experiments.mixed_precision import platform_profile
    from quantlab.platforms import PlatformConfig

    with pytest.raises(ValueError, match="unknown platform 'j9'; allowed: .*j6m"):
        platform_profile("j9", PlatformConfig())
    assert platform_profile("j6p", PlatformConfig()).sensitive_dtype is DType.INT16


def test_reconfigured_simulator_gives_the_same_bits_as_a_fresh_configuration():
    x = _inputs((16, 8))
    kept, fresh = Simulator(FragileSin(), "j6m"), Simulator(FragileSin(), "j6m")
    kept.calibrate([x])
    fresh.calibrate([x])
    kept.run(*x, mode=Mode.FIXED)  # fills the scale cache under the default spec
    spec = raise_spec([("fc2:linear#0", SensitiveType.ACTIVATION)], kept.platform)
    kept.set_qconfig(spec)  # keeps the scales computed by the first run
    fresh.set_qconfig(spec)
    assert torch.equal(kept.run(*x, mode=Mode.FIXED), fresh.run(*x, mode=Mode.FIXED))


def test_illegal_int16_matmul_gets_int8_inputs():
    from torch import nn

    from quantlab.analysis.mixed_precision import apply_legal

    class TwoBranch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) @ self.b(x).transpose(-1, -2)

    x = _inputs((2, 3, 4))
    sim = Simulator(TwoBranch(), "j6m")
    sim.calibrate([x])
    sim.run(*x, mode=Mode.FIXED)
    both = [("a:linear#0", SensitiveType.ACTIVATION), ("b:linear#0", SensitiveType.ACTIVATION)]
    spec = raise_spec(both, sim.platform)
    with pytest.raises(ValueError, match="int16 x int16"):
        sim.set_qconfig(raise_spec(both, sim.platform))
    assert apply_legal(sim, spec) == [":matmul#0"]
    assert spec.by_name[":matmul#0"].input_dtype is DType.INT8
    assert sim.ops.set_index("name").at[":matmul#0", "input_dtype"] == "INT8,INT8"
    sim.run(*x, mode=Mode.FIXED)
