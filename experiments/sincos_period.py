"""What a sin/cos input wider than one period costs, and what the two fixes recover.

QAT evaluates sin/cos through a LUT over the whole input range; the exporter reduces inputs wider
than 2pi to one period (t = x/2pi, floor, frac, x' = 2pi frac, each step re-quantized,
j6-numerics s.5); the alternative fix wraps the angle to [-pi, pi) in float, upstream of
quantization. Op level: input ranges of 1..1024 periods, int8/int16, three LUT strategies, the
three treatments, with the error split into (a) the table's own error and (b) the input error.
Workloads: DETR sine embedding of 1920x1080 pixel coordinates, rotary embedding of 4096
positions, NeRF frequency encoding. Model level: the PosEnc toy model, its output SQNR and where
sin/cos rank in the sensitivity table, per treatment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm import tqdm

from quantlab.analysis.confidence import Estimate
from quantlab.analysis.sincos import (
    Treatment,
    detr_angles,
    error_sources,
    nerf_angles,
    posenc_outputs,
    posenc_study,
    rotary_angles,
)
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import LutFormat, Strategy
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.report import Plot, PlotKind

SOURCES = {"a_max": "(a) table", "b_max": "(b) input", "total_max": "total"}


@dataclass
class SincosPeriodExp:
    """Schema of ``+exp=sincos_period``."""

    periods: list[float] = field(default_factory=lambda: [1, 2, 4, 16, 64, 256, 1024])
    report_periods: list[float] = field(default_factory=lambda: [1, 16, 256])
    in_dtypes: list[DType] = field(default_factory=lambda: [DType.INT8, DType.INT16])
    strategies: list[Strategy] = field(
        default_factory=lambda: [
            Strategy.CURVATURE,
            Strategy.EVENLY,
            Strategy.MINIMAX,
            Strategy.OPTIMAL,
            Strategy.DATA,
        ]
    )
    treatments: list[Treatment] = field(default_factory=lambda: list(Treatment))
    funcs: list[str] = field(default_factory=lambda: ["sin", "cos"])
    samples: int = 65536  # uniform float inputs on [-P 2pi, P 2pi] per case
    main_strategy: Strategy = Strategy.CURVATURE  # vendor default for sin/cos (s.5), if run
    workloads: bool = True
    image_width: int = 1920  # DETR sine embedding / NeRF coordinates of a W x H image
    image_height: int = 1080
    rotary_positions: int = 4096
    rotary_dim: int = 64
    nerf_freqs: int = 10
    model: bool = True  # the PosEnc toy model (quantlab.models "posenc")
    model_dtype: DType = DType.INT16  # angle producers (mul) and sin/cos in this dtype
    model_batch: int = 4
    model_calib_batches: int = 4
    model_eval_batches: int = 2
    top_ops: int = 8  # sensitivity rows shown per treatment
    model_strategies: bool = True  # the PosEnc once per (treatment, strategy): output SQNR + CI
    strategy_eval_batches: int = 8  # evaluation batches of those runs (items: x model_batch)
    resamples: int = 1000  # bootstrap resamples of the evaluation items

    def __post_init__(self) -> None:
        for name in ("periods", "in_dtypes", "strategies", "treatments", "funcs"):
            if not list(getattr(self, name)):
                raise ValueError(f"exp.{name} must not be empty")
        for p in list(self.periods) + list(self.report_periods):
            if not p > 0:
                raise ValueError(f"exp.periods and exp.report_periods must be > 0, got {p}")
        for f in self.funcs:
            if f not in ("sin", "cos"):
                raise ValueError(f"exp.funcs entries must be sin or cos, got {f!r}")
        for dt in list(self.in_dtypes) + [self.model_dtype]:
            if dt not in (DType.INT8, DType.INT16):
                raise ValueError(f"exp dtypes must be INT8 or INT16, got {dt.name}")
        for name in ("strategy_eval_batches", "resamples", "model_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"exp.{name} must be >= 1, got {getattr(self, name)}")
        if self.samples < 16:
            raise ValueError(f"exp.samples must be >= 16, got {self.samples}")


register_schema("exp", "sincos_period_schema", SincosPeriodExp)


def _main(exp: SincosPeriodExp) -> Strategy:
    """The strategy of findings, workloads and the error-source plot: ``main_strategy`` if it
    is run, else the first strategy run."""
    return exp.main_strategy if exp.main_strategy in exp.strategies else exp.strategies[0]


def _op_rows(
    exp: SincosPeriodExp, fmt: LutFormat, rounding, gen: torch.Generator, progress: bool
) -> list[dict]:
    jobs = [
        (f, p, dt, st, tr)
        for f in exp.funcs
        for p in exp.periods
        for dt in exp.in_dtypes
        for st in exp.strategies
        for tr in exp.treatments
    ]
    xs: dict = {}
    rows = []
    for f, p, dt, st, tr in tqdm(jobs, desc="sincos_period op level", disable=not progress):
        if p not in xs:
            u = torch.rand(exp.samples, generator=gen, dtype=torch.float64) * 2 - 1
            xs[p] = u * p * 2 * math.pi
        r = error_sources(f, xs[p], tr, dt, dt, st, fmt, rounding)
        rows.append(
            {
                "func": f,
                "periods": p,
                "in_dtype": dt.name,
                "strategy": st.name,
                "treatment": tr.name,
                **r,
            }
        )
    return rows


def _workload_rows(exp: SincosPeriodExp, fmt: LutFormat, rounding, progress: bool) -> list[dict]:
    w, h = exp.image_width, exp.image_height
    norm = torch.cat([torch.arange(w) / w, torch.arange(h) / h]) * 2 - 1
    loads = {
        f"DETR sine {w}x{h}": detr_angles(w, h),
        f"rotary {exp.rotary_positions} positions": rotary_angles(
            exp.rotary_positions, exp.rotary_dim
        ),
        f"NeRF {exp.nerf_freqs} freqs": nerf_angles(norm, exp.nerf_freqs),
    }
    jobs = [
        (n, f, dt, tr)
        for n in loads
        for f in exp.funcs
        for dt in exp.in_dtypes
        for tr in exp.treatments
    ]
    rows = []
    for name, f, dt, tr in tqdm(jobs, desc="sincos_period workloads", disable=not progress):
        x = loads[name]
        r = error_sources(f, x, tr, dt, dt, _main(exp), fmt, rounding)
        periods = float(x.abs().max()) / (2 * math.pi)
        rows.append(
            {
                "workload": name,
                "periods": periods,
                "func": f,
                "in_dtype": dt.name,
                "treatment": tr.name,
                **r,
            }
        )
    return rows


def _model_rows(exp: SincosPeriodExp, platform, progress: bool) -> tuple[list[dict], pd.DataFrame]:
    from quantlab.models import build_model

    bundle = build_model("posenc")
    calib = [bundle.example_inputs(exp.model_batch, 1 + i) for i in range(exp.model_calib_batches)]
    evals = [bundle.example_inputs(exp.model_batch, 100 + i) for i in range(exp.model_eval_batches)]
    q = OpQConfig(input_dtype=exp.model_dtype, output_dtype=exp.model_dtype)
    spec = QConfigSpec(by_type={"mul": OpQConfig(output_dtype=exp.model_dtype), "sin": q, "cos": q})
    rows, sens = [], []
    for tr in tqdm(list(exp.treatments), desc="sincos_period toy model", disable=not progress):
        m, table = posenc_study(bundle.module, platform, tr, calib, evals, spec, progress)
        table = table.assign(treatment=tr.name)
        sens.append(table)
        for kind, g in table.groupby("sensitive_type", sort=False):
            trig = g[g.op_type.isin(["sin", "cos"])]
            m[f"{kind}_sincos_best_rank"] = int(trig["rank"].min()) if len(trig) else 0
            m[f"{kind}_ops"] = len(g)
            top = g.sort_values("rank").iloc[0]
            m[f"{kind}_top_op"] = top.op_name
            m[f"{kind}_top_sqnr_db"] = float(top.value)
        rows.append({"treatment": tr.name, "model_dtype": exp.model_dtype.name, **m})
    return rows, pd.concat(sens, ignore_index=True)


def _strategy_jobs(exp: SincosPeriodExp) -> list[tuple[Treatment, Strategy]]:
    """(treatment, strategy) pairs of the per-strategy model runs: every pair but DATA under the
    exporter's reduction (its calibrated histogram is of the unreduced input: refused)."""
    return [
        (tr, st)
        for tr in exp.treatments
        for st in exp.strategies
        if not (tr is Treatment.EXPORTER and st is Strategy.DATA)
    ]


