"""Hydra entry point: ``python -m quantlab +exp=<name> [group=option ...] [key=value ...]``."""

from __future__ import annotations

import logging
import random
import shlex
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from quantlab.config import register_all, to_config
from quantlab.experiment import (
    ExperimentResult,
    RunContext,
    check_model_choice,
    lookup,
    registered,
)
from quantlab.host_memory import keep_freed_memory
from quantlab.models.schema import USER_MODELS
from quantlab.report import publish, run_environment, write_report
from quantlab.report.io import atomic_write_text

DONE_MARKER = "DONE"
log = logging.getLogger(__name__)

register_all()


def _usage() -> str:
    names = sorted(registered())
    lines = ["quantlab: choose an experiment with +exp=<name>. Available experiments:"]
    lines += [f"  python -m quantlab +exp={n}" for n in names]
    lines.append("Groups and options: python -m quantlab --help")
    return "\n".join(lines)


def run(
    cfg: DictConfig, output_dir: Path, command: str, model_chosen: bool = False
) -> ExperimentResult | None:
    """Run the experiment chosen in ``cfg`` and write its report into ``output_dir``.

    ``model_chosen``: the command line set ``model=...`` (your own model, custom or onnx,
    counts as chosen either way); an experiment that does not take a model refuses it. A folder
    that already holds a finished run (its DONE marker) is not run again: this is how a sweep
    rerun in the same folder skips finished jobs.
    """
    if cfg.get("exp") is None:
        print(_usage())
        return None
    output_dir = Path(output_dir)
    if (output_dir / DONE_MARKER).exists():
        print(f"quantlab: {output_dir} already holds a finished run; skipped", file=sys.stderr)
        return None
    conf = to_config(cfg)
    entry = lookup(type(conf.exp))
    model_chosen = model_chosen or conf.model.name in USER_MODELS
    check_model_choice(entry, conf.exp, conf.model.name, model_chosen)
    if conf.keep_freed_memory:
        keep_freed_memory()
    if conf.seed is not None:
        import numpy as np
        import torch

        random.seed(conf.seed)
        np.random.seed(conf.seed)  # noqa: NPY002 (legacy global RNG, seeded for user code)
        torch.manual_seed(conf.seed)
    ctx = RunContext(
        platform=conf.platform,
        model=conf.model,
        data=conf.data,
        seed=conf.seed,
        output_dir=output_dir,
        qconfig=conf.qconfig,
        progress=conf.progress,
        model_chosen=model_chosen,
    )
    environment = run_environment()  # as the run starts (an experiment may time on fewer)
    result = entry.fn(conf.exp, ctx)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    write_report(result, output_dir, command, config_yaml, environment=environment)
    if conf.publish_dir:
        publish(output_dir, Path(conf.publish_dir))
    atomic_write_text(output_dir / DONE_MARKER, "")
    log.info("report: %s", output_dir / "report.md")
    if conf.publish_dir:
        log.info("published to %s", Path(conf.publish_dir) / "report.md")
    return result


def reproduce_command(overrides: list[str]) -> str:
    """The shell command that reruns a run with ``overrides``, each quoted where the shell
    would split or expand it (``model.kwargs={a: 1, b: 2}``)."""
    return "python -m quantlab " + " ".join(shlex.quote(o) for o in overrides)


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    command = reproduce_command(hc.overrides.task)
    run(cfg, Path(hc.runtime.output_dir), command, model_choice(hc.overrides.task))


def model_choice(overrides: list[str]) -> bool:
    """Whether the command line chooses the model (``model=...``, ``+model=...``)."""
    return any(o.split("=", 1)[0].lstrip("+~") == "model" for o in overrides)


if __name__ == "__main__":
    main()
