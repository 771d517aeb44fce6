"""+exp=recipe end to end on a user's toy model: the int8 start misses the target, the ceiling
meets it, the chosen configuration raises fewer ops, and its qconfig file, passed back with
qconfig=file, starts a run whose first row reproduces the reported metric."""

from __future__ import annotations

import pandas as pd
import pytest
from recipe_toy import write_inputs

from quantlab import qconfig


def _run(tmp_path, name: str, *overrides: str):
    from experiments.recipe import recipe_exp
    from quantlab.config import compose
    from quantlab.experiment import RunContext
    from quantlab.report import write_report

    cfg = compose(
        ["+exp=recipe", "model=custom", "model.target=recipe_toy:build"]
        + ["model.metric=recipe_toy:agreement", "data=tensors", f"data.path={tmp_path}/x.npz"]
        + ["data.num_calib=64", "data.num_eval=64", "data.batch_size=64", "progress=false"]
        + [f"exp.cache_dir={tmp_path}/cache", "exp.steps=3", *overrides]
    )
    ctx = RunContext(cfg.platform, cfg.model, cfg.data, 0, tmp_path / name, qconfig=cfg.qconfig)
    ctx.progress = False
    res = recipe_exp(cfg.exp, ctx)
    write_report(res, tmp_path / name, "python -m quantlab +exp=recipe", "")
    return res


def test_recipe_writes_a_qconfig_that_reproduces_the_chosen_metric(tmp_path):
    write_inputs(tmp_path / "x.npz")
    res = _run(tmp_path, "run", "exp.max_drop=0.05")
    t = res.table.set_index("step")
    start, ceiling, chosen = t.iloc[0], t[t.direction == "ceiling"].iloc[0], t[t.chosen].iloc[0]
    assert not start.meets_target and ceiling.meets_target and chosen.meets_target
    assert chosen.task >= 0.95 and start.task < 0.95 and chosen.task_n == 64
    assert 0 < chosen.raised_ops < ceiling.raised_ops
    assert chosen.cost_rel < ceiling.cost_rel
    recipe = pd.read_csv(tmp_path / "run" / "recipe.csv")
    assert len(recipe) == len(t) and recipe.chosen.sum() == 1
    assert (tmp_path / "run" / "recipe_path.png").exists()
    assert "Chosen: step" in "\n".join(res.findings)
    file = tmp_path / "run" / "qconfig" / "qconfig.yaml"
    spec = qconfig.load(file)
    assert spec.by_name  # the raised ops
    again = _run(tmp_path, "again", "qconfig=file", f"qconfig.path={file}", "exp.max_drop=0.05")
    first = again.table.iloc[0]
    assert first.direction == "start" and first.meets_target
    assert first.task == chosen.task and first.sqnr_db == chosen.sqnr_db
    assert first.cost == chosen.cost


def test_recipe_says_plainly_when_the_ceiling_misses(tmp_path):
    write_inputs(tmp_path / "x.npz")
    res = _run(tmp_path, "run", "exp.max_drop=null", "exp.min_sqnr_db=300")
    assert not res.table.meets_target.any()
    assert any("not even the ceiling" in f for f in res.findings)
    # every step's output SQNR with its interval over the 64 items, in the table and the words
    t = res.table
    assert (t.sqnr_db_n == 64).all()
    assert ((t.sqnr_db_ci_low <= t.sqnr_db) & (t.sqnr_db <= t.sqnr_db_ci_high)).all()
    start = next(f for f in res.findings if f.startswith("Start ("))
    assert "dB (95% CI" in start and "n=64" in start


def test_recipe_needs_exactly_one_target():
    from quantlab.config import compose

    with pytest.raises(Exception, match="exactly one target"):
        compose(["+exp=recipe", "exp.min_sqnr_db=20"])


def test_the_start_is_the_best_calibration_a_calibration_folder_found(tmp_path):
    from experiments.recipe import best_calibration
    from quantlab.calibration.kinds import ObserverKind
    from quantlab.simulate import Mode

    rows = [  # model, platform, observer, mode, output SQNR (dB)
        ("toy", "j6m", "MSE", "FIXED", 9.0),
        ("toy", "j6m", "PER_OP/MODEL_OUTPUT", "FIXED", 12.0),
        ("toy", "j6m", "KL", "FAKE", 13.0),
        ("other", "j6m", "MINMAX", "FIXED", 30.0),
    ]
    cols = ["model", "platform", "observer", "mode", "output_sqnr_db"]
    pd.DataFrame(rows, columns=cols).to_csv(tmp_path / "results.csv", index=False)
    rule = qconfig.OpQConfig(observer=ObserverKind.CLIPSTD)
    (tmp_path / "qconfig").mkdir()
    qconfig.save(
        qconfig.QConfigSpec(by_name={"fc:linear#0": rule}),
        tmp_path / "qconfig" / "per_op_toy_model_output.yaml",
    )
    spec, words = best_calibration(str(tmp_path), "toy", Mode.FIXED)
    assert spec.by_name == {"fc:linear#0": rule} and "PER_OP/MODEL_OUTPUT" in words
    assert "per_op_toy_model_output.yaml" in words and "12.00 dB" in words
    spec, words = best_calibration(str(tmp_path), "toy", Mode.FAKE)
    assert spec.global_.observer is ObserverKind.KL and "observer KL" in words
    assert best_calibration(str(tmp_path), "absent", Mode.FIXED) is None
    assert best_calibration(str(tmp_path / "nowhere"), "toy", Mode.FIXED) is None


def test_your_models_calibration_is_where_its_recipe_starts(tmp_path):
    """+exp=calibration with your model (model=custom) calibrates that model alone on your
    data; a recipe pointed at that run's folder starts from the best calibration it found."""
    from experiments.calibration import calibration
    from quantlab.config import compose
    from quantlab.experiment import RunContext
    from quantlab.report import write_report

    write_inputs(tmp_path / "x.npz")
    cfg = compose(
        ["+exp=calibration", "model=custom", "model.target=recipe_toy:build", "data=tensors"]
        + [f"data.path={tmp_path}/x.npz", "data.num_calib=64", "data.num_eval=64"]
        + ["data.batch_size=64", "exp.observers=[MSE,MINMAX,HISTOGRAM/SQNR]"]
        + ["exp.per_op_targets=[MODEL_OUTPUT]", "exp.modes=[FIXED]", "progress=false"]
    )
    folder = tmp_path / "calibration"
    ctx = RunContext(cfg.platform, cfg.model, cfg.data, 0, folder, model_chosen=True)
    ctx.progress = False
    res = calibration(cfg.exp, ctx)
    write_report(res, folder, "python -m quantlab +exp=calibration", "")
    name = "custom:recipe_toy:build"
    assert set(res.table.model) == {name} and len(res.table) == 4  # 3 rules + the per-op choice
    assert (res.table.output_sqnr_db_n == 64).all()
    assert (folder / "qconfig" / f"per_op_{name}_model_output.yaml").exists()
    (peer_line,) = [f for f in res.findings if "above the best peer rule" in f]
    assert peer_line.startswith(f"{name}, fixed: above the best peer rule, HISTOGRAM/SQNR")
    best = res.table.loc[res.table.output_sqnr_db.idxmax()]
    rec = _run(tmp_path, "recipe", "exp.max_drop=0.05", f"exp.start_calibration={folder}")
    assert rec.findings[0].startswith(
        f"Calibration: the best calibration {folder} found for {name} on j6m in FIXED mode, "
        f"{best.observer} ("
    )
