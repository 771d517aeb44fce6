"""The LUT benchmarks' shared case (an int16 sigmoid table on 2**log2n codes), and driving its
gather to the compiled tier the way a loop does (``quantlab.numerics.lut.gather``): call
``lut.evaluate`` until the process has gathered enough codes serially and compiled."""

from __future__ import annotations

import time

import torch

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import build_lut, gather

S_IN, S_OUT = 8 / 32767.5, 1 / 32767.5  # int16 scales: inputs within +-8, outputs within +-1


def sigmoid_case(log2n: int) -> tuple:
    """(x, codes, lut, build_s): 2**log2n float32 values (3 times N(0, 1), seed 0), their int16
    codes at ``S_IN``, the built int16 sigmoid table with its code map expanded, and the
    seconds that build and expansion took."""
    x = torch.randn(1 << log2n, generator=torch.Generator().manual_seed(0)) * 3
    codes = torch.round(x / S_IN).clamp(-32768, 32767).to(torch.int16)
    t0 = time.perf_counter()
    lut = build_lut("sigmoid", DType.INT16, S_IN, DType.INT16, S_OUT)
    lut.code_map()  # expand once; cached on the table
    return x, codes, lut, time.perf_counter() - t0


def run_until_compiled(lut, codes, limit_s: float = 300.0) -> dict:
    """Evaluate ``lut`` on ``codes`` until the compiled kernel serves the calls (or compiling
    failed, or ``limit_s`` passed). Returns the number of calls, the codes gathered serially,
    the wall seconds of the whole loop, those of the call that compiled, and whether it did."""
    t0 = time.perf_counter()
    calls, switch_s = 0, 0.0
    while gather.KERNELS.loaded is None and gather.KERNELS.failed is None:
        if time.perf_counter() - t0 > limit_s:
            break
        before = time.perf_counter()
        lut.evaluate(codes)
        calls += 1
        if gather.KERNELS.loaded is not None or gather.KERNELS.failed is not None:
            switch_s = time.perf_counter() - before
    return {
        "calls": calls,
        "serial_codes": gather.TIERS.serial_codes,
        "loop_s": time.perf_counter() - t0,
        "compile_call_s": switch_s,
        "compiled": gather.KERNELS.loaded is not None,
        "failed": gather.KERNELS.failed,
    }


def describe(run: dict) -> str:
    """One sentence on how the switch went, for a report."""
    if not run["compiled"]:
        why = run["failed"] or "not within the time limit"
        return f"The compiled gather did not take over ({why}); the figures are the serial tier."
    if run["serial_codes"] == 0:  # no build to rent against (gather's module docstring)
        how = (
            "it was loaded already in this process"
            if run["calls"] == 0
            else "loading it from the cache folder, where an earlier process built it, took "
            f"{run['compile_call_s'] * 1e3:.1f} ms of the first call"
        )
        return (
            f"The compiled gather served from the first call, as its library needed no build "
            f"({how}). Timed after the switch."
        )
    return (
        f"The compiled gather took over after {run['calls']} calls "
        f"({run['serial_codes']:,} codes gathered serially, the switch threshold "
        f"{gather.COMPILE_AFTER:,}); that loop took {run['loop_s']:.2f} s, of which the call "
        f"that built the kernel (or loaded it from the cache folder, where an earlier process "
        f"built it) took {run['compile_call_s'] * 1e3:.1f} ms. Timed after the switch."
    )