def _model_strategy_rows(exp: SincosPeriodExp, platform, progress: bool) -> pd.DataFrame:
    """The PosEnc per (treatment, strategy of every sin/cos table): fake and fixed output SQNR
    vs float with its 95% bootstrap interval over the evaluation items."""
    from quantlab.analysis.confidence import bootstrap
    from quantlab.models import build_model
    from quantlab.models.tasks import OutputSQNR

    bundle = build_model("posenc")
    calib = [bundle.example_inputs(exp.model_batch, 1 + i) for i in range(exp.model_calib_batches)]
    evals = [
        bundle.example_inputs(exp.model_batch, 100 + i) for i in range(exp.strategy_eval_batches)
    ]
    dt = exp.model_dtype
    rows = []
    jobs = _strategy_jobs(exp)
    for tr, st in tqdm(jobs, desc="sincos_period toy model per strategy", disable=not progress):
        q = OpQConfig(input_dtype=dt, output_dtype=dt, lut_strategy=st)
        spec = QConfigSpec(by_type={"mul": OpQConfig(output_dtype=dt), "sin": q, "cos": q})
        ref, fake, fixed = posenc_outputs(bundle.module, platform, tr, calib, evals, spec, False)
        for mode, out in (("fake", fake), ("fixed", fixed)):
            est = bootstrap(OutputSQNR(), ref, out, resamples=exp.resamples)
            rows.append(
                {
                    "treatment": tr.name,
                    "strategy": st.name,
                    "mode": mode,
                    **est.as_columns("output_sqnr_db"),
                }
            )
    return pd.DataFrame(rows)


