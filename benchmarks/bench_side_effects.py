"""Benchmark: plain eager torch before and after a Simulator ran in the same process.

Not a test. MobileNetV2 (the registry's architecture, random weights, BatchNorm folded), one
1x3x224x224 image, ``model(x)`` under ``torch.no_grad()``, wall time. Three worker processes
build the same model and take turns timing it (``--rounds`` rounds of ``--calls`` calls each,
order alternating; a round counts by its median call, a condition by the median of its rounds):

- ``clean`` never builds a Simulator (the baseline);
- ``mobilenet`` builds a Simulator on the same module, calibrates it, runs fake and fixed;
- ``lut`` runs a Simulator in fixed mode on a conv -> sigmoid model whose int16 sigmoid table
  is evaluated on 2**22 codes (the large-LUT path), as a long loop does: until the table's
  gather has switched to its compiled kernel (``quantlab.numerics.lut.gather``, about 64
  runs; a failed build fails the benchmark, as the state would not be the one measured).

Phase A times the three before any Simulator exists (a control: same processes, nothing run);
phase B after the two Simulators ran. Besides wall time, each worker reports the voluntary
context switches of all its threads per call (threads sleeping in the kernel instead of
spinning between parallel regions; load on the machine barely moves this count) and its
thread count. Claim checked: in phase B each worker's time over ``clean``'s equals its phase A
ratio within noise, and its switches per call do not grow.

    .venv/bin/python benchmarks/bench_side_effects.py [--rounds 15] [--calls 20] [--threads 2]

Results: reports/benchmarks/side_effects.{csv,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "benchmarks"
WARMUP = 10
WORKERS = ("clean", "mobilenet", "lut")
DESCRIPTION = {
    "clean": "no Simulator ever",
    "mobilenet": "a Simulator calibrated MobileNetV2 and ran it in fake and fixed mode",
    "lut": "a Simulator ran a conv -> int16 sigmoid model (2**22 LUT codes) in fixed mode "
    "until its LUT gather switched to the compiled kernel",
}


def _model_and_input():
    from quantlab.models import build_model
    from quantlab.models.schema import ModelConfig

    bundle = build_model(ModelConfig(name="mobilenet_v2", pretrained=False))
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return bundle.module, x


def _switches() -> tuple[int, int]:
    """(voluntary context switches summed over this process's threads, thread count)."""
    total, threads = 0, 0
    for tid in os.listdir("/proc/self/task"):
        try:
            status = Path(f"/proc/self/task/{tid}/status").read_text()
        except OSError:
            continue
        total += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        threads += 1
    return total, threads


def _time_calls(model, x, calls: int) -> dict:
    times = []
    with torch.no_grad():
        s0, _ = _switches()
        for _ in range(calls):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
        s1, threads = _switches()
    return {"times": times, "switches": (s1 - s0) / calls, "threads": threads}


def _run_simulator(kind: str, model, x) -> None:
    from torch import nn

    from quantlab.numerics.dtypes import DType
    from quantlab.numerics.lut import gather
    from quantlab.qconfig import OpQConfig, QConfigSpec
    from quantlab.simulate import Mode, Simulator

    gen = torch.Generator().manual_seed(1)
    if kind == "mobilenet":
        sim = Simulator(model, "j6m")
        sim.calibrate([(torch.randn(1, 3, 224, 224, generator=gen),)], progress=False)
        for mode in (Mode.FAKE, Mode.FIXED):
            sim.run(x, mode=mode)
    elif kind == "lut":
        net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.Sigmoid()).eval()
        big = torch.randn(1, 3, 256, 256, generator=gen)  # sigmoid on 64 * 256 * 256 = 2**22
        int16 = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)
        sim = Simulator(net, "j6m", QConfigSpec(by_type={"sigmoid": int16}))
        sim.calibrate([(big,)], progress=False)
        # a long loop's state: run until the LUT gather has switched to its compiled kernel
        t0 = time.perf_counter()
        while gather.KERNELS.loaded is None and gather.KERNELS.failed is None:
            sim.run(big, mode=Mode.FIXED)
            if time.perf_counter() - t0 > 600:
                raise RuntimeError("the LUT gather did not switch to its compiled kernel in 600 s")
        if gather.KERNELS.failed is not None:
            raise RuntimeError(f"the compiled LUT gather failed: {gather.KERNELS.failed}")


