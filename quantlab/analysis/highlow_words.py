"""Sentences and the task error of the high/low weight split report: each sentence states
measured figures of the per-layer, per-model or fixed-mode tables (SQNR in dB, error in output
LSBs, cost relative to int8)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from quantlab.numerics.split import SplitCombine


def task_error(df: pd.DataFrame) -> pd.Series:
    """One lower-is-better task error per row: KL (nats) for classifiers, 1 - cosine else (an
    embedding's, or the outputs' for a model judged against its float outputs)."""
    if "kl_nats" in df.columns:
        kl = df["kl_nats"]
    else:
        kl = pd.Series(np.nan, index=df.index)
    cos = pd.Series(np.nan, index=df.index)
    for name in ("embedding_cosine", "output_cosine"):
        if name in df.columns:
            cos = cos.where(cos.notna(), df[name])
    return kl.where(kl.notna(), 1 - cos)


def task_error_estimate(row: pd.Series):
    """``task_error`` of one row as an Estimate (its interval and item count): the KL's own, or
    1 - the cosine's interval, reversed."""
    from quantlab.analysis.confidence import Estimate

    if "kl_nats" in row.index and pd.notna(row["kl_nats"]):
        return Estimate.from_columns(row, "kl_nats")
    for name in ("embedding_cosine", "output_cosine"):
        if name in row.index and pd.notna(row[name]):
            e = Estimate.from_columns(row, name)
            return Estimate(1 - e.value, 1 - e.high, 1 - e.low, e.n, e.level)
    raise ValueError("a model-level row holds no task metric (kl_nats or a cosine)")


def split_findings(exp, layers, models) -> list[str]:
    """Per-layer medians by format, the combine modes' extra error and accumulator width, int16
    saturation, and per model the task error and cost of each scheme (``models`` None: none)."""
    out = []
    summ = (
        layers.groupby(["model", "in_dtype", "format"], sort=False)
        .agg(median_sqnr_db=("sqnr_db", "median"), max_err_lsb=("max_err_lsb", "max"))
        .reset_index()
    )
    for (model, dt), g in summ.groupby(["model", "in_dtype"], sort=False):
        d = {r.format: r for r in g.itertuples()}
        parts = ", ".join(f"{f} {r.median_sqnr_db:.1f} dB" for f, r in d.items())
        out.append(
            f"{model}, {dt} inputs, median per-layer output SQNR ({exp.layer_out_dtype.name} "
            f"out): {parts}."
        )
    wide = layers[layers["format"].str.endswith("_wide")]
    sep = layers[layers["format"].str.endswith("_separate")]
    if len(wide) and len(sep):
        key = ["model", "layer", "in_dtype"]
        w = wide.assign(k=wide["format"].str.replace("_wide", ""))
        s = sep.assign(k=sep["format"].str.replace("_separate", ""))
        m = w.merge(s, on=key + ["k"], suffixes=("_w", "_s"))
        d_mean = (m["mean_err_lsb_s"] - m["mean_err_lsb_w"]).mean()
        d_max = (m["max_err_lsb_s"] - m["max_err_lsb_w"]).max()
        worse = float((m["sqnr_db_s"] < m["sqnr_db_w"]).mean())
        out.append(
            f"Combine mode: requantizing the halves separately adds {d_mean:.3f} output LSB of "
            f"mean error (up to {d_max:.2f} LSB more in the worst case) against one wide "
            f"accumulator; separate is worse in {100 * worse:.0f}% of {len(m)} layer cases "
            "(two roundings instead of one)."
        )
        bits = wide["acc_bits"]
        out.append(
            f"The wide accumulator needs up to {int(bits.max())} signed bits (median "
            f"{bits.median():.0f}); {100 * float((bits > 32).mean()):.0f}% of {len(bits)} split "
            "layer cases exceed int32, so the combined sum cannot live in one int32 register."
        )
    i16in = layers[layers["in_dtype"] == "INT16"]
    i16 = i16in[i16in["format"] == "int16"]
    if len(i16):
        sat_layers = int((i16["acc_saturated"] > 0).sum())
        spl = i16in[i16in["format"].str.startswith("split")]
        out.append(
            f"int16 x int16 (no split): {sat_layers} of {len(i16)} layer calls saturate the int32 "
            f"accumulator ({int(i16['acc_saturated'].sum())} outputs in total); with int16 inputs "
            f"and a split int8 weight, {int(spl['acc_saturated'].sum())} outputs saturate in "
            f"{len(spl)} layer cases: each int16 x int8 pass fits int32."
        )
    if models is not None and len(models):
        for model, g in models.groupby("model", sort=False):
            te = dict(zip(g["scheme"], task_error(g)))
            cr = dict(zip(g["scheme"], g.get("cost_rel_int8", g["cost_int8_mac_eq"])))
            metric = "1 - output cosine"
            if "kl_nats" in g.columns and g["kl_nats"].notna().all():
                metric = "KL vs float (nats)"
            elif "embedding_cosine" in g.columns and g["embedding_cosine"].notna().all():
                metric = "1 - embedding cosine"
            est = {r["scheme"]: task_error_estimate(r) for _, r in g.iterrows()}
            parts = ", ".join(f"{s} {est[s].format(3)} at {cr[s]:.2f}x cost" for s in te)
            out.append(f"{model} (weights in each format, activations float; {metric}): {parts}.")
            if {"int8", "split_topk"} <= te.keys() and te["int8"] > 0:
                a, b = est["int8"], est["split_topk"]
                out.append(
                    f"{model}: splitting the {exp.top_k} most weight-sensitive layers removes "
                    f"{100 * (1 - te['split_topk'] / te['int8']):.0f}% of the int8 task error for "
                    f"{100 * (cr['split_topk'] - 1):.0f}% extra cost; the two intervals "
                    f"{a.relation(b)}."
                )
            if {"split_all", "int16"} <= te.keys():
                dom = te["int16"] <= te["split_all"] and cr["int16"] <= cr["split_all"]
                out.append(
                    f"{model}: int16 weights {'dominate' if dom else 'do not dominate'} split-all "
                    f"(error {te['int16']:.3g} vs {te['split_all']:.3g} at {cr['int16']:.2f}x vs "
                    f"{cr['split_all']:.2f}x cost) where the platform runs int16 x int8; the split "
                    "is the way to precise weights when the activations are int16 and int16 x "
                    "int16 is not available (platform.max_int16_gemm_operands < 2)."
                )
            if "top1_agreement" in g.columns and g["top1_agreement"].notna().all():
                t1 = ", ".join(f"{r.scheme} {top1_words(r)}" for r in g.itertuples())
                out.append(f"{model} top-1 agreement with float: {t1}.")
    return out


