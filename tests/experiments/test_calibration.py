"""The calibration experiment on a toy model: rows per observer and mode, CIs, per-op choice,
diagnosis, findings and the bar plots."""

from __future__ import annotations

import pytest

from experiments.calibration import CalibrationExp, calibration
from quantlab.calibration.per_op import ChoiceTarget
from quantlab.data.schema import DataConfig
from quantlab.experiment import RunContext
from quantlab.models.schema import ModelConfig
from quantlab.platforms import PlatformConfig
from quantlab.report import write_report
from quantlab.simulate import Mode


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    exp = CalibrationExp(
        models=["small_cnn"],
        observers=["MINMAX", "MSE_POOLED", "MSE", "HISTOGRAM/SQNR", "HISTOGRAM/MSE"],
        per_op_targets=[ChoiceTarget.OP_OUTPUT],
        per_op_items=2,
        modes=[Mode.FAKE, Mode.FIXED],
        num_calib=3,
        num_eval=4,
        resamples=50,
    )
    ctx = RunContext(
        PlatformConfig(name="j6m"),
        ModelConfig(name="small_cnn"),
        DataConfig(name="synthetic"),
        0,
        tmp_path_factory.mktemp("calibration"),
    )
    return calibration(exp, ctx)


def test_rows_per_observer_and_mode_with_intervals(result):
    t = result.table
    assert set(t["observer"]) == {
        "MINMAX",
        "MSE_POOLED",
        "MSE",
        "HISTOGRAM/SQNR",
        "HISTOGRAM/MSE",
        "PER_OP/OP_OUTPUT",
    }
    assert len(t) == 6 * 2 and set(t["mode"]) == {"FAKE", "FIXED"}
    assert (t["output_sqnr_db_ci_low"] <= t["output_sqnr_db"]).all()
    assert (t["output_sqnr_db"] <= t["output_sqnr_db_ci_high"]).all()
    assert (t["output_sqnr_db_n"] == 4).all() and (t["calib_time_s"] > 0).all()
    assert t[t["default"]]["observer"].unique().tolist() == ["MSE"]
    assert len(set(t["output_sqnr_db"].round(6))) > 1  # the rules really differ


def test_per_op_choice_diagnosis_findings_and_report(result, tmp_path):
    chosen = result.tables["per_op_choice"]
    rules = {"MINMAX", "MSE_POOLED", "MSE", "HISTOGRAM/SQNR", "HISTOGRAM/MSE"}
    assert set(chosen["candidate"]) <= rules
    assert chosen["op"].is_unique and len(chosen) >= 3
    diag = result.tables["mse_diagnosis"]
    rules = diag[[f"{k} err/best" for k in ("MSE_POOLED", "MSE", "HISTOGRAM/MSE", "GLOBAL_MINMAX")]]
    assert (rules >= 1.0 - 1e-9).all().all() and (rules.min(axis=1) <= 1.0 + 1e-9).all()
    assert (diag["vendor grid err/best"] > 0.99).all()  # relative to the best of the four
    assert any("best calibration" in f for f in result.findings)
    # the per-op choice against HISTOGRAM/MSE: both with their intervals, and what they allow
    lines = [f for f in result.findings if f.startswith("Which error a rule minimises")]
    assert len(lines) == 2 and all(f.count("95% CI") == 2 and "the intervals" in f for f in lines)
    path = write_report(result, tmp_path, "python -m quantlab +exp=calibration", "exp: {}\n")
    text = path.read_text()
    assert "sqnr_fake.png" in text and (tmp_path / "sqnr_fixed.png").exists()


def test_schema_rejects_bad_values():
    with pytest.raises(ValueError, match="allowed"):
        CalibrationExp(observers=["MSE", "BEST"])
    with pytest.raises(ValueError, match="FLOAT"):
        CalibrationExp(modes=[Mode.FLOAT])
    with pytest.raises(ValueError, match="HISTOGRAM"):
        CalibrationExp(observers=["HISTOGRAM"])


def test_per_op_choice_is_written_as_a_loadable_qconfig_file(result, tmp_path):
    from quantlab import qconfig_file
    from quantlab.report import QCONFIG_DIR

    (name,) = result.qconfigs
    assert name == "per_op_small_cnn_op_output.yaml"
    write_report(result, tmp_path, "python -m quantlab +exp=calibration", "exp: {}\n")
    spec = qconfig_file.load(tmp_path / QCONFIG_DIR / name)
    chosen = result.tables["per_op_choice"]
    effective = chosen[chosen["effective"]] if "effective" in chosen else chosen
    for op, candidate in zip(effective["op"], effective["candidate"]):
        rule = spec.by_name[op]
        assert rule.observer is not None and candidate.split("/")[0] == rule.observer.name


def test_the_reference_line_is_the_best_peer_rule_of_the_run():
    """Without exp.target_sqnr_db the rules are compared with the run's best peer rule, and a
    rule above it is called apart only where the 95% intervals separate."""
    import pandas as pd

    from experiments.calibration import _reference_finding

    rows = [  # observer, SQNR, CI low, CI high
        ("MINMAX", 10.0, 9.0, 11.0),  # a vendor rule below the best peer
        ("HISTOGRAM/SQNR", 12.0, 11.0, 13.0),  # the best peer rule
        ("MSE_POOLED", 11.0, 10.0, 12.0),
        ("MSE", 12.5, 11.5, 13.5),  # above, intervals overlap
        ("PER_OP/MODEL_OUTPUT", 15.0, 13.5, 16.0),  # above, intervals separate
    ]
    g = pd.DataFrame(rows, columns=["observer", "output_sqnr_db", "lo", "hi"])
    g = g.rename(columns={"lo": "output_sqnr_db_ci_low", "hi": "output_sqnr_db_ci_high"})
    g["output_sqnr_db_n"] = 24
    (line,) = _reference_finding("m", "FIXED", g, CalibrationExp())
    assert line == (
        "m, fixed: above the best peer rule, HISTOGRAM/SQNR (12.00 dB, 95% CI 11.00 to 13.00): "
        "MSE, PER_OP/MODEL_OUTPUT; of these, intervals that separate from its: "
        "PER_OP/MODEL_OUTPUT."
    )
    (line,) = _reference_finding("m", "FIXED", g, CalibrationExp(target_sqnr_db=12.0))
    assert (
        line == "m, fixed: rules reaching 12 dB (exp.target_sqnr_db): HISTOGRAM/SQNR, MSE, "
        "PER_OP/MODEL_OUTPUT."
    )
    assert _reference_finding("m", "FIXED", g[g.observer == "MSE"], CalibrationExp()) == []