def _strategy_findings(ms: pd.DataFrame, exp: SincosPeriodExp) -> list[str]:
    """Per treatment: fixed-mode output SQNR of every strategy with its interval, and whether
    the best one's interval separates from the vendor default's."""
    out = []
    fx = ms[ms["mode"] == "fixed"]
    for tr, g in fx.groupby("treatment", sort=False):
        est = {
            r.strategy: Estimate(
                r.output_sqnr_db,
                r.output_sqnr_db_ci_low,
                r.output_sqnr_db_ci_high,
                r.output_sqnr_db_n,
            )
            for r in g.itertuples()
        }
        best = max(est, key=lambda k: est[k].value)
        cells = ", ".join(
            f"{k} {e.value:.2f} ({e.low:.2f} to {e.high:.2f})" for k, e in est.items()
        )
        n = next(iter(est.values())).n
        text = (
            f"PosEnc per strategy of its sin/cos tables, {tr}, fixed-mode output SQNR vs float "
            f"(dB, 95% CI over n={n} items): {cells}; best {best}"
        )
        base = exp.main_strategy.name
        if base in est and best != base:
            rel = est[best].relation(est[base])
            if rel in ("separate", "overlap"):
                word = "separated from" if rel == "separate" else "overlapping"
                text += f" ({word} {base}'s interval)"
            else:
                text += f" (its interval and {base}'s {rel})"
        out.append(text + ".")
    return out


def _fmt(v: float) -> str:
    return f"{v:.2g}" if v < 0.01 else f"{v:.3f}"


def _span(v: pd.Series) -> str:
    lo, hi = _fmt(float(v.min())), _fmt(float(v.max()))
    return lo if lo == hi else f"{lo}-{hi}"


