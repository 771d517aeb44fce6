"""Table builds run torch on the calling thread only.

A build makes thousands of small torch calls (target values of candidate tables, MINIMAX's
error model). torch hands transcendental kernels (sqrt, sin, exp, ...) to its intra-op threads
even for a few hundred elements (measured: on 2 threads torch.sqrt of 64 float64 values took
twice its 1-thread time), and every such call then waits for all of them: on a machine whose
cores are busy with other work a worker is often descheduled, and a 2-thread MINIMAX build took
5-15x the time (and CPU) of a 1-thread one (benchmarks/bench_lut.py --part build).
``calling_thread_only`` sets torch's intra-op thread count to 1 for the duration of a build and
restores it after. Tables do not change: the elementwise kernels a build uses compute each
element alone (target_values pads and chunks so that the vector kernel answers every element,
segments.py), the bench's 216 builds gave the same tables on 1 and 2 threads, and
tests/numerics/lut/test_lut_build_identity.py pins tables built on torch's default threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_lock = threading.Lock()
_depth = 0  # builds in progress (nested or on several Python threads)
_saved = 1  # torch's thread count before the outermost build


@contextmanager
def calling_thread_only() -> Iterator[None]:
    """torch intra-op threads = 1 inside (reentrant, thread-safe); the count found on entry to
    the outermost block is restored when the last block in progress exits."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = torch.get_num_threads()
            if _saved != 1:
                torch.set_num_threads(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and torch.get_num_threads() != _saved:
                torch.set_num_threads(_saved)
