"""PTQ vs QAT vs deployment-aware QAT on one model: fine-tune through the simulator, judge the
deployed (fixed mode) model.

A ``QatTask`` is a trained float model with its calibration, training and evaluation batches,
the qconfig it deploys under, a loss (against labels, or distillation from the float model) and
task metrics. ``compare_variants`` calibrates a fresh copy per ``Variant``, fine-tunes it with
``Simulator.train_step`` (PTQ: not at all; QAT: plain fake mode; DEPLOYED_QAT: fake mode with the
deployed segment tables, ``FakeOps.DEPLOYED``), and measures each task metric in FIXED, FAKE and
HYBRID mode against its reference, with item count and 95% bootstrap interval, plus the
fake-vs-fixed gap (output SQNR of fixed against fake, and against hybrid = the deployment-aware
fake view) with its interval.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor, nn
from tqdm import tqdm

from quantlab.analysis.confidence import bootstrap, estimate_metrics
from quantlab.models.tasks import OutputSQNR
from quantlab.qconfig import QConfigSpec
from quantlab.simulate import FakeOps, Mode, ScaleTraining, Simulator


class Variant(enum.Enum):
    """PTQ: calibrated, not trained. QAT: fine-tuned through plain fake mode (QAT's exact
    functions). DEPLOYED_QAT: fine-tuned through fake mode with the deployed segment tables and
    period handling (``FakeOps.DEPLOYED``)."""

    PTQ = "ptq"
    QAT = "qat"
    DEPLOYED_QAT = "deployed_qat"


FAKE_OPS = {
    Variant.PTQ: FakeOps.QAT,
    Variant.QAT: FakeOps.QAT,
    Variant.DEPLOYED_QAT: FakeOps.DEPLOYED,
}


@dataclass
class QatTask:
    """One model to fine-tune. ``loss(output, target)``: ``targets[i]`` of ``train[i]`` are
    labels, or the float model's outputs (distillation). ``eval_refs``: per evaluation batch, what
    the metrics compare with (labels, or the float outputs); ``metrics``: task metrics
    (``quantlab.models.tasks``), the first one the headline."""

    name: str
    model: nn.Module
    spec: QConfigSpec
    calib: list[tuple]
    train: list[tuple]
    targets: list[Any]
    loss: Callable[[Any, Any], Tensor]
    eval: list[tuple]
    eval_refs: list[Any]
    metrics: tuple
    reference: str  # what eval_refs are ("labels" or "float model")


@dataclass(frozen=True)
class FineTuning:
    """How each variant trains: ``steps`` Adam steps at ``lr`` cycling over the training
    batches; activation scales per ``scales``."""

    steps: int
    lr: float
    scales: ScaleTraining = ScaleTraining.FIXED


def _finetune(sim: Simulator, task: QatTask, ft: FineTuning, variant: Variant, curve: list):
    if ft.scales is ScaleTraining.LEARNED:
        sim.learn_scales(*task.train[0])
    opt = torch.optim.Adam(sim.trainable_parameters(), lr=ft.lr)
    for step in range(ft.steps):
        i = step % len(task.train)
        target = task.targets[i]
        loss = sim.train_step(task.train[i], lambda out, t=target: task.loss(out, t), opt)
        curve.append({"model": task.name, "variant": variant.name, "step": step + 1, "loss": loss})


def _outputs(sim: Simulator, batches: list[tuple], mode: Mode) -> list:
    with torch.no_grad():
        return [sim.run(*b, mode=mode) for b in batches]


def compare_variants(
    task: QatTask, platform, ft: FineTuning, variants: list[Variant], progress: bool = True
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(metric rows, training-curve rows) of ``task`` under each variant on ``platform``.

    Metric rows: model, variant, mode (FIXED / FAKE / HYBRID), metric, value, ci_low, ci_high,
    items, higher_is_better; gap rows have metric ``gap_sqnr_db`` (mode FAKE: fixed against
    fake; mode HYBRID: fixed against hybrid). The task's model is never changed (each variant
    trains its own copy)."""
    rows, curve = [], []
    first = None
    for variant in tqdm(variants, desc=f"qat {task.name}", disable=not progress):
        model = copy.deepcopy(task.model)
        sim = Simulator(model, platform, task.spec, fake_ops=FAKE_OPS[variant])
        if first is None:  # one calibration, shared by every variant's copy
            sim.calibrate(task.calib, progress=False)
            first = sim
        else:
            sim.share_calibration(first)
        if variant is not Variant.PTQ:
            _finetune(sim, task, ft, variant, curve)
        sim.fake_ops = FakeOps.QAT  # FAKE = QAT's view; HYBRID = the deployed-table view
        outs = {m: _outputs(sim, task.eval, m) for m in (Mode.FIXED, Mode.FAKE, Mode.HYBRID)}
        for mode, out in outs.items():
            est = estimate_metrics(task.metrics, task.eval_refs, out)
            for metric in task.metrics:
                rows.append(_row(task, variant, mode, metric.name, est[metric.name], metric))
        for mode in (Mode.FAKE, Mode.HYBRID):
            gap = bootstrap(OutputSQNR(), outs[mode], outs[Mode.FIXED])
            rows.append(_row(task, variant, mode, "gap_sqnr_db", gap, OutputSQNR()))
    return pd.DataFrame(rows), pd.DataFrame(curve)


def _row(task, variant, mode, name, e, metric) -> dict:
    return {
        "model": task.name,
        "variant": variant.name,
        "mode": mode.name,
        "metric": name,
        "value": e.value,
        "ci_low": e.low,
        "ci_high": e.high,
        "items": e.n,
        "higher_is_better": metric.higher_is_better,
        "reference": task.reference if name != "gap_sqnr_db" else f"{mode.name.lower()} run",
    }