def _findings(df: pd.DataFrame, exp: SincosPeriodExp, fmt_direct: bool) -> list[str]:
    out = []
    main = df[(df.func == exp.funcs[0]) & (df.strategy == _main(exp).name)]
    f0 = exp.funcs[0]
    if Treatment.EXPORTER.name in set(main.treatment):
        for dt in exp.in_dtypes:
            ex = main[(main.treatment == Treatment.EXPORTER.name) & (main.in_dtype == dt.name)]
            no = main[(main.treatment == Treatment.NONE.name) & (main.in_dtype == dt.name)]
            red = ex[ex.reduced]
            if len(red) and len(no):
                out.append(
                    f"{dt.name} {f0}, {_main(exp).name}: with the exporter's reduction the "
                    f"table's own error (a) stays at {_span(red.a_max)} for "
                    f"{red.periods.min():g}-{red.periods.max():g} "
                    f"periods; without it (a) is {_fmt(no.a_max.iloc[0])} at "
                    f"{no.periods.iloc[0]:g} period(s) and {_fmt(no.a_max.iloc[-1])} at "
                    f"{no.periods.iloc[-1]:g}"
                    + (
                        " (int8 in and out: one direct table, output rounding only)."
                        if dt is DType.INT8 and fmt_direct
                        else "."
                    )
                )
    for dt in exp.in_dtypes:
        sel = main[(main.in_dtype == dt.name) & main.periods.isin(exp.report_periods)]
        parts = []
        for tr in exp.treatments:
            cells = [
                f"P={r.periods:g}: {_fmt(r.a_max)}/{_fmt(r.b_max)}/{_fmt(r.total_max)}"
                for r in sel[sel.treatment == tr.name].itertuples()
            ]
            if cells:
                parts.append(f"{tr.name} " + ", ".join(cells))
        if parts:
            out.append(
                f"{dt.name} {f0}, max |error| (a) table / (b) input / total vs float: "
                + "; ".join(parts)
                + "."
            )
    i16 = main[main.in_dtype == DType.INT16.name]
    big = max(exp.periods)
    cells = {tr: i16[(i16.treatment == tr) & (i16.periods == big)] for tr in set(i16.treatment)}
    if all(t.name in cells and len(cells[t.name]) for t in Treatment):
        n, e, w = (cells[t.name].iloc[0] for t in Treatment)
        out.append(
            f"At {big:g} periods (int16) the exporter fixes (a) ({_fmt(n.a_max)} -> "
            f"{_fmt(e.a_max)}) but not (b) ({_fmt(n.b_max)} -> {_fmt(e.b_max)}: its floor step, "
            f"re-quantized with scale ceil(T)/qmax, adds up to half a period-step of its own); "
            f"the float wrap fixes both (a {_fmt(w.a_max)}, b {_fmt(w.b_max)}, total "
            f"{_fmt(w.total_max)}). QAT-to-deployed gap: none {_fmt(n.qat_gap_max)}, exporter "
            f"{_fmt(e.qat_gap_max)}, wrap {_fmt(w.qat_gap_max)}."
        )
    one = df[(df.periods == min(exp.periods)) & (df.treatment == exp.treatments[0].name)]
    one = one[(one.func == f0) & (one.in_dtype == exp.in_dtypes[-1].name)]
    if one.strategy.nunique() > 1:
        out.append(
            f"Strategies at {min(exp.periods):g} period(s), {exp.in_dtypes[-1].name} {f0}, "
            "table error (a): "
            + ", ".join(f"{r.strategy} {_fmt(r.a_max)}" for r in one.itertuples())
            + "."
        )
    return out


