"""Segment-LUT error: every function x dividing strategy x dtype pair, on every input code.

For each function of the LUT registry (with its vendor-default settings: symmetric mode, range
rules, clamps) and each strategy, the integer table is built and evaluated on all input codes
(65536 for int16, 256 for int8). Errors are measured against the exact function saturated to the
output range, in output LSBs and in float, split by region (tails, tables); the fake counterpart
(what QAT computes) and the analytic bound h^2/8 max|f''| per table are reported next to them
(quantlab.numerics.lut.analysis). Every strategy is also scored by its mean error under a stated
input distribution per function (a Gaussian over the function's sample range, see
``LutErrorExp.data_sigma_fraction``), the distribution the DATA strategy is given as its
histogram, and by its build time (from an empty table cache). Sweep one strategy per job with
``python -m quantlab -m +exp=lut_error exp.strategy=EVENLY,CURVATURE,MINIMAX,OPTIMAL``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from tqdm import tqdm

from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import (
    FUNCTIONS,
    InputHistogram,
    SegmentLut,
    Strategy,
    analyze,
    build_lut,
    default_spec,
    mean_error_lsb,
    profile,
)
from quantlab.numerics.lut.analysis import sample_scales
from quantlab.numerics.lut.table import clear_build_cache
from quantlab.report import Plot, PlotKind

OURS = Strategy.MINIMAX
VENDOR = (Strategy.EVENLY, Strategy.CURVATURE)


@dataclass
class LutErrorExp:
    """Schema of ``+exp=lut_error``."""

    functions: list[str] = field(default_factory=lambda: sorted(FUNCTIONS))
    strategies: list[Strategy] = field(
        default_factory=lambda: [
            Strategy.EVENLY,
            Strategy.CURVATURE,
            Strategy.SQRT_CURVATURE,
            Strategy.MINIMAX,
            Strategy.OPTIMAL,
            Strategy.DATA,
        ]
    )
    strategy: Strategy | None = None  # one strategy only (for sweeps); None: all of ``strategies``
    in_dtypes: list[DType] = field(default_factory=lambda: [DType.INT16, DType.INT8])
    out_dtypes: list[DType] = field(default_factory=lambda: [DType.INT16, DType.INT8])
    include_manual_default: bool = True  # gelu: also its vendor fixed points (MANUAL)
    profile_bins: int = 400  # bins along the input axis in the error plot
    # the stated input distribution per function (DATA's histogram, and every strategy's mean
    # error under data): N(centre, (sigma_fraction x width)^2) of the function's sample range,
    # as ``data_bins`` equal bins over that range
    data_sigma_fraction: float = 0.125
    data_bins: int = 2048

    def __post_init__(self) -> None:
        unknown = [f for f in self.functions if f not in FUNCTIONS]
        if unknown or not self.functions:
            raise ValueError(
                f"exp.functions has unknown or no entries {unknown}; allowed: {sorted(FUNCTIONS)}"
            )
        if Strategy.MANUAL in self.strategies or self.strategy is Strategy.MANUAL:
            raise ValueError(
                "exp.strategies/exp.strategy cannot be MANUAL (no points to give); allowed: "
                + ", ".join(s.name for s in Strategy if s is not Strategy.MANUAL)
            )
        for name in ("in_dtypes", "out_dtypes"):
            bad = [d for d in getattr(self, name) if d not in (DType.INT8, DType.INT16)]
            if bad or not getattr(self, name):
                raise ValueError(f"exp.{name} must list INT8/INT16 only, got {bad}")
        if not 0 < self.data_sigma_fraction <= 10:
            raise ValueError(
                f"exp.data_sigma_fraction must be in (0, 10], got {self.data_sigma_fraction}"
            )
        if self.data_bins < 8:
            raise ValueError(f"exp.data_bins must be >= 8, got {self.data_bins}")
        if self.profile_bins < 8:
            raise ValueError(f"exp.profile_bins must be >= 8, got {self.profile_bins}")

    def run_strategies(self) -> list[Strategy]:
        return [self.strategy] if self.strategy is not None else list(self.strategies)


register_schema("exp", "lut_error_schema", LutErrorExp)


def data_histogram(func: str, sigma_fraction: float, bins: int) -> InputHistogram:
    """The stated input distribution of ``func``: a Gaussian centred on its sample range, with
    standard deviation ``sigma_fraction`` x the range's width, as ``bins`` equal bins over the
    range (bin mass = density at the bin centre)."""
    lo, hi = FUNCTIONS[func].sample_range
    edges = np.linspace(lo, hi, bins + 1)
    mid = 0.5 * (edges[:-1] + edges[1:])
    sigma = sigma_fraction * (hi - lo)
    return InputHistogram(lo, hi, tuple(np.exp(-0.5 * ((mid - 0.5 * (lo + hi)) / sigma) ** 2)))


def _timed_build(func, in_dt, s_in, out_dt, s_out, spec, fmt, hist):
    """Build from an empty table cache: (table, wall seconds, CPU seconds of this process)."""
    clear_build_cache()
    t0, c0 = time.perf_counter(), time.process_time()
    lut = build_lut(func, in_dt, s_in, out_dt, s_out, spec, fmt, histogram=hist)
    return lut, time.perf_counter() - t0, time.process_time() - c0


def _spec_for(func: str, strategy: Strategy):
    base = default_spec(func)
    if strategy is Strategy.MANUAL:
        return base
    return replace(base, strategy=strategy, dividing_points=None)


def _profile_rows(lut: SegmentLut, func: str, label: str, bins: int) -> pd.DataFrame:
    """Max |error| (output LSB) per bin of the input axis, plus the dividing points."""
    p = profile(lut)
    err = np.abs(p.fixed - p.exact)
    bins = min(bins, len(p.x))
    edges = np.linspace(p.x[0], p.x[-1], bins + 1)
    which = np.clip(np.searchsorted(edges, p.x, side="right") - 1, 0, bins - 1)
    peak = np.zeros(bins)
    np.maximum.at(peak, which, err)
    df = pd.DataFrame(
        {
            "function": func,
            "strategy": label,
            "x": 0.5 * (edges[:-1] + edges[1:]),
            "max_err_lsb": np.maximum(peak, 1e-2),  # floor for the log axis
            "dividing_point": np.nan,
        }
    )
    if not lut.direct:
        pts = list(lut.dividing_points_float)
        if lut.symmetric:
            pts = sorted({-q for q in pts} | set(pts))
        df.loc[: len(pts) - 1, "dividing_point"] = pts[: len(df)]
    return df


def _comparison(df: pd.DataFrame, in_dt: str, out_dt: str) -> pd.DataFrame:
    """Side by side per function: max error (output LSB) of every strategy."""
    sub = df[(df.region == "all") & (df.in_dtype == in_dt) & (df.out_dtype == out_dt)]
    wide = sub.pivot_table(index="function", columns="strategy", values="max_err_lsb")
    wide.columns = [f"{c.lower()}_lsb" for c in wide.columns]
    wide = wide.reset_index()
    defaults = {f: default_spec(f).strategy.name for f in wide.function}
    wide.insert(1, "vendor_default", wide.function.map(defaults))
    if {"evenly_lsb", "curvature_lsb"} <= set(wide.columns):
        wide["best_vendor_lsb"] = wide[["evenly_lsb", "curvature_lsb"]].min(axis=1)
        if "minimax_lsb" in wide.columns:
            wide["gain_vs_best_vendor"] = wide.best_vendor_lsb / wide.minimax_lsb
            chosen = sub[sub.strategy == OURS.name].set_index("function").chosen
            wide["minimax_start"] = wide.function.map(chosen)
    if {"optimal_lsb", "minimax_lsb"} <= set(wide.columns):
        wide["optimal_gain_vs_minimax"] = wide.minimax_lsb / wide.optimal_lsb
    if {"optimal_lsb", "best_vendor_lsb"} <= set(wide.columns):
        wide["optimal_gain_vs_best_vendor"] = wide.best_vendor_lsb / wide.optimal_lsb
    return wide


def _data_comparison(df: pd.DataFrame, in_dt: str, out_dt: str) -> pd.DataFrame:
    """Per function: mean error under the stated data distribution (output LSB) of every
    strategy, and DATA's max error over OPTIMAL's."""
    sub = df[(df.region == "all") & (df.in_dtype == in_dt) & (df.out_dtype == out_dt)]
    wide = sub.pivot_table(index="function", columns="strategy", values="data_mean_err_lsb")
    wide.columns = [f"{c.lower()}_data_lsb" for c in wide.columns]
    wide = wide.reset_index()
    if {"OPTIMAL", "DATA"} <= set(sub.strategy):
        mx = sub.pivot_table(index="function", columns="strategy", values="max_err_lsb")
        ratio = (mx.DATA / mx.OPTIMAL).rename("data_max_over_optimal_max")
        wide = wide.merge(ratio.reset_index(), on="function")
    return wide


def _optimal_findings(cmp: pd.DataFrame, dcmp: pd.DataFrame, pair: str) -> list[str]:
    """OPTIMAL against every other strategy, and DATA against OPTIMAL, for one dtype pair."""
    out = []
    if "optimal_lsb" in cmp.columns:
        others = [c for c in cmp.columns if c.endswith("_lsb") and c.split("_")[0] not in (
            "optimal", "data", "best")]  # fmt: skip
        ok = cmp.optimal_lsb <= cmp[others].min(axis=1)  # (NaN: a strategy an op lacks)
        line = (
            f"{pair}: OPTIMAL's max error is <= every other strategy's "
            f"({', '.join(o[:-4].upper() for o in others)}) on {int(ok.sum())} of {len(cmp)} ops"
        )
        for col, name in (("optimal_gain_vs_minimax", "MINIMAX"),
                          ("optimal_gain_vs_best_vendor", "the better vendor rule")):  # fmt: skip
            if col in cmp.columns:
                g = cmp[col]
                hi = cmp.loc[g.idxmax()]
                line += (
                    f"; lower than {name} by {g.median():.3g}x (median, up to {g.max():.3g}x on "
                    f"{hi.function})"
                )
        out.append(line + ".")
    if {"optimal_data_lsb", "data_data_lsb"} <= set(dcmp.columns):
        gain = 1 - dcmp.data_data_lsb / dcmp.optimal_data_lsb
        best = dcmp.loc[gain.idxmax()]
        out.append(
            f"{pair}: under the stated data distribution DATA's mean error is "
            f"{100 * gain.median():.1f}% below OPTIMAL's (median; up to {100 * gain.max():.1f}% "
            f"on {best.function}: {best.optimal_data_lsb:.3g} -> {best.data_data_lsb:.3g} LSB), "
            f"never above it on {int((gain >= -1e-9).sum())} of {len(dcmp)} ops; its max error "
            f"is at most {dcmp.data_max_over_optimal_max.max():.3g}x OPTIMAL's (bound 2x)."
        )
    return out


def _build_times(df: pd.DataFrame) -> pd.DataFrame:
    """Per strategy and dtype pair: median and max build time (wall and CPU seconds)."""
    sub = df[(df.region == "all") & (df.strategy != "DIRECT")]
    sub = sub.assign(pair=sub.in_dtype + " -> " + sub.out_dtype)
    g = sub.groupby(["pair", "strategy"], sort=False)
    out = g.agg(
        median_s=("build_s", "median"),
        max_s=("build_s", "max"),
        median_cpu_s=("build_cpu_s", "median"),
        max_cpu_s=("build_cpu_s", "max"),
        functions=("function", "nunique"),
    )
    return out.reset_index()


def _strategy_findings(cmp: pd.DataFrame, pair: str) -> list[str]:
    """Ours vs the vendor's two rules, and curvature vs evenly, for one dtype pair."""
    out = []
    if "gain_vs_best_vendor" in cmp.columns:
        ok = cmp.minimax_lsb <= cmp.best_vendor_lsb
        g = cmp.gain_vs_best_vendor
        lo, hi = cmp.loc[g.idxmin()], cmp.loc[g.idxmax()]
        out.append(
            f"{pair}: our MINIMAX strategy's max error is no worse than the better of the "
            f"vendor's EVENLY and CURVATURE on {int(ok.sum())} of {len(cmp)} ops; it is lower "
            f"by {g.median():.2f}x (median), from {lo.gain_vs_best_vendor:.2f}x on {lo.function} "
            f"({lo.best_vendor_lsb:.3g} -> {lo.minimax_lsb:.3g} LSB) to "
            f"{hi.gain_vs_best_vendor:.3g}x on {hi.function} ({hi.best_vendor_lsb:.4g} -> "
            f"{hi.minimax_lsb:.3g} LSB)."
        )
    if {"evenly_lsb", "curvature_lsb"} <= set(cmp.columns):
        worse = cmp[cmp.curvature_lsb > cmp.evenly_lsb]
        out.append(
            f"{pair}: the vendor's CURVATURE rule (equal shares of |f''|) is worse than EVENLY "
            f"on {len(worse)} of {len(cmp)} ops ({', '.join(worse.function)}); it over-crowds "
            "the points where |f''| peaks."
        )
    return out


