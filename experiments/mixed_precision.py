"""Mixed precision: raise the most sensitive ops and trade accuracy against cost, per platform.

For each platform: rank the ops (quantlab.analysis.sensitivity, cached), then for each ratio of
the sensitivity table raise those ops to int16 (activations on J6E/M/B; on J6H/P the int8
Conv/MatMul inputs, vector ops staying in float16), run the model in fixed point and measure the
task metric (with its 95% interval over the evaluation items) and output SQNR against
float and the cost model (MACs x operand bytes plus LUT and split overheads,
quantlab.analysis.cost). Each evaluated configuration is written as a qconfig file
(``qconfig/<platform>_ratio<r>.yaml``); passed back with ``qconfig=file`` it is the starting
configuration, so its ratio-0 row reproduces that row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from quantlab.analysis.confidence import distinct_digits
from quantlab.analysis.cost import CostModel
from quantlab.analysis.mixed_precision import (
    SensitiveTemplate,
    evaluate_mixed,
    pareto_front,
    select_sensitive,
)
from quantlab.analysis.sensitivity import Metric, SensitiveType, analyze
from quantlab.config import CONFIG_DIR, register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.platforms import PlatformConfig
from quantlab.report import QCONFIG_DIR, Plot, PlotKind
from quantlab.simulate import Mode, Simulator

RANK_METRICS = [Metric.L1, Metric.COSINE, Metric.MSE, Metric.KL, Metric.SQNR, Metric.MAX_ABS]
"""Every output metric (as +exp=sensitivity computes them), so both share cached rankings."""


@dataclass
class MixedPrecisionExp:
    """Schema of ``+exp=mixed_precision``; the model and data come from their groups."""

    platforms: list[str] = field(default_factory=lambda: ["j6m", "j6p"])  # [] = platform group
    ratios: list[float] = field(default_factory=lambda: [0.0, 0.05, 0.1, 0.2, 0.35, 0.5])
    rank_metric: Metric = Metric.L1  # the sensitivity metric the template sorts by
    raise_kinds: list[SensitiveType] = field(
        default_factory=lambda: [SensitiveType.ACTIVATION, SensitiveType.INPUT]
    )  # WEIGHT too: see experiments/recipe.py RAISE_KINDS for what a weight raise does
    mode: Mode = Mode.FIXED  # the mode each configuration is evaluated in
    merge_batches: bool = True
    cache_dir: str | None = ".quantlab_cache"

    def __post_init__(self) -> None:
        bad = [r for r in self.ratios if not 0.0 <= r <= 1.0]
        if bad or not self.ratios:
            raise ValueError(f"exp.ratios must be a non-empty list of values in [0, 1], got {bad}")
        if self.rank_metric is Metric.TASK:
            raise ValueError("exp.rank_metric must be an output metric (L1, COSINE, MSE, KL, ...)")
        if not self.raise_kinds or SensitiveType.FIXED in self.raise_kinds:
            raise ValueError("exp.raise_kinds must be ACTIVATION, WEIGHT and/or INPUT")


register_schema("exp", "mixed_precision_schema", MixedPrecisionExp)


def platform_profile(name: str, current: PlatformConfig) -> PlatformConfig:
    """The profile ``configs/platform/<name>.yaml`` (``current`` when it is that one)."""
    if name == current.name:
        return current
    from omegaconf import OmegaConf

    path = Path(CONFIG_DIR) / "platform" / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ValueError(f"exp.platforms: unknown platform {name!r}; allowed: {known}")
    values = OmegaConf.load(path)
    values.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PlatformConfig), values))


@experiment(MixedPrecisionExp, "mixed_precision", takes_model=True)
def mixed_precision_exp(exp: MixedPrecisionExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.workload import load_workload, model_runs, qconfig_words, start_spec

    bundle, data = load_workload(ctx.model, ctx.data, ctx.seed or 0)
    batches = model_runs(bundle, data.eval, exp.merge_batches)
    task = bundle.task
    out_metrics = [Metric.SQNR, Metric.L1] + ([Metric.TASK] if task is not None else [])
    names = exp.platforms or [ctx.platform.name]
    rows, qconfigs = [], {}
    for pname in names:
        platform = platform_profile(pname, ctx.platform)
        base = start_spec(ctx.qconfig, platform, bundle.module, data.calib[0])
        run = analyze(
            bundle.module,
            platform,
            data.calib,
            batches,
            kinds=[SensitiveType.ACTIVATION, SensitiveType.WEIGHT, SensitiveType.INPUT],
            metrics=RANK_METRICS + ([Metric.TASK] if task is not None else []),
            task=task,
            qconfig=base,
            cache_dir=exp.cache_dir,
            progress=ctx.progress,
        )
        ranking, sim = run.table, run.sim
        if sim is None:  # the ranking came from the cache
            sim = Simulator(bundle.module, platform, base)
            sim.calibrate(data.calib, ctx.progress)
        refs = [sim.run(*b, mode=Mode.FLOAT) for b in batches]
        base_cost = None
        for ratio in tqdm(exp.ratios, desc=f"mixed precision {pname}", disable=not ctx.progress):
            template = SensitiveTemplate(exp.rank_metric, ratio=ratio, kinds=tuple(exp.raise_kinds))
            picked = select_sensitive(ranking, template)
            res = evaluate_mixed(
                sim, batches, refs, picked, out_metrics, task, exp.mode, base, CostModel()
            )
            base_cost = res.cost if base_cost is None else base_cost
            file = f"{pname}_ratio{ratio:g}.yaml"
            qconfigs[file] = (
                res.spec,
                f"chosen by +exp=mixed_precision for {bundle.name} on platform {pname}: ratio "
                f"{ratio:g} of the {exp.rank_metric.name} sensitivity table raised "
                f"({len(picked)} ops, {len(res.pinned)} GEMM inputs pinned to INT8) on top of "
                f"{qconfig_words(ctx.qconfig)}",
            )
            est = res.task
            rows.append(
                {
                    "platform": pname,
                    "ratio": ratio,
                    "raised_ops": len(picked),
                    "sensitive_dtype": platform.sensitive_dtype.name,
                    "cost": res.cost,
                    "cost_rel": res.cost / base_cost if base_cost else float("nan"),
                    **res.sqnr.as_columns("sqnr_db"),
                    "l1": res.metrics["L1"],
                    "task": res.metrics.get("TASK", float("nan")),
                    "task_ci_low": est.low if est is not None else float("nan"),
                    "task_ci_high": est.high if est is not None else float("nan"),
                    "task_n": est.n if est is not None else 0,
                    "raised": " ".join(f"{n}[{k.value[0]}]" for n, k in picked),
                    "pinned_int8": " ".join(res.pinned),
                    "qconfig_file": f"{QCONFIG_DIR}/{file}",
                }
            )
    table = pd.DataFrame(rows)
    higher = True if task is None else task.higher_is_better
    table["pareto"] = False
    for _, g in table.groupby("platform", sort=False):
        score = g["task"] if task is not None else g["sqnr_db"]
        table.loc[g.index, "pareto"] = pareto_front(g["cost_rel"], score, higher)
    task_name = getattr(task, "name", "none")
    plots = [
        Plot(
            name="pareto_task",
            x="cost_rel",
            y="task" if task is not None else "sqnr_db",
            xlabel="cost relative to no raised op (int8-MAC equivalents ratio)",
            ylabel=f"{task_name} vs float (bars: 95% interval)"
            if task is not None
            else "output SQNR vs float (dB)",
            title=f"{bundle.name}: accuracy vs cost as the raised share grows",
            hue="platform",
            kind=PlotKind.LINE,
            ci_low="task_ci_low" if task is not None else None,
            ci_high="task_ci_high" if task is not None else None,
        ),
        Plot(
            name="pareto_sqnr",
            x="cost_rel",
            y="sqnr_db",
            xlabel="cost relative to no raised op (int8-MAC equivalents ratio)",
            ylabel="output SQNR vs float (dB)",
            title=f"{bundle.name}: output SQNR vs cost",
            hue="platform",
            kind=PlotKind.LINE,
        ),
    ]
    return ExperimentResult(
        table=table,
        title=f"Mixed precision of {bundle.name}: raising sensitive ops",
        findings=_findings(table, task_name),
        tables={"per_ratio": _per_ratio(table)},
        plots=plots,
        qconfigs=qconfigs,
        notes=[
            f"Ranking: {exp.rank_metric.name} sensitivity (activation, weight and GEMM-input "
            "rows together, vendor template); raised kinds: "
            + ", ".join(k.value for k in exp.raise_kinds)
            + f"; evaluation in {exp.mode.name} mode against float on "
            f"{sum(len(b[0]) for b in batches)} items of data={data.name}; starting from "
            f"{qconfig_words(ctx.qconfig)}.",
            f"task: {task_name}, measured on all evaluation items; task_ci_low / "
            "task_ci_high: its 95% interval over the items (a share of items, such as top-1 "
            "agreement: Wilson score interval; any other metric: percentile bootstrap, 1000 "
            "resamples), task_n items.",
            f"Each row's configuration is in its qconfig_file ({QCONFIG_DIR}/ in the run "
            "folder); pass it back with qconfig=file qconfig.path=<that file>.",
            "Cost: int8-MAC equivalents (MACs x operand bytes, LUT and split overheads; "
            "quantlab.analysis.cost), relative to the same platform with no raised op.",
            "pareto = no other ratio on that platform is at most as costly and better.",
        ],
    )


def _per_ratio(table: pd.DataFrame) -> pd.DataFrame:
    """The report's table: per platform and raised share, what was raised, its cost, output
    SQNR and the task metric (``task``), each with its 95% interval and item count (no task
    metric: SQNR alone)."""
    cols = ["platform", "ratio", "raised_ops", "sensitive_dtype", "cost_rel"]
    cols += ["sqnr_db", "sqnr_db_ci_low", "sqnr_db_ci_high", "sqnr_db_n"]
    if (table["task_n"] > 0).any():
        cols += ["task", "task_ci_low", "task_ci_high", "task_n"]
    return table[cols + ["pareto"]].copy()


def _estimate(row, prefix: str = "task"):
    from quantlab.analysis.confidence import Estimate

    return Estimate.from_columns(row, prefix)


def _overlap_count(g: pd.DataFrame, top) -> str:
    """How many of the platform's other ratios have an output SQNR interval that overlaps
    ``top``'s, in words."""
    s_top = _estimate(top, "sqnr_db")
    others = [_estimate(r, "sqnr_db") for _, r in g.iterrows() if r.ratio != top.ratio]
    overlap = sum(not s_top.separated_from(e) for e in others)
    return f"overlaps {overlap} of the other {len(others)} ratios'"


