"""Sentences of the consistency report: each states one measured figure of a table (its op,
its dB or LSB count, the mode pair) so that the report's findings carry their evidence."""

from __future__ import annotations

import math

import pandas as pd

from quantlab.op_kinds import EVAL_IDENTITY_TYPES, OpCategory
from quantlab.simulate import Mode
from quantlab.simulate.fixed_ops import FLOAT_OUTPUT


def each_output_finding(each: pd.DataFrame, a: Mode, b: Mode) -> list[str]:
    """One sentence with each float output's ``b``-vs-``a`` SQNR (the ``output_each`` rows);
    none for a model with one output or a mode pair those rows leave out."""
    g = each[(each.reference == a.name) & (each.compared == b.name)] if not each.empty else each
    if g.empty:  # one output, or a pair of modes the rows leave out (hybrid)
        return []
    parts = ", ".join(f"{r.output} {r.sqnr_db:.1f} dB" for r in g.itertuples())
    return [
        f"The model has {len(g)} float outputs; {b.name.lower()} vs {a.name.lower()} SQNR per "
        f"output: {parts} (the figure at the model output pools them, weighted by size; "
        "table output_each)."
    ]


def task_findings(task: pd.DataFrame) -> list[str]:
    """One sentence per task metric: fake and fixed against float with item counts and 95%
    intervals, and whether the two intervals separate (no verdict from one item)."""
    from quantlab.analysis.confidence import Estimate, distinct_digits

    out = []
    for metric, g in task.groupby("metric", sort=False):
        e = {
            r.compared: Estimate(r.value, r.ci_low, r.ci_high, int(r.items)) for r in g.itertuples()
        }
        fake, fixed = e.get("FAKE"), e.get("FIXED")
        d = distinct_digits(fake, fixed) if fake is not None and fixed is not None else 4
        parts = "; ".join(f"{m.lower()} {est.format(d)}" for m, est in e.items())
        verdict = ""
        if fake is not None and fixed is not None and not fake.has_interval:
            verdict = " With one item there is no interval: the difference is not resolved."
        elif fake is not None and fixed is not None and fake.value != fixed.value:
            relation = fake.relation(fixed)  # "overlap", or separate on too few items
            verdict = " The fake and fixed intervals " + (
                "do not overlap: the difference is resolved."
                if fake.separated_from(fixed)
                else f"{relation}: the difference is not resolved on these items."
            )
        out.append(f"Task metric {metric}: {parts}.{verdict}")
    return out


def accumulated_finding(acc: pd.DataFrame) -> str:
    """The accumulated view in one sentence: its lowest SQNR along depth and where, and the
    last op's (a model's last op need not be its worst, or an output on the main path). Where
    the lowest is at a pass-through op (a view, a slice, relu, max pooling: it moves or selects
    values and adds no error of its own, but the values it keeps can carry less signal), the
    sentence says so and names the lowest among the ops that compute."""

    def db(v: float) -> str:
        return "bit-identical (inf dB)" if math.isinf(v) and v > 0 else f"{v:.1f} dB SQNR"

    last, known = acc.iloc[-1], acc.sqnr_db.dropna()
    at = known.idxmin() if not known.empty else acc.index[-1]
    worst = acc.loc[at]
    if worst["name"] == last["name"] or worst.sqnr_db == last.sqnr_db:
        return (
            f"Accumulated along depth, the gap reaches {db(last.sqnr_db)} at the last op "
            f"({last['name']})."
        )
    where = f"{worst['name']} ({db(worst.sqnr_db)})"
    passes = acc.category == OpCategory.PASS_THROUGH.name if "category" in acc else None
    if passes is not None and passes[at]:
        computing = acc.sqnr_db[~passes].dropna()
        why = "it only moves or selects values, so its gap was made before it"
        if not computing.empty:
            low = acc.loc[computing.idxmin()]
            why += f"; the widest at an op that computes is at {low['name']}, {db(low.sqnr_db)}"
        where += f", a pass-through op ({why})"
    return (
        f"Accumulated along depth, the gap is widest at {where}; at the last op "
        f"({last['name']}) it is {db(last.sqnr_db)}."
    )


def lsb_words(row, unit: str) -> str:
    """``row``'s largest error in output LSBs; an output with no integer grid (float16 or
    float32 on J6H/P) has none, and says so."""
    if pd.isna(row.err_lsb):
        return f"a {row.out_dtype} output (no LSB)"
    return f"{row.err_lsb:.3g} {unit}"


def float_ops_finding(ops, platform: str, model: str) -> str:
    """How many captured op calls run in float, in three disjoint groups: ops quantlab does
    not model, modelled ops the platform does not support, and supported ops whose fixed
    kernel computes in float (``fixed_kernel`` starting "float", or a kernel that declined
    the call in the fixed run: ``fixed_in_float``; not an op whose float16 output dtype its
    qconfig chose), each with its op types; eval-mode identities (dropout), which the export
    removes, are counted apart when there are any."""
    identity = (ops.category == "NONE") & ops.op_type.isin(EVAL_IDENTITY_TYPES)
    not_modelled = (ops.category == "NONE") & ~identity
    unsupported = ~not_modelled & ~identity & ~ops.supported
    declined = ops["fixed_in_float"] if "fixed_in_float" in ops else False
    by_dtype = ops.fixed_kernel.str.endswith(f"({FLOAT_OUTPUT})")  # float16 by its qconfig
    in_float = ops.supported & ((ops.fixed_kernel.str.startswith("float") & ~by_dtype) | declined)

    def group(mask) -> str:
        types = sorted(set(ops.op_type[mask]))
        return f"{int(mask.sum())}" + (f" ({', '.join(types)})" if types else "")

    removed = (
        f"{group(identity)} are the identity in eval mode (removed at export); "
        if identity.any()
        else ""
    )
    return (
        f"{model} has {len(ops)} captured op calls: {removed}{group(not_modelled)} are ops "
        f"quantlab does not model (they run in float); {group(unsupported)} run in float because "
        f"{platform} does not support them; {group(in_float)} compute in float in fixed mode and "
        "quantize their output."
    )
