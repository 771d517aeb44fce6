"""Aggregate a sweep folder: every finished job's results.csv plus its overrides, once each.

A sweep folder (``hydra.sweep.dir``) holds one subfolder per job. A job is *finished* when its
folder holds the DONE marker that ``quantlab.__main__.run`` writes last and atomically; only
finished jobs enter the summary, each exactly once, however often the sweep was interrupted and
rerun in the same folder. Files written into the sweep folder:

- ``summary.csv``: every row of every finished job's results.csv, with the job's folder name
  (``job``) and its command-line overrides (one column per override key) in front;
- ``summary_jobs.csv``: one row per finished job: overrides, row count and the mean of each
  numeric result column over the job's rows;
- ``summary_<metric>.png``: that mean against the first swept key, one line per value of the
  second swept key (a key is *swept* when its value differs between jobs);
- ``summary.md``: counts (finished, unfinished) and the job table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from quantlab.report import markdown_table
from quantlab.report.io import atomic_savefig, atomic_write_csv, atomic_write_text
from quantlab.report.plots import Plot, PlotKind, draw

DONE_MARKER = "DONE"
RESULTS_FILE = "results.csv"
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
MAX_METRIC_PLOTS = 6


@dataclass(frozen=True)
class JobRecord:
    """One job folder of a sweep: where it is, its overrides, whether it finished."""

    folder: Path
    name: str  # the folder's path relative to the sweep folder
    overrides: dict[str, str]
    finished: bool


def parse_override(text: str) -> tuple[str, str]:
    """``"+exp=lut_error"`` -> ``("exp", "lut_error")``; strips ``+``, ``++`` and ``~``.

    Raises ValueError for text without ``=`` (Hydra never records such a task override).
    """
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"override {text!r} has no '='; expected key=value")
    return key.lstrip("+~"), value


def read_overrides(job_folder: Path) -> dict[str, str]:
    """The task overrides Hydra recorded for a job (``.hydra/overrides.yaml``), in order."""
    path = Path(job_folder) / OVERRIDES_FILE
    if not path.exists():
        return {}
    from omegaconf import OmegaConf

    items = OmegaConf.to_container(OmegaConf.load(path))
    return dict(parse_override(str(item)) for item in items or [])


def find_jobs(sweep_dir: Path) -> list[JobRecord]:
    """Every job folder under ``sweep_dir`` (one that Hydra started or that holds a DONE marker).

    Job folders are found by their ``.hydra`` folder or DONE marker at any depth (an override
    value containing '/' nests the folder), skipping submitit's own ``.submitit`` folder.
    Sorted by folder name, so the order does not depend on which job finished first.
    """
    sweep_dir = Path(sweep_dir)
    folders: set[Path] = set()
    for marker in (DONE_MARKER, ".hydra"):
        for p in sweep_dir.rglob(marker):
            rel = p.parent.relative_to(sweep_dir)
            if p.parent != sweep_dir and ".submitit" not in rel.parts:
                folders.add(p.parent)
    jobs = []
    for folder in sorted(folders):
        finished = (folder / DONE_MARKER).exists() and (folder / RESULTS_FILE).exists()
        jobs.append(
            JobRecord(
                folder=folder,
                name=folder.relative_to(sweep_dir).as_posix(),
                overrides=read_overrides(folder),
                finished=finished,
            )
        )
    return jobs


def swept_keys(jobs: list[JobRecord]) -> list[str]:
    """Override keys whose value differs between jobs (or is missing in some), first-seen order."""
    keys: dict[str, None] = {}
    for j in jobs:
        keys.update(dict.fromkeys(j.overrides))
    return [k for k in keys if len({j.overrides.get(k) for j in jobs}) > 1]


def _numeric(values: pd.Series) -> pd.Series:
    """Values as numbers where every one converts (so '8', '16' plot as numbers), else as text."""
    converted = pd.to_numeric(values, errors="coerce")
    return converted if converted.notna().all() else values.astype(str)


def summarize_sweep(sweep_dir: Path, plots: bool = True) -> pd.DataFrame:
    """Merge every finished job of ``sweep_dir`` into ``summary.csv`` (+ job table, plots, md).

    Returns the merged table (also when no job has finished: then it is empty). A results
    column that has the same name as an override key keeps its name; the override becomes
    ``sweep.<key>``.
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ValueError(f"sweep folder {sweep_dir} does not exist")
    jobs = find_jobs(sweep_dir)
    done = [j for j in jobs if j.finished]
    frames, job_rows = [], []
    for j in done:
        df = pd.read_csv(j.folder / RESULTS_FILE)
        front = {"job": j.name}
        for k, v in j.overrides.items():
            front[f"sweep.{k}" if k in df.columns or k == "job" else k] = v
        for i, (k, v) in enumerate(front.items()):
            df.insert(i, k, v)
        frames.append(df)
        means = df.drop(columns=list(front)).select_dtypes("number").mean()
        job_rows.append({**front, "rows": len(df), **means.to_dict()})
    summary = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["job"])
    by_job = pd.DataFrame(job_rows) if job_rows else pd.DataFrame(columns=["job", "rows"])
    atomic_write_csv(summary, sweep_dir / "summary.csv")
    atomic_write_csv(by_job, sweep_dir / "summary_jobs.csv")

    keys = [k for k in swept_keys(done) if k in by_job.columns]
    png_names = _write_plots(by_job, keys, sweep_dir) if plots and keys and len(done) > 1 else []
    unfinished = [j.name for j in jobs if not j.finished]
    md = [
        f"# Sweep summary: {sweep_dir.name}",
        "",
        f"- {len(done)} finished jobs ({len(summary)} result rows) merged into `summary.csv`.",
        f"- {len(unfinished)} unfinished job folders (no DONE marker): "
        + (", ".join(unfinished) if unfinished else "none")
        + ".",
        f"- Swept keys: {', '.join(keys) if keys else 'none'}.",
        "",
        "## Jobs (mean of each numeric result column)",
        "",
        markdown_table(by_job),
        "",
    ]
    md += [f"![{n}]({n}.png)\n" for n in png_names]
    atomic_write_text(sweep_dir / "summary.md", "\n".join(md))
    return summary


def _write_plots(by_job: pd.DataFrame, keys: list[str], sweep_dir: Path) -> list[str]:
    import matplotlib.pyplot as plt

    table = by_job.copy()
    for k in keys:
        table[k] = _numeric(table[k])
    fixed = {"job", "rows", *keys} | {c for c in table.columns if c.startswith("sweep.")}
    metrics = [
        c
        for c in table.columns
        if c not in fixed and pd.api.types.is_numeric_dtype(table[c]) and table[c].notna().any()
    ][:MAX_METRIC_PLOTS]
    names = []
    for metric in metrics:
        name = "summary_" + "".join(ch if ch.isalnum() else "_" for ch in metric)
        plot = Plot(
            name=name,
            x=keys[0],
            y=metric,
            xlabel=f"{keys[0]} (swept value)",
            ylabel=f"{metric} (job mean, units of results.csv)",
            title=f"{metric} across the sweep",
            hue=keys[1] if len(keys) > 1 else None,
            kind=PlotKind.LINE,
        )
        fig = draw(plot, table)
        atomic_savefig(fig, sweep_dir / f"{name}.png")
        plt.close(fig)
        names.append(name)
    return names
