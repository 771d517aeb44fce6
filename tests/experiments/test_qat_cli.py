"""+exp=qat end to end from the command line on a quick configuration: every variant of every
model has its deployed metric with an interval and both gaps; the report, its plots, tables and
resolved config are written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
QUICK = [
    "exp.steps=2",
    "exp.cnn_steps=1",
    "exp.decoder_layers=1",
    "exp.decoder_float_steps=2",
    "exp.decoder_train_samples=8",
    "exp.decoder_eval_samples=4",
    "exp.decoder_batch=4",
    "exp.posenc_batch=2",
    "exp.posenc_train_batches=1",
    "exp.posenc_eval_batches=1",
    "model=small_cnn",
    "data=synthetic",
    "data.num_calib=2",
    "data.num_eval=4",
    "exp.cnn_batch=2",
]


def test_qat_quick_run_writes_its_report(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-m", "quantlab", "+exp=qat", *QUICK, "progress=false"]
        + [f"hydra.run.dir={tmp_path}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    t = pd.read_csv(tmp_path / "results.csv")
    assert set(t.model) == {"decoder", "posenc", "small_cnn"}
    assert set(t.variant) == {"PTQ", "QAT", "DEPLOYED_QAT"}
    fixed = t[(t["mode"] == "FIXED") & (t.metric != "gap_sqnr_db")]
    assert len(fixed.groupby(["model", "variant"])) == 9
    assert (fixed["items"] >= 2).all() and fixed.ci_low.notna().all()
    cnn = t[t.model == "small_cnn"]  # fixed mode on the chip's input; each fake run on its own
    assert set(cnn[cnn["mode"] == "FIXED"].input) == {"UINT8_RGB"}
    own = cnn[(cnn["mode"] == "FAKE") & (cnn.metric != "gap_sqnr_db")]
    own = own.groupby("variant").input.first()
    assert own["PTQ"] == own["QAT"] == "FLOAT_NORMALIZED" and own["DEPLOYED_QAT"] == "UINT8_RGB"
    assert {"top1_agreement", "output_sqnr_db"} <= set(cnn.metric)
    gaps = t[t.metric == "gap_sqnr_db"]
    assert set(gaps["mode"]) == {"FAKE", "HYBRID"} and len(gaps) == 18
    curve = pd.read_csv(tmp_path / "training_curve.csv")
    assert set(curve.variant) == {"QAT", "DEPLOYED_QAT"} and curve.step.max() == 2
    report = (tmp_path / "report.md").read_text()
    assert "does deployment-aware QAT leave a smaller fake-vs-fixed gap" in report
    for png in ("deployed_metric.png", "gap.png", "training_curve.png"):
        assert (tmp_path / png).exists() and png in report
    assert (tmp_path / "config.yaml").exists()


def test_qat_schema_rejects_bad_fields():
    import pytest

    from experiments.qat import QatExp

    with pytest.raises(ValueError, match="exp.steps must be >= 0"):
        QatExp(steps=-1)
    with pytest.raises(ValueError, match="exp.models must not be empty"):
        QatExp(models=[])
    with pytest.raises(ValueError, match="exp.deployed_input: unknown input format"):
        QatExp(deployed_input="RGB8")


def test_qat_cnn_names_a_deployed_input_it_cannot_use(tmp_path):
    import pytest

    from experiments.qat import QatExp, _cnn
    from quantlab.data.schema import DataConfig
    from quantlab.experiment import RunContext
    from quantlab.models.schema import ModelConfig
    from quantlab.platforms import PlatformConfig

    def ctx(model: ModelConfig) -> RunContext:
        return RunContext(PlatformConfig(), model, DataConfig(num_calib=1, num_eval=2), 0, tmp_path)

    nv12 = ModelConfig(name="small_cnn", pretrained=False, input_format="NV12")
    uint8 = QatExp(deployed_input="UINT8_RGB")
    with pytest.raises(ValueError, match="deployed_input=UINT8_RGB differs from model.input_"):
        _cnn(uint8, ctx(nv12))
    with pytest.raises(ValueError, match="needs an image model.*FLOAT_NORMALIZED"):
        _cnn(uint8, ctx(ModelConfig(name="posenc", pretrained=False)))


def test_qat_cnn_takes_the_models_own_deployed_input_by_default(tmp_path):
    """exp.deployed_input unset (null): uint8 pixels for an image model with its preprocessing,
    model.input_format where set, the float input for a model that takes no image (the
    positional-encoding toy), which the explicit UINT8_RGB refuses."""
    from experiments.qat import QatExp, _chip_words, _cnn
    from quantlab.data.schema import DataConfig
    from quantlab.experiment import RunContext
    from quantlab.models.input_path import InputFormat
    from quantlab.models.schema import ModelConfig
    from quantlab.platforms import PlatformConfig

    def chip(model: ModelConfig) -> InputFormat:
        data = DataConfig(num_calib=1, num_eval=2)
        return _cnn(QatExp(), RunContext(PlatformConfig(), model, data, 0, tmp_path))[1]

    assert QatExp().deployed_input is None
    assert chip(ModelConfig(name="small_cnn", pretrained=False)) is InputFormat.UINT8_RGB
    nv12 = ModelConfig(name="small_cnn", pretrained=False, input_format="NV12")
    assert chip(nv12) is InputFormat.NV12
    posenc = chip(ModelConfig(name="posenc", pretrained=False))
    assert posenc is InputFormat.FLOAT_NORMALIZED
    assert "the float input quantized at its calibrated scale" in _chip_words(posenc)
    assert "uint8 pixels" in _chip_words(InputFormat.UINT8_RGB)
