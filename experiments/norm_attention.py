"""LayerNorm, Dynamic Tanh and softmax-free attention in fixed point: does the advice pay?

The vendor's operator-replacement advice for transformers on J6: replace LayerNorm by Dynamic
Tanh (``weight * tanh(alpha x) + bias``, one LUT op instead of the eight-step normalisation
composite) and drop softmax for SimA-style L1-normalised Q/K. The three digit transformers
trained in the lab (LayerNorm + softmax, DyT + softmax, LayerNorm + SimA) are quantized on each
platform (platform templates: int8 on J6M, float16 vector ops with int8 GEMMs on J6P) and
evaluated on the held-out digits in float, fake (QAT numerics) and fixed (deployed numerics)
mode: top-1 accuracy with Wilson score intervals, top-1 agreement with float and with fake, and
the accumulated error (SQNR against float) along the residual stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm import tqdm

from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.platforms import PLATFORM_NAMES
from quantlab.report import Plot, PlotKind
from quantlab.simulate import Mode, View

MODELS = ("digits_layernorm", "digits_dyt", "digits_sima")
SQNR_PLOT_CAP = 100.0  # identical outputs (SQNR = +inf) are drawn at this height


@dataclass
class NormAttentionExp:
    """Schema of ``+exp=norm_attention``; the data (held-out digits) comes from its group."""

    models: list[str] = field(default_factory=lambda: list(MODELS))
    platforms: list[str] = field(default_factory=lambda: ["j6m", "j6p"])
    depth_items: int = 100  # evaluation items of the along-depth comparison
    resamples: int = 1000  # bootstrap resamples of every interval
    level: float = 0.95  # confidence level of every interval

    def __post_init__(self) -> None:
        bad = [m for m in self.models if m not in MODELS]
        if bad or not self.models:
            raise ValueError(f"exp.models: unknown or empty {bad}; allowed: {list(MODELS)}")
        bad = [p for p in self.platforms if p not in PLATFORM_NAMES]
        if bad or not self.platforms:
            raise ValueError(
                f"exp.platforms: unknown or empty {bad}; allowed: {list(PLATFORM_NAMES)}"
            )
        if self.depth_items < 1:
            raise ValueError(f"exp.depth_items must be >= 1, got {self.depth_items}")
        if self.resamples < 1:
            raise ValueError(f"exp.resamples must be >= 1, got {self.resamples}")
        if not 0 < self.level < 1:
            raise ValueError(f"exp.level must be in (0, 1), got {self.level}")


register_schema("exp", "norm_attention_schema", NormAttentionExp)


def residual_points(ops: pd.DataFrame) -> list[tuple[str, str]]:
    """(op name, label) of the residual stream of a digit transformer: the embedding sum, each
    block's two residual adds, and the logits (the last op)."""
    out = []
    for name, module, op_type in zip(ops.name, ops.module, ops.op_type):
        if op_type != "add":
            continue
        if module == "":
            out.append((name, "embed"))
        elif module.startswith("blocks.") and module.count(".") == 1:
            part = "attn" if name.endswith("#0") else "mlp"
            out.append((name, f"block{module.split('.')[1]}.{part}"))
    out.append((ops.name.iloc[-1], "logits"))
    return out


def _along_depth(sim, batch: tuple, model: str, platform: str) -> pd.DataFrame:
    points = residual_points(sim.ops)
    rows = []
    for mode in (Mode.FAKE, Mode.FIXED):
        t = sim.compare(*batch, a=Mode.FLOAT, b=mode, view=View.ACCUMULATED).set_index("name")
        for depth, (name, label) in enumerate(points):
            sq = float(t.loc[name, "sqnr_db"])
            rows.append(
                {
                    "model": model,
                    "platform": platform,
                    "mode": mode.name,
                    "depth": depth,
                    "point": label,
                    "name": name,
                    "sqnr_db": sq,
                    "sqnr_db_plot": min(sq, SQNR_PLOT_CAP),
                    "series": f"{model} {mode.name.lower()}",
                }
            )
    return pd.DataFrame(rows)


def _evaluate(exp, model: str, platform: str, bundle, data, progress: bool):
    from quantlab.analysis.confidence import bootstrap
    from quantlab.simulate import Simulator

    sim = Simulator(bundle.module, platform)
    sim.calibrate(data.calib, progress)
    modes = (Mode.FLOAT, Mode.FAKE, Mode.FIXED)
    outs = {m: [sim.run(*b, mode=m) for b in data.eval] for m in modes}
    task = bundle.task

    def ci(ref, test, labels):
        return bootstrap(task, ref, test, labels, resamples=exp.resamples, level=exp.level, seed=0)

    row = {"model": model, "platform": platform}
    for m in modes:
        row |= ci(outs[m], outs[m], data.labels).as_columns(f"{m.name.lower()}_accuracy")
    row |= ci(outs[Mode.FLOAT], outs[Mode.FIXED], None).as_columns("fixed_vs_float_agreement")
    row |= ci(outs[Mode.FAKE], outs[Mode.FIXED], None).as_columns("fixed_vs_fake_agreement")
    ops = sim.ops
    row["norm_ops"] = int(ops.op_type.isin(["layer_norm", "group_norm", "instance_norm"]).sum())
    row["norm_kernel"] = ", ".join(
        sorted(set(ops[ops.op_type == "layer_norm"].fixed_kernel)) or ["(none)"]
    )
    n = min(exp.depth_items, sum(len(b[0]) for b in data.eval))
    batch = (torch.cat([b[0] for b in data.eval])[:n],)
    depth = _along_depth(sim, batch, model, platform)
    return row, depth, ops.assign(model=model, platform=platform)


