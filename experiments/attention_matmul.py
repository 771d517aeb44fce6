"""MiniLM's attention MatMuls and linear layers at int8, int15 split and dual int16, its
additive attention mask under int8 and int16 activations, and float16 vs int16 vector ops.

On one integer platform (j6m by default) MiniLM runs in fixed point with the platform template,
then with one scheme applied either to the attention MatMuls (QK^T, AV) or to the Linear layers
(``quantlab.analysis.attention``): embedding cosine against float and output SQNR, each with a
95% interval over the sentences, and the cost model's int8-MAC equivalents. The mask section
measures the attention mass the fixed-point softmax gives to padded keys and the scores'
quantization step at int8, at int16 (the mask add and the scores at int16) and with the mask
constant clamped to what the data needs. The vector section runs the model on a float16
platform (j6p) with its template (vector ops float16) and with every activation int16 (GEMM
inputs int8 in both).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm import tqdm

from quantlab.analysis.attention import (
    ItemMean,
    Scheme,
    Target,
    attention_ops,
    clamped_mask_value,
    padded_key_mass,
    saturated_share,
    scheme_spec,
    score_spread,
)
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.numerics.dtypes import DType
from quantlab.numerics.split import check_split_k
from quantlab.platforms import PLATFORM_NAMES
from quantlab.report import Plot, PlotKind

ATTENTION_SCHEMES = (Scheme.INT8, Scheme.SPLIT, Scheme.DUAL_INT16)
LINEAR_SCHEMES = (Scheme.INT8, Scheme.SPLIT, Scheme.INT16_WEIGHT, Scheme.DUAL_INT16)


@dataclass
class AttentionMatmulExp:
    """Schema of ``+exp=attention_matmul`` (MiniLM on the sentence pairs)."""

    attention_schemes: list[Scheme] = field(default_factory=lambda: list(ATTENTION_SCHEMES))
    linear_schemes: list[Scheme] = field(default_factory=lambda: list(LINEAR_SCHEMES))
    k: int = 7  # low-part shift of every split
    background: DType = DType.INT16  # output dtype of every op the scheme does not set
    num_calib: int = 8  # sentence pairs
    num_eval: int = 16  # sentence pairs (items: 2 sentences each)
    batch_size: int = 16  # pairs per batch
    # clamped additive mask; None: from the calibration scores (analysis.attention)
    mask_value: float | None = None
    vector_platform: str | None = "j6p"  # float16 vs int16 vector ops there (None: skip)
    resamples: int = 1000

    def __post_init__(self) -> None:
        check_split_k(self.k)
        self.attention_schemes = [Scheme[str(s).split(".")[-1]] for s in self.attention_schemes]
        self.linear_schemes = [Scheme[str(s).split(".")[-1]] for s in self.linear_schemes]
        if Scheme.INT16_WEIGHT in self.attention_schemes:
            raise ValueError("exp.attention_schemes: INT16_WEIGHT applies to Linear layers only")
        for name in ("num_calib", "num_eval", "batch_size", "resamples"):
            if getattr(self, name) < 1:
                raise ValueError(f"exp.{name} must be >= 1, got {getattr(self, name)}")
        self.background = DType.parse(self.background)
        if self.background not in (DType.INT8, DType.INT16):
            raise ValueError(f"exp.background must be INT8 or INT16, got {self.background}")
        if self.mask_value is not None and not self.mask_value < 0:
            raise ValueError(f"exp.mask_value must be negative, got {self.mask_value}")
        if self.vector_platform is not None and self.vector_platform not in PLATFORM_NAMES:
            raise ValueError(
                f"exp.vector_platform={self.vector_platform!r}; allowed: {list(PLATFORM_NAMES)}"
            )


register_schema("exp", "attention_matmul_schema", AttentionMatmulExp)


class _Runner:
    """One calibrated simulator of a MiniLM embedder and its float references."""

    def __init__(self, module, platform, data, exp, progress):
        from quantlab.simulate import Simulator

        self.sim = Simulator(module, platform)
        self.sim.calibrate(data.calib, progress)
        self.data, self.exp = data, exp
        with torch.no_grad():
            self.refs = [module(*b) for b in data.eval]
        self.roles = attention_ops(self.sim.ops)

    def measure(self, spec, label: dict) -> dict:
        from quantlab.analysis.confidence import bootstrap, sqnr_estimate
        from quantlab.analysis.cost import model_cost
        from quantlab.models.tasks import EmbeddingCosine
        from quantlab.simulate import Mode

        try:
            self.sim.set_qconfig(spec)
            traces = [self.sim.trace(*b, mode=Mode.FIXED) for b in self.data.eval]
        except ValueError as e:  # a combination the platform refuses
            return label | {"status": f"refused: {e}"}
        outs = [t.result for t in traces]
        r = self.exp.resamples
        row = label | {"status": "ran"}
        row |= bootstrap(EmbeddingCosine(), self.refs, outs, resamples=r).as_columns("cosine")
        row |= sqnr_estimate(self.refs, outs).as_columns("sqnr_db")
        row["cost_int8_mac_eq"] = model_cost(self.sim.ops, self.sim.platform.lut_direct_int8)
        mass = [
            padded_key_mass(t.outputs, self.roles.softmax, b[1])
            for t, b in zip(traces, self.data.eval)
        ]
        row |= bootstrap(ItemMean(), mass, mass, resamples=r).as_columns("padded_mass")
        sat = [saturated_share(t, self.roles.mask_add) for t in traces]
        row["mask_add_saturated"] = sum(sat) / len(sat)
        row["float16_overflow"] = sum(sum(t.float16_overflow.values()) for t in traces)
        rq = self.sim.qconfig_of(self.roles.mask_add[0])
        out_dt = rq.output_dtype
        row["score_step"] = (
            float(self.sim.act_scale(self.roles.mask_add[0], "out", out_dt, rq))
            if out_dt.is_int
            else float("nan")
        )
        return row


def _data(exp, bundle):
    from quantlab.data import load_data
    from quantlab.data.schema import DataConfig

    cfg = DataConfig(
        name="sentences", num_calib=exp.num_calib, num_eval=exp.num_eval, batch_size=exp.batch_size
    )
    return load_data(cfg, bundle)


@experiment(AttentionMatmulExp, "attention_matmul")
def run(exp: AttentionMatmulExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.models import build_model
    from quantlab.models.minilm import MiniLMEmbedder
    from quantlab.qconfig import OpQConfig, QConfigSpec
    from quantlab.simulate import Mode

    bundle = build_model("minilm", seed=0 if ctx.seed is None else ctx.seed)
    if not isinstance(bundle.module, MiniLMEmbedder):
        raise ValueError("attention_matmul studies model=minilm (its attention and mask)")
    data = _data(exp, bundle)
    plat = ctx.platform
    steps = len(exp.attention_schemes) + len(exp.linear_schemes) + 4
    bar = tqdm(total=steps, desc="attention_matmul", disable=not ctx.progress)
    main = _Runner(bundle.module, plat, data, exp, False)
    rows = []
    for target, schemes in (
        (Target.ATTENTION_MATMUL, exp.attention_schemes),
        (Target.LINEAR, exp.linear_schemes),
    ):
        for scheme in schemes:
            spec = scheme_spec(main.roles, target, scheme, exp.k, exp.background)
            label = {
                "section": "gemm",
                "platform": plat.name,
                "background": exp.background.name,
                "target": target.value,
            }
            rows.append(main.measure(spec, label | {"scheme": scheme.value}))
            bar.update()
    # the additive mask at int8 and int16 activations: the model's constant, then clamped
    base = bundle.module.mask_value
    spread = max(
        score_spread(main.sim.trace(*b, mode=Mode.FLOAT).outputs, main.roles.scores, b[1])
        for b in data.calib
    )
    clamped = exp.mask_value if exp.mask_value is not None else clamped_mask_value(spread)
    clamped_model = MiniLMEmbedder(bundle.module.bert, mask_value=clamped).eval()
    alt = _Runner(clamped_model, plat, data, exp, False)
    alt.refs = main.refs  # against the same float embeddings
    mask_rows = []
    for runner, value in ((main, base), (alt, clamped)):
        for bg in (DType.INT8, DType.INT16):
            spec = QConfigSpec(global_=OpQConfig(output_dtype=bg))
            label = {"section": "mask", "platform": plat.name, "background": bg.name}
            mask_rows.append(runner.measure(spec, label | {"scheme": f"mask {value:g}"}))
            bar.update()
    vec_rows = []
    if exp.vector_platform is not None:
        from quantlab.simulate.profiles import platform_config

        vp = platform_config(exp.vector_platform)
        vec = _Runner(bundle.module, vp, data, exp, False)
        label = {"section": "vector", "platform": vp.name, "background": "template"}
        vec_rows.append(
            vec.measure(
                QConfigSpec(), label | {"scheme": f"template ({vp.global_dtype.name} vector ops)"}
            )
        )
        i16 = QConfigSpec(global_=OpQConfig(output_dtype=DType.INT16))
        vec_rows.append(vec.measure(i16, label | {"scheme": "INT16 vector ops"}))
    bar.close()
    table = pd.DataFrame(rows + mask_rows + vec_rows)
    return assemble(exp, table, spread, clamped, base, len(data.eval), plat.name)


def _fmt(r, prefix: str, digits: int = 4) -> str:
    if r.get("status") != "ran":
        return "-"
    return (
        f"{r[prefix]:.{digits}f} [{r[prefix + '_ci_low']:.{digits}f}, "
        f"{r[prefix + '_ci_high']:.{digits}f}]"
    )


def _est(r, prefix: str = "cosine"):
    from quantlab.analysis.confidence import Estimate

    return Estimate.from_columns(r, prefix)


def _sqnr(r) -> str:
    """The row's output SQNR with its interval (``-`` where the scheme did not run)."""
    if r.get("status") != "ran":
        return "-"
    return _est(r, "sqnr_db").format_db(count=False)


