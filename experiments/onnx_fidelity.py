"""ONNX fidelity: does onnxruntime, running quantlab's exported QDQ model, compute what
quantlab's fixed mode (``onnxruntime`` profile) computes, value for value?

Per model: calibrate, export (``quantlab.export.to_onnx_qdq``), run the export in onnxruntime
(CPU, default graph optimizations, which fuse QDQ patterns into QLinear kernels) and quantlab
fixed mode on the same evaluation inputs; count differing output values, their size in output
LSBs, and find the first op in execution order whose output differs, with onnxruntime's kernel
for it. Rows of the main table: one per model: each of ``exp.models`` on its own data, or the
model the command chooses (``model=...``, your own included) alone, on ``data=...``. With an
onnxruntime profile other than this machine's (``export.ort_host``), the first finding says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import pandas as pd

from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.export import ActivationEncoding
from quantlab.report import Plot


@dataclass
class OnnxFidelityExp:
    """Schema of ``+exp=onnx_fidelity``; the platform comes from its group (onnxruntime).
    ``models`` is the list compared when the command chooses no model (``model=...``)."""

    models: list[str] = field(
        default_factory=lambda: ["small_cnn", "mobilenet_v2", "efficientnet_lite0", "minilm"]
    )
    encoding: ActivationEncoding = ActivationEncoding.UNSIGNED_OFFSET  # the main table's
    other_encodings: list[ActivationEncoding] = field(
        default_factory=lambda: [ActivationEncoding.SIGNED]
    )
    max_eval_items: int = 8  # evaluation items merged into one batch per model

    def __post_init__(self) -> None:
        from quantlab.models import MODEL_NAMES

        bad = [m for m in self.models if m not in MODEL_NAMES]
        if bad or not self.models:
            raise ValueError(
                f"exp.models has unknown or no model(s) {bad}; allowed: {', '.join(MODEL_NAMES)}"
            )
        self.encoding = ActivationEncoding(_enum_value(self.encoding))
        self.other_encodings = [ActivationEncoding(_enum_value(e)) for e in self.other_encodings]
        if self.max_eval_items < 1:
            raise ValueError(f"exp.max_eval_items must be >= 1, got {self.max_eval_items}")


def _enum_value(e):
    if isinstance(e, ActivationEncoding):
        return e.value
    names = {m.name: m.value for m in ActivationEncoding}
    if e in names:
        return names[e]
    if e in names.values():
        return e
    raise ValueError(f"exp encoding {e!r} is not allowed; allowed: {', '.join(names)}")


register_schema("exp", "onnx_fidelity_schema", OnnxFidelityExp)


def _largest_difference(r, unit: str) -> str:
    """A row's largest output difference: in output LSBs, or in value where an output is float
    (no LSB: ``max_diff_lsb`` NaN)."""
    if pd.isna(r.max_diff_lsb):
        return f"a float output: max |difference| {r.max_abs_diff:.3g}"
    return f"max {r.max_diff_lsb:.3g} {unit}"


def _findings(main: pd.DataFrame, others: pd.DataFrame, islands: pd.DataFrame, exp) -> list[str]:
    out = []
    for r in main.itertuples():
        line = (
            f"{r.model} ({r.items} {r.data} items, {exp.encoding.name} activations): "
            f"{r.outputs_differing} of {r.outputs_compared} output values differ between "
            f"onnxruntime and quantlab fixed mode ({_largest_difference(r, 'output LSB')})"
        )
        if r.first_diverging_op:
            line += (
                f"; the first op whose output differs is {r.first_diverging_op} "
                f"({r.first_diverging_type}, onnxruntime kernel {r.first_diverging_kernel}, "
                f"op {r.first_diverging_order + 1} in execution order)"
            )
            line += (
                "."
                if r.probe_kernels_match
                else ", in the export that exposes every op's "
                "output, where onnxruntime ran other computing kernels than in this one "
                "(probe_kernels_match False): the per-op rows need not show this export's ops."
            )
        else:
            line += "; no intermediate op output differs."
        out.append(line)
    for r in others.itertuples():
        out.append(
            f"With {r.encoding} activations, {r.model}: {r.outputs_differing} of "
            f"{r.outputs_compared} output values differ ({_largest_difference(r, 'LSB')}); "
            f"onnxruntime runs {r.float_conv} Conv and {r.float_add} Add nodes in float32."
        )
    fl = islands[islands.computes_float]
    for model, part in fl.groupby("model", sort=False):
        fams = [
            f"{r.op_type} ({r.ort_kernel}: {r.ops_differing} of {r.ops} ops, "
            f"{r.differing_elements:,} of {r.elements:,} values differ)"
            for r in part.itertuples()
        ]
        out.append(
            f"{model}: onnxruntime computes in float32 between Dequantize and Quantize "
            f"({exp.encoding.name}): " + "; ".join(fams) + " (a count includes differences "
            "inherited from earlier ops)."
        )
    return out


def _host_profile_finding(platform: str) -> list[str]:
    """A sentence when ``platform`` is an onnxruntime profile other than the one that gives
    this machine's onnxruntime bits (``export.ort_host.onnxruntime_profile``), else none."""
    from quantlab.export.ort_host import EXACT_PROFILE, SATURATING_PROFILE, onnxruntime_profile

    host = onnxruntime_profile()
    if platform not in (EXACT_PROFILE, SATURATING_PROFILE) or platform == host:
        return []
    why = (
        "its uint8 x int8 GEMM kernels saturate each pair of products to int16, as on an x86 "
        "CPU without VNNI"
        if host == SATURATING_PROFILE
        else "its uint8 x int8 products sum exactly (VNNI, AMX or Arm), which "
        f"{SATURATING_PROFILE} does not model"
    )
    return [
        f"This machine's onnxruntime is the {host} profile's, not {platform}'s: {why}. "
        f"Differences below can come from that alone; rerun with platform={host}."
    ]


