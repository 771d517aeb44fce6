"""The vendor's precision recipe, end to end, on one model and platform (quantlab.analysis.recipe).

Rank the ops (quantlab.analysis.sensitivity, cached, activation, weight and GEMM-input rows),
then follow the platform's flow (seed 004 l.55-93) against the target in ``exp``: J6E/M/B start
all int8, look at the ceiling and back off; J6H/P start from float16 with int8 Conv/MatMul,
switch float16-overflowing ops to int16 and raise the sensitive GEMM inputs and weights to
int16. Every evaluated configuration is a row (task metric with its 95% interval, output SQNR,
cost, raised ops); the cheapest one that meets the target is the product.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from quantlab.analysis.confidence import distinct_digits
from quantlab.analysis.recipe import (
    Direction,
    RecipeResult,
    RecipeTarget,
    no_drop_from,
    run_recipe,
)
from quantlab.analysis.sensitivity import Metric, SensitiveType, analyze
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.models.tasks import OutputSQNR
from quantlab.qconfig import QConfigSpec
from quantlab.report import QCONFIG_DIR, Plot, PlotKind
from quantlab.simulate import Mode, Simulator

RANK_METRICS = [Metric.L1, Metric.COSINE, Metric.MSE, Metric.KL, Metric.SQNR, Metric.MAX_ABS]
"""Every output metric, as +exp=mixed_precision ranks them, so both share cached rankings."""
QCONFIG_FILE = "qconfig.yaml"  # the chosen configuration, in <run>/qconfig/
RANK_KINDS = [SensitiveType.ACTIVATION, SensitiveType.WEIGHT, SensitiveType.INPUT]
RAISE_KINDS = [SensitiveType.ACTIVATION, SensitiveType.INPUT]
"""Raised by default: activations and GEMM inputs. A weight raise (WEIGHT) pins the GEMM's input
to int8 where input and weight cannot both be int16 (J6E/M), undoing the activation raises
that feed it, and on J6H/P an int16 x int16 Conv/Linear saturates the int32 accumulator
(platform.accumulator_overflow, assumed): add WEIGHT to exp.raise_kinds to measure it."""


@dataclass
class RecipeExp:
    """Schema of ``+exp=recipe``; the model, data and platform come from their groups.

    Exactly one target: ``target_metric`` (the task metric's value), ``max_drop`` (the most the
    task metric may lose against the float model) or ``min_sqnr_db`` (output SQNR floor, dB).
    """

    target_metric: float | None = None
    max_drop: float | None = None
    min_sqnr_db: float | None = None
    directions: list[Direction] = field(default_factory=list)  # []: the platform's own flow
    rank_metric: Metric = Metric.L1  # the sensitivity metric that orders the raises
    raise_kinds: list[SensitiveType] = field(default_factory=lambda: list(RAISE_KINDS))
    steps: int = 6  # raise: evenly spaced shares tried; back-off: groups lowered at once
    refine: int = 3  # raise: bisection steps between the last miss and the first hit
    max_evaluations: int = 40  # configurations evaluated at most (start and ceiling included)
    mode: Mode = Mode.FIXED  # the mode each configuration is evaluated in
    merge_batches: bool = True
    cache_dir: str | None = ".quantlab_cache"
    # a published +exp=calibration folder: the recipe starts from the calibration it found best
    # for this model (the highest output SQNR in exp.mode; a per-op choice is its qconfig file),
    # unless the qconfig group names a file or preset; null: the qconfig group's choice alone
    start_calibration: str | None = "reports/calibration"

    def __post_init__(self) -> None:
        self.target()  # exactly one target, finite
        if self.rank_metric is Metric.TASK:
            raise ValueError("exp.rank_metric must be an output metric (L1, COSINE, MSE, KL, ...)")
        if not self.raise_kinds or SensitiveType.FIXED in self.raise_kinds:
            raise ValueError("exp.raise_kinds must be ACTIVATION, WEIGHT and/or INPUT")
        if self.steps < 1 or self.refine < 0 or self.max_evaluations < 2:
            raise ValueError(
                "exp.steps must be >= 1, exp.refine >= 0 and exp.max_evaluations >= 2; got "
                f"{self.steps}, {self.refine}, {self.max_evaluations}"
            )

    def target(self) -> RecipeTarget:
        return RecipeTarget(self.target_metric, self.max_drop, self.min_sqnr_db)


register_schema("exp", "recipe_schema", RecipeExp)


@experiment(RecipeExp, "recipe", takes_model=True)
def recipe_exp(exp: RecipeExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.qconfig import check_matches
    from quantlab.qconfig_presets import QConfigPreset
    from quantlab.workload import (
        load_workload,
        model_ops,
        model_runs,
        qconfig_words,
        start_spec,
    )

    bundle, data = load_workload(ctx.model, ctx.data, ctx.seed or 0)
    batches = model_runs(bundle, data.eval, exp.merge_batches)
    task, platform = bundle.task, ctx.platform
    target = exp.target()
    if target.on_task and task is None:
        raise ValueError(
            f"model {bundle.name} has no task metric, so exp.target_metric / exp.max_drop "
            "cannot be judged; use exp.min_sqnr_db"
        )
    if target.max_drop is not None and task.name == OutputSQNR().name:
        raise no_drop_from(task)  # before the sensitivity ranking, not after it
    base = start_spec(ctx.qconfig, platform, bundle.module, data.calib[0])
    start_words = qconfig_words(ctx.qconfig)
    own = ctx.qconfig is not None and ctx.qconfig.preset is not QConfigPreset.DEFAULT
    if exp.start_calibration is not None and not own:
        found = best_calibration(exp.start_calibration, bundle.name, exp.mode)
        if found is not None:
            base, start_words = found
            check_matches(base, model_ops(bundle.module, platform, data.calib[0]), start_words)
        else:
            start_words += (
                f" ({exp.start_calibration}/results.csv has no {exp.mode.name} row for "
                f"{bundle.name})"
            )
    run = analyze(
        bundle.module,
        platform,
        data.calib,
        batches,
        kinds=RANK_KINDS,
        metrics=RANK_METRICS + ([Metric.TASK] if task is not None else []),
        task=task,
        qconfig=base,
        cache_dir=exp.cache_dir,
        progress=ctx.progress,
    )
    sim = run.sim
    if sim is None:  # the ranking came from the cache
        sim = Simulator(bundle.module, platform, base)
        sim.calibrate(data.calib, ctx.progress)
    say = tqdm.write if ctx.progress else None
    res = run_recipe(
        sim,
        batches,
        run.table,
        target,
        task,
        base,
        directions=exp.directions or None,
        rank_metric=exp.rank_metric,
        kinds=exp.raise_kinds,
        steps=exp.steps,
        refine=exp.refine,
        max_evaluations=exp.max_evaluations,
        mode=exp.mode,
        progress=say,
    )
    path = res.table()
    path.insert(0, "platform", platform.name)
    path.insert(1, "model", bundle.name)
    goal = target.words(task, res.float_value)
    path["target"] = res.threshold
    items = sum(len(b[0]) for b in batches)
    tables = {"recipe": _path_view(path)}
    if res.overflow_ops:
        tables["float16_overflow"] = _overflow_table(res, sim)
    y, ylabel = _score_axis(task, target)
    plots = [
        Plot(
            name="recipe_path",
            x="cost_rel",
            y=y,
            xlabel="cost relative to the start configuration (int8-MAC equivalents ratio)",
            ylabel=ylabel,
            title=f"{bundle.name} on {platform.name}: the recipe's configurations (dashed: target)",
            hue="direction",
            kind=PlotKind.SCATTER,
            reference="target",
            ci_low="task_ci_low" if target.on_task else "sqnr_db_ci_low",
            ci_high="task_ci_high" if target.on_task else "sqnr_db_ci_high",
        ),
    ]
    if target.on_task:
        plots.append(
            Plot(
                name="recipe_sqnr",
                x="cost_rel",
                y="sqnr_db",
                xlabel="cost relative to the start configuration (int8-MAC equivalents ratio)",
                ylabel="output SQNR vs float (dB; bars: 95% interval)",
                title=f"{bundle.name} on {platform.name}: output SQNR along the recipe",
                hue="direction",
                kind=PlotKind.SCATTER,
                ci_low="sqnr_db_ci_low",
                ci_high="sqnr_db_ci_high",
            )
        )
    product = res.chosen or res.best
    verdict = "meets" if res.chosen is not None else "does NOT meet (the best measured)"
    header = (
        f"chosen by +exp=recipe for {bundle.name} on platform {platform.name}: step "
        f"{product.step} ({product.direction}), {len(product.raised)} raises; {verdict} the "
        f"target {goal}; starting from {start_words}"
    )
    return ExperimentResult(
        table=path,
        title=f"Precision recipe for {bundle.name} on {platform.name}",
        findings=[f"Calibration: {start_words}.", *_findings(res, path, goal, platform, task)],
        tables=tables,
        plots=plots,
        qconfigs={QCONFIG_FILE: (product.spec, header)},
        notes=[
            f"Starting configuration: {start_words}; the chosen configuration "
            f"is {QCONFIG_DIR}/{QCONFIG_FILE}, to pass back with qconfig=file "
            f"qconfig.path=<this folder>/{QCONFIG_DIR}/{QCONFIG_FILE}.",
            "Flow (seed 004 l.55-93): "
            + ", ".join(d.value for d in (exp.directions or _flow(platform)))
            + f"; candidates: the {exp.rank_metric.name} sensitivity rows of kinds "
            + ", ".join(k.value for k in exp.raise_kinds)
            + f" whose quantized dtype is INT8 ({len(res.candidates)} rows), most sensitive "
            "first; activation rows go to platform.sensitive_dtype "
            f"({platform.sensitive_dtype.name}; the ceiling uses platform.ceiling_dtype, "
            f"{platform.ceiling_dtype.name}), GEMM inputs to {platform.sensitive_dtype.name}, "
            "weights to INT16; an op with a raised output or input drops the calibration rule "
            "the start gave it by name (chosen for int8) and takes the default observer "
            f"({platform.default_observer.name}).",
            f"Evaluation in {exp.mode.name} mode against float on {items} items of "
            f"data={data.name}; task: the task metric on all items, task_ci_low/task_ci_high "
            "its 95% interval over the items (a share of items, such as top-1 agreement: "
            "Wilson score interval; any other metric: percentile bootstrap, 1000 resamples); "
            "sqnr_db: output SQNR over every output value, sqnr_db_ci_low/sqnr_db_ci_high its "
            "95% percentile-bootstrap interval over the items; the target is judged on the value.",
            "Cost: int8-MAC equivalents (MACs x operand bytes, LUT and split overheads; "
            "quantlab.analysis.cost), relative to the start configuration.",
            "float16_overflow: values beyond +-65504 cast to float16 (before saturation), "
            "summed over the evaluation items and ops.",
        ],
    )


def best_calibration(folder: str, model: str, mode: Mode) -> tuple[QConfigSpec, str] | None:
    """(the qconfig of the best calibration a published +exp=calibration ``folder`` found for
    ``model`` in ``mode``: highest output SQNR; words naming it), or None if it has no row
    (or no results.csv).

    A per-op choice (observer ``PER_OP/<TARGET>``) is its qconfig file in ``folder``/qconfig; a
    single rule is that observer for every op."""
    from quantlab.calibration.choice import ObserverChoice
    from quantlab.qconfig import load

    table = Path(folder) / "results.csv"
    if not table.is_file():
        return None
    rows = pd.read_csv(table)
    rows = rows[(rows["model"] == model) & (rows["mode"] == mode.name)]
    if rows.empty:
        return None
    best = rows.loc[rows["output_sqnr_db"].idxmax()]
    where = (
        f"the best calibration {folder} found for {model} on {best['platform']} in "
        f"{mode.name} mode, {best['observer']} ({best['output_sqnr_db']:.2f} dB output SQNR "
        f"there)"
    )
    label = str(best["observer"])
    if label.startswith("PER_OP/"):
        target = label.split("/", 1)[1].lower()
        path = Path(folder) / QCONFIG_DIR / f"per_op_{model}_{target}.yaml"
        return load(path), f"{where}: qconfig=file ({path})"
    return QConfigSpec(global_=ObserverChoice.parse(label).rule()), f"{where}: observer {label}"


def _flow(platform) -> list[Direction]:
    from quantlab.analysis.recipe import platform_directions

    return platform_directions(platform)


def _score_axis(task, target: RecipeTarget) -> tuple[str, str]:
    if target.on_task:
        return "task", f"{task.name} vs float (bars: 95% interval)"
    return "sqnr_db", "output SQNR vs float (dB; bars: 95% interval)"


def _path_view(path: pd.DataFrame) -> pd.DataFrame:
    cols = [
        "step",
        "direction",
        "raised_ops",
        "task",
        "task_ci_low",
        "task_ci_high",
        "task_n",
        "sqnr_db",
        "sqnr_db_ci_low",
        "sqnr_db_ci_high",
        "sqnr_db_n",
        "cost_rel",
        "float16_overflow",
        "meets_target",
        "chosen",
    ]
    return path[cols]


def _overflow_table(res: RecipeResult, sim) -> pd.DataFrame:
    start = res.steps[0]
    types = sim.ops.set_index("name")["op_type"]
    rows = [
        {"op_name": n, "op_type": types.get(n, ""), "float16_overflow": start.float16_overflow[n]}
        for n in res.overflow_ops
    ]
    return pd.DataFrame(rows)


def _findings(res: RecipeResult, path, goal: str, platform, task) -> list[str]:
    start, name = res.steps[0], getattr(task, "name", "output SQNR")
    out = [f"Target: {goal}."]

    def score(step) -> str:
        sqnr = f"output SQNR {step.sqnr.format_db()}"
        return f"{name} {step.task}, {sqnr}" if step.task is not None else sqnr

    out.append(
        f"Start ({platform.global_dtype.name} activations, {platform.gemm_input_dtype.name} "
        f"Conv/MatMul inputs): {score(start)}; "
        + ("meets the target." if start.meets else "misses the target.")
    )
    if res.overflow_ops:
        out.append(
            f"{len(res.overflow_ops)} op(s) cast values beyond +-65504 to float16 "
            f"({sum(start.float16_overflow.values())} values): switched to INT16 "
            "(seed 004 l.81)."
        )
    ceiling = next((s for s in res.steps if s.direction == "ceiling"), None)
    if ceiling is not None:
        out.append(
            f"Ceiling ({len(ceiling.raised)} raises on {path.raised_ops[ceiling.step]} ops, "
            f"{path.cost_rel[ceiling.step]:.3f}x the cost): {score(ceiling)}; "
            + ("meets the target." if ceiling.meets else "misses the target.")
        )
    if res.chosen is None:
        out.append(
            f"No configuration meets the target, not even the ceiling. The best measured is "
            f"step {res.best.step} ({res.best.direction}, {score(res.best)}); the written "
            "qconfig is that configuration and does NOT meet the target."
        )
    else:
        c = res.chosen
        out.append(
            f"Chosen: step {c.step} ({c.direction}), the cheapest configuration meeting the "
            f"target: {path.raised_ops[c.step]} ops raised, {path.cost_rel[c.step]:.3f}x the "
            f"start's cost, {score(c)}."
        )
        if c.task is not None and start.task is not None and c is not start:
            sep = c.task.separated_from(start.task)
            relation = c.task.relation(start.task)  # "overlap", or separate on too few items
            d = distinct_digits(start.task, c.task)
            out.append(
                f"Against the start, {name} moves {start.task.value:.{d}g} -> "
                f"{c.task.value:.{d}g} "
                f"on {c.task.n} items: the 95% intervals "
                + ("do not overlap (resolved)." if sep else f"{relation} (not resolved).")
            )
    return out
