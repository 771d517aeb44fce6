"""How much precision a high/low int8 split of a GEMM weight (or an int16 MatMul operand)
recovers, at what cost, and what the way the halves are combined changes (j6-numerics s.6,
bit-exact-emulation s.6).

Per layer: every Conv/Linear (and attention MatMul) call of real models (``exp.models``, or
the model the command chooses, your own included), captured on a real input, run in fixed
point with int8 / split (k, combine mode) / int16 operands: output SQNR and error in output
LSBs. Per model: int8, split of the top-k weight-sensitive layers, split of all, int16 weights;
task metrics against float on real photos / sentences (or your data), and cost.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm import tqdm

from quantlab.analysis.cost import model_cost
from quantlab.analysis.highlow_words import fixed_findings, split_findings, task_error
from quantlab.analysis.weight_split import (
    FormatChoice,
    OperandFormat,
    capture_gemm_calls,
    crop_conv_input,
    evaluate_formats,
    fake_weight,
    fixed_split_study,
    weight_sensitivity,
)
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.numerics.dtypes import DType
from quantlab.numerics.split import SplitCombine, check_split_k
from quantlab.report import Plot, PlotKind

SCHEMES = ("int8", "split_topk", "split_all", "int16")


@dataclass
class HighlowSplitExp:
    """Schema of ``+exp=highlow_split``. ``models`` (on their own data) and ``fixed_models`` are
    the lists run when the command chooses no model; a chosen one (``model=...``, your own
    included) runs alone, every study on ``data=...``."""

    models: list[str] = field(
        default_factory=lambda: ["mobilenet_v2", "efficientnet_lite0", "minilm"]
    )
    ks: list[int] = field(default_factory=lambda: [7, 8])
    combines: list[SplitCombine] = field(
        default_factory=lambda: [SplitCombine.WIDE_ACCUMULATOR, SplitCombine.SEPARATE_REQUANT]
    )
    layer_in_dtypes: list[DType] = field(default_factory=lambda: [DType.INT8, DType.INT16])
    # per-layer output; None: platform.global_dtype where it is float (float16 on J6H/P), else
    # platform.sensitive_dtype (int16 on J6E/M/B)
    layer_out_dtype: DType | None = None
    max_layers: int | None = None  # per model, in execution order (None: every GEMM)
    layer_max_hw: int = 8  # conv inputs cropped to the central HxW (<= this) per layer
    schemes: list[str] = field(default_factory=lambda: list(SCHEMES))
    model_k: int = 7  # split shift of the model-level schemes
    top_k: int = 5  # layers split in split_topk (most weight-sensitive first)
    num_calib: int = 2
    num_eval: int = 4
    sensitivity_batches: int = 1
    # simulator study (FIXED mode, activations as deployed) of these models, on their own data
    fixed_models: list[str] = field(default_factory=lambda: ["mobilenet_v2", "efficientnet_lite0"])
    fixed_num_calib: int = 4
    fixed_num_eval: int = 4

    def __post_init__(self) -> None:
        for k in list(self.ks) + [self.model_k]:
            check_split_k(k)
        bad = [s for s in self.schemes if s not in SCHEMES]
        if bad:
            raise ValueError(f"exp.schemes: unknown {bad}; allowed: {list(SCHEMES)}")
        for name in ("models", "ks", "combines", "layer_in_dtypes", "schemes"):
            if not list(getattr(self, name)):
                raise ValueError(f"exp.{name} must not be empty")
        if self.fixed_num_calib < 1 or self.fixed_num_eval < 1:
            raise ValueError("exp.fixed_num_calib and exp.fixed_num_eval must be >= 1")
        if self.top_k < 1:
            raise ValueError(f"exp.top_k must be >= 1, got {self.top_k}")
        if self.layer_out_dtype not in (None, DType.INT8, DType.INT16, DType.FLOAT16):
            raise ValueError(
                "exp.layer_out_dtype must be INT8, INT16, FLOAT16 or null, got "
                f"{self.layer_out_dtype}"
            )


register_schema("exp", "highlow_split_schema", HighlowSplitExp)


def _formats(exp: HighlowSplitExp) -> list[FormatChoice]:
    out = [FormatChoice(OperandFormat.INT8)]
    out += [FormatChoice(OperandFormat.SPLIT, k, c) for k in exp.ks for c in exp.combines]
    return out + [FormatChoice(OperandFormat.INT16)]


def _per_layer(exp, name, module, batch, progress: bool) -> pd.DataFrame:
    calls = capture_gemm_calls(module, batch)
    if exp.max_layers is not None:
        calls = calls[: exp.max_layers]
    calls = [crop_conv_input(c, exp.layer_max_hw) for c in calls]
    rows = []
    fmts = _formats(exp)
    for i, call in enumerate(tqdm(calls, desc=f"{name} layers", disable=not progress)):
        for dt in exp.layer_in_dtypes:
            for r in evaluate_formats(call, fmts, in_dtype=dt, out_dtype=exp.layer_out_dtype):
                rows.append({"model": name, "layer_idx": i} | r)
    return pd.DataFrame(rows)


def _gemm_modules(module) -> dict[str, str]:
    """module path -> op name of its (first) GEMM call, for Conv1d, Conv2d and Linear
    modules."""
    out = {}
    for path, m in module.named_modules():
        if isinstance(m, torch.nn.Conv1d):
            out[path] = f"{path}:conv1d#0"
        elif isinstance(m, torch.nn.Conv2d):
            out[path] = f"{path}:conv2d#0"
        elif isinstance(m, torch.nn.Linear):
            out[path] = f"{path}:linear#0"
    return out


def _model_level(exp, ctx, name, bundle, data) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Weight-only study: every Conv/Linear weight in its scheme's format (int8, split k, int16;
    QAT numerics: the exact value each format represents), activations float, task metrics of
    the outputs against float; cost from the platform template's op table with the scheme's
    weight formats."""
    from quantlab.analysis.confidence import estimate_metrics
    from quantlab.simulate import Simulator

    module = bundle.module
    sens = weight_sensitivity(module, data.calib[: exp.sensitivity_batches])
    sens.insert(0, "model", name)
    gemms = _gemm_modules(module)
    top = list(sens["module"].head(exp.top_k))
    with torch.no_grad():
        ref = [module(*b) for b in data.eval]
    sim = Simulator(module, ctx.platform)
    sim.calibrate(data.calib[:1], ctx.progress)
    base_ops = _first_dtype(sim.ops)
    mods = dict(module.named_modules())
    fmt = {
        "int8": FormatChoice(OperandFormat.INT8),
        "split": FormatChoice(OperandFormat.SPLIT, exp.model_k),
        "int16": FormatChoice(OperandFormat.INT16),
    }
    rows = []
    for scheme in exp.schemes:
        split = {"split_topk": set(top), "split_all": set(gemms)}.get(scheme, set())
        default = "int16" if scheme == "int16" else "int8"
        originals = {m: mods[m].weight.data for m in gemms}
        try:
            for m in gemms:
                mods[m].weight.data = fake_weight(
                    originals[m], fmt["split" if m in split else default]
                )
            with torch.no_grad():
                outs = [module(*b) for b in data.eval]
        finally:
            for m, w in originals.items():
                mods[m].weight.data = w
        ops = base_ops.copy()
        split_ops = {gemms[m] for m in split}
        ops["weight_split"] = [exp.model_k if n in split_ops else 0 for n in ops["name"]]
        if scheme == "int16":
            is_w = ops["name"].isin(set(gemms.values()))
            ops.loc[is_w, "weight_dtype"] = DType.INT16.name
        cost = model_cost(ops, ctx.platform.lut_direct_int8)
        wbytes, extra = _bytes_and_extra_macs(module, gemms, scheme, split, ops)
        row = {
            "model": name,
            "scheme": scheme,
            "layers_changed": len(gemms) if scheme == "int16" else len(split),
            "cost_int8_mac_eq": cost,
            "weight_bytes": wbytes,
            "extra_int8_macs": extra,
        }
        for metric_name, est in estimate_metrics(bundle.metrics, ref, outs, data.labels).items():
            row.update(est.as_columns(metric_name))
        rows.append(row)
    df = pd.DataFrame(rows)
    base = df.loc[df["scheme"] == "int8", "cost_int8_mac_eq"]
    if len(base):
        df["cost_rel_int8"] = df["cost_int8_mac_eq"] / float(base.iloc[0])
    return df, sens