def _est(r: pd.Series, prefix: str):
    from quantlab.analysis.confidence import Estimate

    return Estimate.from_columns(r, prefix)


def _bracketed(r: pd.Series, prefix: str) -> str:
    """A share with its interval, ``value [low, high]``, three decimals."""
    return f"{r[prefix]:.3f} [{r[prefix + '_ci_low']:.3f}, {r[prefix + '_ci_high']:.3f}]"


def _findings(table: pd.DataFrame, depth: pd.DataFrame, exp: NormAttentionExp) -> list[str]:
    out = []
    pct = round(100 * exp.level)
    for plat, sub in table.groupby("platform", sort=False):
        sub = sub.set_index("model")
        parts = [
            f"{m} {r.fixed_accuracy:.3f} [{r.fixed_accuracy_ci_low:.3f}, "
            f"{r.fixed_accuracy_ci_high:.3f}] (float {r.float_accuracy:.3f})"
            for m, r in sub.iterrows()
        ]
        n = int(sub.fixed_accuracy_n.iloc[0])
        out.append(
            f"{plat}, fixed-point top-1 accuracy on {n} held-out digits ({pct}% CI): "
            + "; ".join(parts)
            + "."
        )
        if "digits_layernorm" in sub.index:
            ln = _est(sub.loc["digits_layernorm"], "fixed_accuracy")
            for alt in ("digits_dyt", "digits_sima"):
                if alt not in sub.index:
                    continue
                a = _est(sub.loc[alt], "fixed_accuracy")
                sep = a.relation(ln)
                out.append(
                    f"{plat}: {alt} vs digits_layernorm in fixed point: {a.value - ln.value:+.3f} "
                    f"accuracy; the {pct}% intervals {sep}."
                )
        gaps = [
            f"{m} {r.fixed_accuracy - r.fake_accuracy:+.3f} accuracy, fixed agrees with fake on "
            f"{_bracketed(r, 'fixed_vs_fake_agreement')} of the digits"
            for m, r in sub.iterrows()
        ]
        out.append(f"{plat}, fake -> fixed gap: " + "; ".join(gaps) + ".")
        d = depth[(depth.platform == plat) & (depth["mode"] == "FIXED")]
        growth = []
        for m, dm in d.groupby("model", sort=False):
            first, last = dm.iloc[0], dm.iloc[-1]
            growth.append(
                f"{m} {first.sqnr_db:.1f} dB at {first.point} -> {last.sqnr_db:.1f} dB at "
                f"{last.point}"
            )
        out.append(f"{plat}, fixed vs float SQNR along the residual stream: " + "; ".join(growth))
    j6m = table[table.platform == "j6m"].set_index("model")
    if {"digits_layernorm", "digits_dyt", "digits_sima"} <= set(j6m.index):
        ln, dyt, sima = (j6m.loc[m] for m in ("digits_layernorm", "digits_dyt", "digits_sima"))

        def drop(r):
            return r.float_accuracy - r.fixed_accuracy

        ln_est = _est(ln, "fixed_accuracy")
        agree = "fixed_vs_float_agreement"
        separated = [
            m
            for m, r in (("DyT", dyt), ("SimA", sima))
            if _est(r, "fixed_accuracy").separated_from(ln_est)
        ]
        verdict = (
            "no: neither replacement's fixed-point accuracy interval separates from LayerNorm's"
            if not separated
            else f"the intervals separate for {', '.join(separated)}"
        )
        out.append(
            "Does the advice pay in fixed point (j6m, accuracy lost float -> fixed)? "
            f"LayerNorm {drop(ln):+.3f}, DyT {drop(dyt):+.3f}, SimA {drop(sima):+.3f}; "
            f"fixed-vs-float agreement ({pct}% CI) LayerNorm {_bracketed(ln, agree)}, "
            f"DyT {_bracketed(dyt, agree)}, SimA {_bracketed(sima, agree)}. "
            f"In accuracy: {verdict}."
        )
    return out


