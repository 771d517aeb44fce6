"""Whether torch's int8 matrix product is fast on this machine.

``torch._int_mm`` on CPU has a vectorised kernel only where the processor offers one: it took
0.24x the time of the float32 product of the same shape on a CPU with VNNI, and about 40x on an
AVX2-only one (a scalar loop). The exact paths INT32 and INT32_SPLIT give the same bits as every
other exact path, so whether AUTO takes them is a question of speed alone, answered here once
per process by timing both products on one probe shape.
"""

from __future__ import annotations

import threading
import time

import torch

PROBE_SHAPE = (64, 256, 256)  # (M, K, N): 4.2M multiply-adds, ~0.1 ms in float32
PROBE_REPEATS = 9
PROBE_RUNS = 3  # whole measurements; the smallest ratio counts
PAYS_BELOW = 1.0  # AUTO takes the int8 product when it is faster than the float32 product

_LOCK = threading.Lock()
_STATE: dict = {"ratio": None}


def measure_int8_product(
    shape: tuple[int, int, int] = PROBE_SHAPE, repeats: int = PROBE_REPEATS
) -> float:
    """Fastest wall time of ``torch._int_mm`` on int8 (M, K) @ (K, N) over the fastest time of
    ``torch.mm`` on the same operands in float32, each measured ``repeats`` times after three
    warm-up calls, alternating, on torch's current thread count; the fastest of several runs,
    as load from other processes only ever adds time."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=gen)
    af, bf = a.to(torch.float32), b.to(torch.float32)
    runs = {"int8": lambda: torch._int_mm(a, b), "float32": lambda: torch.mm(af, bf)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(3):
        for fn in runs.values():
            fn()
    for _ in range(repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return min(times["int8"]) / max(min(times["float32"]), 1e-9)


def int8_product_ratio() -> float:
    """The smallest of ``PROBE_RUNS`` ``measure_int8_product()`` ratios, measured on the first
    call of the process and kept (one measurement alone read above 1 at times on a busy VNNI
    machine where the products' steady ratio is 0.2 to 0.5)."""
    if _STATE["ratio"] is None:
        with _LOCK:
            if _STATE["ratio"] is None:
                _STATE["ratio"] = min(measure_int8_product() for _ in range(PROBE_RUNS))
    return _STATE["ratio"]


def int8_product_pays() -> bool:
    """True when this machine's int8 matrix product beats its float32 one (``PAYS_BELOW``)."""
    return int8_product_ratio() < PAYS_BELOW