def _sep(a, b) -> str:
    return f"intervals {_est(a).relation(_est(b))}"


def _findings(t: pd.DataFrame, spread: float, clamped: float, base: float) -> list[str]:
    out = []
    gemm = t[t.section == "gemm"]
    for target, sub in gemm.groupby("target", sort=False):
        ref = sub[(sub.status == "ran") & (sub.scheme == "int8")]
        parts = []
        for _, r in sub.iterrows():
            if r.status != "ran":
                parts.append(f"{r.scheme} refused ({r.status.split(': ', 1)[-1][:100]})")
                continue
            sep = f", {_sep(r, ref.iloc[0])} with int8" if len(ref) and r.scheme != "int8" else ""
            cost = f"{r.cost_rel_int8:.3f}x cost" if len(ref) else f"{r.cost_int8_mac_eq:.3g} cost"
            parts.append(f"{r.scheme} {_fmt(r, 'cosine')} (output SQNR {_sqnr(r)}) at {cost}{sep}")
        n = int(sub.cosine_n.dropna().iloc[0]) if sub.cosine_n.notna().any() else 0
        out.append(
            f"{sub.platform.iloc[0]}, {target} with every other activation "
            f"{sub.background.iloc[0]} (embedding cosine vs float over {n} sentences, 95% CI; "
            "cost relative to this target's int8): " + "; ".join(parts) + "."
        )
    mask = t[(t.section == "mask") & (t.status == "ran")]
    for bg, sub in mask.groupby("background", sort=False):
        parts = [
            f"{r.scheme}: padded-key attention mass {r.padded_mass:.2e}, score step "
            f"{r.score_step:.4f} logits, {r.mask_add_saturated:.3%} of the mask-add codes "
            f"saturated, cosine {_fmt(r, 'cosine')}"
            for _, r in sub.iterrows()
        ]
        tail = f" ({_sep(sub.iloc[1], sub.iloc[0])})" if len(sub) == 2 else ""
        out.append(f"Attention mask, {bg} activations: " + "; ".join(parts) + tail + ".")
    out.append(
        f"The calibration scores span up to {spread:.2f} logits within a row, so the scores "
        f"themselves, not the mask constant ({base:g}), set most of an int8 score step; the "
        f"clamped constant {clamped:g} (= -(ceil(spread) + 12): still below the exp table's "
        "floor of -12 for every padded key) narrows the step only by the share the constant "
        "added."
    )
    vec = t[(t.section == "vector") & (t.status == "ran")]
    if len(vec) == 2:
        a, b = vec.iloc[0], vec.iloc[1]
        out.append(
            f"{a.platform}, vector ops: {a.scheme} cosine {_fmt(a, 'cosine')} with "
            f"{int(a.float16_overflow)} float16 overflows; {b.scheme} {_fmt(b, 'cosine')} with "
            f"{b.mask_add_saturated:.3%} of the mask-add codes saturated; {_sep(a, b)}; cost "
            f"{a.cost_int8_mac_eq / b.cost_int8_mac_eq:.3f}x (the cost model prices float16 "
            "and int16 alike: 2 bytes per element)."
        )
    return out


