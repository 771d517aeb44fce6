"""Many candidate tables at once: their entries, index multipliers and integer outputs, exactly as
a built SegmentLut holds and evaluates them (geometry: table.py; integer contract: segment.py).

A table between input codes d0 < d1 with n = ``entries`` holds
``T[k] = saturate(round(g((d0 + k (d1 - d0) / (n - 1)) s_in) / s_out))``, k = 0..n-1, rounded by
``LutFormat.table_round``; its index multiplier (m, r) is ``slope_bits``-bit
``m = round((n - 1) 2^F 2^r / (d1 - d0))`` with r in [0, 31] as large as fits. A code a in the
table answers ``idx = min(((a - d0) m) >> r, (n - 1) << F)``, ``j = idx >> F``,
``w = idx & (2^F - 1)``, ``y = saturate(round((T[j] << F + (T[j+1] - T[j]) w) / 2^F))`` with
``LutFormat.interp_round`` and T[n] := T[n-1]. Everything is numpy int64 (products < 2^47).

Target values: ``target_values`` evaluates g on a flat float64 tensor padded to a multiple of
TARGET_BLOCK elements, in calls of TARGET_CHUNK elements. torch's vectorised kernels and their
scalar remainder loop can differ by one ulp (measured for sigmoid and silu), and torch splits an
elementwise op of more than its parallel grain (32768 elements; for transcendental kernels such
as sin, tanh and erf somewhere between 1024 and 2048, measured) into one chunk per thread, each
with its own remainder. A call of at most TARGET_CHUNK elements runs on the calling thread, so
every table entry, of a built table or of a candidate, comes from the vectorised kernel whatever
the batch it is computed in and whatever torch's thread count (which is left alone); and a build,
thousands of such calls, never waits for intra-op threads (on a busy machine a parallel call
waits for a descheduled worker: builds took 2-15x longer on 2 threads than on 1). Once a process
has called torch.set_num_threads, MKL's vector math no longer sizes its thread count by the call
and runs even these small calls on every thread (measured); quantlab never calls it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.formats import LutFormat
from quantlab.numerics.rounding import Round, round_float, rshift_round_np

TargetFn = Callable[[Tensor], Tensor]
TARGET_BLOCK = 64  # pad target evaluations to this many elements (>= any SIMD loop unroll)
TARGET_CHUNK = 1 << 10  # elements per call of g, a multiple of TARGET_BLOCK: torch runs its
# transcendental kernels (sin, cos, exp, log, sqrt, tanh, erf, round, floor) on its intra-op
# threads from well below its 32768-element grain (measured: 1536 elements of tanh did, 1024 of
# none did)
MAX_SHIFT = 31  # index multiplier shifts r in [0, MAX_SHIFT] (table.py's _fit_mantissa)


def target_values(g: TargetFn, x: np.ndarray | Tensor) -> np.ndarray:
    """g at the float64 positions ``x`` (any shape), computed on a flat tensor padded (with its
    last value) to a multiple of TARGET_BLOCK, in calls of TARGET_CHUNK elements (each runs on
    the calling thread); float64 numpy, shape of x."""
    t = torch.as_tensor(x, dtype=torch.float64).reshape(-1)
    n = t.numel()
    if n == 0:
        return np.zeros(np.shape(x), dtype=np.float64)
    pad = (-n) % TARGET_BLOCK
    if pad:
        t = torch.cat([t, t[-1:].expand(pad)])
    t = t.contiguous()
    y = torch.cat([g(t[i : i + TARGET_CHUNK]) for i in range(0, t.numel(), TARGET_CHUNK)])
    return y[:n].numpy().reshape(np.shape(x))


def quantize_targets(y: np.ndarray, out_scale: float, out_dtype: DType, mode: Round) -> np.ndarray:
    """``saturate(round(y / out_scale))`` by ``mode`` in float64 (int64 codes, shape of y); a
    non-finite target is an error (a clamp rule is missing). Computed in calls of TARGET_CHUNK
    elements (below torch's parallel grain: no thread wake-ups for many small tables)."""
    t = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64)).reshape(-1)
    out = np.empty(t.numel(), dtype=np.int64)
    for i in range(0, t.numel(), TARGET_CHUNK):  # elementwise; chunks run on the calling thread
        c = t[i : i + TARGET_CHUNK]
        if not bool(torch.isfinite(c).all()):
            raise ValueError("a LUT target produced a non-finite value (a clamp rule is missing)")
        r = round_float(c / out_scale, mode).clamp(out_dtype.qmin, out_dtype.qmax)
        out[i : i + TARGET_CHUNK] = r.to(torch.int64).numpy()
    return out.reshape(np.shape(y))


