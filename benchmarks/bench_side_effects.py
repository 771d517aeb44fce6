"""Benchmark: plain eager torch before and after a Simulator ran in the same process.

Not a test. MobileNetV2 (the registry's architecture, random weights, BatchNorm folded), one
1x3x224x224 image, ``model(x)`` under ``torch.no_grad()``, wall time. Two worker processes
build the same model: ``clean`` never builds a Simulator; ``used`` first times eager torch like
``clean`` (phase A, a control: two processes, no Simulator anywhere), then builds a Simulator
on the same module, calibrates it and runs it once in fake and once in fixed mode, and times
eager torch again (phase B). In each phase the two processes take turns (``--rounds`` rounds of
``--calls`` calls each, order alternating), so load from other processes hits both alike; a
round counts by its median call and a condition by the median of its rounds. Claim checked:
after / before in phase B equals the phase A control within noise.

    .venv/bin/python benchmarks/bench_side_effects.py [--rounds 15] [--calls 20] [--threads 2]

Results: reports/benchmarks/side_effects.{csv,md}.
"""

from __future__ import annotations

import argparse
import json
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


def _model_and_input():
    from quantlab.models import build_model
    from quantlab.models.schema import ModelConfig

    bundle = build_model(ModelConfig(name="mobilenet_v2", pretrained=False))
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return bundle.module, x


def _time_calls(model, x, calls: int) -> list[float]:
    out = []
    with torch.no_grad():
        for _ in range(calls):
            t0 = time.perf_counter()
            model(x)
            out.append(time.perf_counter() - t0)
    return out


def worker(threads: int) -> None:
    """Serve commands on stdin, one per line: ``time N`` (time N eager calls, print their wall
    times as JSON) or ``simulate`` (calibrate a Simulator on the model, run fake and fixed)."""
    torch.set_num_threads(threads)
    model, x = _model_and_input()
    _time_calls(model, x, WARMUP)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "time":
            print(json.dumps(_time_calls(model, x, int(cmd[1]))), flush=True)
        elif cmd[0] == "simulate":
            from quantlab.simulate import Mode, Simulator

            gen = torch.Generator().manual_seed(1)
            sim = Simulator(model, "j6m")
            sim.calibrate([(torch.randn(1, 3, 224, 224, generator=gen),)], progress=False)
            for mode in (Mode.FAKE, Mode.FIXED):
                sim.run(x, mode=mode)
            del sim
            _time_calls(model, x, WARMUP)
            print(json.dumps({"simulated": True}), flush=True)
        else:
            raise ValueError(f"unknown command {line!r}")


class _Worker:
    def __init__(self, threads: int) -> None:
        cmd = [sys.executable, __file__, "--worker", "--threads", str(threads)]
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


def _rounds(a: _Worker, b: _Worker, rounds: int, calls: int) -> tuple[list[float], list[float]]:
    """Per-round median call time (seconds) of ``a`` and of ``b``, taking turns."""
    ra, rb = [], []
    for r in range(rounds):
        order = [(a, ra), (b, rb)] if r % 2 == 0 else [(b, rb), (a, ra)]
        for w, into in order:
            into.append(statistics.median(w.ask(f"time {calls}")))
    return ra, rb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.threads)
        return
    clean, used = _Worker(args.threads), _Worker(args.threads)
    try:
        a_clean, a_used = _rounds(clean, used, args.rounds, args.calls)
        used.ask("simulate")
        b_clean, b_used = _rounds(clean, used, args.rounds, args.calls)
    finally:
        clean.close()
        used.close()
    rows = [
        ("A", "clean process", "no Simulator in either process", a_clean),
        ("A", "used process", "before its Simulator exists", a_used),
        ("B", "clean process", "no Simulator ever (before)", b_clean),
        ("B", "used process", "after a Simulator calibrated, ran fake and fixed", b_used),
    ]
    table = pd.DataFrame(
        [
            {
                "phase": phase,
                "process": proc,
                "condition": cond,
                "median_ms": 1e3 * statistics.median(ts),
                "min_round_ms": 1e3 * min(ts),
                "max_round_ms": 1e3 * max(ts),
                "rounds": args.rounds,
                "calls_per_round": args.calls,
                "threads": args.threads,
            }
            for phase, proc, cond, ts in rows
        ]
    )
    control = statistics.median(a_used) / statistics.median(a_clean)
    after = statistics.median(b_used) / statistics.median(b_clean)
    from quantlab.report import markdown_table
    from quantlab.report.io import atomic_write_csv, atomic_write_text

    OUT.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(table, OUT / "side_effects.csv")
    lines = [
        "# Eager torch before and after a Simulator: MobileNetV2 (BN folded), 1x3x224x224",
        "",
        f"- after a Simulator ran (calibrate, fake, fixed): {after:.3f}x the eager time of a "
        f"process that never built one ({1e3 * statistics.median(b_used):.2f} ms vs "
        f"{1e3 * statistics.median(b_clean):.2f} ms, medians of {args.rounds} rounds)",
        f"- control, the same two processes before any Simulator: {control:.3f}x "
        f"({1e3 * statistics.median(a_used):.2f} ms vs {1e3 * statistics.median(a_clean):.2f} ms)",
        f"- plain `model(x)` under `torch.no_grad()`, {args.threads} torch threads, wall time; "
        f"each round is the median of {args.calls} calls, and the two processes take turns round "
        "by round. On a shared machine wall time swings with other load; compare the ratios.",
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