def _first_dtype(ops: pd.DataFrame) -> pd.DataFrame:
    """``Simulator.ops`` lists one dtype per input ("INT8,INT8", "" for none); the cost model
    takes one name or None."""
    ops = ops.copy()
    for col in ("input_dtype", "weight_dtype", "output_dtype"):
        if col in ops.columns:
            ops[col] = [(v.split(",")[0] or None) if isinstance(v, str) else v for v in ops[col]]
    return ops


def _bytes_and_extra_macs(module, gemms, scheme, chosen, ops) -> tuple[int, float]:
    mods = dict(module.named_modules())
    macs = {r.name: float(r.flops) / 2 for r in ops.itertuples() if r.name in gemms.values()}
    wbytes, extra = 0, 0.0
    for path, op in gemms.items():
        n = mods[path].weight.numel()
        two = scheme == "int16" or path in chosen  # 2 bytes and a second int8 pass
        wbytes += n * (2 if two else 1)
        extra += macs.get(op, 0.0) if two else 0.0
    return wbytes, extra


def _fixed_level(exp, ctx, name, bundle, sens, data=None) -> pd.DataFrame:
    """The split schemes through the simulator in FIXED mode on ``data`` (None: the model's own
    data at ``exp.fixed_num_calib`` / ``fixed_num_eval`` items)."""
    from quantlab.data import load_data
    from quantlab.data.schema import DataConfig

    if data is None:
        own = DataConfig(
            name=bundle.default_data, num_calib=exp.fixed_num_calib, num_eval=exp.fixed_num_eval
        )
        data = load_data(own, model=name)
    if sens is None:
        sens = weight_sensitivity(bundle.module, data.calib[: exp.sensitivity_batches])
    df = fixed_split_study(
        bundle.module,
        ctx.platform,
        data.calib,
        data.eval,
        bundle.metrics,
        data.labels,
        top_modules=list(sens["module"].head(exp.top_k)),
        k=exp.model_k,
        combines=list(exp.combines),
        progress=ctx.progress,
    )
    df.insert(0, "model", name)
    return df