def top1_words(r) -> str:
    """Top-1 agreement of a row with its 95% Wilson score interval and item count."""
    from quantlab.analysis.confidence import Estimate

    return str(Estimate.from_columns(r, "top1_agreement"))


def fixed_findings(exp, df: pd.DataFrame) -> list[str]:
    """Per model, each scheme's deployed output SQNR against float with its task metrics and
    cost, the SQNR gained by splitting, and separate requantization against one wide sum."""
    from quantlab.analysis.confidence import Estimate

    out = []
    has_kl = "kl_nats" in df.columns
    for model, g in df.groupby("model", sort=False):
        label = [s if c == "-" else f"{s}/{c.lower()}" for s, c in zip(g["scheme"], g["combine"])]
        parts = []
        for lab, r in zip(label, g.itertuples()):
            kl = f", KL {Estimate.from_columns(r, 'kl_nats').format(3)}" if has_kl else ""
            t1 = f", top-1 {top1_words(r)}" if "top1_agreement" in g.columns else ""
            parts.append(f"{lab} {_sqnr(r).format_db(1)}{kl}{t1} at {r.cost_rel_int8:.2f}x")
        out.append(
            f"{model} through the simulator (FIXED, template activations, "
            f"{exp.fixed_num_eval} inputs), output SQNR vs float: " + "; ".join(parts) + "."
        )
        base = g[g["scheme"] == "int8"].iloc[0]
        for combine, h in g[g["scheme"] != "int8"].groupby("combine", sort=False):
            r = h.set_index("scheme")
            if "split_all" not in r.index:
                continue
            d = r.loc["split_all", "sqnr_db"] - base["sqnr_db"]
            dt = r.loc["split_topk", "sqnr_db"] - base["sqnr_db"] if "split_topk" in r.index else 0
            rel = _sqnr(r.loc["split_all"]).relation(_sqnr(base))
            out.append(
                f"{model}, {combine}: splitting all {int(r.loc['split_all', 'layers_split'])} "
                f"layers {'raises' if d > 0 else 'lowers'} the deployed output SQNR by "
                f"{abs(d):.2f} dB ({'+' if dt >= 0 else '-'}{abs(dt):.2f} dB for the top "
                f"{exp.top_k}) at {r.loc['split_all', 'cost_rel_int8']:.2f}x cost, from "
                f"{base['sqnr_db']:.1f} dB with int8 weights; the split-all and int8 intervals "
                f"{rel}."
            )
        wide = g[g["combine"] == SplitCombine.WIDE_ACCUMULATOR.name].set_index("scheme")
        sep = g[g["combine"] == SplitCombine.SEPARATE_REQUANT.name].set_index("scheme")
        both = [s for s in wide.index if s in sep.index]
        if both:
            diffs = ", ".join(
                f"{s} {sep.loc[s, 'sqnr_db'] - wide.loc[s, 'sqnr_db']:+.2f} dB (intervals "
                f"{_sqnr(sep.loc[s]).relation(_sqnr(wide.loc[s]))})"
                for s in both
            )
            out.append(
                f"{model}: separate requantization of the halves vs one wide accumulator "
                f"(output SQNR, separate - wide): {diffs}."
            )
    return out


def _sqnr(r):
    """A fixed-mode row's output SQNR as an Estimate (its interval over the items)."""
    from quantlab.analysis.confidence import Estimate

    return Estimate.from_columns(r, "sqnr_db")
