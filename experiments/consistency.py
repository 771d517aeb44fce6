"""Fake-vs-fixed consistency: where the deployed integer model departs from what QAT computed.

The model is calibrated on the data's calibration items, then the evaluation items run in fake
mode (QAT numerics) and fixed mode (deployed numerics). Every captured op is compared in two
views: isolated (each fixed op fed the fake run's inputs: the op's own gap) and accumulated
(both runs end to end: the gap as it reaches that depth). Rows: one per op and view. A hybrid
run (segment-LUT ops fixed, everything else fake: the vendor's ptq.onnx stage) splits the
output's export gap into LUT error (fake -> hybrid) and requantization error (hybrid -> fixed:
integer GEMMs, requantization and every other integer kernel). The
model's task metrics of the fake and the fixed run against float come with their item count
and 95% interval; an ONNX model's float run is also checked against onnxruntime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from quantlab.analysis.consistency_words import (
    accumulated_finding,
    each_output_finding,
    float_ops_finding,
    lsb_words,
    task_findings,
)
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.report import Plot, PlotKind
from quantlab.simulate import Mode, View
from quantlab.simulate.non_finite import non_finite_words

SQNR_PLOT_CAP = 100.0  # identical outputs (SQNR = +inf) are drawn at this height
GAP_PARTS = {
    (Mode.FAKE, Mode.FIXED): "export gap (all)",
    (Mode.FAKE, Mode.HYBRID): "LUT error",
    (Mode.HYBRID, Mode.FIXED): "requantization error",
}
"""The export gap and its two parts at the model output (rows of the model_output table)."""


@dataclass
class ConsistencyExp:
    """Schema of ``+exp=consistency``; model, data and platform come from their groups."""

    mode_a: Mode = Mode.FAKE  # the reference run
    mode_b: Mode = Mode.FIXED  # the run compared with it
    threshold_db: float = 30.0  # an op "diverges" when its SQNR against the reference is lower
    # evaluation items merged into one run: the first run is the one the per-op tables compare;
    # the task metrics run every evaluation item, in runs of this size
    max_eval_items: int = 8
    top_k: int = 10  # rows of the worst-ops table

    def __post_init__(self) -> None:
        if self.mode_a is self.mode_b:
            raise ValueError(f"exp.mode_a and exp.mode_b must differ, both are {self.mode_a.name}")
        if self.max_eval_items < 1:
            raise ValueError(f"exp.max_eval_items must be >= 1, got {self.max_eval_items}")
        if self.top_k < 1:
            raise ValueError(f"exp.top_k must be >= 1, got {self.top_k}")


register_schema("exp", "consistency_schema", ConsistencyExp)


def eval_runs(batches: list, labels, per_run: int, whole_runs: bool) -> tuple[list, list | None]:
    """(runs, their labels): every evaluation batch, merged into runs of ``per_run`` batches
    (the first run is the one the per-op tables compare); ``whole_runs``: full runs only, the
    rest left out (a graph that fixes its batch takes no other size), else a shorter last run;
    the labels merged alike (None without labels)."""
    from quantlab.analysis.confidence import concat_items
    from quantlab.workload import merge_items

    end = max(1, len(batches) // per_run) * per_run if whole_runs else len(batches)
    starts = range(0, end, per_run)
    runs = [merge_items(batches[i : i + per_run], per_run) for i in starts]
    if labels is None:
        return runs, None
    return runs, [concat_items(list(labels[i : i + per_run])) for i in starts]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _run_outputs(sim, batch: tuple, modes: list[Mode]) -> dict:
    return {m: sim.run(*batch, mode=m) for m in modes}


def _output_rows(outs: dict, bundle, batch: tuple) -> pd.DataFrame:
    """Output metrics of each mode pair, the SQNR with its 95% interval over the run's items
    (``sqnr_db_ci_low``, ``sqnr_db_ci_high``, ``sqnr_db_n``); with an external reference runtime
    (ONNX models), the float run against that runtime too."""
    from quantlab.analysis.confidence import sqnr_estimate
    from quantlab.analysis.metrics import all_metrics, flat

    flats = {m: flat(o) for m, o in outs.items()}
    rows = []
    for a, b in (
        (Mode.FLOAT, Mode.FAKE),
        (Mode.FLOAT, Mode.FIXED),
        (Mode.FAKE, Mode.FIXED),
        (Mode.FAKE, Mode.HYBRID),
        (Mode.HYBRID, Mode.FIXED),
    ):
        row = {"reference": a.name, "compared": b.name, "gap": GAP_PARTS.get((a, b), "")}
        row.update(all_metrics(flats[a], flats[b]))
        row.update(sqnr_estimate([outs[a]], [outs[b]]).as_columns("sqnr_db"))
        rows.append(row)
    if bundle.reference is not None:
        ref_out = bundle.reference(*batch)
        row = {"reference": bundle.reference_name.upper(), "compared": Mode.FLOAT.name, "gap": ""}
        row.update(all_metrics(flat(ref_out), flats[Mode.FLOAT]))
        row.update(sqnr_estimate([ref_out], [outs[Mode.FLOAT]]).as_columns("sqnr_db"))
        rows.append(row)
    return pd.DataFrame(rows)


def _each_output_rows(outs: dict) -> pd.DataFrame:
    """Per float output of the model (more than one: a tuple or dict), fake and fixed against
    float and fixed against fake; empty for one output (``model_output`` is its figure)."""
    from quantlab.analysis.metrics import all_metrics, named_float_leaves

    leaves = {m: named_float_leaves(o) for m, o in outs.items()}
    if len(leaves[Mode.FLOAT]) < 2:
        return pd.DataFrame()
    rows = []
    for a, b in ((Mode.FLOAT, Mode.FAKE), (Mode.FLOAT, Mode.FIXED), (Mode.FAKE, Mode.FIXED)):
        for (name, x), (_, y) in zip(leaves[a], leaves[b], strict=True):
            row = {"output": name, "reference": a.name, "compared": b.name}
            row.update(
                all_metrics(x.detach().double().reshape(-1), y.detach().double().reshape(-1))
            )
            rows.append(row)
    return pd.DataFrame(rows)


def task_table(runs: list[dict], bundle, labels) -> pd.DataFrame:
    """Each task metric of the FAKE and the FIXED run against FLOAT over the items of every run
    (``runs``: each run's outputs by mode; ``labels``: each run's labels, or None), with its
    item count and 95% bootstrap interval (quantlab.analysis.confidence)."""
    from quantlab.analysis.confidence import estimate_metrics

    rows = []
    ref = [outs[Mode.FLOAT] for outs in runs]
    for mode in (Mode.FAKE, Mode.FIXED):
        est = estimate_metrics(bundle.metrics, ref, [outs[mode] for outs in runs], labels)
        for metric in bundle.metrics:
            e = est[metric.name]
            rows.append(
                {
                    "metric": metric.name,
                    "compared": mode.name,
                    "value": e.value,
                    "ci_low": e.low,
                    "ci_high": e.high,
                    "items": e.n,
                    "higher_is_better": metric.higher_is_better,
                }
            )
    return pd.DataFrame(rows)


def consistency_table(sim, batch: tuple, exp: ConsistencyExp) -> pd.DataFrame:
    """Per-op comparison of exp.mode_b against exp.mode_a in both views (tidy rows)."""
    parts = [sim.compare(*batch, a=exp.mode_a, b=exp.mode_b, view=v) for v in View]
    table = pd.concat(parts, ignore_index=True)
    table["depth"] = table.groupby("view").cumcount()
    ops = sim.ops.set_index("name")
    table["fixed_kernel"] = [ops.fixed_kernel.get(n, "") for n in table["name"]]
    table["category"] = [ops.category.get(n, "") for n in table["name"]]
    capped = table["sqnr_db"].clip(upper=SQNR_PLOT_CAP)
    table["sqnr_db_plot"] = capped.where(~table["sqnr_db"].isna(), float("nan"))
    return table


def _gap_parts(outputs: pd.DataFrame) -> pd.DataFrame:
    """The rows of the model_output table that split the export gap (``GAP_PARTS``)."""
    return outputs[outputs.gap != ""]


def _gap_split_findings(outputs: pd.DataFrame) -> list[str]:
    parts = _gap_parts(outputs).set_index("gap")
    if len(parts) < 3:
        return []
    total, lut, req = (parts.loc[k] for k in GAP_PARTS.values())

    def words(r) -> str:
        if r.max_abs == 0:
            return "none (bit-identical outputs)"
        return f"SQNR {_sqnr(r).format_db(1)}, MSE {r.mse:.4g}, max |error| {r.max_abs:.4g}"

    return [
        f"Split of the fake-vs-fixed export gap at the output (MSE {total.mse:.4g}) by a hybrid "
        f"run (LUT ops fixed, the rest fake): LUT error (fake vs hybrid) {words(lut)}; "
        f"requantization error (hybrid vs fixed) {words(req)}."
    ]


def _sqnr(row):
    """A model_output row's output SQNR as an Estimate (its value and 95% interval)."""
    from quantlab.analysis.confidence import Estimate

    return Estimate.from_columns(row, "sqnr_db")


