"""What the deployed image input path costs against float preprocessing.

The float reference is the trained model on float-preprocessed images ((x - mean) / std of the
resized image, never rounded to uint8). Each variant feeds the same photos as the deployed
model would take them: FLOAT_NORMALIZED (the first conv calibrates its own input scale),
UINT8_RGB (pixels rounded to uint8, int8 codes p - 128 at input scale 1, mean/std folded into
the first conv, the conv's padding as a mean-pixel border), the same with a zero-code border,
and NV12 (uint8 pixels through NV12 and the chip's conversion back, platform ``image_yuv_*``).
Each variant is calibrated on the calibration photos and run in float, fake and fixed mode;
rows hold the output SQNR against the float reference and the top-1 agreement with it, each
with its 95% interval over the evaluation photos (Wilson score for the agreement, percentile
bootstrap for the SQNR).

``model=...`` runs the chosen model alone on ``data=...`` instead of ``exp.models``: your own
image model (one (3, H, W) input) takes the preprocessing its image data describes
(``data.mean``, ``data.std``, ``data.channel_order``, ``data.resize``), and its rows carry
output SQNR and its own first output metric (top-1 agreement for a classifier's logits, else
output cosine).

Sources: the toolchain inserts a preprocessing node for colour conversion (NV12 -> BGR) and
(data - mean) / std (seed 002 s.6.3); pyramid models take NV12 (s.8.3); a fixed input scale in
QAT must match the deployed input source (seed 004). The conversion's matrix, range and rounding
are not published there: they are the platform's assumed ``image_yuv_*`` fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch

from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.models.input_path import Border, InputFormat
from quantlab.models.schema import ModelConfig
from quantlab.report import Plot, PlotKind
from quantlab.simulate import Mode

SQNR_PLOT_CAP = 100.0  # dB


@dataclass
class InputPathExp:
    """Schema of ``+exp=input_path``; data and platform come from their groups."""

    models: list[str] = field(default_factory=lambda: ["mobilenet_v2", "efficientnet_lite0"])
    formats: list[InputFormat] = field(
        default_factory=lambda: [
            InputFormat.FLOAT_NORMALIZED,
            InputFormat.UINT8_RGB,
            InputFormat.NV12,
        ]
    )
    zero_code_border: bool = True  # also UINT8_RGB with a zero-code border
    modes: list[Mode] = field(default_factory=lambda: [Mode.FLOAT, Mode.FAKE, Mode.FIXED])
    pretrained: bool = True  # the models' real weights (false: random init, for quick checks)

    def __post_init__(self) -> None:
        for name in ("models", "formats", "modes"):
            if not list(getattr(self, name)):
                raise ValueError(f"exp.{name} must not be empty")
        self.formats = [InputFormat.parse(f, "exp.formats") for f in self.formats]


register_schema("exp", "input_path_schema", InputPathExp)


ZERO_BORDER = "UINT8_RGB_ZERO_BORDER"
SHORT = {  # plot labels
    InputFormat.FLOAT_NORMALIZED.name: "float",
    InputFormat.UINT8_RGB.name: "uint8 rgb",
    InputFormat.UINT8_BGR.name: "uint8 bgr",
    InputFormat.NV12.name: "nv12",
    ZERO_BORDER: "uint8 0-border",
}


def _variants(exp: InputPathExp) -> list[tuple[str, InputFormat, Border]]:
    out = [(f.name, f, Border.MEAN_PIXEL) for f in exp.formats]
    if exp.zero_code_border:
        out.append((ZERO_BORDER, InputFormat.UINT8_RGB, Border.ZERO_CODE))
    return out


def _reference(model_cfg, data_cfg, seed: int, platform):
    """The float model and its outputs on float-preprocessed evaluation photos."""
    from quantlab.workload import load_workload

    bundle, data = load_workload(model_cfg, data_cfg, seed, platform)
    with torch.no_grad():
        outs = [bundle.module(*b) for b in data.eval]
    return bundle, data, outs


def _variant_runs(bundle, data, sim_factory, modes, progress: bool) -> dict:
    sim = sim_factory(bundle.module)
    sim.calibrate(data.calib, progress=progress)
    return {m: [sim.run(*b, mode=m) for b in data.eval] for m in modes}


def _models(exp: InputPathExp, ctx: RunContext) -> list[ModelConfig]:
    """The model the command chose (``model=...``, your own included), else ``exp.models``."""
    if not ctx.model_chosen:
        return [ModelConfig(name=name, pretrained=exp.pretrained) for name in exp.models]
    if ctx.model.input_format is not InputFormat.FLOAT_NORMALIZED:
        raise ValueError(
            f"model.input_format={ctx.model.input_format.name}: +exp=input_path compares the "
            "input formats of exp.formats against float preprocessing itself; leave "
            "model.input_format unset"
        )
    return [ctx.model]


def _metrics(bundle, chosen: bool) -> tuple:
    """Output SQNR and a second task metric against the float reference: top-1 agreement for
    the listed classifiers; for a chosen model the first of its own metrics that compares
    outputs alone (top-1 agreement for a classifier-shaped output, else output cosine)."""
    from quantlab.models.tasks import OutputSQNR, Top1Agreement

    if not chosen:
        return OutputSQNR(), Top1Agreement()
    second = [m for m in bundle.metrics if m.name != "output_sqnr_db" and not m.uses_labels]
    return (OutputSQNR(), *second[:1])


def measure(exp: InputPathExp, ctx: RunContext) -> pd.DataFrame:
    """One row per model, variant and mode: output SQNR and a second metric (``_metrics``)
    against the float reference, each with its interval and item count."""
    from quantlab.analysis.confidence import estimate_metrics
    from quantlab.models.input_path import deploy_workload
    from quantlab.simulate import Simulator

    rows = []
    for model_cfg in _models(exp, ctx):
        bundle, float_data, ref = _reference(model_cfg, ctx.data, ctx.seed or 0, ctx.platform)
        metrics = _metrics(bundle, ctx.model_chosen)
        for label, fmt, border in _variants(exp):
            if fmt is InputFormat.FLOAT_NORMALIZED:
                b, data = bundle, float_data
            else:
                b, data = deploy_workload(bundle, ctx.data, fmt, ctx.platform, border)
            outs = _variant_runs(
                b, data, lambda m: Simulator(m, ctx.platform), exp.modes, ctx.progress
            )
            for mode, test in outs.items():
                est = estimate_metrics(metrics, ref, test)
                row = {"model": bundle.name, "variant": label, "mode": mode.name}
                for m in metrics:
                    row.update(est[m.name].as_columns(m.name))
                rows.append(row)
    return pd.DataFrame(rows)


SECOND_WORDS = {  # metric: (in the findings, the plot's y axis, the plot's title)
    "top1_agreement": (
        "top-1",
        "top-1 agreement with float (fraction of images)",
        "Top-1 agreement",
    ),
    "output_cosine": ("cosine", "output cosine with float (mean over images)", "Output cosine"),
}


def _second_words(metric: str) -> tuple[str, str, str]:
    """``SECOND_WORDS`` of ``metric``; a metric of your own is named as it is."""
    return SECOND_WORDS.get(metric, (metric, f"{metric} against float", metric))


def _second_metric(table: pd.DataFrame) -> str | None:
    """The table's metric besides output SQNR (None: output SQNR alone)."""
    names = [c[: -len("_n")] for c in table.columns if c.endswith("_n")]
    return next((n for n in names if n != "output_sqnr_db"), None)


