"""norm_attention on a few digits: accuracy intervals per mode, agreement, the residual stream
along depth, LayerNorm as the integer composite on j6m, findings and report."""

import pytest

from experiments.norm_attention import MODELS, NormAttentionExp, residual_points, run
from quantlab.data.schema import DataConfig
from quantlab.experiment import RunContext
from quantlab.platforms import PlatformConfig
from quantlab.report import write_report


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    exp = NormAttentionExp(platforms=["j6m"], depth_items=20, resamples=50)
    data = DataConfig(name="digits", num_calib=40, num_eval=60, batch_size=30)
    ctx = RunContext(PlatformConfig(), None, data, 0, tmp_path_factory.mktemp("na"), progress=False)
    return run(exp, ctx), ctx


def test_accuracy_intervals_and_agreement(result):
    res, _ = result
    t = res.table.set_index("model")
    assert list(t.index) == list(MODELS)
    for mode in ("float", "fake", "fixed"):
        col = f"{mode}_accuracy"
        assert (t[f"{col}_n"] == 60).all()
        assert ((t[f"{col}_ci_low"] <= t[col]) & (t[col] <= t[f"{col}_ci_high"])).all()
        assert (t[col] > 0.5).all()  # trained models, far above chance (0.1)
    assert (t.fixed_vs_float_agreement > 0.8).all()
    assert t.loc["digits_layernorm", "norm_ops"] == 5 and t.loc["digits_dyt", "norm_ops"] == 0
    assert t.loc["digits_layernorm", "norm_kernel"].startswith("integer")


def test_along_depth_follows_the_residual_stream(result):
    res, _ = result
    d = res.tables["along_depth"]
    one = d[(d.model == "digits_layernorm") & (d["mode"] == "FIXED")]
    assert list(one.point) == [
        "embed",
        "block0.attn",
        "block0.mlp",
        "block1.attn",
        "block1.mlp",
        "logits",
    ]
    assert one.sqnr_db.iloc[-1] < 60  # int8 end to end: a finite, measured gap


def test_findings_and_report(result, tmp_path):
    res, _ = result
    text = " ".join(res.findings)
    assert "digits_dyt vs digits_layernorm" in text and "intervals" in text
    assert "Does the advice pay" in text
    verdict = next(f for f in res.findings if f.startswith("Does the advice pay"))
    assert "agreement (95% CI) LayerNorm " in verdict and verdict.count("[") == 3  # intervals
    write_report(res, tmp_path, "python -m quantlab +exp=norm_attention", "exp: {}\n")
    assert (tmp_path / "report.md").exists()
    assert (tmp_path / "sqnr_along_depth.png").exists()


def test_residual_points_need_no_model():
    import pandas as pd

    ops = pd.DataFrame(
        {
            "name": [":add#0", "blocks.0:add#0", "blocks.0.norm1:add#0", "blocks.0:add#1", "h"],
            "module": ["", "blocks.0", "blocks.0.norm1", "blocks.0", "head"],
            "op_type": ["add", "add", "add", "add", "linear"],
        }
    )
    labels = [lab for _, lab in residual_points(ops)]
    assert labels == ["embed", "block0.attn", "block0.mlp", "logits"]


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="exp.models"):
        NormAttentionExp(models=["resnet"])
    with pytest.raises(ValueError, match="exp.platforms"):
        NormAttentionExp(platforms=["j7"])