@experiment(HighlowSplitExp, "highlow_split", takes_model=True)
def run(exp: HighlowSplitExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.workload import listed_or_chosen

    if exp.layer_out_dtype is None:  # int16 on J6E/M/B, float16 on J6H/P
        p = ctx.platform
        out = p.global_dtype if p.global_dtype.is_float else p.sensitive_dtype
        exp = dataclasses.replace(exp, layer_out_dtype=out)
    layers, models, sens, fixed = [], [], [], []
    for name, bundle, data in listed_or_chosen(ctx, exp.models, exp.num_calib, exp.num_eval):
        if not _gemm_modules(bundle.module):
            raise ValueError(
                f"model {name} has no nn.Conv1d, nn.Conv2d or nn.Linear module: the high/low "
                "weight split studies their weights, and this model has none to split"
            )
        layers.append(_per_layer(exp, name, bundle.module, data.eval[0], ctx.progress))
        if exp.schemes:
            m, s = _model_level(exp, ctx, name, bundle, data)
            models.append(m)
            sens.append(s)
        if ctx.model_chosen or name in exp.fixed_models:
            fixed_data = data if ctx.model_chosen else None  # a chosen model: its data alone
            fixed.append(
                _fixed_level(exp, ctx, name, bundle, sens[-1] if sens else None, fixed_data)
            )
    layer_df = pd.concat(layers, ignore_index=True)
    model_df = pd.concat(models, ignore_index=True) if models else pd.DataFrame()
    fixed_df = pd.concat(fixed, ignore_index=True) if fixed else pd.DataFrame()
    tables = {
        "layer_summary": layer_df.groupby(["model", "in_dtype", "format"], sort=False)
        .agg(
            median_sqnr_db=("sqnr_db", "median"),
            min_sqnr_db=("sqnr_db", "min"),
            mean_err_lsb=("mean_err_lsb", "mean"),
            max_err_lsb=("max_err_lsb", "max"),
            acc_saturated=("acc_saturated", "sum"),
        )
        .reset_index(),
    }
    plots = [
        Plot(
            "layer_sqnr",
            x="layer_idx",
            y="sqnr_db",
            xlabel="GEMM index in execution order (layer depth)",
            ylabel="output SQNR vs float (dB)",
            title=f"per-layer output SQNR, INT8 inputs, {exp.layer_out_dtype.name} outputs",
            hue="format",
            facet="model",
            table="layer_int8_inputs",
        )
    ]
    tables["layer_int8_inputs"] = layer_df[layer_df["in_dtype"] == exp.layer_in_dtypes[0].name]
    if len(model_df):
        model_df["task_error"] = task_error(model_df)
        tables["model_level"] = model_df
        tables["sensitivity"] = pd.concat(sens, ignore_index=True)
        plots.append(
            Plot(
                "pareto",
                x="cost_rel_int8",
                y="task_error",
                xlabel="cost relative to all-int8 (int8-MAC equivalents, cost model)",
                ylabel="task error vs float (KL nats; 1 - cosine for MiniLM and models without "
                "a classifier output), log",
                title="task error vs cost: int8, split top-k, split all, int16 weights",
                hue="scheme",
                facet="model",
                kind=PlotKind.SCATTER,
                logy=True,
                table="model_level",
            )
        )
    findings = split_findings(exp, layer_df, model_df if len(model_df) else None)
    if len(fixed_df):
        tables["model_fixed"] = fixed_df
        findings += fixed_findings(exp, fixed_df)
    return ExperimentResult(
        table=layer_df,
        title="High/low int8 splitting of Conv/Linear weights and MatMul operands",
        findings=findings,
        tables=tables,
        plots=plots,
        notes=[
            "Per layer: each GEMM call captured in float on one real input (conv inputs cropped "
            f"to the central {exp.layer_max_hw}x{exp.layer_max_hw} window); input quantized "
            "per tensor (amax/((qmax - qmin)/2)), weights per output channel; exact integer "
            "accumulators (int32 per int8 pass, saturating); reference = float64 GEMM of the "
            "dequantized input with float weights; output requantized (MUL_SHIFT, half up) to "
            "the output dtype at amax(reference). Error in output LSBs against the reference "
            "(float16 outputs, J6H/P: s_x * s_w * acc rounded to float16, error in float16 ulps "
            "at each reference value).",
            "split_kK_wide: acc_hi + acc_lo / 2^K exactly in a 48-bit accumulator, one "
            "requantization (16-bit multiplier); split_kK_separate: each half requantized with "
            "its own 31-bit multiplier, the rounded results added. MatMul (split16_*): the right "
            "operand quantized to int16 in [-32768, 32639] and taken as hi*256 + lo.",
            "Model level (weight-only, QAT numerics): every Conv/Linear weight holds the value "
            "its format represents (int8 or int16 fake quant per output channel, or the exact "
            "split s*(w_hi + w_lo/2^k)); activations stay float, so the task metrics isolate "
            "the weight format. Top-k by the vendor weight-sensitivity pass (one layer's weight "
            "int8, rest float; output SQNR). Cost uses the "
            f"{ctx.platform.name} template's op table (int8 activations) with each scheme's "
            "weight formats.",
            "Cost: quantlab.analysis.cost (int8-MAC equivalents; a split GEMM runs twice plus a "
            "combine step); extra_int8_macs = MACs of the GEMMs that take a second int8 pass.",
            "Model level through the simulator (table model_fixed): Simulator(model, "
            f"{ctx.platform.name} template) calibrated on {exp.fixed_num_calib} and evaluated "
            f"on {exp.fixed_num_eval} inputs of each model's own data (photos for the CNNs) in "
            "FIXED mode, so activations, LUTs and requantization are as deployed; split_topk / "
            "split_all set OpQConfig(weight_split=model_k) by op name on the top-k modules of the "
            "sensitivity table / on every Conv/Linear with an int8 weight; each split scheme once "
            "per platform.weight_split_combine (dataclasses.replace on the platform). sqnr_db: "
            "model output vs float over every output value, with its 95% percentile-bootstrap "
            "interval over the inputs (sqnr_db_ci_low / _ci_high, sqnr_db_n). The cost model "
            "does not depend on the combine mode.",
            "Attention MatMuls (MiniLM) appear in the per-layer table only; the model-level "
            "schemes change Conv/Linear weights.",
        ],
    )