def _measure(sim, batch: tuple, ctx: RunContext, name: str, enc: ActivationEncoding):
    """``analysis.onnx_fidelity.measure`` with the profile's QLinear zero point set to the one
    the export holds int8 activations with (the profile's add arithmetic depends on it)."""
    from quantlab.analysis.onnx_fidelity import measure

    profile = sim.platform
    sim.platform = replace(profile, qlinear_zero_point=enc.int8_zero_point)
    try:
        stem = re.sub(r"[^\w.-]+", "_", name)  # custom:pkg.mod:fn -> custom_pkg.mod_fn
        return measure(sim, batch, ctx.output_dir, f"{stem}_{enc.value}", enc)
    finally:
        sim.platform = profile


@experiment(OnnxFidelityExp, "onnx_fidelity", takes_model=True)
def onnx_fidelity(exp: OnnxFidelityExp, ctx: RunContext) -> ExperimentResult:
    from tqdm import tqdm

    from quantlab.analysis.onnx_fidelity import float_islands
    from quantlab.simulate import Simulator
    from quantlab.workload import batches_per_run, listed_or_chosen, merge_items

    rows, other_rows, per_ops, islands = [], [], [], []
    workloads = listed_or_chosen(ctx, exp.models)
    total = 1 if ctx.model_chosen else len(exp.models)
    for name, bundle, data in tqdm(
        workloads, desc="onnx fidelity", total=total, disable=not ctx.progress
    ):
        sim = Simulator(bundle.module, ctx.platform)
        sim.calibrate(data.calib, ctx.progress)
        n = batches_per_run(bundle, data, exp.max_eval_items)
        batch = merge_items(data.eval, n, pad_token_rows=True)
        items = int(batch[0].shape[0])
        base = {"model": name, "data": data.name, "items": items}
        fid = _measure(sim, batch, ctx, name, exp.encoding)
        rows.append({**base, **fid.summary})
        per_ops.append(fid.per_op.assign(model=name))
        islands.append(float_islands(fid.per_op).assign(model=name))
        for enc in exp.other_encodings:
            o = _measure(sim, batch, ctx, name, enc)
            other_rows.append(
                {
                    **base,
                    "encoding": enc.name,
                    **o.summary,
                    "float_conv": o.kernels.get("Conv", 0),
                    "float_add": o.kernels.get("Add", 0),
                }
            )
    main = pd.DataFrame(rows)
    others = pd.DataFrame(other_rows)
    per_op = pd.concat(per_ops, ignore_index=True)
    isl = pd.concat(islands, ignore_index=True)
    isl = isl[["model", *[c for c in isl.columns if c != "model"]]]
    along = per_op[per_op.elements > 0].copy()  # every compared op of every model
    along["differing_pct"] = 100.0 * along.differing_share
    plots = []
    if len(along):
        plots = [
            Plot(
                name="differing_along_depth",
                x="order",
                y="differing_pct",
                hue="model",
                table="divergence_along_depth",
                facet="model",
                xlabel="op in execution order (index)",
                ylabel="output values differing from quantlab (%)",
                title="onnxruntime vs quantlab fixed mode, op by op",
            ),
            Plot(
                name="max_lsb_along_depth",
                x="order",
                y="max_diff_lsb",
                hue="model",
                table="divergence_along_depth",
                facet="model",
                xlabel="op in execution order (index)",
                ylabel="max |difference| (output LSB)",
                title="largest per-op difference in output LSBs",
            ),
        ]
    first_rows = per_op[per_op.differing > 0].groupby("model", sort=False).head(5)
    return ExperimentResult(
        table=main,
        title=f"ONNX QDQ fidelity: onnxruntime vs quantlab fixed mode ({ctx.platform.name})",
        findings=[*_host_profile_finding(ctx.platform.name), *_findings(main, others, isl, exp)],
        tables={
            "other_encodings": others,
            "float_islands": isl,
            "first_differing_ops": first_rows[
                [
                    "model",
                    "order",
                    "name",
                    "op_type",
                    "ort_kernel",
                    "differing",
                    "elements",
                    "max_diff_lsb",
                ]
            ],
            "divergence_along_depth": along[
                ["model", "order", "name", "op_type", "ort_kernel", "differing_pct", "max_diff_lsb"]
            ],
            "per_op": per_op,
        },
        plots=plots,
        notes=[
            "Each model is calibrated on its data's calibration items; the first "
            f"{exp.max_eval_items} evaluation items run as one batch (token inputs padded with "
            "[PAD] = 0 and a 0 mask to the longest).",
            "onnxruntime: CPU, default graph optimizations, one thread, "
            "session.intra_op.allow_spinning = 0; kernels read from the optimized graph it saves.",
            "UNSIGNED_OFFSET writes int8 activations as uint8 code + 128 with zero point 128 (the "
            "same values); SIGNED writes int8 codes with zero point 0.",
            "Per-op rows compare the integer codes of every quantized op output (float outputs: "
            "values) from a second export that exposes them as graph outputs; "
            "probe_kernels_match says whether that export ran the same computing kernels.",
            "computes_float: onnxruntime evaluates the op in float32 between Dequantize and "
            "Quantize (not an integer kernel, not a pure data movement).",
            "The exported .onnx files stay in the run folder.",
        ],
    )
