"""Benchmark: calibration time against the eager forwards over the same batches.

MobileNetV2 (pretrained, BatchNorm folded) calibrated on ``--photos`` real photos (one per
batch) for platform j6m, whose MSE observer searches 95 candidate scales per activation on every
batch (``quantlab.calibration.mse_search``). Timed in interleaved rounds, wall time, medians:

- ``eager forwards``: ``model(x)`` under ``torch.no_grad()`` for every calibration batch (the
  baseline: what the model itself costs on the same data);
- ``quantlab calibrate``: ``Simulator.calibrate`` on a new Simulator (the MSE search selects
  a batch's values through numpy and sorts float32 ones by ``calibration.sort_native``'s radix
  sort);
- ``quantlab calibrate, numpy sort``: the same with numpy's sort of the float64 values, the
  form the radix sort replaced;
- ``quantlab calibrate, torch sort and selection``: the same with the value selection and sort
  done by torch (``x[x != 0]``, ``torch.sort``), the forms numpy's replaced before.
  The same values in the same order, so the same choices.

Checked: the three calibrations give the same fake-mode output on a photo, bit for bit. The
process
keeps freed memory (``quantlab.host_memory``), as ``python -m quantlab`` does, unless
``--system-malloc``.

    .venv/bin/python benchmarks/bench_calibrate.py [--photos 8] [--rounds 5] [--threads 2]

Results: reports/benchmarks/calibrate.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from quantlab.calibration import mse_search
from quantlab.data import load_data
from quantlab.data.schema import DataConfig
from quantlab.host_memory import keep_freed_memory
from quantlab.models import build_model
from quantlab.report import markdown_table
from quantlab.report.io import atomic_write_text
from quantlab.simulate import Mode, Simulator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_info import cpu_description, shown_path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "benchmarks"
EAGER = "eager forwards (baseline)"
QUANTLAB = "quantlab calibrate"
NUMPY_SORT = "quantlab calibrate, numpy sort"
TORCH_FORMS = "quantlab calibrate, torch sort and selection"


def _torch_nonzero_float64(x):
    flat = x.detach().reshape(-1)
    return flat[flat != 0].to(torch.float64)


def _torch_sorted_values(x):
    return torch.sort(x).values


_FORMS = ("nonzero_float64", "sorted_values", "_nonzero_numpy", "sort_float64")


def _calibrated_output(module, batches, probe, variant: str):
    """(seconds to calibrate a new Simulator on ``batches``, its fake-mode output on
    ``probe``) with the MSE search's selection and sort of ``variant``."""
    saved = {name: getattr(mse_search, name) for name in _FORMS}
    if variant in (NUMPY_SORT, TORCH_FORMS):
        mse_search.sort_float64 = lambda x: None  # no radix sort: sorted_values sorts
    if variant == TORCH_FORMS:
        mse_search._nonzero_numpy = lambda x: None  # nonzero_float64 selects
        mse_search.nonzero_float64 = _torch_nonzero_float64
        mse_search.sorted_values = _torch_sorted_values
    try:
        sim = Simulator(module, "j6m")
        t0 = time.perf_counter()
        sim.calibrate(batches, progress=False)
        seconds = time.perf_counter() - t0
    finally:
        for name, fn in saved.items():
            setattr(mse_search, name, fn)
    return seconds, sim.run(*probe, mode=Mode.FAKE)


