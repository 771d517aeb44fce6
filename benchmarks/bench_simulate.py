"""Benchmark: cost of fake and fixed mode relative to float, MobileNetV2 on 1x3x224x224.

Not a test. Random weights (the registry's mobilenet_v2 architecture, ``pretrained=False``).
Time: the three modes run interleaved, ``--rounds`` times after a warm-up, and each mode's
median (wall time and process CPU time) is compared with the float median of the same run
(targets: fake <= 1.5x, fixed <= 4x).
Memory: each mode runs in a fresh subprocess; the peak resident set growth during one run
(VmHWM after resetting it via /proc/self/clear_refs, minus VmRSS before; glibc's mmap threshold
is pinned at 64 KiB so freed tensors leave the resident set) is compared with float's (target:
fixed <= 2x). Results: reports/benchmarks/simulate.{csv,md}.

    .venv/bin/python benchmarks/bench_simulate.py [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "benchmarks"
TARGETS = {"fake": 1.5, "fixed": 4.0}
MEMORY_TARGET = 2.0


def _setup(threads: int):
    from quantlab.models import build_model
    from quantlab.models.schema import ModelConfig
    from quantlab.simulate import Mode, Simulator

    torch.set_num_threads(threads)
    bundle = build_model(ModelConfig(name="mobilenet_v2", pretrained=False))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 224, 224, generator=gen)
    sim = Simulator(bundle.module, "j6m")
    sim.calibrate([(torch.randn(1, 3, 224, 224, generator=gen),)], progress=False)
    for m in (Mode.FAKE, Mode.FIXED):  # scales, weight codes and tables are built once
        sim.run(x, mode=m)
    return sim, x


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(mode: str, threads: int) -> None:
    """Run one mode once in this (fresh) process and print the peak RSS growth in KiB."""
    sim, x = _setup(threads)
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kb("VmRSS")
    with torch.no_grad():
        y = sim.run(x, mode=mode)
    peak = _status_kb("VmHWM")
    print(json.dumps({"mode": mode, "peak_growth_kib": peak - before, "out": float(y.sum())}))


def time_modes(rounds: int, threads: int) -> pd.DataFrame:
    sim, x = _setup(threads)
    rows = []
    for r in range(rounds):
        for mode in ("float", "fake", "fixed"):
            t, c = time.perf_counter(), time.process_time()
            sim.run(x, mode=mode)
            rows.append(
                {
                    "round": r,
                    "mode": mode,
                    "seconds": time.perf_counter() - t,
                    "cpu_seconds": time.process_time() - c,
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.threads)
        return
    times = time_modes(args.rounds, args.threads)
    med = times.groupby("mode")["seconds"].median()
    cpu = times.groupby("mode")["cpu_seconds"].median()
    mem = {}
    for mode in ("float", "fake", "fixed"):
        cmd = [sys.executable, __file__, "--memory-child", mode, "--threads", str(args.threads)]
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
        mem[mode] = json.loads(out.stdout.strip().splitlines()[-1])["peak_growth_kib"]
    rows = []
    for mode in ("float", "fake", "fixed"):
        rows.append(
            {
                "mode": mode,
                "median_s": med[mode],
                "min_s": times[times["mode"] == mode]["seconds"].min(),
                "ratio_to_float": med[mode] / med["float"],
                "median_cpu_s": cpu[mode],
                "cpu_ratio_to_float": cpu[mode] / cpu["float"],
                "time_target": TARGETS.get(mode, 1.0),
                "peak_mem_growth_mib": mem[mode] / 1024,
                "mem_ratio_to_float": mem[mode] / max(mem["float"], 1),
                "rounds": args.rounds,
                "threads": args.threads,
            }
        )
    table = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / "simulate.csv", index=False)
    fake, fixed = table.set_index("mode").loc["fake"], table.set_index("mode").loc["fixed"]
    fl = table.set_index("mode").loc["float"]
    lines = [
        "# Simulator cost: MobileNetV2 (random weights), 1x3x224x224, platform j6m",
        "",
        f"- fake mode: {fake.cpu_ratio_to_float:.2f}x float in CPU time (target <= 1.5x); "
        f"{fake.ratio_to_float:.2f}x in wall time",
        f"- fixed mode: {fixed.cpu_ratio_to_float:.2f}x float in CPU time (target <= 4x); "
        f"{fixed.ratio_to_float:.2f}x in wall time",
        f"- peak memory growth of one run: fixed {fixed.mem_ratio_to_float:.2f}x float "
        f"(target <= 2x; {fixed.peak_mem_growth_mib:.1f} MiB vs {fl.peak_mem_growth_mib:.1f} MiB)",
        f"- medians of {args.rounds} interleaved rounds in one process, {args.threads} torch "
        "threads. On a shared machine wall time swings with other load; process CPU time "
        "(all threads) is the steadier measure.",
        "",
        "| mode | median wall s | min wall s | wall x float | median CPU s | CPU x float "
        "| peak mem growth MiB | mem x float |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['median_s']:.4f} | {r['min_s']:.4f} | "
            f"{r['ratio_to_float']:.2f} | {r['median_cpu_s']:.4f} | "
            f"{r['cpu_ratio_to_float']:.2f} | {r['peak_mem_growth_mib']:.1f} | "
            f"{r['mem_ratio_to_float']:.2f} |"
        )
    lines += ["", "Reproduce: `.venv/bin/python benchmarks/bench_simulate.py`", ""]
    (OUT / "simulate.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
