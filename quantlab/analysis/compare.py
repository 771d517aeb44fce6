"""Per-op comparison of two runs of one model (e.g. fake vs fixed), in two views.

ACCUMULATED: both runs go end to end; each op's output difference includes the error carried in
from earlier ops. ISOLATED: run b is fed, op by op, the inputs run a gave that op (each op of b
returns a's output to the next op after its own output was recorded), so a row measures that
op alone. Rows are in b's execution order; ops missing from a (other control-flow path) are
skipped.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from quantlab.analysis.metrics import all_metrics, flat, float_leaves
from quantlab.simulate.modes import Mode, Trace, View


def _out_quant(info):
    """(dtype name, scale, saturated count function) of an op's recorded QInfo."""
    if isinstance(info, list):
        info = info[0] if info else None
    if info is None:
        return "FLOAT32", math.nan, None
    scale = float(info.scale) if info.scale is not None else math.nan
    return info.dtype.name, scale, info


def compare_traces(ta: Trace, tb: Trace, ops: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per op of ``tb`` also in ``ta``: metrics of b's output against a's.

    Columns: index, name, op_type, l1, cosine, mse, kl, sqnr_db, max_abs, err_lsb (max_abs in
    units of b's output scale; NaN for float outputs), saturated (b's output codes at the
    dtype's limits), float16_overflow (finite values beyond +-65504 that b's op cast to float16,
    before saturation), numel, out_dtype, out_scale (and module, flops when ``ops`` is given).
    """
    meta = {} if ops is None else ops.set_index("name").to_dict("index")
    rows = []
    for i, name in enumerate(tb.order):
        if name not in ta.outputs:
            continue
        ra, rb = ta.outputs[name], tb.outputs[name]
        la, lb = float_leaves(ra), float_leaves(rb)
        if not la or [t.shape for t in la] != [t.shape for t in lb]:
            continue
        x, y = flat(ra), flat(rb)
        m = all_metrics(x, y)
        dt, scale, info = _out_quant(tb.qinfo.get(name))
        sat = 0
        if info is not None and info.dtype.is_int and info.scale is not None:
            codes = torch.round(y / float(info.scale))
            sat = int(((codes <= info.dtype.qmin) | (codes >= info.dtype.qmax)).sum())
        row = {"index": i, "name": name, "op_type": meta.get(name, {}).get("op_type", "")}
        if not row["op_type"]:
            row["op_type"] = name.split(":")[-1].split("#")[0]
        row.update(m)
        row["err_lsb"] = m["max_abs"] / scale if scale == scale and scale > 0 else math.nan
        row["saturated"] = sat
        row["float16_overflow"] = tb.float16_overflow.get(name, 0)
        row["numel"] = int(y.numel())
        row["out_dtype"] = dt
        row["out_scale"] = scale
        if name in meta:
            row["module"] = meta[name]["module"]
            row["flops"] = meta[name]["flops"]
        rows.append(row)
    return pd.DataFrame(rows)


def compare_modes(sim, inputs: tuple, a: Mode, b: Mode, view: View) -> pd.DataFrame:
    """Trace ``inputs`` in modes a and b (b isolated per op for View.ISOLATED) and compare."""
    ta = sim.trace(*inputs, mode=a)
    tb = sim.trace(*inputs, mode=b, _isolate=ta if view is View.ISOLATED else None)
    table = compare_traces(ta, tb, sim.ops)
    table.insert(0, "view", view.name)
    return table


def first_divergence(
    table: pd.DataFrame, metric: str = "sqnr_db", threshold: float = 30.0
) -> pd.Series | None:
    """The first row (in execution order) whose ``metric`` crosses ``threshold``: below it for
    cosine/SQNR (higher is better), above it for the others; None if no row does."""
    from quantlab.analysis.metrics import HIGHER_IS_BETTER

    if metric not in table.columns:
        raise ValueError(f"metric {metric!r} is not a column; allowed: {list(table.columns)}")
    bad = table[metric] < threshold if metric in HIGHER_IS_BETTER else table[metric] > threshold
    hits = table[bad]
    return None if hits.empty else hits.iloc[0]