def _findings(table, outputs, support, exp, ctx, bundle) -> list[str]:
    from quantlab.analysis.compare import first_divergence

    a, b = exp.mode_a.name.lower(), exp.mode_b.name.lower()
    out = []
    if bundle.reference is not None:
        r = outputs[outputs.reference == bundle.reference_name.upper()].iloc[0]
        out.append(
            f"The converted module's float run matches {bundle.reference_name} (fp32, the "
            f"original graph) to max |difference| {r.max_abs:.3g} (SQNR {r.sqnr_db:.1f} dB)."
        )
    row = outputs[(outputs.reference == exp.mode_a.name) & (outputs.compared == exp.mode_b.name)]
    if not row.empty:
        r = row.iloc[0]
        sqnr = _sqnr(r).format_db(1)  # "identical outputs (n=N)" where no value differs
        out.append(
            f"At the model output, {b} vs {a} on {ctx.platform.name}: "
            f"{'SQNR ' if r.max_abs else ''}{sqnr}, cosine {r.cosine:.5f}, max |error| "
            f"{r.max_abs:.4g}."
        )
    out.extend(_gap_split_findings(outputs))
    fl = outputs[outputs.reference == "FLOAT"].set_index("compared")
    if {"FAKE", "FIXED"} <= set(fl.index):
        fake, fixed = _sqnr(fl.loc["FAKE"]), _sqnr(fl.loc["FIXED"])
        out.append(
            f"Against float, the output SQNR is {fake.format_db(1)} in fake mode and "
            f"{fixed.format_db(1)} in fixed mode: the intervals {fake.relation(fixed)}."
        )
    iso = table[table.view == "ISOLATED"]
    acc = table[table.view == "ACCUMULATED"]
    first = first_divergence(iso, "sqnr_db", exp.threshold_db)
    if first is None:
        out.append(
            f"No op alone (isolated view) falls below {exp.threshold_db:g} dB SQNR; "
            f"the lowest is {iso.sqnr_db.min():.1f} dB."
        )
    else:
        out.append(
            f"The first op whose own {b}-vs-{a} gap exceeds the {exp.threshold_db:g} dB threshold "
            f"is {first['name']} ({first.op_type}, depth {int(first.depth)} of {len(iso)}): "
            f"SQNR {first.sqnr_db:.1f} dB, {lsb_words(first, 'output LSB max')}."
        )
    finite = iso[iso.sqnr_db < math.inf]
    if not finite.empty:
        worst = finite.loc[finite.sqnr_db.idxmin()]
        by_type = finite.groupby("op_type").sqnr_db.min().sort_values()
        out.append(
            f"The largest isolated gap is at {worst['name']} ({worst.op_type}): "
            f"SQNR {worst.sqnr_db:.1f} dB, {lsb_words(worst, 'LSB')}; by op type, the lowest "
            "isolated SQNR is "
            + ", ".join(f"{t} {v:.1f} dB" for t, v in by_type.head(4).items())
            + "."
        )
    exact = int((iso.max_abs == 0).sum())
    gridded = int(iso.err_lsb.notna().sum())  # ops whose output has an integer grid
    lsb = (
        f"{int((iso.err_lsb.round() > 1).sum())} differ by more than one output LSB"
        + (f" (of the {gridded} whose output has an integer grid)" if gridded < len(iso) else "")
        if gridded
        else "no op's output has an integer grid (float16), so none is counted in LSBs"
    )
    out.append(
        f"{exact} of {len(iso)} ops give bit-identical outputs in both modes when fed the same "
        f"inputs; {lsb}."
    )
    if not acc.empty:
        out.append(accumulated_finding(acc))
    out.append(float_ops_finding(support, ctx.platform.name, bundle.name))
    return out


