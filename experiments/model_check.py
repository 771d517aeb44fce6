"""Model check: where each op of a model runs on the chosen J6 platform and toolchain.

One float run of the model on one input batch captures every op and every deployment pattern
(in-place slice and bool-mask assignment, nonzero, einsum, ArgMax/TopK index dtypes, fmod and
remainder, broadcast where); each row says where it runs (BPU fixed point, BPU float, VPU, SPU,
CPU fallback, refused), why, with the seed line, at what precision, and the fix the seeds suggest
(quantlab.analysis.placement). The platform's qconfig template decides the precisions, and the
discovery checks (high-precision output only at a model output, no float into a fixed-point op
on J6E/M, float16 only where TAE/VAE have it) run on the way.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantlab.analysis.placement import UNIT_ORDER, Unit, model_placement, unit_counts
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.report import Plot, PlotKind
from quantlab.simulate.non_finite import non_finite_words

COLUMNS = ["position", "name", "op_type", "pattern", "unit", "engine", "precision", "reason",
           "seed", "fix"]  # fmt: skip


OFF_BPU = [Unit.CPU.value, Unit.REFUSED.value, Unit.UNPLACED.value]


@dataclass
class ModelCheckExp:
    """Schema of ``+exp=model_check``; the model, input data and platform (with its
    ``toolchain``) come from their groups; the first calibration batch is the input."""

    batch: int = 0  # which calibration batch to run

    def __post_init__(self) -> None:
        if self.batch < 0:
            raise ValueError(f"exp.batch must be >= 0, got {self.batch}")


register_schema("exp", "model_check_schema", ModelCheckExp)


def _findings(table, counts, name: str, plat) -> list[str]:
    n = len(table)
    parts = ", ".join(f"{int(r.ops)} {r.unit}" for r in counts.itertuples() if r.ops)
    out = [
        f"{name} on {plat.name} with {plat.toolchain.value}: {n} rows (captured ops and "
        f"patterns): {parts}."
    ]
    off = table[table.unit.isin(OFF_BPU)]
    if len(off):
        kinds = off.groupby(["unit", "op_type"]).size()
        listing = "; ".join(f"{u}: {c} x {t}" for (u, t), c in kinds.items())
        out.append(f"Off the BPU or not placed: {listing}.")
    else:
        out.append(
            "No captured op or pattern falls back to the CPU, is refused or is left unplaced."
        )
    if plat.assumptions:
        out.append(
            f"{plat.name} takes {len(plat.assumptions)} named assumption(s) where the seeds "
            f"disagree or are silent: {', '.join(plat.assumptions)} (see Method)."
        )
    return out


@experiment(ModelCheckExp, "model_check", takes_model=True)
def model_check_exp(exp: ModelCheckExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.simulate import Mode, Simulator
    from quantlab.workload import load_workload, qconfig_words, start_spec

    bundle, data = load_workload(ctx.model, ctx.data, ctx.seed or 0)
    if exp.batch >= len(data.calib):
        raise ValueError(
            f"exp.batch={exp.batch} but data={data.name} has {len(data.calib)} calibration "
            f"batch(es); allowed: 0..{len(data.calib) - 1}"
        )
    batch = data.calib[exp.batch]
    batch = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    spec = start_spec(ctx.qconfig, ctx.platform, bundle.module, batch)
    sim = Simulator(bundle.module, ctx.platform, spec)
    # one fixed-mode run (calibrated on this batch) tells the ops whose fixed kernel declines
    # the call, so that quantlab computes it in float (the ops table's fixed_in_float); where
    # it fails, the placement stands and the findings say why the declines are not named
    fixed_failed = None
    try:
        sim.calibrate([batch], progress=False)
        sim.run(*batch, mode=Mode.FIXED)
    except (ValueError, RuntimeError) as err:
        fixed_failed = f"{type(err).__name__}: {err}"
    table = model_placement(sim, batch)
    table.insert(0, "platform", ctx.platform.name)
    table.insert(1, "toolchain", ctx.platform.toolchain.value)
    table.insert(2, "model", bundle.name)
    counts = unit_counts(table)
    off = table[table.unit.isin(OFF_BPU)][COLUMNS]
    off = off.sort_values("unit", key=lambda u: u.map(OFF_BPU.index), kind="stable")
    plot = Plot(
        name="op_sequence",
        x="position",
        y="unit",
        xlabel="op position in execution order (ops and patterns, count)",
        ylabel="where it runs (unit)",
        title=f"{bundle.name} on {ctx.platform.name} ({ctx.platform.toolchain.value})",
        kind=PlotKind.SEQUENCE,
        categories=tuple(UNIT_ORDER),
    )
    notes = [
        "Seed lines refer to the vendor documents in the shared seeds folder: 000 (operator "
        "support and optimisation), 002 (J6E/M deployment guide), 004 (platform differences).",
        "Captured ops take their placement from their category (TAE: GEMM; VAE: elementwise, "
        "LUT, reductions, norms, softmax; AAE: pooling, resize, grid_sample; DTE: layout) and "
        "their precision from the platform's qconfig template; fixed_kernel in results.csv is "
        "how quantlab simulates the op (one fixed-mode run on the input below, calibrated on "
        "it, names the calls whose fixed kernel declines them: quantlab computes those in "
        "float).",
        "Patterns (setitem, masked_fill, nonzero, argmax, ...) are calls the op capture does not "
        "keep or ops whose placement the seeds decide; 'not captured' in fixed_kernel marks "
        "them. An op quantlab does not model and no seed places is listed as 'not placed' (it "
        "runs in float in quantlab; the chip may run it anywhere).",
        f"Toolchain {ctx.platform.toolchain.value} (platform.toolchain; allowed: "
        "OE_3_0_0, OE_3_2_0, OE_3_5_0) gates fmod on the VPU (OE-v3.5.0, seed 000 line 63) and "
        "TopK on the SPU (seed 000 line 83).",
    ]
    notes += [f"Assumption {k}: {v}." for k, v in ctx.platform.assumptions.items()]
    notes.append(
        f"Input: calibration batch {exp.batch} of data={data.name}; precisions from "
        f"{qconfig_words(ctx.qconfig)}."
    )
    return ExperimentResult(
        table=table,
        title=f"Model check of {bundle.name} on {ctx.platform.name}",
        findings=_findings(table, counts, bundle.name, ctx.platform)
        + (
            [
                f"The fixed-mode run on the input failed ({fixed_failed}), so calls whose "
                "fixed kernel declines them are not named."
            ]
            if fixed_failed
            else []
        )
        + [w for w in [non_finite_words(sim.non_finite_points(), sim.platform.quantize_cast)] if w],
        tables={
            "cpu_fallback_and_unplaced": off,
            "unit_counts": counts,
            "placement": table[COLUMNS],
        },
        plots=[plot],
        notes=notes,
    )
