"""Which ops of a model are sensitive to quantization (the vendor's one-op-at-a-time ranking).

From the all-float model, each op's output quantization (activation) and then its weight
quantization (weight) is switched on alone; optionally each op alone goes from fake to fixed
point (fixed). The model output is compared with the baseline by L1, signed cosine, MSE, KL,
SQNR, max abs and the model's task metric; ops are ranked per metric
(quantlab.analysis.sensitivity).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from quantlab.analysis.sensitivity import Metric, SensitiveType, analyze, merge_batches
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.report import Plot, PlotKind

UNITS = {
    Metric.L1: "mean |output error|, output units",
    Metric.COSINE: "cosine similarity, unitless",
    Metric.MSE: "mean squared error, output units^2",
    Metric.KL: "KL divergence, nats",
    Metric.SQNR: "SQNR, dB",
    Metric.MAX_ABS: "max |output error|, output units",
}


@dataclass
class SensitivityExp:
    """Schema of ``+exp=sensitivity``; the model, data and platform come from their groups."""

    kinds: list[SensitiveType] = field(
        default_factory=lambda: [SensitiveType.ACTIVATION, SensitiveType.WEIGHT]
    )
    metrics: list[Metric] = field(
        default_factory=lambda: [
            Metric.L1,
            Metric.COSINE,
            Metric.MSE,
            Metric.KL,
            Metric.SQNR,
            Metric.MAX_ABS,
            Metric.TASK,
        ]
    )
    sort_metric: Metric = Metric.L1  # the metric of the top-ops table and the bar plot
    top_k: int = 15
    merge_batches: bool = True  # run the evaluation items as one batch
    replay: bool = True  # False: one full forward per op (the naive method)
    freeze_indices: bool = True
    cache_dir: str | None = ".quantlab_cache"  # None: no cache

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"exp.top_k must be >= 1, got {self.top_k}")
        if not self.kinds:
            raise ValueError("exp.kinds must name at least one of ACTIVATION, WEIGHT, FIXED")
        if self.sort_metric not in self.metrics:
            raise ValueError(
                f"exp.sort_metric={self.sort_metric.name} is not in exp.metrics "
                f"({', '.join(m.name for m in self.metrics)})"
            )


register_schema("exp", "sensitivity_schema", SensitivityExp)


def top_table(table: pd.DataFrame, metric: Metric, k: int) -> pd.DataFrame:
    """The ``k`` most sensitive ops per sensitive type by ``metric`` (rank order)."""
    sub = table[(table["metric"] == metric.name) & (table["rank"] <= k)]
    return sub.sort_values(["sensitive_type", "rank"], kind="stable").reset_index(drop=True)


def _findings(table: pd.DataFrame, top: pd.DataFrame, exp: SensitivityExp, run) -> list[str]:
    out = []
    m = exp.sort_metric.name
    for kind, g in top.groupby("sensitive_type", sort=False):
        first = g.iloc[0]
        k_share = float(g["flops_share"].sum())
        every = table[(table["sensitive_type"] == kind) & (table["metric"] == m)]["value"]
        out.append(
            f"{kind}: the most sensitive op by {m} is {first.op_name} ({first.op_type}, "
            f"{first.quant_dtype}) with {m} = {first.value:.4g} (median over the {len(every)} "
            f"ops studied: {every.median():.4g}); the top {len(g)} ops carry "
            f"{100 * k_share:.1f}% of the model's flops."
        )
    for kind, g in table.groupby("sensitive_type", sort=False):
        values = g.pivot_table(index="op_name", columns="metric", values="value")
        flat = [c for c in values.columns if values[c].nunique() <= 1]
        wide = g.pivot_table(index="op_name", columns="metric", values="rank")
        others = [c for c in wide.columns if c != m and c not in flat]
        if m in wide and m not in flat and others and len(wide) > 2:
            rho = wide[others].corrwith(wide[m], method="spearman")
            text = (
                f"{kind}: rank agreement with {m} (Spearman) ranges from {rho.min():.2f} "
                f"({rho.idxmin()}) to {rho.max():.2f} ({rho.idxmax()}) over {len(wide)} ops"
            )
            if flat:
                text += f"; {', '.join(flat)} take one value for every op (no ranking)"
            out.append(text + ".")
    how = "read from the cache (no model run)" if run.cached else f"{run.runs} model runs"
    out.append(f"The ranking took {run.seconds:.1f} s: {how}.")
    return out


@experiment(SensitivityExp, "sensitivity")
def sensitivity_exp(exp: SensitivityExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.data import load_data
    from quantlab.models import build_model

    bundle = build_model(ctx.model, seed=ctx.seed or 0)
    data = load_data(ctx.data, bundle.name)
    metrics = [m for m in exp.metrics if m is not Metric.TASK or bundle.task is not None]
    batches = merge_batches(data.eval) if exp.merge_batches else data.eval
    run = analyze(
        bundle.module,
        ctx.platform,
        data.calib,
        batches,
        kinds=exp.kinds,
        metrics=metrics,
        task=bundle.task,
        cache_dir=exp.cache_dir,
        replay=exp.replay,
        freeze_indices=exp.freeze_indices,
        progress=ctx.progress,
    )
    table = run.table
    top = top_table(table, exp.sort_metric, exp.top_k)
    unit = UNITS.get(exp.sort_metric, getattr(bundle.task, "name", "task metric"))
    plot = Plot(
        name="sensitivity_top",
        x="op_name",
        y="value",
        xlabel="op (rank 1 at the top)",
        ylabel=f"{exp.sort_metric.name} ({unit})",
        title=f"{bundle.name} on {ctx.platform.name}: most sensitive ops by {exp.sort_metric.name}",
        facet="sensitive_type",
        kind=PlotKind.BAR,
        table="top_ops",
    )
    notes = [
        "activation: from the all-float model only this op's output is fake-quantized; weight: "
        "only its weight; fixed: from the all-fake model only this op runs in fixed point.",
        "Pass-through ops (reshape, relu, max pooling) keep their input's scale and are not "
        "studied; ops the platform does not run quantized are not studied.",
        "Discontinuous index ops (topk, sort, argmax, max/min along a dim) reuse the baseline's "
        "indices; the ops before the studied one replay the recorded baseline.",
        "COSINE, SQNR and a higher-is-better task metric rank ascending (lower = more sensitive), "
        "the others descending.",
        f"Inputs: {sum(len(b[0]) for b in batches)} evaluation items of data={data.name}; "
        f"{len(data.calib)} calibration batches. Task metric: "
        f"{getattr(bundle.task, 'name', 'none')}.",
    ]
    return ExperimentResult(
        table=table,
        title=f"Sensitivity of {bundle.name} on {ctx.platform.name}",
        findings=_findings(table, top, exp, run),
        tables={"top_ops": top, "sensitivity": table},
        plots=[plot],
        notes=notes,
    )
