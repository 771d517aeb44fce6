"""+exp=input_path composed as the command line composes it, on the toy CNN and two photos:
every variant and mode measured with its interval, the report with its plots, the float path
identical to float preprocessing in float mode, and a bad input format named; then on a user's
own image model and images."""

from __future__ import annotations

import math

import pytest

SMALL = ["exp.models=[small_cnn]", "exp.pretrained=false", "data.num_calib=1"]
SMALL += ["data.num_eval=2", "progress=false", "exp.modes=[FLOAT,FIXED]"]
SMALL += ["exp.formats=[FLOAT_NORMALIZED,NV12]", "exp.zero_code_border=false"]


def test_input_path_measures_every_variant(tmp_path):
    from experiments.input_path import input_path
    from quantlab.config import compose
    from quantlab.experiment import RunContext
    from quantlab.report import write_report

    cfg = compose(["+exp=input_path", *SMALL])
    ctx = RunContext(cfg.platform, cfg.model, cfg.data, 0, tmp_path, progress=False)
    res = input_path(cfg.exp, ctx)
    write_report(res, tmp_path, "python -m quantlab +exp=input_path", "")
    t = res.table
    assert set(t.variant) == {"FLOAT_NORMALIZED", "NV12"}
    assert set(t["mode"]) == {"FLOAT", "FIXED"} and len(t) == 4
    assert (t.top1_agreement_n == 2).all() and (t.output_sqnr_db_n == 2).all()
    same = t[(t.variant == "FLOAT_NORMALIZED") & (t["mode"] == "FLOAT")].iloc[0]
    assert same.output_sqnr_db == math.inf and same.top1_agreement == 1.0
    deployed = t[(t.variant != "FLOAT_NORMALIZED") & (t["mode"] == "FLOAT")]
    assert (deployed.output_sqnr_db < math.inf).all()  # uint8 rounding is measured
    for f in ("report.md", "output_sqnr.png", "top1_agreement.png"):
        assert (tmp_path / f).exists(), f
    assert any("fixed mode" in f for f in res.findings)
    # every figure of the findings carries its item count (and an interval unless identical)
    for line in res.findings:
        assert line.count("n=2") == 2 * 2, line  # two paths, two metrics each
        assert "Top-1 intervals separated from float preprocessing" in line
    table = (tmp_path / "report.md").read_text().split("## per input path", 1)[1]
    assert "top1_agreement_ci_low" in table and "output_sqnr_db_n" in table


def test_input_path_names_a_bad_input_format():
    from quantlab.config import compose

    with pytest.raises(Exception) as err:
        compose(["+exp=input_path", *SMALL, "exp.formats=[RGB8]"])
    text = f"{err.value} {err.value.__cause__}"
    assert "RGB8" in text and "FLOAT_NORMALIZED, UINT8_RGB, UINT8_BGR, NV12" in text


def test_input_path_runs_your_image_model_alone_on_your_images(tmp_path, monkeypatch):
    """model=custom with data=images: the chosen model alone, its preprocessing from the data
    config, its own output metric (top-1 agreement: the toy classifier's logits)."""
    from user_package import PACKAGE, image_folder, write_package

    from experiments.input_path import input_path
    from quantlab.config import compose
    from quantlab.experiment import RunContext
    from quantlab.report import write_report

    write_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    user = ["model=custom", f"model.target={PACKAGE}.nets:build", "data=images"]
    user += [f"data.path={image_folder(tmp_path / 'imgs')}", "data.size=[24,24]"]
    user += ["data.mean=[0.5,0.5,0.5]", "data.std=[0.25,0.25,0.25]", "data.channel_order=BGR"]
    cfg = compose(["+exp=input_path", *SMALL[1:], *user])
    assert cfg.data.name == "images"
    ctx = RunContext(cfg.platform, cfg.model, cfg.data, 0, tmp_path, False, model_chosen=True)
    res = input_path(cfg.exp, ctx)
    write_report(res, tmp_path / "out", "python -m quantlab +exp=input_path model=custom", "")
    t = res.table
    assert set(t.model) == {f"custom:{PACKAGE}.nets:build"}
    assert len(t) == 4 and (t.top1_agreement_n == 2).all()
    same = t[(t.variant == "FLOAT_NORMALIZED") & (t["mode"] == "FLOAT")].iloc[0]
    assert same.output_sqnr_db == math.inf
    nv12 = t[(t.variant == "NV12") & (t["mode"] == "FLOAT")].iloc[0]
    assert 10 < nv12.output_sqnr_db < math.inf  # the pixels' rounding and NV12, measured
    assert (tmp_path / "out" / "top1_agreement.png").exists()

    cfg = compose(["+exp=input_path", *SMALL[1:], *user, "model.input_format=NV12"])
    ctx = RunContext(cfg.platform, cfg.model, cfg.data, 0, tmp_path, False, model_chosen=True)
    with pytest.raises(ValueError, match="compares the input formats of exp.formats"):
        input_path(cfg.exp, ctx)