@experiment(ConsistencyExp, "consistency", takes_model=True)
def consistency(exp: ConsistencyExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.simulate import Simulator
    from quantlab.workload import (
        batch_items,
        batches_per_run,
        load_workload,
        qconfig_words,
        start_spec,
    )

    bundle, data = load_workload(ctx.model, ctx.data, ctx.seed or 0)
    spec = start_spec(ctx.qconfig, ctx.platform, bundle.module, data.calib[0])
    sim = Simulator(bundle.module, ctx.platform, spec)
    sim.calibrate(data.calib, ctx.progress)
    merged, fixed_batch = batches_per_run(bundle, data, exp.max_eval_items), bundle.fixed_batch
    runs, run_labels = eval_runs(data.eval, data.labels, merged, fixed_batch is not None)
    batch = runs[0]
    table = consistency_table(sim, batch, exp)
    outs = _run_outputs(sim, batch, [Mode.FLOAT, Mode.FAKE, Mode.FIXED, Mode.HYBRID])
    outputs = _output_rows(outs, bundle, batch)
    each = _each_output_rows(outs)
    more = [_run_outputs(sim, b, [Mode.FLOAT, Mode.FAKE, Mode.FIXED]) for b in runs[1:]]
    task = task_table([outs, *more], bundle, run_labels)
    support = sim.ops[
        [
            "name",
            "op_type",
            "supported",
            "category",
            "fixed_kernel",
            "fixed_in_float",
            "input_dtype",
            "weight_dtype",
            "output_dtype",
        ]
    ]
    # the plots follow the ops that compute (pass-through and fused ops copy their input)
    computes = ~table.fixed_kernel.str.startswith(("pass_through", "fused"))
    along = table[computes].copy()
    along["compute_depth"] = along.groupby("view").cumcount()
    iso = table[table.view == "ISOLATED"]
    worst = iso.sort_values("sqnr_db").head(exp.top_k)[
        ["name", "op_type", "sqnr_db", "cosine", "max_abs", "err_lsb", "saturated", "out_dtype"]
    ]
    kernel = iso.fixed_kernel.str.replace(r"^fused into .*", "fused into its GEMM", regex=True)
    by_type = (
        iso.assign(fixed_kernel=kernel)
        .groupby(["op_type", "fixed_kernel"], sort=False)
        .agg(
            ops=("name", "size"),
            min_sqnr_db=("sqnr_db", "min"),
            max_err_lsb=("err_lsb", "max"),
            bit_identical=("max_abs", lambda v: int((v == 0).sum())),
        )
        .reset_index()
        .sort_values("min_sqnr_db", kind="stable")
    )
    a, b = exp.mode_a.name.lower(), exp.mode_b.name.lower()
    plots = [
        Plot(
            name="sqnr_along_depth",
            x="compute_depth",
            y="sqnr_db_plot",
            hue="view",
            table="along_depth",
            xlabel="computing op in execution order (ops; pass-through and fused ops left out)",
            ylabel=f"SQNR of {b} vs {a} (dB; identical drawn at {SQNR_PLOT_CAP:g})",
            title=f"{bundle.name} on {ctx.platform.name}: {b} vs {a} along depth",
        ),
    ]
    if along.err_lsb.notna().any():  # float16 outputs (J6H/P) have no LSB to draw
        plots.append(
            Plot(
                name="error_lsb_along_depth",
                x="compute_depth",
                y="err_lsb",
                hue="view",
                table="along_depth",
                xlabel="computing op in execution order (ops; pass-through and fused ops left out)",
                ylabel="max |error| (output LSB)",
                title=f"{bundle.name}: largest per-op error in output LSBs",
            )
        )
    split = _gap_parts(outputs).copy()
    for col in ("sqnr_db", "sqnr_db_ci_low", "sqnr_db_ci_high"):
        split[f"{col}_plot"] = split[col].clip(upper=SQNR_PLOT_CAP)
    plots.append(
        Plot(
            name="export_gap_split",
            x="gap",
            y="sqnr_db_plot",
            xlabel="part of the fake-vs-fixed gap at the model output",
            ylabel=f"output SQNR (dB, 95% CI bars; identical drawn at {SQNR_PLOT_CAP:g})",
            title=f"{bundle.name}: export gap split into LUT and requantization error",
            kind=PlotKind.BAR,
            ci_low="sqnr_db_ci_low_plot",
            ci_high="sqnr_db_ci_high_plot",
            table="export_gap_split",
        )
    )
    plots.append(
        Plot(
            name="task_metrics",
            x="compared",
            y="value",
            xlabel="run compared with float (mode)",
            ylabel="task metric value (its own unit; bars: 95% interval)",
            title=f"{bundle.name}: task metrics on {int(task['items'].iloc[0])} evaluation items",
            facet="metric",
            kind=PlotKind.BAR,
            table="task_metrics",
            ci_low="ci_low",
            ci_high="ci_high",
        )
    )
    return ExperimentResult(
        table=table,
        title=f"Fake vs fixed consistency: {bundle.name} on {ctx.platform.name}",
        findings=_findings(table, outputs, support, exp, ctx, bundle)
        + task_findings(task)
        + each_output_finding(each, exp.mode_a, exp.mode_b)
        + [w for w in [non_finite_words(sim.non_finite_points(), sim.platform.quantize_cast)] if w]
        + (
            [
                f"The ONNX graph fixes its batch at {fixed_batch}: the per-op tables and the "
                f"model output compare fake, fixed and onnxruntime on one run of "
                f"{_count(batch_items(batch), 'evaluation item')}; the task metrics run "
                f"{_count(sum(batch_items(b) for b in runs), 'item')} in "
                f"{_count(len(runs), 'run')} of that size."
            ]
            if merged < exp.max_eval_items
            else []
        ),
        tables={
            "model_output": outputs,
            **({"output_each": each} if not each.empty else {}),
            "export_gap_split": split[
                ["gap", "reference", "compared", "sqnr_db", "sqnr_db_ci_low", "sqnr_db_ci_high"]
                + ["sqnr_db_n", "mse", "max_abs"]
                + ["sqnr_db_plot", "sqnr_db_ci_low_plot", "sqnr_db_ci_high_plot"]
            ],
            "task_metrics": task,
            "by_op_type": by_type,
            "worst_ops": worst,
            "op_support": support,
            "along_depth": along[
                ["view", "compute_depth", "name", "op_type", "sqnr_db", "sqnr_db_plot", "err_lsb"]
            ],
        },
        plots=plots,
        notes=[
            f"Data: {data.description}. Calibration: {len(data.calib)} {data.name} batches; "
            f"per-op comparison: the first run, {_count(batch_items(batch), 'evaluation item')}; "
            "task metrics: "
            f"{_count(sum(batch_items(b) for b in runs), 'evaluation item')} in "
            f"{_count(len(runs), 'run')} of at most {merged} batches; "
            f"{qconfig_words(ctx.qconfig)}.",
            "Task metrics compare the fake and the fixed run with the float run (a metric that "
            "reads labels, e.g. face accuracy, compares with the labels); each value is "
            "measured on the evaluation items above, with its 95% interval over them (a share of "
            "items, such as top-1 agreement or face accuracy: Wilson score interval; any other "
            "metric: percentile bootstrap, 1000 resamples, seed 0); n = item count.",
            "Isolated view: each op of the compared run is fed the reference run's inputs, so a "
            "row is that op's own gap; accumulated view: both runs end to end.",
            "err_lsb is the largest |error| in units of the compared run's output scale; "
            "saturated counts output codes at the dtype's limits.",
            "Fake mode uses torch's fake-quant kernels (QAT numerics); fixed mode uses "
            "quantlab.numerics integer kernels with the platform's requantization; hybrid mode "
            "runs the segment-LUT ops (sigmoid, tanh, exp, ..., sin/cos, softmax) as fixed mode "
            "and every other op as fake mode.",
        ],
    )
