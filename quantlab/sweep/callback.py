"""Hydra callback that summarizes a multirun when it ends (``hydra.callbacks.summary``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from quantlab.sweep.summary import find_jobs, summarize_sweep

log = logging.getLogger(__name__)


class SummaryCallback(Callback):
    """At the end of a multirun, merge every finished job of ``hydra.sweep.dir``.

    Runs in the process that launched the sweep (also for the joblib and submitit launchers),
    after every job returned. Writes summary.csv, summary_jobs.csv, summary.md and plots into
    the sweep folder (see quantlab.sweep.summary). A plain run (no ``-m``) is left alone.
    """

    def __init__(self, plots: bool = True) -> None:
        self.plots = plots

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        summary = summarize_sweep(sweep_dir, plots=self.plots)
        jobs = find_jobs(sweep_dir)
        finished = sum(j.finished for j in jobs)
        log.info(
            "sweep summary: %d/%d jobs finished, %d rows -> %s",
            finished,
            len(jobs),
            len(summary),
            sweep_dir / "summary.csv",
        )
