"""PTQ vs QAT vs deployment-aware QAT on one model: fine-tune through the simulator, judge the
deployed (fixed mode) model.

A ``QatTask`` is a trained float model with its calibration, training and evaluation batches,
the qconfig it deploys under, a loss (against labels, or distillation from the float model) and
task metrics; an image model also says how the chip receives its input (``DeployedInput``: the
deployed input path, ``quantlab.models.input_path``). ``compare_variants`` calibrates once, then
per ``Variant`` fine-tunes a fresh copy with ``Simulator.train_step`` (PTQ: not at all; QAT:
plain fake mode on the task's own input; DEPLOYED_QAT: fake mode with the deployed segment
tables, ``FakeOps.DEPLOYED``, on the deployed input) and measures each task metric in FIXED mode
on the deployed input (a model trained on the task's own input is deployed first: mean/std
folded into its first conv), and in FAKE and HYBRID mode on the input it trained on, against its
reference, with item count and 95% bootstrap interval, plus the fake-vs-fixed gap (output SQNR
of fixed against fake, and against hybrid = the deployment-aware fake view) with its interval.
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
    functions) on the task's own input. DEPLOYED_QAT: fine-tuned through fake mode with the
    deployed segment tables and period handling (``FakeOps.DEPLOYED``) on the input the chip
    receives (``QatTask.deployed``, when the task has one)."""

    PTQ = "ptq"
    QAT = "qat"
    DEPLOYED_QAT = "deployed_qat"


FAKE_OPS = {
    Variant.PTQ: FakeOps.QAT,
    Variant.QAT: FakeOps.QAT,
    Variant.DEPLOYED_QAT: FakeOps.DEPLOYED,
}


@dataclass(frozen=True)
class DeployedInput:
    """How the chip receives a task's input when that differs from the input the task trains on
    (an image model's deployed input path): ``deploy(model)`` is the deployed copy of a (trained)
    model of the task (e.g. ``quantlab.models.input_path.deploy_input_path``: mean/std folded
    into its first conv), ``train`` and ``eval`` the task's training and evaluation batches as
    the chip receives them (the same items in the same order); ``name`` says what it is (e.g.
    ``UINT8_RGB``)."""

    name: str
    deploy: Callable[[nn.Module], nn.Module]
    train: list[tuple]
    eval: list[tuple]


@dataclass
class QatTask:
    """One model to fine-tune. ``loss(output, target)``: ``targets[i]`` of ``train[i]`` are
    labels, or the float model's outputs (distillation). ``eval_refs``: per evaluation batch, what
    the metrics compare with (labels, or the float outputs); ``metrics``: task metrics
    (``quantlab.models.tasks``), the first one the headline. ``input``: what the model's own
    input is (e.g. ``FLOAT_NORMALIZED``); ``deployed``: how the chip receives it instead (None:
    as the model takes it)."""

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
    input: str = "float"
    deployed: DeployedInput | None = None


@dataclass(frozen=True)
class FineTuning:
    """How each variant trains: ``steps`` Adam steps at ``lr`` cycling over the training
    batches; activation scales per ``scales``."""

    steps: int
    lr: float
    scales: ScaleTraining = ScaleTraining.FIXED


def _finetune(sim: Simulator, train: list[tuple], task: QatTask, ft: FineTuning, variant, curve):
    if ft.scales is ScaleTraining.LEARNED:
        sim.learn_scales(*train[0])
    opt = torch.optim.Adam(sim.trainable_parameters(), lr=ft.lr)
    for step in range(ft.steps):
        i = step % len(train)
        target = task.targets[i]
        loss = sim.train_step(train[i], lambda out, t=target: task.loss(out, t), opt)
        curve.append({"model": task.name, "variant": variant.name, "step": step + 1, "loss": loss})


def _outputs(sim: Simulator, batches: list[tuple], mode: Mode) -> list:
    with torch.no_grad():
        return [sim.run(*b, mode=mode) for b in batches]


def compare_variants(
    task: QatTask, platform, ft: FineTuning, variants: list[Variant], progress: bool = True
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(metric rows, training-curve rows) of ``task`` under each variant on ``platform``.

    Metric rows: model, variant, mode (FIXED / FAKE / HYBRID), input (what the run took: the
    deployed input's name for FIXED when the task has one, else ``task.input``), metric, value,
    ci_low, ci_high, items, higher_is_better; gap rows have metric ``gap_sqnr_db`` (mode FAKE:
    fixed against fake; mode HYBRID: fixed against hybrid). One calibration on the task's own
    input serves every variant and form (op names are the same; a deployed input arrives as
    codes at its fixed scale and needs none). The task's model is never changed (each variant
    trains its own copy)."""
    rows, curve = [], []
    base = Simulator(copy.deepcopy(task.model), platform, task.spec)
    base.calibrate(task.calib, progress=False)
    dep = task.deployed
    for variant in tqdm(variants, desc=f"qat {task.name}", disable=not progress):
        on_chip = variant is Variant.DEPLOYED_QAT and dep is not None
        model, train, evals = copy.deepcopy(task.model), task.train, task.eval
        if on_chip:
            model, train, evals = dep.deploy(model), dep.train, dep.eval
        sim = Simulator(model, platform, task.spec, fake_ops=FAKE_OPS[variant])
        sim.share_calibration(base)
        if variant is not Variant.PTQ:
            _finetune(sim, train, task, ft, variant, curve)
        sim.fake_ops = FakeOps.QAT  # FAKE = QAT's view; HYBRID = the deployed-table view
        outs = {m: _outputs(sim, evals, m) for m in (Mode.FAKE, Mode.HYBRID)}
        if dep is None or on_chip:
            outs[Mode.FIXED] = _outputs(sim, evals, Mode.FIXED)
        else:  # what the chip computes from the fine-tuned model: its deployed form
            chip = Simulator(dep.deploy(sim.model), platform, task.spec)
            chip.share_calibration(sim, learned_scales=True)
            outs[Mode.FIXED] = _outputs(chip, dep.eval, Mode.FIXED)
        own = dep.name if on_chip else task.input
        inputs = {Mode.FIXED: task.input if dep is None else dep.name}
        inputs |= {Mode.FAKE: own, Mode.HYBRID: own}
        for mode in (Mode.FIXED, Mode.FAKE, Mode.HYBRID):
            est = estimate_metrics(task.metrics, task.eval_refs, outs[mode])
            for metric in task.metrics:
                e = est[metric.name]
                rows.append(_row(task, variant, mode, inputs[mode], metric.name, e, metric))
        compared = own if own == inputs[Mode.FIXED] else f"{inputs[Mode.FIXED]} vs {own}"
        for mode in (Mode.FAKE, Mode.HYBRID):
            gap = bootstrap(OutputSQNR(), outs[mode], outs[Mode.FIXED])
            rows.append(_row(task, variant, mode, compared, "gap_sqnr_db", gap, OutputSQNR()))
    return pd.DataFrame(rows), pd.DataFrame(curve)


def _row(task, variant, mode, inp, name, e, metric) -> dict:
    return {
        "model": task.name,
        "variant": variant.name,
        "mode": mode.name,
        "input": inp,
        "metric": name,
        "value": e.value,
        "ci_low": e.low,
        "ci_high": e.high,
        "items": e.n,
        "higher_is_better": metric.higher_is_better,
        "reference": task.reference if name != "gap_sqnr_db" else f"{mode.name.lower()} run",
    }
