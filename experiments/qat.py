"""PTQ vs QAT vs deployment-aware QAT: does fine-tuning through what the chip computes pay?

Three models, each calibrated and then fine-tuned briefly through the simulator
(``Simulator.train_step``, straight-through gradients, calibrated activation scales frozen:
the vendor's fixed-scale QAT): the DETR-style decoder of ``+exp=inverse_sigmoid`` (box chain
and inverse_sigmoid at int16 with the vendor's default table strategy, trained on its box
labels), the sin/cos positional-encoding toy of ``+exp=sincos_period`` and the real CNN of the
``model``/``data`` groups (MobileNetV2 on the packaged photos), both distilled from their float
model. Variants: PTQ (no training), QAT (plain fake mode on the input as ``model.input_format``
configures it, by default the lab's float preprocessing) and DEPLOYED_QAT (fake mode with the
deployed segment tables, ``FakeOps.DEPLOYED``, and the CNN on the input the chip receives,
``exp.deployed_input``: uint8 pixels with mean/std folded into the first conv). Reported: the
deployed task metric (fixed mode; the CNN on its deployed input, a model trained on float
preprocessing deployed first) with its 95% interval, the fake-vs-fixed gap before (PTQ) and
after, and the training curves.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch.nn import functional as F

from quantlab.analysis.qat import FineTuning, QatTask, Variant, compare_variants
from quantlab.analysis.qat_cnn import cnn_task, loss_words
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.models.input_path import InputFormat
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
    # the CNN's input on the chip: FIXED mode of every variant, and DEPLOYED_QAT's training;
    # FLOAT_NORMALIZED: the float input at its calibrated scale (a model without an input path);
    # None: the model's own (model.input_format where set, UINT8_RGB for an image model with
    # its preprocessing, FLOAT_NORMALIZED for any other: audio, tokens, tensors)
    deployed_input: InputFormat | None = None

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
        if self.deployed_input is not None:
            self.deployed_input = InputFormat.parse(self.deployed_input, "exp.deployed_input")
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


def _loss_unit(words: str) -> str:
    return "KL, nats" if words == "KL" else "MSE of the outputs"


def _cnn(exp: QatExp, ctx: RunContext) -> tuple[QatTask, InputFormat]:
    """``quantlab.analysis.qat_cnn.cnn_task`` at this run's ``exp.cnn_batch`` and
    ``exp.deployed_input``."""
    return cnn_task(ctx, exp.cnn_batch, exp.deployed_input)


def _gap_words(df: pd.DataFrame, variant: str, mode: str) -> str:
    r = df[(df.variant == variant) & (df.metric == "gap_sqnr_db") & (df["mode"] == mode)]
    if r.empty:
        return "n/a"
    r = r.iloc[0]
    return f"{r.value:.1f} dB (CI {r.ci_low:.1f} to {r.ci_high:.1f})"


def _estimate(r):
    from quantlab.analysis.confidence import Estimate

    return Estimate(r.value, r.ci_low, r.ci_high, int(r["items"]))


def _separated(rows: pd.DataFrame) -> str:
    """The pairs of variants whose intervals separate (rows indexed by variant), or "none"."""
    names = list(rows.index)
    pairs = [
        f"{a.lower()}/{b.lower()}"
        for k, a in enumerate(names)
        for b in names[k + 1 :]
        if _estimate(rows.loc[a]).separated_from(_estimate(rows.loc[b]))
    ]
    return ", ".join(pairs) or "none"


def _findings(table: pd.DataFrame, exp: QatExp) -> list[str]:
    out = []
    for model, g in table.groupby("model", sort=False):
        fixed_rows = g[(g["mode"] == "FIXED") & (g.metric != "gap_sqnr_db")]
        chip = fixed_rows.input.iloc[0]
        for metric in fixed_rows.metric.unique():
            fixed = fixed_rows[fixed_rows.metric == metric].set_index("variant")
            parts = "; ".join(f"{v.lower()} {_estimate(r)}" for v, r in fixed.iterrows())
            better = "higher" if bool(fixed.higher_is_better.iloc[0]) else "lower"
            out.append(
                f"{model}, deployed (fixed mode, input {chip}) {metric} ({better} is better): "
                f"{parts}; intervals separated: {_separated(fixed)}."
            )
        gaps = ", ".join(
            f"{v.lower()} fixed vs fake {_gap_words(g, v, 'FAKE')}, vs hybrid "
            f"{_gap_words(g, v, 'HYBRID')}"
            for v in fixed_rows.variant.unique()
        )
        out.append(f"{model}, fake-vs-fixed gap (output SQNR of fixed against): {gaps}.")
        gap = g[g.metric == "gap_sqnr_db"]
        fake, hybrid = gap[gap["mode"] == "FAKE"].value, gap[gap["mode"] == "HYBRID"].value
        if list(fake) == list(hybrid):
            trained = g[(g["mode"] == "FAKE") & (g.metric != "gap_sqnr_db")]
            own = trained.groupby("variant", sort=False).input.first()
            if own.get("DEPLOYED_QAT", chip) != own.get("QAT", chip):
                what = (
                    "deployment-aware QAT differs from plain QAT only by the input it trains on "
                    f"({own['DEPLOYED_QAT']} as the chip receives it, against {own['QAT']})"
                )
            else:
                what = "deployment-aware QAT trains on plain QAT's forward"
            out.append(
                f"{model}: hybrid equals fake for every variant (no segment-LUT op reaches the "
                f"output differently), so {what}."
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
        rel = own_q.relation(own_d)  # "overlap", or separate on too few items
        verdict = (
            "Not shown: the gap is "
            + ("smaller" if smaller else "not smaller")
            + " with deployment-aware QAT, "
            + ("but the intervals overlap." if rel == "overlap" else f"and the intervals {rel}.")
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


def qat_result(
    table: pd.DataFrame,
    curve: pd.DataFrame | None,
    exp: QatExp,
    platform: str,
    cnn_batch: int | None = None,
    cnn_loss: str = "KL",
):
    """The report of a qat run from its measured tables (results and training curve);
    ``cnn_batch``: the CNN's training batch in items where it differs from ``exp.cnn_batch``
    (a graph that fixes its batch); ``cnn_loss``: its distillation loss (KL for a classifier,
    MSE otherwise)."""
    deployed = table[(table["mode"] == "FIXED") & (table.metric != "gap_sqnr_db")].copy()
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
            ylabel="task metric in fixed mode (its own unit; bars: 95% interval)",
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
                ylabel=f"training loss (decoder: box L1; posenc: MSE; CNN: {_loss_unit(cnn_loss)})",
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
            f"{exp.cnn_steps} steps at lr {exp.cnn_lr:g} (CNN, batches of "
            f"{_batch_words(exp, cnn_batch)} calibration items); activation scales "
            f"{exp.scales.name} (FIXED: the calibrated scales frozen, the vendor's "
            "fixed-scale QAT; LEARNED: LSQ); straight-through gradients; BatchNorm folded with "
            "frozen statistics.",
            f"Losses: decoder L1 to its target boxes (labels); posenc MSE and CNN {cnn_loss} to "
            "the float model's outputs (distillation, no labels; the CNN's MSE, for a model that "
            "is no classifier, over every float output tensor). Metrics: decoder box L1 to the "
            "target boxes, posenc output SQNR and the CNN's task metrics (a classifier: top-1 "
            "agreement, KL and output SQNR) against the float model on float preprocessing, on "
            "held-out items; 95% intervals over items: Wilson score interval for top-1 agreement "
            "(a share of items), percentile bootstrap (1000 resamples, seed 0) for the others.",
            "Gap: output SQNR of the fixed run against the fake run (QAT's view) and against the "
            "hybrid run (segment-LUT ops as deployed, the rest fake: the deployment-aware view); "
            "before = PTQ, after = each trained variant. The fixed run takes the input the chip "
            "receives and the fake and hybrid runs the input the variant trained on (column "
            "`input`), so for a CNN trained on float preprocessing the gap includes the input "
            "path.",
            f"Decoder: {exp.decoder_layers} layers trained {exp.decoder_float_steps} float steps "
            f"on {exp.decoder_train_samples} box sets, evaluated on {exp.decoder_eval_samples}; "
            f"box chain and inverse_sigmoid at {exp.decoder_dtype.name}, inverse_sigmoid table "
            f"{exp.decoder_strategy.name}. Posenc: mul, sin, cos at {exp.posenc_dtype.name}. "
            "CNN: PTQ and QAT calibrate and train on the input model.input_format configures; "
            f"on the chip it takes {_chip_words(exp.deployed_input)}, where DEPLOYED_QAT trains "
            "and every variant's fixed run is measured. One calibration on the configured input "
            "serves every variant.",
        ],
    )


@experiment(QatExp, "qat", takes_model=True)
def qat(exp: QatExp, ctx: RunContext) -> ExperimentResult:
    from quantlab.workload import batch_items

    seed = 0 if ctx.seed is None else ctx.seed
    toy = FineTuning(exp.steps, exp.lr, exp.scales)
    jobs = []
    if QatModel.DECODER in exp.models:
        jobs.append((_decoder(exp, seed), toy))
    if QatModel.POSENC in exp.models:
        jobs.append((_posenc(exp), toy))
    cnn_batch, cnn_loss = None, "KL"
    if QatModel.CNN in exp.models:
        cnn, chip = _cnn(exp, ctx)
        exp = dataclasses.replace(exp, deployed_input=chip)  # the report names the input used
        jobs.append((cnn, FineTuning(exp.cnn_steps, exp.cnn_lr, exp.scales)))
        cnn_batch, cnn_loss = batch_items(cnn.train[0]), loss_words(cnn.loss)
    parts, curves = [], []
    for task, ft in jobs:
        rows, curve = compare_variants(task, ctx.platform, ft, list(exp.variants), ctx.progress)
        parts.append(rows)
        curves.append(curve)
    table = pd.concat(parts, ignore_index=True)
    curve = pd.concat(curves, ignore_index=True) if any(len(c) for c in curves) else None
    return qat_result(table, curve, exp, ctx.platform.name, cnn_batch, cnn_loss)


def _chip_words(fmt: InputFormat | None) -> str:
    """What the CNN's deployed input ``exp.deployed_input`` (resolved; None: no CNN ran) is."""
    if fmt is None:
        return "the input exp.deployed_input names (unset: the model's own; no CNN ran here)"
    if fmt is InputFormat.FLOAT_NORMALIZED:
        return (
            "FLOAT_NORMALIZED (exp.deployed_input: the float input quantized at its calibrated "
            "scale, the default for a model that takes no image)"
        )
    return (
        f"{fmt.name} (exp.deployed_input: uint8 pixels as int8 codes at scale 1, mean/std "
        "folded into the first conv, its padding moved to the input; "
        "quantlab.models.input_path; a model trained on float preprocessing is folded after "
        "training)"
    )


def _batch_words(exp: QatExp, cnn_batch: int | None) -> str:
    if cnn_batch is None or cnn_batch >= exp.cnn_batch:
        return f"{exp.cnn_batch}"
    return f"{cnn_batch} (the model's graph fixes its batch; exp.cnn_batch={exp.cnn_batch})"
