"""``python -m quantlab.sweep <sweep folder> [--no-plots]``: (re)write a sweep's summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantlab.sweep.summary import find_jobs, summarize_sweep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quantlab.sweep", description=__doc__)
    parser.add_argument("sweep_dir", type=Path, help="the sweep folder (hydra.sweep.dir)")
    parser.add_argument("--no-plots", action="store_true", help="write the tables only")
    args = parser.parse_args(argv)
    summary = summarize_sweep(args.sweep_dir, plots=not args.no_plots)
    jobs = find_jobs(args.sweep_dir)
    print(
        f"{sum(j.finished for j in jobs)}/{len(jobs)} jobs finished; {len(summary)} rows in "
        f"{args.sweep_dir / 'summary.csv'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
