"""Benchmark: sensitivity ranking with replayed upstream ops vs one full forward per op.

Targets checked: ranking the ops of mobilenet_v2 on 24 real photos (activation and weight
passes) with the replayed baseline (``quantlab.analysis.sensitivity``) costs at most 0.3x the
naive method, one full forward per studied op, measured in the same run, and under 90 s in all.
The load average (``os.getloadavg``) before and after is recorded with the figures.

Both methods make exactly the same per-op runs (the same ``Simulator.run`` calls, with and
without ``replay=``); they are timed op by op and *paired* (for each op the naive and the fast
run follow each other, in alternating order), so load from other processes hits both alike.
(mobilenet_v2 has no index op, so the frozen-indices mode of the library is inactive, as here.)
The fast total includes recording the all-float baseline trace (shared by both passes). The
activation scales and weight codes are computed once before timing (both methods need the same
ones). Every fast output is checked equal, bit for bit, to its naive twin. Also reported: the
work ratio in flops (the fast method recomputes the studied op and everything after it), which
does not depend on the machine.

The process keeps freed memory (``quantlab.host_memory.keep_freed_memory``), as
``python -m quantlab`` does; ``--system-malloc`` leaves the C library's default, under which
every large activation is a fresh mapping (page faults and zero fill in the kernel). The
report gives the process's user and system CPU time and its peak resident size.

Run: .venv/bin/python benchmarks/bench_sensitivity.py [--model mobilenet_v2] [--photos 24]
     [--system-malloc]
Writes reports/benchmarks/sensitivity.json and reports/benchmarks/sensitivity.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as host
import resource
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from quantlab.analysis.sensitivity import (
    SensitiveType,
    check_batches,
    float_inputs_spec,
    merge_batches,
    pass_modes,
    studied_ops,
)
from quantlab.data import load_data
from quantlab.data.schema import DataConfig
from quantlab.host_memory import keep_freed_memory
from quantlab.models import build_model
from quantlab.report.io import atomic_write_text
from quantlab.simulate import Mode, Simulator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_info import cpu_description, shown_path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "benchmarks"
LIMIT = 0.3  # target: fast / naive <= 0.3
TIME_LIMIT_S = 90.0  # target: the replayed ranking (both passes) takes under 90 s


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _same(a, b) -> bool:
    la, lb = torch.utils._pytree.tree_flatten(a)[0], torch.utils._pytree.tree_flatten(b)[0]
    return len(la) == len(lb) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(la, lb)
    )


def bench(model: str, data: str, photos: int, calib: int, platform: str) -> dict:
    bundle = build_model(model)
    ds = load_data(DataConfig(name=data, num_calib=calib, num_eval=photos), bundle.name)
    batches = merge_batches(check_batches(ds.eval))
    sim = Simulator(bundle.module, platform)
    sim.calibrate(ds.calib)
    sim.run(*batches[0])  # discover ops, resolve qconfigs
    ops = sim.ops
    flops = dict(zip(ops["name"], ops["flops"].astype(float)))
    order = list(ops["name"])
    total_flops = sum(flops.values())
    user = sim.spec
    sim.set_qconfig(float_inputs_spec(user, set(ops.loc[ops["supported"], "op_type"])))
    result: dict = {"passes": {}}
    t_fast = t_naive = 0.0
    w_fast = w_naive = 0.0
    mismatches = 0
    # warm the activation scales and weight codes once (untimed): both methods need them
    sim.run(*batches[0], mode=Mode.FAKE)
    traces, t_trace = [], 0.0
    for b in batches:  # the all-float baseline, shared by the activation and weight passes
        tr, dt = _timed(lambda b=b: sim.trace(*b, mode=Mode.FLOAT))
        traces.append(tr)
        t_trace += dt
    w_fast += total_flops * len(batches)
    for kind in (SensitiveType.ACTIVATION, SensitiveType.WEIGHT):
        names = studied_ops(sim, kind)
        k_fast = t_trace if kind is SensitiveType.ACTIVATION else 0.0
        k_naive = 0.0
        for i, name in enumerate(tqdm(names, desc=f"bench {kind.value}")):
            mode, op_modes = pass_modes(kind, name)
            for b, tr in zip(batches, traces):

                def naive(b=b, mode=mode, op_modes=op_modes):
                    return sim.run(*b, mode=mode, op_modes=op_modes)

                def fast(b=b, tr=tr, mode=mode, op_modes=op_modes):
                    return sim.run(*b, mode=mode, op_modes=op_modes, replay=tr)

                if i % 2 == 0:
                    y_naive, dn = _timed(naive)
                    y_fast, df = _timed(fast)
                else:
                    y_fast, df = _timed(fast)
                    y_naive, dn = _timed(naive)
                mismatches += not _same(y_naive, y_fast)
                k_fast += df
                k_naive += dn
            start = order.index(name)
            w_fast += sum(flops[n] for n in order[start:]) * len(batches)
            w_naive += total_flops * len(batches)
        result["passes"][kind.value] = {
            "ops": len(names),
            "naive_s": k_naive,
            "fast_s": k_fast,
            "trace_s": t_trace if kind is SensitiveType.ACTIVATION else 0.0,
            "ratio": k_fast / k_naive,
        }
        t_fast += k_fast
        t_naive += k_naive
    sim.set_qconfig(user)
    result.update(
        {
            "model": model,
            "data": data,
            "items": int(sum(len(b[0]) for b in batches)),
            "platform": platform,
            "naive_s": t_naive,
            "fast_s": t_fast,
            "ratio": t_fast / t_naive,
            "work_ratio_flops": w_fast / w_naive,
            "output_mismatches": mismatches,
            "limit": LIMIT,
            "time_limit_s": TIME_LIMIT_S,
            "pass": t_fast / t_naive <= LIMIT and mismatches == 0,
            "time_pass": t_fast < TIME_LIMIT_S,
            "threads": torch.get_num_threads(),
            "machine": f"{host.machine()} {host.processor() or ''}".strip(),
            "torch": torch.__version__,
        }
    )
    return result


def report(r: dict) -> str:
    lines = [
        "# Benchmark: sensitivity ranking, replayed upstream vs one full forward per op",
        "",
        f"{r['model']} on {r['items']} items of data={r['data']} (one batch), platform "
        f"{r['platform']}, {r['threads']} torch threads, torch {r['torch']}.",
        "",
        f"CPU: {r['cpu']}. Memory: {r['malloc']}.",
        "",
        "| pass | ops studied | naive (s) | replayed (s, incl. trace) | ratio |",
        "|---|---|---|---|---|",
    ]
    for kind, p in r["passes"].items():
        lines.append(
            f"| {kind} | {p['ops']} | {p['naive_s']:.2f} | {p['fast_s']:.2f} | {p['ratio']:.3f} |"
        )
    lines += [
        f"| **total** | | {r['naive_s']:.2f} | {r['fast_s']:.2f} | **{r['ratio']:.3f}** |",
        "",
        f"- Time ratio replayed / naive: **{r['ratio']:.3f}** (target <= {r['limit']}, "
        "outputs identical): " + ("met" if r["pass"] else "MISSED") + ".",
        f"- Replayed ranking, both passes: **{r['fast_s']:.1f} s** (target < "
        f"{r['time_limit_s']:.0f} s): " + ("met" if r["time_pass"] else "MISSED") + ".",
        f"- Load average (1, 5, 15 min) {r['load_before']} before, {r['load_after']} after, "
        f"on {r['cpu_count']} cores (a busy machine distorts seconds more than the ratio).",
        f"- Work ratio in flops (machine independent): {r['work_ratio_flops']:.3f}.",
        f"- Outputs of the two methods differing in any bit: {r['output_mismatches']}.",
        f"- Process CPU time: {r['user_cpu_s']:.1f} s user, {r['system_cpu_s']:.1f} s system "
        f"(the kernel's share: page faults and zero fill of new mappings); peak resident size "
        f"{r['peak_rss_mib']:.0f} MiB.",
        "- Per-op runs are paired (naive and replayed back to back, alternating order), so "
        "load from other processes hits both alike.",
        "",
        "Reproduce: `.venv/bin/python benchmarks/bench_sensitivity.py"
        + (" --system-malloc" if not r["freed_memory_kept"] else "")
        + (f" --out {r['out']}" if r["out"] != shown_path(OUT) else "")
        + "`",
        "",
    ]
    return "\n".join(lines)


def process_usage() -> dict:
    """This process's user and system CPU seconds so far and its peak resident size (MiB)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "user_cpu_s": u.ru_utime,
        "system_cpu_s": u.ru_stime,
        "peak_rss_mib": u.ru_maxrss / 1024,  # Linux reports KiB
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--data", default="photos")
    ap.add_argument("--photos", type=int, default=24)
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--platform", default="j6m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--system-malloc",
        action="store_true",
        help="leave the C library's malloc as it is (default: keep freed memory, as the CLI)",
    )
    args = ap.parse_args()
    kept = False if args.system_malloc else keep_freed_memory()
    torch.set_num_threads(args.threads)
    load_before = [round(v, 2) for v in os.getloadavg()]
    r = bench(args.model, args.data, args.photos, args.calib, args.platform)
    r.update(
        load_before=load_before,
        load_after=[round(v, 2) for v in os.getloadavg()],
        cpu_count=os.cpu_count(),
        cpu=cpu_description(),
        freed_memory_kept=kept,
        malloc=(
            "freed memory kept in the process (quantlab.host_memory.keep_freed_memory)"
            if kept
            else "the C library's default malloc"
        ),
        out=shown_path(args.out),
        **process_usage(),
    )
    md = report(r)
    atomic_write_text(args.out / "sensitivity.json", json.dumps(r, indent=2) + "\n")
    atomic_write_text(args.out / "sensitivity.md", md)
    print(md)


if __name__ == "__main__":
    main()
