"""Which ops of a model are sensitive to quantization (the vendor's one-op-at-a-time ranking).

From the all-float model, each op's output quantization (activation) and then its weight
quantization (weight) is switched on alone; optionally each op alone goes from fake to fixed
point (fixed). The model output is compared with the baseline by L1, signed cosine, MSE, KL,
SQNR, max abs and the model's task metric (with its 95% interval over the
evaluation items); ops are ranked per metric (quantlab.analysis.sensitivity). The vendor's
sensitive-op template then raises the ``top_k`` rows (activation and weight rows together) and
the run writes that choice as a qconfig file, ready for ``qconfig=file``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from quantlab.analysis.sensitivity import Metric, SensitiveType, analyze
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
    Metric.RTOL: "max |output error| / |reference|, unitless",
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


def _task_finding(table: pd.DataFrame, task) -> str | None:
    """How many ops move the task metric so that its interval separates from the least affected
    op's (``Estimate.separated_from``: the two intervals apart, on items enough to resolve it)."""
    from quantlab.analysis.confidence import Estimate

    rows = table[table["metric"] == "TASK"]
    if rows.empty or task is None:
        return None
    parts = []
    for kind, g in rows.groupby("sensitive_type", sort=False):
        n = int(g["items"].iloc[0])
        unmoved = g["value"].max() if task.higher_is_better else g["value"].min()
        if g["value"].nunique() == 1:  # no op moves it: none is the most sensitive
            parts.append(f"{kind}: every op gives {task.name} {unmoved:.4g} (n={n})")
            continue
        best = g.loc[g["value"] == unmoved].iloc[0]
        least = Estimate(best.value, best.ci_low, best.ci_high, n)
        moved = sum(
            Estimate(r.value, r.ci_low, r.ci_high, n).separated_from(least) for r in g.itertuples()
        )
        worst = g.iloc[0]
        verdict = (
            f"for {moved} of {len(g)} ops the interval separates from the least affected op's "
            f"({best.op_name}: {least})"
            if least.has_interval
            else f"with {n} item(s) there are no intervals"
        )
        parts.append(
            f"{kind}: {task.name} of the most sensitive op {worst.op_name} is "
            f"{Estimate(worst.value, worst.ci_low, worst.ci_high, n)}; {verdict}"
        )
    return "Task metric over the evaluation items: " + "; ".join(parts) + "."


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


@experiment(SensitivityExp, "sensitivity", takes_model=True)
def sensitivity_exp(exp: SensitivityExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.workload import load_workload, model_runs, qconfig_words, start_spec

    bundle, data = load_workload(ctx.model, ctx.data, ctx.seed or 0)
    spec = start_spec(ctx.qconfig, ctx.platform, bundle.module, data.calib[0])
    metrics = [m for m in exp.metrics if m is not Metric.TASK or bundle.task is not None]
    batches = model_runs(bundle, data.eval, exp.merge_batches)
    run = analyze(
        bundle.module,
        ctx.platform,
        data.calib,
        batches,
        kinds=exp.kinds,
        metrics=metrics,
        task=bundle.task,
        qconfig=spec,
        cache_dir=exp.cache_dir,
        replay=exp.replay,
        freeze_indices=exp.freeze_indices,
        progress=ctx.progress,
    )
    table = run.table
    top = top_table(table, exp.sort_metric, exp.top_k)
    if top[["ci_low", "ci_high"]].isna().all().all():  # intervals: the task metric's alone
        top = top.drop(columns=["ci_low", "ci_high"])
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
        f"{len(data.calib)} calibration batches; {qconfig_words(ctx.qconfig)}. Task metric: "
        f"{getattr(bundle.task, 'name', 'none')}, with its 95% interval over the evaluation "
        "items (ci_low, ci_high; a share of items, such as top-1 agreement: Wilson score "
        "interval; any other metric: percentile bootstrap, 1000 resamples).",
    ]
    findings = _findings(table, top, exp, run)
    task_line = _task_finding(table, bundle.task)
    if task_line:
        findings.insert(len(findings) - 1, task_line)
    qconfigs = {}
    chosen = chosen_qconfig(exp, ctx, bundle, data, spec, table)
    if chosen is not None:
        name, spec_top, header, picked = chosen
        qconfigs[name] = (spec_top, header)
        notes.append(
            f"qconfig/{name}: the vendor's sensitive-op template on this table (sort by "
            f"{exp.sort_metric.name}, the first {exp.top_k} activation and weight rows together, "
            f"int8 rows raised to {ctx.platform.sensitive_dtype.name} activations or INT16 "
            f"weights): {len(picked)} ops raised; pass it back with qconfig=file."
        )
    return ExperimentResult(
        table=table,
        title=f"Sensitivity of {bundle.name} on {ctx.platform.name}",
        findings=findings,
        tables={"top_ops": top, "sensitivity": table},
        plots=[plot],
        notes=notes,
        qconfigs=qconfigs,
    )


def chosen_qconfig(exp: SensitivityExp, ctx: RunContext, bundle, data, base, table):
    """(file name, QConfigSpec, header, raised ops) of the top-k choice, or None when the table
    has no activation or weight rows."""
    from quantlab.analysis.mixed_precision import (
        SensitiveTemplate,
        apply_legal,
        raise_spec,
        select_sensitive,
    )
    from quantlab.simulate import Mode, Simulator
    from quantlab.workload import qconfig_words

    kinds = tuple(k for k in exp.kinds if k is not SensitiveType.FIXED)
    if not kinds or table[table["metric"] == exp.sort_metric.name].empty:
        return None
    template = SensitiveTemplate(exp.sort_metric, topk=exp.top_k, kinds=kinds)
    picked = select_sensitive(table, template, bundle.task)
    sim = Simulator(bundle.module, ctx.platform, base)
    sim.run(*data.calib[0], mode=Mode.FLOAT)  # discover the ops (no calibration needed)
    spec = raise_spec(picked, ctx.platform, base)
    pinned = apply_legal(sim, spec)
    header = (
        f"chosen by +exp=sensitivity for {bundle.name} on platform {ctx.platform.name}: the top "
        f"{exp.top_k} rows by {exp.sort_metric.name} ({len(picked)} ops raised"
        + (f", {len(pinned)} GEMM inputs pinned to INT8" if pinned else "")
        + f"), on top of {qconfig_words(ctx.qconfig)}"
    )
    return f"{ctx.platform.name}_top{exp.top_k}_{exp.sort_metric.name}.yaml", spec, header, picked