def _summary(table: pd.DataFrame, support: pd.DataFrame) -> pd.DataFrame:
    """One row per model and platform: each accuracy as value [low, high], the agreements, and
    how LayerNorm ran (its fixed kernel at integer activations, float at float16 ones)."""
    ln = support[support.op_type == "layer_norm"].set_index(["model", "platform"])

    rows = []
    for _, r in table.iterrows():
        rows.append(
            {
                "model": r.model,
                "platform": r.platform,
                "n": int(r.float_accuracy_n),
                "float": _bracketed(r, "float_accuracy"),
                "fake": _bracketed(r, "fake_accuracy"),
                "fixed": _bracketed(r, "fixed_accuracy"),
                "fixed_vs_float_agreement": _bracketed(r, "fixed_vs_float_agreement"),
                "fixed_vs_fake_agreement": _bracketed(r, "fixed_vs_fake_agreement"),
                "layer_norm": _norm_how(ln, r),
            }
        )
    return pd.DataFrame(rows)


def _norm_how(ln: pd.DataFrame, r: pd.Series) -> str:
    key = (r.model, r.platform)
    if key not in ln.index:
        return "(none)"
    dtype = str(ln.loc[[key], "output_dtype"].iloc[0])
    return r.norm_kernel if dtype.startswith("INT") else f"float between {dtype} casts"


@experiment(NormAttentionExp, "norm_attention")
def run(exp: NormAttentionExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.data import load_data
    from quantlab.models import build_model

    rows, depths, ops = [], [], []
    jobs = [(m, p) for m in exp.models for p in exp.platforms]
    bundles = {}
    for model, platform in tqdm(jobs, desc="norm_attention", disable=not ctx.progress):
        if model not in bundles:
            bundles[model] = build_model(model, seed=0 if ctx.seed is None else ctx.seed)
        bundle = bundles[model]
        data = load_data(ctx.data, model)
        row, depth, op_table = _evaluate(exp, model, platform, bundle, data, False)
        rows.append(row)
        depths.append(depth)
        ops.append(op_table)
    support = pd.concat(ops, ignore_index=True)
    support = (
        support[support.op_type.isin(["layer_norm", "tanh", "softmax", "reciprocal", "embedding"])]
        .groupby(["model", "platform", "op_type", "fixed_kernel", "output_dtype"], sort=False)
        .size()
        .rename("ops")
        .reset_index()
    )
    return assemble(
        exp, ctx.data, pd.DataFrame(rows), pd.concat(depths, ignore_index=True), support
    )


def assemble(exp, data_cfg, table: pd.DataFrame, depth: pd.DataFrame, support: pd.DataFrame):
    """The ExperimentResult of the measured tables (accuracy rows, along-depth rows, kernels)."""
    acc_long = pd.concat(
        [
            table[["model", "platform"]].assign(
                mode=m,
                accuracy=table[f"{m}_accuracy"],
                ci_low=table[f"{m}_accuracy_ci_low"],
                ci_high=table[f"{m}_accuracy_ci_high"],
                series=table["model"] + " " + m,
                label=table["model"] + " " + table["platform"] + " " + m,
            )
            for m in ("float", "fake", "fixed")
        ],
        ignore_index=True,
    )
    plots = [
        Plot(
            name="accuracy",
            x="label",
            y="accuracy",
            table="accuracy_long",
            kind=PlotKind.BAR,
            xlabel="model, platform, mode",
            ylabel=f"top-1 accuracy on {int(table.float_accuracy_n.iloc[0])} held-out digits",
            title="Digit transformers: accuracy per mode (bars: value; CI in the table)",
        ),
        Plot(
            name="sqnr_along_depth",
            x="depth",
            y="sqnr_db_plot",
            hue="series",
            facet="platform",
            table="along_depth",
            xlabel="residual stream point (0 = embedding sum, last = logits)",
            ylabel=f"SQNR against float (dB; identical drawn at {SQNR_PLOT_CAP:g})",
            title="Accumulated error along depth",
        ),
    ]
    return ExperimentResult(
        table=table,
        title="LayerNorm vs DyT vs softmax-free attention in fixed point (digit transformers)",
        findings=_findings(table, depth, exp),
        tables={
            "accuracy": _summary(table, support),
            "accuracy_long": acc_long,
            "along_depth": depth,
            "op_kernels": support,
        },
        plots=plots,
        notes=[
            f"Data: {data_cfg.name}, calibration {data_cfg.num_calib} training-pool images, "
            f"evaluation {data_cfg.num_eval} held-out images; {round(100 * exp.level)}% "
            "intervals over items: Wilson score intervals for accuracy and agreement (shares of "
            f"items), percentile bootstrap ({exp.resamples} resamples, seed 0) for any other "
            "metric (quantlab.analysis.confidence.bootstrap).",
            "Agreement: share of digits whose arg-max class equals the reference mode's.",
            "Platform templates: every activation at platform.global_dtype (INT8 on j6m, "
            "FLOAT16 on j6p), GEMM inputs at platform.gemm_input_dtype (INT8), weights INT8 per "
            "channel. On j6m LayerNorm runs as the integer composite (int16 intermediates, rsqrt "
            "segment LUT); on j6p it runs in float16.",
            f"Along depth: accumulated view on the first {exp.depth_items} evaluation items; "
            "residual points are the embedding sum, each block's two residual adds, and logits.",
            f"SQNR is capped at {SQNR_PLOT_CAP:g} dB in the plot only (identical = +inf).",
        ],
    )