def _global_findings(df: pd.DataFrame) -> list[str]:
    """Vendor defaults, the QAT-to-deployed gap, the direct table and the analytic bound."""
    out = []
    vend = df[(df.region == "all") & df.is_default]
    if len(vend):
        top = vend.sort_values("max_err_lsb", ascending=False).head(3)
        parts = [
            f"{r.function} {r.in_dtype}->{r.out_dtype} {r.max_err_lsb:.4g} LSB "
            f"({r.max_err:.3g} in float, {r.strategy})"
            for r in top.itertuples()
        ]
        out.append("Largest errors with the vendor's default settings: " + "; ".join(parts) + ".")
        fake = vend.fake_max_err_lsb.max()
        gap = vend.sort_values("gap_max_lsb", ascending=False).iloc[0]
        out.append(
            f"QAT-to-deployed gap: the fake counterpart (exact f, then output fake quant) stays "
            f"within {fake:.3g} LSB of f on every op, while the integer tables differ from it by "
            f"up to {gap.gap_max_lsb:.4g} LSB ({gap.function} {gap.in_dtype}->{gap.out_dtype})."
        )
    direct = df[(df.region == "all") & (df.in_dtype == "INT8") & (df.out_dtype == "INT8")]
    if len(direct):
        out.append(
            f"int8 -> int8 uses the direct 256-entry table: max error "
            f"{direct.max_err_lsb.max():.3g} LSB and a zero gap to fake quant "
            f"(max gap {direct.gap_max_lsb.max():.3g} LSB) on all {direct.function.nunique()} ops."
        )
    tabs = df[df.region.str.startswith("table") & np.isfinite(df.bound_lsb)]
    if len(tabs):
        held = (tabs.interp_max_err_lsb <= tabs.bound_lsb + 1.0 + 1e-6).sum()
        out.append(
            f"Analytic bound: on {held} of {len(tabs)} tables the error at the interpolated "
            "position stays within h^2/8 max|f''| + 1 output LSB (table and output rounding)."
        )
    return out


