"""Report writing: results.csv, extra tables, plots and report.md for one run, all atomic."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from quantlab.report.io import atomic_savefig, atomic_write_csv, atomic_write_text
from quantlab.report.plots import Plot, PlotKind, draw

__all__ = ["Plot", "PlotKind", "write_report", "run_environment", "markdown_table", "QCONFIG_DIR"]

QCONFIG_DIR = "qconfig"
"""Subfolder of a run folder holding the qconfig YAML files the run chose."""


def markdown_table(df: pd.DataFrame, max_rows: int = 40, floatfmt: str = ".4g") -> str:
    """A GitHub markdown table of ``df`` (first ``max_rows`` rows), numbers with ``floatfmt``."""
    shown = df.head(max_rows)
    cols = [str(c) for c in shown.columns]

    def fmt(v) -> str:
        if isinstance(v, float):
            return format(v, floatfmt)
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in shown.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    if len(df) > max_rows:
        lines.append(f"\n({len(df) - max_rows} more rows in the CSV)")
    return "\n".join(lines)


def run_environment() -> str:
    """What a run's float figures depend on beyond its config: torch's version, its intra-op
    thread count (a float convolution's sums follow it, and calibration and every mode after
    it follow those bits) and the CPU kernels torch picks."""
    import torch

    return (
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )


def write_report(
    result,
    out_dir: Path,
    command: str,
    config_yaml: str,
    summary_columns: list[str] | None = None,
    environment: str | None = None,
) -> Path:
    """Write ``result`` (an ExperimentResult) into ``out_dir``; return the report path.

    Files: results.csv (the tidy table), <name>.csv per extra table, <plot>.png per plot,
    config.yaml (the resolved config of this run), the qconfig YAML files the run chose
    (``result.qconfigs``) and report.md (findings, tables, plots, the command that reproduces it
    and the ``environment`` it ran in, ``run_environment``).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(result.table, out_dir / "results.csv")
    atomic_write_text(out_dir / "config.yaml", config_yaml)
    for name, df in result.tables.items():
        atomic_write_csv(df, out_dir / f"{name}.csv")
    if result.qconfigs:
        from quantlab.qconfig import save

        for name, (spec, header) in result.qconfigs.items():
            save(spec, out_dir / QCONFIG_DIR / name, header)
    import matplotlib.pyplot as plt

    pngs = []
    for plot in result.plots:
        df = result.table if plot.table is None else result.tables[plot.table]
        fig = draw(plot, df)
        atomic_savefig(fig, out_dir / f"{plot.name}.png")
        plt.close(fig)
        pngs.append(plot)

    md = [f"# {result.title}", ""]
    if result.findings:
        md += ["## Findings", ""] + [f"- {f}" for f in result.findings] + [""]
    for name, df in result.tables.items():
        md += [f"## {name.replace('_', ' ')}", "", markdown_table(df), ""]
    if pngs:
        md += ["## Plots", ""]
        for plot in pngs:
            md += [f"![{plot.title or plot.name}]({plot.name}.png)", ""]
    if result.notes:
        md += ["## Method", ""] + [f"- {n}" for n in result.notes] + [""]
    md += [
        "## Reproduce",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Raw results: `results.csv` ({len(result.table)} rows); resolved config: `config.yaml`.",
        "",
    ]
    if environment:
        md += [
            f"Ran on {environment}: torch's float convolutions can sum in an order that follows "
            "the thread count, so another count can move the figures in their last digits.",
            "",
        ]
    if result.qconfigs:
        files = ", ".join(f"`{QCONFIG_DIR}/{n}`" for n in result.qconfigs)
        md += [
            "Chosen per-op precision, ready to pass back with `qconfig=file "
            f"qconfig.path=<this folder>/{QCONFIG_DIR}/<file>`: {files}.",
            "",
        ]
    return atomic_write_text(out_dir / "report.md", "\n".join(md))


def publish(run_dir: Path, publish_dir: Path) -> Path:
    """Copy a run's report files (md, csv, png, yaml, and the chosen ``qconfig/*.yaml``) to
    ``publish_dir`` (e.g. reports/<exp>)."""
    publish_dir = Path(publish_dir)
    publish_dir.mkdir(parents=True, exist_ok=True)
    for f in Path(run_dir).iterdir():
        if f.is_file() and f.suffix in {".md", ".csv", ".png", ".yaml"}:
            shutil.copy2(f, publish_dir / f.name)
    chosen = Path(run_dir) / QCONFIG_DIR
    if chosen.is_dir():
        (publish_dir / QCONFIG_DIR).mkdir(exist_ok=True)
        for f in chosen.glob("*.yaml"):
            shutil.copy2(f, publish_dir / QCONFIG_DIR / f.name)
    return publish_dir