def _findings(table: pd.DataFrame) -> list[str]:
    """Per model and mode: each input path's output SQNR and second metric with their 95%
    intervals and item counts, and the paths whose intervals separate from float
    preprocessing's."""
    from quantlab.analysis.confidence import Estimate

    est = Estimate.from_columns

    second = _second_metric(table)
    words = _second_words(second)[0] if second else ""
    out = []
    for (model, mode), g in table.groupby(["model", "mode"], sort=False):
        base = g[g.variant == InputFormat.FLOAT_NORMALIZED.name]
        parts = [
            f"{r['variant']} {est(r, 'output_sqnr_db').format_db()}"
            + (f", {words} {est(r, second)}" if second else "")
            for _, r in g.iterrows()
        ]
        line = f"{model}, {mode.lower()} mode: " + "; ".join(parts) + "."
        if not base.empty:
            b = base.iloc[0]
            for metric, name in [("output_sqnr_db", "Output SQNR"), (second, words)]:
                if metric is None:
                    continue
                sep = [
                    r.variant
                    for _, r in g.iterrows()
                    if r.variant != b.variant and est(r, metric).separated_from(est(b, metric))
                ]
                line += (
                    f" {name[0].upper() + name[1:]} intervals separated from float "
                    "preprocessing: " + (", ".join(sep) if sep else "none") + "."
                )
        out.append(line)
    return out