def worker(kind: str, threads: int) -> None:
    """Serve commands on stdin, one per line: ``time N`` (time N eager calls, print their wall
    times, switches per call and thread count as JSON) or ``simulate`` (run this worker's
    Simulator, if it has one)."""
    torch.set_num_threads(threads)
    model, x = _model_and_input()
    _time_calls(model, x, WARMUP)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "time":
            print(json.dumps(_time_calls(model, x, int(cmd[1]))), flush=True)
        elif cmd[0] == "simulate":
            _run_simulator(kind, model, x)
            _time_calls(model, x, WARMUP)
            print(json.dumps({"simulated": True}), flush=True)
        else:
            raise ValueError(f"unknown command {line!r}")


class _Worker:
    def __init__(self, kind: str, threads: int) -> None:
        cmd = [sys.executable, __file__, "--worker", kind, "--threads", str(threads)]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.ask(None)

    def ask(self, command: str | None):
        if command is not None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker stopped (exit code {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def _phase(workers: dict, rounds: int, calls: int) -> dict:
    """Per worker: per-round median call time (s), switches per call and thread count."""
    out = {k: {"rounds": [], "switches": [], "threads": 0} for k in workers}
    kinds = list(workers)
    for r in range(rounds):
        for k in kinds if r % 2 == 0 else kinds[::-1]:
            res = workers[k].ask(f"time {calls}")
            out[k]["rounds"].append(statistics.median(res["times"]))
            out[k]["switches"].append(res["switches"])
            out[k]["threads"] = res["threads"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", default=None, choices=WORKERS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.threads)
        return
    workers = {k: _Worker(k, args.threads) for k in WORKERS}
    try:
        before = _phase(workers, args.rounds, args.calls)
        for w in workers.values():
            w.ask("simulate")
        after = _phase(workers, args.rounds, args.calls)
    finally:
        for w in workers.values():
            w.close()
    med = statistics.median
    rows = []
    for phase, data in (("A: before any Simulator", before), ("B: after", after)):
        base = med(data["clean"]["rounds"])
        for k in WORKERS:
            d = data[k]
            rows.append(
                {
                    "phase": phase,
                    "worker": k,
                    "condition": "no Simulator yet" if phase.startswith("A") else DESCRIPTION[k],
                    "median_ms": 1e3 * med(d["rounds"]),
                    "ratio_to_clean": med(d["rounds"]) / base,
                    "min_round_ms": 1e3 * min(d["rounds"]),
                    "max_round_ms": 1e3 * max(d["rounds"]),
                    "voluntary_switches_per_call": med(d["switches"]),
                    "threads": d["threads"],
                    "rounds": args.rounds,
                    "calls_per_round": args.calls,
                    "torch_threads": args.threads,
                }
            )
    table = pd.DataFrame(rows)
    from quantlab.report import markdown_table
    from quantlab.report.io import atomic_write_csv, atomic_write_text

    OUT.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(table, OUT / "side_effects.csv")
    by = table.set_index(["phase", "worker"])
    lines = ["# Eager torch before and after a Simulator: MobileNetV2 (BN folded), 1x3x224x224", ""]
    for k in WORKERS[1:]:
        a, b = by.loc[("A: before any Simulator", k)], by.loc[("B: after", k)]
        lines.append(
            f"- after {DESCRIPTION[k]}: {b.ratio_to_clean:.3f}x the eager time of the clean "
            f"process ({b.median_ms:.2f} ms; before: {a.ratio_to_clean:.3f}x, "
            f"{a.median_ms:.2f} ms); voluntary context switches per call "
            f"{a.voluntary_switches_per_call:.1f} -> {b.voluntary_switches_per_call:.1f}, "
            f"threads {int(a.threads)} -> {int(b.threads)}"
        )
    lines += [
        f"- plain `model(x)` under `torch.no_grad()`, {args.threads} torch threads, wall time; "
        f"each round is the median of {args.calls} calls, and the processes take turns round "
        "by round. On a shared machine wall time swings with other load; compare the ratios, "
        "and the context switches, which load barely moves.",
        "",
        markdown_table(table.round(3)),
        "",
        "Reproduce: `.venv/bin/python benchmarks/bench_side_effects.py`",
        "",
    ]
    atomic_write_text(OUT / "side_effects.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