@experiment(SincosPeriodExp, "sincos_period")
def sincos_period(exp: SincosPeriodExp, ctx: RunContext) -> ExperimentResult:
    platform = ctx.platform
    fmt = platform.lut_format()
    rnd = platform.fake_round
    gen = torch.Generator().manual_seed(0 if ctx.seed is None else ctx.seed)
    tables: dict[str, pd.DataFrame] = {}
    df = pd.DataFrame(_op_rows(exp, fmt, rnd, gen, ctx.progress))
    wl = pd.DataFrame(_workload_rows(exp, fmt, rnd, ctx.progress)) if exp.workloads else None
    model = _model_rows(exp, platform, ctx.progress) if exp.model else None
    by_strategy = (
        _model_strategy_rows(exp, platform, ctx.progress)
        if exp.model and exp.model_strategies
        else None
    )
    findings = _findings(df, exp, fmt.direct_int8)
    f0 = exp.funcs[0]
    src = df[(df.func == f0) & (df.strategy == _main(exp).name)]
    long = src.melt(
        id_vars=["periods", "in_dtype", "treatment"],
        value_vars=list(SOURCES),
        var_name="source",
        value_name="max_abs_error",
    )
    long["source"] = long.source.map(SOURCES)
    long["case"] = long.in_dtype + " " + long.treatment
    tables["error_sources"] = long
    tables["report_periods"] = src[src.periods.isin(exp.report_periods)][
        [
            "periods",
            "in_dtype",
            "treatment",
            "a_max",
            "b_max",
            "total_max",
            "qat_gap_max",
            "input_step",
            "reduced",
        ]
    ]
    plots = [
        Plot(
            "error_sources",
            "periods",
            "max_abs_error",
            "input range (periods of 2pi)",
            "max |error| (sin units)",
            f"{f0}, {_main(exp).name}: (a) table, (b) input, total",
            hue="source",
            facet="case",
            logx=True,
            logy=True,
            table="error_sources",
        ),
        Plot(
            "table_error_by_strategy",
            "periods",
            "a_max",
            "input range (periods of 2pi)",
            "max table error (a) (sin units)",
            f"{f0}: table error per strategy",
            hue="strategy",
            facet="case",
            logx=True,
            logy=True,
            table="strategies",
        ),
    ]
    st = df[df.func == f0].assign(case=lambda d: d.in_dtype + " " + d.treatment)
    tables["strategies"] = st[["periods", "case", "strategy", "a_max", "total_max"]]
    if wl is not None:
        tables["workloads"] = wl
        w16 = wl[(wl.func == f0) & (wl.in_dtype == exp.in_dtypes[-1].name)]
        for name, g in w16.groupby("workload", sort=False):
            findings.append(
                f"{name} ({g.periods.iloc[0]:.0f} periods, {exp.in_dtypes[-1].name} {f0}), total "
                "max |error| vs float: "
                + ", ".join(f"{r.treatment} {_fmt(r.total_max)}" for r in g.itertuples())
                + "."
            )
    if model is not None:
        rows, sens = model
        mt = pd.DataFrame(rows)
        tables["toy_model"] = mt
        top = sens[sens["rank"] <= exp.top_ops].copy()
        tables["sensitivity_top"] = top[
            ["treatment", "sensitive_type", "rank", "op_name", "op_type", "value"]
        ]
        fixed_top = top[top.sensitive_type == "fixed"]
        plots.append(
            Plot(
                "sensitivity_fixed",
                "op_name",
                "value",
                "op (one at a time FIXED)",
                "output SQNR vs all-fake (dB; lower = more sensitive)",
                "PosEnc: ops ranked by what export costs them",
                facet="treatment",
                kind=PlotKind.BAR,
                table="sensitivity_fixed_top",
            )
        )
        tables["sensitivity_fixed_top"] = fixed_top[["treatment", "op_name", "value"]]
        findings.append(
            f"PosEnc toy model ({exp.model_dtype.name} angles and sin/cos), output SQNR vs float "
            "(fake / fixed / fixed-vs-fake gap, 95% CIs over "
            f"n={int(mt.fake_sqnr_db_n.iloc[0])} items): "
            + "; ".join(
                f"{r.treatment} "
                + " / ".join(
                    Estimate.from_columns(r, f"{k}_sqnr_db").format_db(1, count=False)
                    for k in ("fake", "fixed", "gap")
                )
                for r in mt.itertuples()
            )
            + "."
        )
        if "fixed_sincos_best_rank" in mt:
            findings.append(
                "Sensitivity (one op FIXED at a time, SQNR): best sin/cos rank "
                + "; ".join(
                    f"{r.treatment} {r.fixed_sincos_best_rank} of {r.fixed_ops} "
                    f"(top op {r.fixed_top_op})"
                    for r in mt.itertuples()
                )
                + "."
            )
        if "activation_top_op" in mt:
            findings.append(
                "Sensitivity (one op's output fake-quantized at a time, SQNR): top op "
                + "; ".join(
                    f"{r.treatment} {r.activation_top_op} {r.activation_top_sqnr_db:.1f} dB "
                    f"(best sin/cos rank {r.activation_sincos_best_rank})"
                    for r in mt.itertuples()
                )
                + ": the input error (b) is charged to the ops that produce the angles."
            )
    if by_strategy is not None and len(by_strategy):
        tables["model_strategies"] = by_strategy
        tables["model_strategies_fixed"] = by_strategy[by_strategy["mode"] == "fixed"]
        findings += _strategy_findings(by_strategy, exp)
        plots.append(
            Plot(
                "model_sqnr_by_strategy",
                "strategy",
                "output_sqnr_db",
                "strategy of every sin/cos table",
                "fixed-mode output SQNR vs float (dB; bars: 95% bootstrap interval)",
                "PosEnc: fixed-mode output SQNR per LUT strategy",
                facet="treatment",
                kind=PlotKind.BAR,
                ci_low="output_sqnr_db_ci_low",
                ci_high="output_sqnr_db_ci_high",
                table="model_strategies_fixed",
            )
        )
    notes = [
        "Treatments: NONE quantizes the input over its whole range (scale max|x|/(qmax+0.5)) "
        "and builds the LUT on that range; EXPORTER quantizes the same way, then applies the "
        "exporter's four re-quantized steps when s_in*qmax > 2pi (quantlab.numerics.periodic) "
        "and looks up a LUT built on [0, 2pi] at scale 2pi/qmax; WRAP wraps x to [-pi, pi) "
        "in float first and quantizes with range pi.",
        "Errors in sin/cos units: (a) = LUT output - f(dequantized codes fed to the table); "
        "(b) = f(those codes) - f(x); total = LUT output - f(x); QAT gap = LUT output - "
        "fake-quantized f of the QAT input (full range for NONE/EXPORTER, wrapped for WRAP). "
        f"{exp.samples} uniform samples per range; output int8/int16 over [-1, 1].",
        f"LUT: quantlab.numerics.lut.build_lut on the platform's format ({fmt.tables} tables of "
        f"{fmt.entries} entries, {fmt.index_frac_bits}-bit interpolation; int8->int8 is the "
        "direct 256-entry table), default sin/cos spec with the strategy swapped; MINIMAX, "
        "OPTIMAL (the least max error over every input code) and DATA are quantlab's own. "
        "DATA's input distribution here (standalone tables, nothing calibrated): the histogram "
        "of the table's own inputs, i.e. the uniform samples on their codes after the "
        "treatment (reduced to [0, 2pi] where the exporter reduces), in 512 equal bins; in a "
        "model, a period-reduced sin/cos refuses DATA (its calibrated histogram is of the "
        "unreduced input).",
        "Toy model: quantlab.models 'posenc' (DETR sine of pixel coordinates, NeRF, rotary; "
        f"seeded 1920x1080 coordinates, batch {exp.model_batch}), calibrated on "
        f"{exp.model_calib_batches} batches, evaluated on {exp.model_eval_batches}; angle "
        f"producers (mul) and sin/cos at {exp.model_dtype.name}, the rest by the platform "
        "template. WRAP runs the same layers on angles wrapped in float outside the model. "
        "Sensitivity: quantlab.analysis.sensitivity, ACTIVATION and FIXED passes, SQNR.",
        "Toy model per strategy: every sin/cos op of the PosEnc built with one strategy "
        f"(lut_strategy in the qconfig; DATA under its calibrated input histogram), calibrated "
        f"as above and evaluated on {exp.strategy_eval_batches} batches of {exp.model_batch} "
        "items (coordinate sets); output_sqnr_db = 10 log10(sum ref^2 / sum (ref - test)^2) "
        "over the items (quantlab.models.tasks.OutputSQNR), _ci_low/_ci_high its 95% "
        f"percentile-bootstrap interval over the items ({exp.resamples} resamples), _n the "
        "item count. DATA is not run under EXPORTER: the Simulator refuses it for a "
        "period-reduced input (the calibrated histogram is of the unreduced input).",
    ]
    return ExperimentResult(
        table=df,
        title="sin/cos beyond one period: table error, input error and the two fixes",
        findings=findings,
        tables=tables,
        plots=plots,
        notes=notes,
    )