def _per_path(table: pd.DataFrame) -> pd.DataFrame:
    """The report's table: model, mode and input path with each metric, its 95% interval and
    item count, as results.csv holds them (without the plots' capped copies)."""
    keep = [c for c in table.columns if not c.startswith("sqnr_plot") and c != "path"]
    return table[keep].copy()


@experiment(InputPathExp, "input_path", takes_model=True)
def input_path(exp: InputPathExp, ctx: RunContext) -> ExperimentResult:
    table = measure(exp, ctx)
    table["path"] = table["variant"].map(SHORT)
    for suffix in ("", "_ci_low", "_ci_high"):  # identical outputs (+inf dB) drawn at the cap
        table[f"sqnr_plot{suffix}"] = table[f"output_sqnr_db{suffix}"].clip(upper=SQNR_PLOT_CAP)
    plots = [
        Plot(
            "output_sqnr",
            x="path",
            y="sqnr_plot",
            xlabel="input path",
            ylabel="output SQNR vs float preprocessing (dB)",
            title="Output SQNR per input path (95% CI)",
            hue="mode",
            facet="model",
            kind=PlotKind.SCATTER,
            ci_low="sqnr_plot_ci_low",
            ci_high="sqnr_plot_ci_high",
        ),
    ]
    second = _second_metric(table)
    if second:
        _, axis, title = _second_words(second)
        plots.append(
            Plot(
                second,
                x="path",
                y=second,
                xlabel="input path",
                ylabel=axis,
                title=f"{title} per input path (95% CI)",
                hue="mode",
                facet="model",
                kind=PlotKind.SCATTER,
                ci_low=f"{second}_ci_low",
                ci_high=f"{second}_ci_high",
            )
        )
    notes = [
        "Reference: the float model on float-preprocessed images (no uint8 rounding).",
        "UINT8_*: uint8 pixels round(255 x) (half to even) as int8 codes p - 128 at input "
        "scale 1, (x - mean) / std folded into the first conv (weights and bias rewritten), "
        "its zero padding moved to the input as a border of the mean pixel's code (or of "
        "code 0 for UINT8_RGB_ZERO_BORDER).",
        f"NV12: {ctx.platform.image_yuv_matrix.name}, {ctx.platform.image_yuv_range.name} range, "
        f"rounding {ctx.platform.image_yuv_round.name} (platform fields, assumed); chroma the "
        "mean of each 2x2 block, repeated on the way back.",
        f"Identical outputs (SQNR +inf) are drawn at {SQNR_PLOT_CAP:g} dB.",
        "FLOAT mode of a deployed variant isolates the input path itself (uint8 / NV12 "
        "rounding and the border); fake and fixed add the model's quantization.",
    ]
    return ExperimentResult(
        table=table,
        title="Deployed image input path vs float preprocessing",
        findings=_findings(table),
        tables={"per_input_path": _per_path(table)},
        plots=plots,
        notes=notes,
    )
