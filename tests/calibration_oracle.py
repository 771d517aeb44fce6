"""Independent float64 numpy twins of the calibration rules' building blocks (for tests only).

Nothing here calls quantlab: scales, rounding and fake quantization are written out again from
their definitions, so a test comparing a rule with these checks the rule, not the library twice.
"""

from __future__ import annotations

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def scale(amax: float, rule: str, qmin: int = -128, qmax: int = 127) -> float:
    """The scale of ``amax`` under a rule name: half_range, qmax or pot (float32 value)."""
    if rule == "half_range":
        s = amax / ((qmax - qmin) / 2)
    elif rule == "qmax":
        s = amax / qmax
    elif rule == "pot":
        s = 2.0 ** np.ceil(np.log2(max(amax / qmax, EPS32)))
    else:
        raise ValueError(rule)
    return float(max(np.float32(s), np.float32(EPS32)))


def rnd(t: np.ndarray, mode: str) -> np.ndarray:
    if mode == "half_even":
        return np.round(t)
    if mode == "half_away":
        return np.sign(t) * np.floor(np.abs(t) + 0.5)
    if mode == "half_up":
        return np.floor(t + 0.5)
    raise ValueError(mode)


def fake_quant(x: np.ndarray, s: float, qmin: int, qmax: int, mode: str) -> np.ndarray:
    return np.clip(rnd(x / s, mode), qmin, qmax) * s


def sse(x, amax, rule, qmin=-128, qmax=127, mode="half_even") -> float:
    """Sum of squared fake-quant errors of ``x`` at candidate ``amax``."""
    return sse_at(x, scale(amax, rule, qmin, qmax), qmin, qmax, mode)


def sse_at(x, s: float, qmin=-128, qmax=127, mode="half_even") -> float:
    """Sum of squared fake-quant errors of ``x`` at scale ``s``."""
    x = np.asarray(x, dtype=np.float64)
    return float(((fake_quant(x, s, qmin, qmax, mode) - x) ** 2).sum())


def ema(ranges, c: float = 0.01):
    lo, hi = ranges[0]
    for a, b in ranges[1:]:
        lo, hi = lo + c * (a - lo), hi + c * (b - hi)
    return lo, hi


def amax_of(r) -> float:
    return max(-r[0], r[1], 0.0)


def bin_integral(lo, hi, s, qmin, qmax, points: int = 4001):
    """(rounding, clipping) error integrals over [lo, hi] of one bin by dense trapezoids."""
    x = np.linspace(lo, hi, points)
    t = x / s
    q = np.clip(np.round(t), qmin, qmax)
    err = (q * s - x) ** 2
    clipped = (t > qmax + 0.5) | (t < qmin - 0.5)
    r = np.trapezoid(np.where(clipped, 0.0, err), x)
    c = np.trapezoid(np.where(clipped, err, 0.0), x)
    return r, c


def hist_objective(counts, edges, s, gamma=1.0, qmin=-128, qmax=127, points=801) -> float:
    """sum over bins of count / width * (rounding + gamma * clipping integral), dense trapezoids
    over all non-empty bins at once."""
    counts, edges = np.asarray(counts, dtype=np.float64), np.asarray(edges, dtype=np.float64)
    keep = counts > 0
    lo, hi = edges[:-1][keep], edges[1:][keep]
    u = np.linspace(0.0, 1.0, points)
    x = lo[:, None] + (hi - lo)[:, None] * u[None, :]
    t = x / s
    err = (np.clip(np.round(t), qmin, qmax) * s - x) ** 2
    clipped = (t > qmax + 0.5) | (t < qmin - 0.5)
    err = np.where(clipped, gamma * err, err)
    per_bin = np.trapezoid(err, u, axis=1)  # the integral over the bin divided by its width
    return float((counts[keep] * per_bin).sum())


def kl_threshold(counts: np.ndarray, width: float, levels: int) -> float:
    """The KLObserver search straight from its description, one candidate at a time."""
    h = np.array(counts, dtype=np.float64)
    h[0] = h[1]
    divergences = []
    for i in range(128, len(h) + 1):
        level_of = np.arange(i) * levels // i
        full = h[:i] != 0
        totals = np.bincount(level_of[full], weights=h[:i][full], minlength=levels)
        members = np.bincount(level_of[full], minlength=levels)
        q = np.where(full, totals[level_of] / np.maximum(members[level_of], 1), 0.0)
        p = h[:i].copy()
        p[-1] += h[i:].sum()
        p, q = p / p.sum(), q / q.sum() + 1e-10
        divergences.append(float(np.sum(p[p > 0] * np.log(p[p > 0] / q[p > 0]))))
    sums = [sum(divergences[t : t + 9]) for t in range(len(divergences) - 10)]
    best = max(t for t, v in enumerate(sums) if v == min(sums))
    return (best + 128 + 4) * width