def _findings(table: pd.DataFrame, task_name: str) -> list[str]:
    out = []
    for pname, g in table.groupby("platform", sort=False):
        lo, hi = g.iloc[0], g.iloc[-1]
        s_lo, s_hi = _estimate(lo, "sqnr_db"), _estimate(hi, "sqnr_db")
        text = (
            f"{pname}: raising {hi.raised_ops} ops (ratio {hi.ratio:g}, to "
            f"{hi.sensitive_dtype}) moves output SQNR from {s_lo.format_db()} to "
            f"{s_hi.format_db()} (the intervals {s_lo.relation(s_hi)})"
        )
        if hi.task_n == 0:  # no task metric: output SQNR alone
            text += f" at {hi.cost_rel:.3f}x the cost."
        else:
            a, b = _estimate(lo), _estimate(hi)
            d = distinct_digits(a, b)
            text += (
                f" and {task_name} from {a.format(d)} to {b.format(d)} at {hi.cost_rel:.3f}x "
                "the cost: "
            )
            if lo.task == hi.task:
                text += f"the same {task_name} on these items."
            elif a.separated_from(b):
                text += "the intervals do not overlap (resolved)."
            else:
                text += f"the intervals {a.relation(b)} (not resolved)."
        out.append(text)
        best = g[g["pareto"]]
        top = g.loc[g["sqnr_db"].idxmax()]
        s_top = _estimate(top, "sqnr_db")
        out.append(
            f"{pname}: the highest output SQNR, {s_top.format_db(count=False)}, comes at ratio "
            f"{top.ratio:g} ({top.raised_ops} ops raised, {top.cost_rel:.3f}x the cost; its "
            f"interval {_overlap_count(g, top)}); Pareto-optimal ratios ({task_name} vs cost): "
            f"{', '.join(f'{r:g}' for r in best['ratio'])}."
        )
    return out
