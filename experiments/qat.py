"""PTQ vs QAT vs deployment-aware QAT: does fine-tuning through what the chip computes pay?

Three models, each calibrated and then fine-tuned briefly through the simulator
(``Simulator.train_step``, straight-through gradients, calibrated activation scales frozen:
the vendor's fixed-scale QAT): the DETR-style decoder of ``+exp=inverse_sigmoid`` (box chain
and inverse_sigmoid at int16 with the vendor's default table strategy, trained on its box
labels), the sin/cos positional-encoding toy of ``+exp=sincos_period`` and the real CNN of the
``model``/``data`` groups (MobileNetV2 on the packaged photos, float preprocessing), both
distilled from their float model. Variants: PTQ (no training), QAT (plain fake mode) and
DEPLOYED_QAT (fake mode with the deployed segment tables, ``FakeOps.DEPLOYED``). Reported: the
deployed (fixed mode) task metric with its 95% interval, the fake-vs-fixed gap before (PTQ) and
after, and the training curves.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch.nn import functional as F

from quantlab.analysis.qat import FineTuning, QatTask, Variant, compare_variants
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import Strategy
from quantlab.report import Plot, PlotKind
from quantlab.simulate import ScaleTraining


class QatModel(enum.Enum):
    """DECODER: the DETR-style decoder (inverse_sigmoid). POSENC: the sin/cos toy. CNN: the
    ``model`` group's model on the ``data`` group's inputs."""

    DECODER = "decoder"
    POSENC = "posenc"
    CNN = "cnn"


@dataclass
class QatExp:
    """Schema of ``+exp=qat``."""

    models: list[QatModel] = field(default_factory=lambda: list(QatModel))
    variants: list[Variant] = field(default_factory=lambda: list(Variant))
    scales: ScaleTraining = ScaleTraining.FIXED
    steps: int = 60  # fine-tuning steps of the toys (decoder, posenc)
    lr: float = 1e-3
    # --- decoder (as +exp=inverse_sigmoid)
    decoder_dtype: DType = DType.INT16  # box chain and inverse_sigmoid
    decoder_strategy: Strategy = Strategy.CURVATURE  # the vendor's default table strategy
    decoder_layers: int = 6
    decoder_float_steps: int = 150  # float training before quantization
    decoder_train_samples: int = 128
    decoder_eval_samples: int = 64
    decoder_batch: int = 16
    # --- posenc (as +exp=sincos_period)
    posenc_dtype: DType = DType.INT16  # angle producers (mul) and sin/cos
    posenc_batch: int = 8
    posenc_train_batches: int = 4
    posenc_eval_batches: int = 4
    # --- CNN (model / data groups)
    cnn_steps: int = 6
    cnn_lr: float = 1e-5
    cnn_batch: int = 4  # calibration items per training step

    def __post_init__(self) -> None:
        for name in ("models", "variants"):
            if not list(getattr(self, name)):
                raise ValueError(f"exp.{name} must not be empty")
        for name in ("steps", "cnn_steps", "decoder_float_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"exp.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("decoder_batch", "posenc_batch", "cnn_batch", "decoder_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"exp.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("decoder_train_samples", "decoder_eval_samples"):
            if getattr(self, name) < 2:
                raise ValueError(f"exp.{name} must be >= 2, got {getattr(self, name)}")
        for name in ("posenc_train_batches", "posenc_eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"exp.{name} must be >= 1, got {getattr(self, name)}")
        for dt in (self.decoder_dtype, self.posenc_dtype):
            if dt not in (DType.INT8, DType.INT16):
                raise ValueError(f"exp dtypes must be INT8 or INT16, got {dt.name}")
        if not self.lr > 0 or not self.cnn_lr > 0:
            raise ValueError("exp.lr and exp.cnn_lr must be > 0")


register_schema("exp", "qat_schema", QatExp)


def _decoder(exp: QatExp, seed: int) -> QatTask:
    from experiments.inverse_sigmoid import BOX_CHAIN
    from quantlab.analysis.train import fit, synthetic_boxes
    from quantlab.models.tasks import BoxL1
    from quantlab.models.toy_attention import DetrDecoder
    from quantlab.qconfig import OpQConfig, QConfigSpec

    train = synthetic_boxes(exp.decoder_train_samples, seed=seed)
    test = synthetic_boxes(exp.decoder_eval_samples, seed=seed + 1)
    xs, ts = train.batches(exp.decoder_batch), train.targets(exp.decoder_batch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DetrDecoder(layers=exp.decoder_layers)
    fit(model, xs, ts, exp.decoder_float_steps, lr=3e-3, seed=seed)
    dt = exp.decoder_dtype
    chain = OpQConfig(input_dtype=dt, output_dtype=dt)
    isig = OpQConfig(input_dtype=dt, output_dtype=dt, lut_strategy=exp.decoder_strategy)
    spec = QConfigSpec(by_type={"inverse_sigmoid": isig} | {t: chain for t in BOX_CHAIN})
    return QatTask(
        "decoder",
        model,
        spec,
        xs[:1],
        xs,
        ts,
        lambda y, t: (y - t).abs().mean(),
        test.batches(exp.decoder_batch),
        test.targets(exp.decoder_batch),
        (BoxL1(),),
        "labels",
    )


def _distilled(name, model, spec, calib, train, evals, metrics, loss) -> QatTask:
    with torch.no_grad():
        targets = [model(*b) for b in train]
        refs = [model(*b) for b in evals]
    return QatTask(name, model, spec, calib, train, targets, loss, evals, refs, metrics, "float")


def _posenc(exp: QatExp) -> QatTask:
    from quantlab.models import build_model
    from quantlab.models.tasks import OutputSQNR
    from quantlab.qconfig import OpQConfig, QConfigSpec

    b = build_model("posenc")
    q = OpQConfig(input_dtype=exp.posenc_dtype, output_dtype=exp.posenc_dtype)
    mul = OpQConfig(output_dtype=exp.posenc_dtype)
    spec = QConfigSpec(by_type={"mul": mul, "sin": q, "cos": q})
    n = exp.posenc_batch
    train = [b.example_inputs(n, 10 + i) for i in range(exp.posenc_train_batches)]
    evals = [b.example_inputs(n, 100 + i) for i in range(exp.posenc_eval_batches)]
    return _distilled(
        "posenc",
        b.module,
        spec,
        [b.example_inputs(n, 1)],
        train,
        evals,
        (OutputSQNR(),),
        F.mse_loss,
    )


def _kl(y, t):
    return F.kl_div(
        F.log_softmax(y, -1), F.log_softmax(t, -1), reduction="batchmean", log_target=True
    )


def _cnn(exp: QatExp, ctx: RunContext) -> QatTask:
    from experiments.consistency import _merge
    from quantlab.workload import load_workload, start_spec

    bundle, data = load_workload(ctx.model, ctx.data, ctx.seed or 0)
    spec = start_spec(ctx.qconfig, ctx.platform, bundle.module, data.calib[0])
    k = exp.cnn_batch
    train = [_merge(data.calib[i : i + k], k) for i in range(0, len(data.calib), k)]
    return _distilled(
        bundle.name, bundle.module, spec, data.calib, train, data.eval, bundle.metrics, _kl
    )


def _gap_words(df: pd.DataFrame, variant: str, mode: str) -> str:
    r = df[(df.variant == variant) & (df.metric == "gap_sqnr_db") & (df["mode"] == mode)]
    if r.empty:
        return "n/a"
    r = r.iloc[0]
    return f"{r.value:.1f} dB (CI {r.ci_low:.1f} to {r.ci_high:.1f})"


def _estimate(r):
    from quantlab.analysis.confidence import Estimate

    return Estimate(r.value, r.ci_low, r.ci_high, int(r["items"]))


def _findings(table: pd.DataFrame, exp: QatExp) -> list[str]:
    out = []
    for model, g in table.groupby("model", sort=False):
        head = g[g.metric != "gap_sqnr_db"].metric.iloc[0]
        fixed = g[(g["mode"] == "FIXED") & (g.metric == head)].set_index("variant")
        parts = "; ".join(f"{v.lower()} {_estimate(r)}" for v, r in fixed.iterrows())
        better = "higher" if bool(fixed.higher_is_better.iloc[0]) else "lower"
        out.append(f"{model}, deployed (fixed mode) {head} ({better} is better): {parts}.")
        gaps = ", ".join(
            f"{v.lower()} fixed vs fake {_gap_words(g, v, 'FAKE')}, vs hybrid "
            f"{_gap_words(g, v, 'HYBRID')}"
            for v in fixed.index
        )
        out.append(f"{model}, fake-vs-fixed gap (output SQNR of fixed against): {gaps}.")
        gap = g[g.metric == "gap_sqnr_db"]
        fake, hybrid = gap[gap["mode"] == "FAKE"].value, gap[gap["mode"] == "HYBRID"].value
        if list(fake) == list(hybrid):
            out.append(
                f"{model}: hybrid equals fake for every variant (no segment-LUT op reaches the "
                "output differently), so deployment-aware QAT trains on plain QAT's forward."
            )
    out.extend(_decoder_verdict(table))
    return out


def _gap(dec: pd.DataFrame, variant: str, mode: str):
    return _estimate(dec[(dec.variant == variant) & (dec["mode"] == mode)].iloc[0])


def _decoder_verdict(table: pd.DataFrame) -> list[str]:
    """Whether deployment-aware QAT leaves a smaller fake-vs-fixed gap than plain QAT on the
    decoder: each against its own training view, and like for like."""
    dec = table[(table.model == "decoder") & (table.metric == "gap_sqnr_db")]
    if not {"QAT", "DEPLOYED_QAT"} <= set(dec.variant):
        return []
    own_q, own_d = _gap(dec, "QAT", "FAKE"), _gap(dec, "DEPLOYED_QAT", "HYBRID")
    smaller = own_d.value > own_q.value  # higher SQNR = smaller gap
    resolved = own_q.separated_from(own_d)
    if smaller and resolved:
        verdict = "Yes: deployment-aware QAT leaves a smaller gap (the intervals separate)."
    elif resolved:
        verdict = "No: deployment-aware QAT leaves a larger gap (the intervals separate)."
    else:
        verdict = (
            "Not shown: the gap is "
            + ("smaller" if smaller else "not smaller")
            + " with deployment-aware QAT, but the intervals overlap."
        )
    like = ", ".join(
        f"fixed vs {m.lower()}: plain {_gap(dec, 'QAT', m).value:.1f} dB, deployment-aware "
        f"{_gap(dec, 'DEPLOYED_QAT', m).value:.1f} dB"
        for m in ("FAKE", "HYBRID")
    )
    return [
        "Decoder, does deployment-aware QAT leave a smaller fake-vs-fixed gap than plain QAT? "
        f"Each against what it trained on (output SQNR, higher = smaller gap): plain QAT "
        f"(fixed vs fake) {own_q} dB, deployment-aware QAT (fixed vs its deployed-table view, "
        f"= hybrid) {own_d} dB. {verdict} Like for like: {like}."
    ]


def qat_result(table: pd.DataFrame, curve: pd.DataFrame | None, exp: QatExp, platform: str):
    """The report of a qat run from its measured tables (results and training curve)."""
    heads = table[table.metric != "gap_sqnr_db"].groupby("model", sort=False).metric.first()
    deployed = table[(table["mode"] == "FIXED") & table.metric.isin(set(heads))].copy()
    deployed["model_metric"] = deployed.model + ": " + deployed.metric
    gaps = table[table.metric == "gap_sqnr_db"].copy()
    gaps["compared"] = gaps.variant + ", fixed vs " + gaps["mode"].str.lower()
    tables = {"deployed_metric": deployed, "gap": gaps}
    plots = [
        Plot(
            "deployed_metric",
            x="variant",
            y="value",
            xlabel="variant",
            ylabel="task metric in fixed mode (its own unit; bars: 95% bootstrap interval)",
            title=f"Deployed metric per variant on {platform}",
            facet="model_metric",
            kind=PlotKind.BAR,
            table="deployed_metric",
            ci_low="ci_low",
            ci_high="ci_high",
        ),
        Plot(
            "gap",
            x="compared",
            y="value",
            xlabel="variant, runs compared",
            ylabel="output SQNR of fixed against fake / hybrid (dB; higher = smaller gap)",
            title="Fake-vs-fixed gap before (PTQ) and after fine-tuning",
            facet="model",
            kind=PlotKind.BAR,
            table="gap",
            ci_low="ci_low",
            ci_high="ci_high",
        ),
    ]
    if curve is not None:
        tables["training_curve"] = curve
        plots.append(
            Plot(
                "training_curve",
                x="step",
                y="loss",
                xlabel="fine-tuning step",
                ylabel="training loss (decoder: box L1; posenc: MSE; CNN: KL, nats)",
                title="Training curves (loss of the variant's own fake-mode forward)",
                hue="variant",
                facet="model",
                logy=True,
                table="training_curve",
            )
        )
    return ExperimentResult(
        table=table,
        title=f"PTQ vs QAT vs deployment-aware QAT on {platform}",
        findings=_findings(table, exp),
        tables=tables,
        plots=plots,
        notes=[
            f"Fine-tuning: Adam, {exp.steps} steps at lr {exp.lr:g} (decoder, posenc) and "
            f"{exp.cnn_steps} steps at lr {exp.cnn_lr:g} (CNN, batches of {exp.cnn_batch} "
            f"calibration items); activation scales {exp.scales.name} (FIXED: the calibrated "
            "scales frozen, the vendor's fixed-scale QAT; LEARNED: LSQ); straight-through "
            "gradients; BatchNorm folded with frozen statistics.",
            "Losses: decoder L1 to its target boxes (labels); posenc MSE and CNN KL to the float "
            "model's outputs (distillation, no labels). Metrics: decoder box L1 to the target "
            "boxes, posenc output SQNR and CNN top-1 agreement / KL against the float model, on "
            "held-out items; 95% percentile bootstrap over items (1000 resamples, seed 0).",
            "Gap: output SQNR of the fixed run against the fake run (QAT's view) and against the "
            "hybrid run (segment-LUT ops as deployed, the rest fake: the deployment-aware view); "
            "before = PTQ, after = each trained variant.",
            f"Decoder: {exp.decoder_layers} layers trained {exp.decoder_float_steps} float steps "
            f"on {exp.decoder_train_samples} box sets, evaluated on {exp.decoder_eval_samples}; "
            f"box chain and inverse_sigmoid at {exp.decoder_dtype.name}, inverse_sigmoid table "
            f"{exp.decoder_strategy.name}. Posenc: mul, sin, cos at {exp.posenc_dtype.name}. "
            "CNN: the data group's float preprocessing.",
        ],
    )


@experiment(QatExp, "qat")
def qat(exp: QatExp, ctx: RunContext) -> ExperimentResult:
    seed = 0 if ctx.seed is None else ctx.seed
    toy = FineTuning(exp.steps, exp.lr, exp.scales)
    jobs = []
    if QatModel.DECODER in exp.models:
        jobs.append((_decoder(exp, seed), toy))
    if QatModel.POSENC in exp.models:
        jobs.append((_posenc(exp), toy))
    if QatModel.CNN in exp.models:
        jobs.append((_cnn(exp, ctx), FineTuning(exp.cnn_steps, exp.cnn_lr, exp.scales)))
    parts, curves = [], []
    for task, ft in jobs:
        rows, curve = compare_variants(task, ctx.platform, ft, list(exp.variants), ctx.progress)
        parts.append(rows)
        curves.append(curve)
    table = pd.concat(parts, ignore_index=True)
    curve = pd.concat(curves, ignore_index=True) if any(len(c) for c in curves) else None
    return qat_result(table, curve, exp, ctx.platform.name)