@experiment(LutErrorExp, "lut_error")
def lut_error(exp: LutErrorExp, ctx: RunContext) -> ExperimentResult:
    fmt = ctx.platform.lut_format()
    pairs = [(i, o) for i in exp.in_dtypes for o in exp.out_dtypes]
    jobs = []
    for func in exp.functions:
        strategies = exp.run_strategies()
        if exp.include_manual_default and default_spec(func).strategy is Strategy.MANUAL:
            strategies = strategies + [Strategy.MANUAL]
        for in_dt, out_dt in pairs:
            direct = fmt.direct_int8 and in_dt is DType.INT8 and out_dt is DType.INT8
            for st in [default_spec(func).strategy] if direct else strategies:
                jobs.append((func, st, in_dt, out_dt, direct))
    plot_pair = pairs[0]
    rows, profiles = [], []
    for func, st, in_dt, out_dt, direct in tqdm(jobs, desc="lut_error", disable=not ctx.progress):
        s_in, s_out = sample_scales(func, in_dt, out_dt)
        spec = _spec_for(func, st)
        hist = data_histogram(func, exp.data_sigma_fraction, exp.data_bins)
        lut, wall, cpu = _timed_build(func, in_dt, s_in, out_dt, s_out, spec, fmt, hist)
        label = "DIRECT" if direct else st.name
        reg = analyze(lut)
        reg.insert(0, "function", func)
        reg.insert(1, "strategy", label)
        reg.insert(2, "chosen", lut.chosen_strategy.name if not direct else "DIRECT")
        reg.insert(3, "in_dtype", in_dt.name)
        reg.insert(4, "out_dtype", out_dt.name)
        reg["in_scale"] = s_in
        reg["out_scale"] = s_out
        reg["is_default"] = direct or st is default_spec(func).strategy
        reg["data_mean_err_lsb"] = mean_error_lsb(lut, hist.code_weights(in_dt, s_in))
        reg["build_s"] = wall
        reg["build_cpu_s"] = cpu
        pts = () if lut.direct else lut.dividing_points_float
        reg["dividing_points"] = " ".join(f"{p:.4g}" for p in pts)
        rows.append(reg)
        if (in_dt, out_dt) == plot_pair and not direct:
            profiles.append(_profile_rows(lut, func, label, exp.profile_bins))
    df = pd.concat(rows, ignore_index=True)
    tables: dict[str, pd.DataFrame] = {}
    findings: list[str] = []
    for in_dt, out_dt in pairs:
        if fmt.direct_int8 and in_dt is DType.INT8 and out_dt is DType.INT8:
            continue
        cmp = _comparison(df, in_dt.name, out_dt.name)
        key = f"strategies_{in_dt.name.lower()}_to_{out_dt.name.lower()}"
        tables[key] = cmp
        dcmp = _data_comparison(df, in_dt.name, out_dt.name)
        tables[f"data_{key}"] = dcmp
        findings += _optimal_findings(cmp, dcmp, f"{in_dt.name} -> {out_dt.name}")
        if (in_dt, out_dt) in (plot_pair, (DType.INT8, DType.INT16)):
            findings += _strategy_findings(cmp, f"{in_dt.name} -> {out_dt.name}")
    findings += _global_findings(df)
    times = _build_times(df)
    tables["build_times"] = times
    for st in ("OPTIMAL", "DATA"):
        t = times[times.strategy == st]
        if len(t):
            worst = t.loc[t.max_s.idxmax()]
            findings.append(
                f"Build time of {st} (J6 geometry, from an empty cache, on a shared 2-core "
                f"machine: indicative, benchmarks/bench_lut.py is the reference): at most "
                f"{worst.max_s:.2f} s wall ({t.max_cpu_s.max():.2f} s CPU), on {worst.pair}."
            )
    default_rows = df[df.is_default & (df.region == "all")]
    tables["vendor_defaults"] = default_rows[
        ["function", "strategy", "in_dtype", "out_dtype", "max_err_lsb", "mean_err_lsb", "max_err"]
        + ["fake_max_err_lsb", "gap_max_lsb", "gap_mean_lsb", "dividing_points"]
    ].reset_index(drop=True)
    plots = []
    if profiles:
        prof = pd.concat(profiles, ignore_index=True)
        tables["error_profile"] = prof
        in_dt, out_dt = plot_pair
        plots.append(
            Plot(
                name="error_along_input",
                table="error_profile",
                x="x",
                y="max_err_lsb",
                xlabel="input x (float units)",
                ylabel="max |LUT - f| per bin (output LSB)",
                title=f"LUT error along the input axis, {in_dt.name} -> {out_dt.name} "
                "(dotted: dividing points)",
                hue="strategy",
                facet="function",
                vlines="dividing_point",
                logy=True,
            )
        )
    in_dt, out_dt = plot_pair
    key = f"data_strategies_{in_dt.name.lower()}_to_{out_dt.name.lower()}"
    if key in tables:
        long = df[(df.region == "all") & (df.in_dtype == in_dt.name)]
        long = long[(long.out_dtype == out_dt.name) & (long.strategy != "MANUAL")]
        tables["data_errors"] = long[["function", "strategy", "data_mean_err_lsb"]].reset_index(
            drop=True
        )
        plots.append(
            Plot(
                name="error_under_data",
                table="data_errors",
                x="strategy",
                y="data_mean_err_lsb",
                xlabel="strategy",
                ylabel="mean |LUT - f| under the data distribution (output LSB)",
                title=f"Error the data sees, {in_dt.name} -> {out_dt.name}",
                facet="function",
                kind=PlotKind.BAR,
            )
        )
    plots.append(
        Plot(
            name="build_time",
            table="build_times",
            x="strategy",
            y="max_cpu_s",
            xlabel="strategy",
            ylabel="slowest build over the functions (s of CPU, all threads)",
            title="Table build time from an empty cache",
            facet="pair",
            kind=PlotKind.BAR,
        )
    )
    notes = [
        "Inputs: every code of the input dtype; scales from each function's sample range "
        "(quantlab.numerics.lut.FUNCTIONS: sample_range, sample_out_amax) with the J6 rule "
        "amax / ((qmax - qmin) / 2).",
        "Error = |LUT output - clamp(f(x), output range)| in output LSBs (float: times the output "
        "scale); fake = the same for round(f(x)/s_out), what QAT computes; gap = |LUT - fake|.",
        "Interpolation error is measured at the position the hardware interpolates at (the "
        "floored 8-fraction-bit table index), so the index quantization is excluded there and "
        "included in max_err_lsb.",
        f"Format: {fmt.tables} tables x {fmt.entries} entries, {fmt.index_frac_bits} index "
        f"fraction bits, interpolation rounding {fmt.interp_round.name} (assumed), direct int8 "
        f"table {fmt.direct_int8} (from the platform profile {ctx.platform.name}).",
        "Strategies: EVENLY and CURVATURE as the vendor describes them; SQRT_CURVATURE and "
        "MINIMAX are quantlab's (quantlab/numerics/lut/strategies.py). MINIMAX keeps the best "
        "measured of its candidates (minimax, sqrt-curvature, evenly, curvature: column "
        "minimax_start) and refines the points on the measured error, so it is never worse "
        "than either vendor rule.",
        "OPTIMAL (quantlab/numerics/lut/optimal.py): the smallest max error over every input "
        "code, measured through the integer evaluation itself, certified by dynamic programming "
        "over a stated candidate set (every point set for ranges of at most 320 codes, i.e. "
        "every int8 input; otherwise a curvature/uniform quantile grid with the vendor rules' "
        "points, then refinement boxes down to one code). It is therefore never worse than "
        "EVENLY, CURVATURE or SQRT_CURVATURE; against MINIMAX and MANUAL it is measured here.",
        f"DATA (quantlab/numerics/lut/data_weighted.py): the smallest mean error under the op's "
        f"input histogram with the max error at most LutSpec.data_error_factor (2) x "
        f"OPTIMAL's. Here the histogram is the stated distribution: per function a Gaussian "
        f"N(centre, ({exp.data_sigma_fraction:g} x width)^2) of its sample range, "
        f"{exp.data_bins} equal bins over that range (e.g. sigmoid: N(0, 2^2) on [-8, 8]; "
        "inverse_sigmoid: N(0.5, 0.125^2) on [0, 1]); column data_mean_err_lsb scores every "
        "strategy under it.",
        "Build times: each table built from an empty cache (DATA includes its OPTIMAL step), "
        "wall and CPU seconds on a machine shared with other jobs: indicative only.",
        "Symmetric ops answer the code qmin as -f(qmax s_in) ('mirror edge' region): for int8 "
        "inputs this single code dominates the max error of sin and sqrt.",
    ]
    return ExperimentResult(
        table=df,
        title="Segment-LUT error: functions x dividing strategies x dtypes",
        findings=findings,
        tables=tables,
        plots=plots,
        notes=notes,
    )
