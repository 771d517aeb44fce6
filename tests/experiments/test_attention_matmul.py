"""+exp=attention_matmul end to end on a few sentence pairs: the attention split runs on j6m and
lands between int8 and dual int16 in cost, dual int16 Linear layers are refused by name, the
mask section measures padded-key mass and the score step, and the report is written."""

from __future__ import annotations

import math

import pytest

from quantlab.analysis.attention import clamped_mask_value


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    from experiments.attention_matmul import run
    from quantlab.config import compose
    from quantlab.experiment import RunContext
    from quantlab.report import write_report

    cfg = compose(
        ["+exp=attention_matmul", "progress=false", "exp.num_calib=1", "exp.num_eval=2"]
        + ["exp.batch_size=2", "exp.resamples=50", "exp.vector_platform=null"]
        + ["platform.default_observer=MINMAX"]  # the cheapest calibration
        + ["exp.attention_schemes=[INT8,SPLIT,DUAL_INT16]", "exp.linear_schemes=[DUAL_INT16]"]
    )
    out = tmp_path_factory.mktemp("am")
    ctx = RunContext(cfg.platform, cfg.model, cfg.data, 0, out, progress=False)
    res = run(cfg.exp, ctx)
    write_report(res, out, "python -m quantlab +exp=attention_matmul", "")
    return res, out


def test_schemes_cost_and_refusal(result):
    res, _ = result
    g = res.table[res.table.section == "gemm"].set_index(["target", "scheme"])
    att = g.loc["attention_matmul"]
    assert (att.status == "ran").all() and (att.cosine_n == 4).all()
    assert att.loc["int8", "cost_rel_int8"] == 1.0
    assert 1.0 < att.loc["split", "cost_rel_int8"] < att.loc["dual_int16", "cost_rel_int8"]
    assert att.loc["dual_int16", "cosine"] > att.loc["int8", "cosine"]
    # the output SQNR carries its interval over the same sentences
    assert (att.sqnr_db_n == 4).all()
    assert (att.sqnr_db_ci_low <= att.sqnr_db).all() and (att.sqnr_db <= att.sqnr_db_ci_high).all()
    (words,) = [f for f in res.findings if "attention_matmul with" in f]
    assert "output SQNR" in words and "dB (95% CI" in words
    summary = res.tables["summary"]
    ran = summary.status == "ran"
    assert summary["output SQNR (95% CI)"][ran].str.contains("95% CI").all()
    assert (summary["output SQNR (95% CI)"][~ran] == "-").all() and (~ran).any()
    lin = g.loc["linear"]
    assert (
        lin.loc["dual_int16", "status"].startswith("refused")
        and "int16 x int16" in (lin.loc["dual_int16", "status"])
    )


def test_mask_section_and_report(result):
    res, out = result
    m = res.table[res.table.section == "mask"]
    assert len(m) == 4 and (m.status == "ran").all()
    assert list(m.background) == ["INT8", "INT16", "INT8", "INT16"]
    assert (m.padded_mass >= 0).all() and (m.padded_mass < 1).all()
    int8, int16 = m.iloc[0], m.iloc[1]
    assert int16.score_step < int8.score_step / 100  # int16 scores: a finer step
    assert any("Attention mask" in f for f in res.findings)
    assert (out / "report.md").exists() and (out / "cosine.png").exists()


def test_clamped_mask_value_is_spread_plus_the_exp_floor():
    assert clamped_mask_value(7.2) == -20.0
    assert clamped_mask_value(0.0) == -12.0
    with pytest.raises(ValueError, match="spread"):
        clamped_mask_value(math.nan)
