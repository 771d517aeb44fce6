"""Where a simulator run's time goes: torch.profiler per aten op, and per quantlab stage.

Stages are the cumulative time of the functions that implement them, from one cProfile run
(cProfile adds a fixed cost per Python call, so Python-heavy stages read high; the shares
still rank them): capture and dispatch (everything not in a stage below), activation
quantization, weight and bias preparation, exact GEMM sums, GEMM requantization (``finish``),
elementwise fixed kernels (add, mul, requant ops) and segment LUTs; the rest is capture,
dispatch, bookkeeping and the float ops the model or a fake-mode op runs. Used by
``bench_simulate.py --profile``.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

# stage -> (file suffix, function name) pairs whose cumulative time is the stage's
STAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "activation quantization": (("simulate/quant_state.py", "quantize_act"),),
    "weight codes and bias": (
        ("simulate/quant_state.py", "weight_q"),
        ("simulate/quant_state.py", "weight_value"),
        ("simulate/quant_state.py", "bias_value"),
        ("simulate/batch_norm_folding.py", "_fold"),
    ),
    "exact GEMM sums": (  # the planned kernels, whichever entry point (a prepared conv too)
        ("numerics/gemm/kernels.py", "conv_planned"),
        ("numerics/gemm/kernels.py", "matmul_planned"),
    ),
    "GEMM requantization": (("numerics/gemm/finish.py", "finish_gemm"),),
    "elementwise fixed kernels": (
        ("simulate/fixed_ops.py", "_add"),
        ("simulate/fixed_ops.py", "_mul"),
        ("simulate/fixed_ops.py", "_requant_op"),
        ("simulate/fixed_ops.py", "_reduce"),
        ("simulate/fixed_pool.py", "pool_op"),
        ("simulate/fixed_lut.py", "softmax_op"),
    ),
    "segment LUT": (("simulate/fixed_lut.py", "lut_op"),),
}


def aten_table(fn: Callable[[], object], runs: int, rows: int = 15) -> pd.DataFrame:
    """Self CPU time per aten op over ``runs`` calls of ``fn`` (torch.profiler)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return pd.DataFrame(
        [
            {
                "aten op": e.key,
                "calls per run": e.count / runs,
                "self CPU ms per run": e.self_cpu_time_total / 1e3 / runs,
                "share": e.self_cpu_time_total / total,
            }
            for e in events[:rows]
        ]
    )


def cprofile_stats(fn: Callable[[], object], runs: int) -> dict:
    """cProfile's statistics of ``runs`` calls of ``fn``: (file, line, name) -> (primitive
    calls, calls, own seconds, cumulative seconds, callers)."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(runs):
        fn()
    pr.disable()
    return pstats.Stats(pr).stats


def stage_table(fn: Callable[[], object], runs: int) -> pd.DataFrame:
    """Cumulative seconds per quantlab stage over ``runs`` calls of ``fn`` (cProfile)."""
    return stage_rows(cprofile_stats(fn, runs), runs)


def stage_rows(stats: dict, runs: int) -> pd.DataFrame:
    """The stage table of ``cprofile_stats`` taken over ``runs`` calls."""
    total = sum(v[2] for v in stats.values()) or 1.0
    rows, covered = [], 0.0
    for stage, funcs in STAGES.items():
        ct = 0.0
        for (file, _line, name), v in stats.items():
            if any(file.endswith(f) and name == n for f, n in funcs):
                ct += v[3]  # cumulative: a recursive function's outermost calls only
        rows.append({"stage": stage, "ms per run": ct * 1e3 / runs, "share": ct / total})
        covered += ct
    rows.insert(
        0,
        {
            "stage": "the rest: capture, dispatch, bookkeeping, the model's float ops",
            "ms per run": max(total - covered, 0.0) * 1e3 / runs,
            "share": max(total - covered, 0.0) / total,
        },
    )
    return pd.DataFrame(rows)


def python_table(fn: Callable[[], object], runs: int, rows: int = 15) -> pd.DataFrame:
    """Own time (cProfile tottime, calls below excluded) per Python function or builtin over
    ``runs`` calls of ``fn``, the largest ``rows``: what a run's per-op work consists of."""
    stats = cprofile_stats(fn, runs)
    total = sum(v[2] for v in stats.values()) or 1.0
    top = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:rows]
    return pd.DataFrame(
        [
            {
                "function": _where(file, line, name),
                "calls per run": v[1] / runs,
                "own ms per run": v[2] * 1e3 / runs,
                "share": v[2] / total,
            }
            for (file, line, name), v in top
        ]
    )


def step_table(sim, fn: Callable[[], object], runs: int) -> pd.DataFrame:
    """Wall time per op type of the steps of a traced program (``program_steps``: prepared,
    fused and fully dispatched ops) over ``runs`` calls of ``fn``, a steady run of ``sim``
    that has switched to its program, and what the run spends outside them (the generated
    code's own torch calls, the program's checks). Each step is timed with
    ``time.perf_counter`` around its call (about a microsecond each); no profiler runs."""
    import time

    from quantlab.simulate import program_steps

    classes = (program_steps._Prepared, program_steps._Fused, program_steps._Full)
    originals = {c: c.__call__ for c in classes}
    spent: dict[str, list[float]] = {}

    def timed(cls):
        call = originals[cls]

        def run(self, *args, **kwargs):
            t = time.perf_counter()
            try:
                return call(self, *args, **kwargs)
            finally:
                info = sim._info.get(self.name if hasattr(self, "name") else self.full.name)
                key = info.op_type if info is not None else "(other)"
                spent.setdefault(key, []).append(time.perf_counter() - t)

        return run

    fn()
    try:
        for cls in classes:
            cls.__call__ = timed(cls)
        t0 = time.perf_counter()
        for _ in range(runs):
            fn()
        total = time.perf_counter() - t0
    finally:
        for cls, call in originals.items():
            cls.__call__ = call
    rows = [
        {"op type": k, "calls per run": len(v) / runs, "ms per run": sum(v) * 1e3 / runs}
        for k, v in spent.items()
    ]
    inside = sum(sum(v) for v in spent.values())
    rows.append(
        {
            "op type": "outside the steps: generated code's own torch calls, checks",
            "calls per run": "-",
            "ms per run": (total - inside) * 1e3 / runs,
        }
    )
    table = pd.DataFrame(rows).sort_values("ms per run", ascending=False, ignore_index=True)
    table["share"] = table["ms per run"] / (total * 1e3 / runs)
    return table


def _where(file: str, line: int, name: str) -> str:
    """``name (package/path.py:line)`` with the path from the package down (or the builtin)."""
    if file == "~":
        return name
    parts = file.replace("\\", "/").split("/")
    for root in ("quantlab", "torch"):
        if root in parts:
            file = "/".join(parts[len(parts) - 1 - parts[::-1].index(root) :])
            break
    return f"{name} ({file}:{line})"


def profile_run(fn: Callable[[], object], runs: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(aten ops, quantlab stages) of ``runs`` calls of ``fn`` after one warm-up call."""
    fn()
    with torch.no_grad():
        return aten_table(fn, runs), stage_table(fn, runs)