def sample_positions(d0: np.ndarray, d1: np.ndarray, k: np.ndarray, entries: int) -> np.ndarray:
    """Input-code positions ``d0 + k ((d1 - d0) / (entries - 1))`` (float64, broadcast), the same
    float operations, in the same order, as table.py's sampling."""
    d0 = np.asarray(d0, dtype=np.int64)
    step = (np.asarray(d1, dtype=np.int64) - d0) / (entries - 1)
    return d0 + np.asarray(k, dtype=np.float64) * step


def table_entries(
    g: TargetFn,
    d0: np.ndarray,
    d1: np.ndarray,
    fmt: LutFormat,
    in_scale: float,
    out_scale: float,
    out_dtype: DType,
) -> np.ndarray:
    """The int64 entries [P, entries] of the P tables ``[d0[p], d1[p]]`` (module docstring)."""
    d0 = np.asarray(d0, dtype=np.int64).reshape(-1, 1)
    d1 = np.asarray(d1, dtype=np.int64).reshape(-1, 1)
    k = np.arange(fmt.entries, dtype=np.float64)[None, :]
    x = sample_positions(d0, d1, k, fmt.entries) * in_scale
    return quantize_targets(target_values(g, x), out_scale, out_dtype, fmt.table_round)


def index_multipliers(
    widths: np.ndarray, entries: int, frac_bits: int, bits: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, r, ok) for tables ``widths`` input codes wide: ``m = round(target 2^r)`` (ties to
    even) with ``target = ((entries - 1) << frac_bits) / width`` and the largest r in
    [0, MAX_SHIFT] with ``|m| <= 2^(bits-1) - 1``. ``ok`` is False where even r = 0 does not fit
    (such a table is too narrow to index; build_lut refuses it)."""
    widths = np.asarray(widths, dtype=np.int64)
    uniq, inv = np.unique(widths, return_inverse=True)
    target = ((entries - 1) << frac_bits) / np.maximum(uniq, 1)
    shifts = np.arange(MAX_SHIFT, -1, -1, dtype=np.int64)
    m = np.round(target[:, None] * np.exp2(shifts.astype(np.float64))[None, :])
    fits = np.abs(m) <= (1 << (bits - 1)) - 1
    first = fits.argmax(axis=1)
    ok = fits.any(axis=1) & (uniq >= 1)
    mult = np.where(ok, m[np.arange(len(uniq)), first], 0).astype(np.int64)
    shift = np.where(ok, shifts[first], 0)
    return mult[inv].reshape(widths.shape), shift[inv].reshape(widths.shape), ok[inv]


def interpolate(
    t0: np.ndarray, t1: np.ndarray, w: np.ndarray, fmt: LutFormat, out_dtype: DType
) -> np.ndarray:
    """``saturate(round((t0 << F + (t1 - t0) w) / 2^F))`` with ``fmt.interp_round`` (int64)."""
    f = fmt.index_frac_bits
    v = (t0 << f) + (t1 - t0) * w
    if f and fmt.interp_round is Round.HALF_UP:
        y = (v + (1 << (f - 1))) >> f  # the common case, without the general helper's extras
    else:
        y = rshift_round_np(v, f, fmt.interp_round)
    return np.clip(y, out_dtype.qmin, out_dtype.qmax)