def assemble(exp, table, spread, clamped, base, batches, platform) -> ExperimentResult:
    """The ExperimentResult of the measured rows (one per section, target and scheme)."""
    t = table.copy()
    if "target" not in t.columns:
        t["target"] = None
    t["target"] = t.target.fillna("-")
    int8 = t[(t.section == "gemm") & (t.status == "ran") & (t.scheme == "int8")]
    ref = dict(zip(int8.target, int8.cost_int8_mac_eq))
    ref_cost = t.target.map(ref).astype(float)
    t["cost_rel_int8"] = t["cost_int8_mac_eq"] / ref_cost
    t["label"] = t.section + " " + t.background + " " + t.target.where(t.section == "gemm", "")
    t["label"] = t["label"].str.strip() + " " + t.scheme
    summary = pd.DataFrame(
        {
            "section": t.section,
            "platform": t.platform,
            "background": t.background,
            "target": t.target,
            "scheme": t.scheme,
            "embedding_cosine (95% CI)": [_fmt(r, "cosine") for _, r in t.iterrows()],
            "output SQNR (95% CI)": [_sqnr(r) for _, r in t.iterrows()],
            "cost_rel_int8": t.cost_rel_int8.round(3),
            "padded_mass": t.padded_mass,
            "score_step_logits": t.score_step,
            "mask_add_saturated": t.mask_add_saturated,
            "float16_overflow": t.float16_overflow,
            "status": t.status,
        }
    )
    ran = t[t.status == "ran"]
    cosine = ran[["label", "cosine", "cosine_ci_low", "cosine_ci_high"]]
    gemm_cost = ran[ran.section == "gemm"][["target", "scheme", "cost_rel_int8"]].assign(
        one_minus_cosine=1.0 - ran[ran.section == "gemm"].cosine
    )
    plots = [
        Plot(
            name="cosine",
            x="label",
            y="cosine",
            table="cosine_by_run",
            kind=PlotKind.BAR,
            ci_low="cosine_ci_low",
            ci_high="cosine_ci_high",
            xlabel="section, background, target, scheme",
            ylabel="embedding cosine vs float (1 = identical; 95% CI bars)",
            title="MiniLM in fixed point: attention MatMuls, linear layers, mask, vector ops",
        ),
        Plot(
            name="cost_vs_error",
            x="cost_rel_int8",
            y="one_minus_cosine",
            hue="target",
            table="gemm_cost",
            kind=PlotKind.SCATTER,
            logy=True,
            xlabel=f"cost (int8-MAC equivalents, relative to the target's int8, {platform})",
            ylabel="1 - embedding cosine vs float (log)",
            title="Precision against cost per scheme",
        ),
    ]
    return ExperimentResult(
        table=t,
        title="Attention MatMuls, linear layers and masks of MiniLM in fixed point",
        findings=_findings(t, spread, clamped, base),
        tables={"summary": summary, "cosine_by_run": cosine, "gemm_cost": gemm_cost},
        plots=plots,
        notes=[
            f"Model: all-MiniLM-L6-v2 (model=minilm), mask constant {base:g} in the model; data: "
            f"the lab's sentence pairs, {exp.num_calib} pairs calibrate, {exp.num_eval} pairs "
            f"({2 * exp.num_eval} sentences) evaluate in {batches} batch(es) of "
            f"{exp.batch_size} pairs. Metric: embedding cosine against the float model per "
            f"sentence, percentile bootstrap over sentences ({exp.resamples} resamples, seed 0). "
            "Output SQNR: 10 log10(sum ref^2 / sum (ref - test)^2) over every embedding value, "
            "its interval a percentile bootstrap over the same sentences "
            "(quantlab.analysis.confidence.sqnr_estimate).",
            "Schemes (quantlab.analysis.attention.scheme_spec, by op name over the platform "
            f"template): split = weight_split={exp.k}; on a MatMul its second operand (K^T, V) "
            "leaves the key/value Linear as int16 and is split into int8 halves at its int8 "
            "scale (numerics.split_matmul); on a Linear its weight. dual_int16 = the MatMul "
            "inputs and their producers (query/key/value Linears, softmax) at int16; on a Linear "
            "input and weight int16. int16_weight = Linear weights int16.",
            "Cost: quantlab.analysis.cost.model_cost of the run's op table (MACs x operand "
            "bytes; a split GEMM is two int8 passes plus a combine per output element).",
            "Mask section: padded_mass = attention probability on padded keys per sentence "
            "(mean over layers, heads and real query positions), with its bootstrap interval; "
            "score_step = the mask add's output scale (logits per code) in the first layer; "
            "mask_add_saturated = share of the mask-add output codes at the dtype's limits. "
            "'int16 scores' sets the score scaling and the mask add to INT16 outputs. The "
            "clamped mask is a second MiniLMEmbedder with mask_value set, calibrated anew.",
            "Vector section: the float16 platform's template (vector ops float16, GEMM inputs "
            "int8) against global output_dtype INT16 (every activation int16, GEMM inputs int8).",
        ],
    )