def bench(photos: int, rounds: int) -> dict:
    bundle = build_model("mobilenet_v2")
    ds = load_data(DataConfig(name="photos", num_calib=photos, num_eval=1), bundle.name)
    module, batches, probe = bundle.module, list(ds.calib), ds.eval[0]

    def eager():
        t0 = time.perf_counter()
        with torch.no_grad():
            for b in batches:
                module(*b)
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {EAGER: [], QUANTLAB: [], NUMPY_SORT: [], TORCH_FORMS: []}
    outputs = {}
    eager()  # warm-up
    for r in range(rounds):
        order = [QUANTLAB, NUMPY_SORT, TORCH_FORMS]
        order = order if r % 2 == 0 else order[::-1]
        times[EAGER].append(eager())
        for name in order:
            seconds, out = _calibrated_output(module, batches, probe, name)
            times[name].append(seconds)
            outputs[name] = out
        print(f"round {r + 1}/{rounds}", file=sys.stderr)
    base = statistics.median(times[EAGER])
    rows = [
        {
            "variant": name,
            "median_s": statistics.median(ts),
            "min_s": min(ts),
            "max_s": max(ts),
            "x_eager": statistics.median(ts) / base,
        }
        for name, ts in times.items()
    ]
    return {
        "model": "mobilenet_v2",
        "photos": len(batches),
        "rounds": rounds,
        "rows": rows,
        "same_fake_output": all(
            torch.equal(outputs[QUANTLAB], outputs[v]) for v in (NUMPY_SORT, TORCH_FORMS)
        ),
        "over_numpy_sort": statistics.median(times[QUANTLAB])
        / statistics.median(times[NUMPY_SORT]),
        "numpy_over_torch_forms": statistics.median(times[NUMPY_SORT])
        / statistics.median(times[TORCH_FORMS]),
    }


def report(r: dict) -> str:
    table = [
        {
            "variant": row["variant"],
            "median (s)": f"{row['median_s']:.2f}",
            "min (s)": f"{row['min_s']:.2f}",
            "max (s)": f"{row['max_s']:.2f}",
            "x eager": f"{row['x_eager']:.1f}",
        }
        for row in r["rows"]
    ]
    return "\n".join(
        [
            "# Benchmark: calibration against the eager forwards over the same batches",
            "",
            f"{r['model']} calibrated for j6m on {r['photos']} photos (one per batch); medians of "
            f"{r['rounds']} interleaved rounds, wall time, {r['threads']} torch threads, torch "
            f"{r['torch']}.",
            "",
            f"CPU: {r['cpu']}. Memory: {r['malloc']}. Load average (1, 5, 15 min) "
            f"{r['load_before']} before, {r['load_after']} after, on {r['cpu_count']} cores.",
            "",
            markdown_table(pd.DataFrame(table)),
            "",
            "- quantlab's calibration (the radix sort of float32 values) over the same "
            f"calibration with numpy's sort of float64 values: **{r['over_numpy_sort']:.2f}x**.",
            "- With numpy's sort, over the same with the selection and sort done by torch: "
            f"**{r['numpy_over_torch_forms']:.2f}x**.",
            "- The three calibrations give the same fake-mode output on a photo, bit for bit: "
            f"**{r['same_fake_output']}**.",
            "",
            "Reproduce: `.venv/bin/python benchmarks/bench_calibrate.py"
            + ("" if r["freed_memory_kept"] else " --system-malloc")
            + f" --photos {r['photos']} --rounds {r['rounds']}"
            + (f" --out {r['out']}" if r["out"] != shown_path(OUT) else "")
            + "`",
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--photos", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--system-malloc", action="store_true", help="leave the C library's malloc")
    args = ap.parse_args()
    kept = False if args.system_malloc else keep_freed_memory()
    torch.set_num_threads(args.threads)
    load_before = [round(v, 2) for v in os.getloadavg()]
    r = bench(args.photos, args.rounds)
    r.update(
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        cpu=cpu_description(),
        cpu_count=os.cpu_count(),
        load_before=load_before,
        load_after=[round(v, 2) for v in os.getloadavg()],
        freed_memory_kept=kept,
        out=shown_path(args.out),
        malloc="freed memory kept in the process (quantlab.host_memory)"
        if kept
        else "the C library's default malloc",
    )
    md = report(r)
    atomic_write_text(args.out / "calibrate.json", json.dumps(r, indent=2) + "\n")
    atomic_write_text(args.out / "calibrate.md", md)
    print(md)
    if not r["same_fake_output"]:
        raise SystemExit("the two calibrations differ")


if __name__ == "__main__":
    main()
