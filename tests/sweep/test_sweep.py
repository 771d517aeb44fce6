"""Sweeps: summary of finished jobs, resume after a kill, joblib and submitit launchers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from quantlab.sweep import find_jobs, summarize_sweep, swept_keys
from quantlab.sweep.summary import parse_override

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().parent / "run_quantlab.py"


def _fake_job(sweep: Path, name: str, overrides: list[str], rows: pd.DataFrame | None) -> Path:
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if rows is not None:
        rows.to_csv(job / "results.csv", index=False)
        (job / "DONE").write_text("")
    return job


def test_parse_override():
    assert parse_override("+exp=lut_error") == ("exp", "lut_error")
    assert parse_override("++a.b=1=2") == ("a.b", "1=2")
    with pytest.raises(ValueError, match="no '='"):
        parse_override("platform")


def test_summary_merges_finished_jobs_once(tmp_path):
    sweep = tmp_path / "sweep"
    for v in (1, 2):
        rows = pd.DataFrame({"x": [0, 1], "y": [0.0, float(v)], "platform": ["j6m", "j6m"]})
        _fake_job(sweep, f"v={v}", ["+exp=probe", f"exp.value={v}", "platform=j6m"], rows)
    _fake_job(sweep, "v=3", ["+exp=probe", "exp.value=3", "platform=j6m"], None)  # unfinished
    summary = summarize_sweep(sweep)
    assert list(summary.columns[:4]) == ["job", "exp", "exp.value", "sweep.platform"]
    assert summary.groupby("job").size().to_dict() == {"v=1": 2, "v=2": 2}
    assert (sweep / "summary.csv").exists() and (sweep / "summary_y.png").exists()
    by_job = pd.read_csv(sweep / "summary_jobs.csv")
    assert by_job["y"].tolist() == [0.5, 1.0]
    md = (sweep / "summary.md").read_text()
    assert "2 finished jobs" in md and "1 unfinished job folders" in md and "v=3" in md
    assert swept_keys(find_jobs(sweep)) == ["exp.value"]
    # summarizing again gives the same table (idempotent)
    assert summarize_sweep(sweep).equals(summary)


def test_summary_of_missing_folder_fails(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        summarize_sweep(tmp_path / "nope")


def _quantlab(args: list[str], cwd: Path = ROOT, **kw) -> subprocess.Popen:
    # this checkout first: the runner must import this quantlab, not an installed one
    path = os.pathsep.join([str(RUNNER.parent), str(ROOT)])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(RUNNER), *args, "progress=false"]
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw
    )


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    return text


def test_killed_sweep_resumes_without_repeating_jobs(tmp_path):
    """Kill a sweep after its first job, rerun it (joblib, in parallel) in the same folder."""
    sweep = tmp_path / "sweep"
    args = ["-m", "+exp=sweep_probe_schema", "exp.value=1,2,3", "exp.sleep_s=1.0"]
    proc = _quantlab([*args, f"hydra.sweep.dir={sweep}"], start_new_session=True)
    deadline = time.monotonic() + 90
    try:
        while not any(sweep.glob("*/DONE")):
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the first job did not finish in time"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first = [j for j in find_jobs(sweep) if j.finished]
    assert len(first) == 1, "the sweep was meant to be stopped after its first job"
    first_mtime = (first[0].folder / "results.csv").stat().st_mtime_ns
    assert not (sweep / "summary.csv").exists()

    out = _finish(_quantlab([*args, "sweep=joblib", f"hydra.sweep.dir={sweep}"]))
    assert "already holds a finished run; skipped" in out
    summary = pd.read_csv(sweep / "summary.csv")
    assert summary.groupby("exp.value").size().to_dict() == {1: 3, 2: 3, 3: 3}
    assert summary["job"].nunique() == 3
    assert (first[0].folder / "results.csv").stat().st_mtime_ns == first_mtime  # not rerun
    assert (summary["y"] == summary["exp.value"] * summary["x"]).all()


def test_submitit_local_sweep(tmp_path):
    """The cluster code path (pickled jobs, submitit folders) through the local executor."""
    sweep = tmp_path / "sweep"
    _finish(
        _quantlab(
            ["+exp=sweep_probe_schema", "exp.value=2,5", "sweep=local_submitit"]
            + [f"hydra.sweep.dir={sweep}"]
        )
    )
    assert any((sweep / ".submitit").iterdir())
    summary = pd.read_csv(sweep / "summary.csv")
    assert sorted(summary["exp.value"].unique()) == [2, 5]
    assert len(summary) == 6


@pytest.mark.parametrize(
    "preset, target",
    [
        ("joblib", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"),
        ("local_submitit", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"),
        ("slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
    ],
)
def test_sweep_presets_compose(preset, target, monkeypatch):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from quantlab.config import CONFIG_DIR, register_all

    monkeypatch.setenv("QUANTLAB_SLURM_PARTITION", "cpu")
    register_all()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"sweep={preset}"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == target
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.callbacks.summary._target_ == "quantlab.sweep.SummaryCallback"
    if preset == "slurm":
        resolved = OmegaConf.to_container(launcher, resolve=False)
        assert launcher.partition == "cpu" and launcher.cpus_per_task == 4
        assert resolved["submitit_folder"].endswith("/.submitit/%j")


def test_summary_command(tmp_path, capsys):
    from quantlab.sweep.__main__ import main

    sweep = tmp_path / "sweep"
    _fake_job(sweep, "a=1", ["a=1"], pd.DataFrame({"y": [1.0]}))
    _fake_job(sweep, "a=2", ["a=2"], None)
    assert main([str(sweep), "--no-plots"]) == 0
    assert "1/2 jobs finished; 1 rows" in capsys.readouterr().out
    assert not list(sweep.glob("*.png"))


def test_runs_and_sweeps_write_into_their_default_folders(tmp_path):
    """Without hydra.run.dir / hydra.sweep.dir (as the README's commands run): a run writes
    outputs/<experiment>/<time>/, a sweep (basic and joblib launchers) multirun/<experiment>/
    <time>/ with its summary, under the working folder."""
    # the run and the first sweep at once: they write into different folders
    single = _quantlab(["+exp=sweep_probe_schema", "exp.value=2"], cwd=tmp_path)
    basic = _quantlab(["-m", "+exp=sweep_probe_schema", "exp.value=1,2"], cwd=tmp_path)
    _finish(single)
    _finish(basic)
    (run,) = (tmp_path / "outputs" / "sweep_probe_schema").iterdir()
    assert (run / "results.csv").exists() and (run / "config.yaml").exists()
    time.sleep(1.1)  # the next sweep's folder is named by a later second
    args = ["+exp=sweep_probe_schema", "exp.value=3,4", "sweep=joblib"]
    _finish(_quantlab(args, cwd=tmp_path))
    sweeps = sorted((tmp_path / "multirun" / "sweep_probe_schema").iterdir())
    assert len(sweeps) == 2
    for sweep, values in zip(sweeps, ([1, 2], [3, 4])):
        summary = pd.read_csv(sweep / "summary.csv")
        assert sorted(summary["exp.value"].unique()) == values
