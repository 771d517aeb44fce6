"""Benchmark: evaluating a built int16 segment LUT vs torch.sigmoid, both on 2**22 elements.

Claim checked (acceptance): one evaluation of a built int16 table (``SegmentLut.evaluate``, a
gather through the cached 65536-entry code map) costs at most 3x ``torch.sigmoid`` on the same
number of float32 elements. Also timed for context: the exact vectorised integer path without
the map (numpy int64), and the fake counterpart ``lut_fake``. Medians of ``--repeats`` runs,
interleaved so that load from other processes hits every variant alike.

Run: .venv/bin/python benchmarks/bench_lut.py [--log2n 22] [--repeats 9]
Writes reports/benchmarks/lut.csv and reports/benchmarks/lut.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut, lut_fake
from quantlab.numerics.lut.segment import evaluate_codes_int
from quantlab.report import markdown_table
from quantlab.report.io import atomic_write_csv, atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "benchmarks"
LIMIT = 3.0  # acceptance: LUT evaluation <= 3x torch.sigmoid


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=22)
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    args = ap.parse_args()
    n = 1 << args.log2n
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g) * 3
    s_in, s_out = 8 / 32767.5, 1 / 32767.5
    codes = torch.round(x / s_in).clamp(-32768, 32767).to(torch.int16)
    t_build = time.perf_counter()
    lut = build_lut("sigmoid", DType.INT16, s_in, DType.INT16, s_out)
    lut.code_map()  # expand once; cached on the table
    t_build = time.perf_counter() - t_build
    assert torch.equal(lut.evaluate(codes[:4096]), lut.evaluate_reference(codes[:4096]))

    variants = {
        "torch.sigmoid (float32, baseline)": lambda: torch.sigmoid(x),
        "SegmentLut.evaluate (int16 gather)": lambda: lut.evaluate(codes),
        "lut_fake (float64 f + fake quant)": lambda: lut_fake(x, "sigmoid", DType.INT16, s_out),
        "integer path without the map (numpy int64)": lambda: evaluate_codes_int(lut, codes),
    }
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():  # warm-up
            fn()
        for _ in range(args.repeats):
            for name, fn in variants.items():
                times[name].append(_time(fn))
        base = statistics.median(times["torch.sigmoid (float32, baseline)"])
        rows += [
            {
                "threads": threads,
                "variant": name,
                "elements": n,
                "median_s": statistics.median(ts),
                "min_s": min(ts),
                "ratio_to_sigmoid": statistics.median(ts) / base,
                "repeats": len(ts),
            }
            for name, ts in times.items()
        ]
    df = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(df, OUT / "lut.csv")
    lut_rows = df[df.variant.str.startswith("SegmentLut")]
    claims = [
        f"- {int(r.threads)} thread(s): evaluating a built int16 sigmoid table on "
        f"2^{args.log2n} = {n} codes takes {r.ratio_to_sigmoid:.2f}x the median time of "
        f"torch.sigmoid on as many float32 values; this "
        f"{'meets' if r.ratio_to_sigmoid <= LIMIT else 'misses'} the <= {LIMIT:.0f}x target."
        for r in lut_rows.itertuples()
    ]
    md = [
        "# LUT evaluation speed",
        "",
        *claims,
        f"- Building the table and expanding its 65536-entry code map took {t_build:.3f} s "
        "(once per scale/dtype/spec; cached).",
        f"- torch {torch.__version__}, {platform.machine()}, Python "
        f"{platform.python_version()}; medians of {args.repeats} interleaved runs (ratios are "
        "what to trust: torch.sigmoid's time moves with the allocator's state).",
        "",
        markdown_table(df),
        "",
        "Reproduce: `.venv/bin/python benchmarks/bench_lut.py`",
        "",
    ]
    atomic_write_text(OUT / "lut.md", "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
