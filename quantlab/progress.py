"""Progress lines for long work (calibration, sensitivity, sweeps), printed to stderr."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

_ENABLED = True


def set_progress(enabled: bool) -> None:
    """Turn progress lines on or off for this process (``progress=false`` on the command line)."""
    global _ENABLED
    _ENABLED = enabled


def progress(
    items: Iterable[T], desc: str, total: int | None = None, every_s: float = 2.0
) -> Iterator[T]:
    """Yield ``items``, printing ``[desc] i/total (pct) elapsed, eta`` at most every ``every_s``."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    start = last = time.perf_counter()
    i = 0
    for i, item in enumerate(items, 1):
        yield item
        now = time.perf_counter()
        if _ENABLED and (now - last >= every_s or (total is not None and i == total)):
            last = now
            el = now - start
            if total:
                eta = el / i * (total - i)
                msg = f"[{desc}] {i}/{total} ({100 * i / total:.0f}%) {el:.1f}s, eta {eta:.1f}s"
            else:
                msg = f"[{desc}] {i} done, {el:.1f}s"
            print(msg, file=sys.stderr, flush=True)
