"""Where a segment LUT puts its dividing points: the vendor's two rules, manual points, and ours.

Every strategy returns ``tables + 1`` increasing float points ``lo = p_0 < ... < p_T = hi`` on the
table range; table ``i`` covers ``[p_i, p_{i+1}]``. Points are later rounded to input codes
(table.py). ``g`` is the table's target function on float64 tensors (finite everywhere).

EVENLY:         equal widths, ``p_i = lo + i (hi - lo) / T`` (vendor ``evenly``, j6-numerics s.3).
CURVATURE:      the vendor's ``curvature`` rule exactly: g on 257 points (256 intervals), |g''| by
                finite differences (last value repeated), cumulative sum, and a point at the first
                grid node where ``floor(cumsum / (total / T))`` reaches each of 1..T-1
                (horizon-plugin.md s.1.4). Fewer points (a near-vertical g) are padded with hi.
SQRT_CURVATURE: ours: equidistribute the integral of sqrt|g''| (de Boor's rule for linear
                pieces, the asymptotically optimal density; bit-exact-emulation.md s.4.3), on a
                4096-interval grid with linear interpolation of the cumulative integral.
MINIMAX:        ours: bisection on the error level eps; for each eps the tables are laid greedily
                from lo, each as wide as its modelled error (``table_errors``: ``entries``
                uniform samples, linear interpolation read at the floored F-bit index) stays
                <= eps; the smallest feasible eps wins. build_lut then keeps the candidate with
                the lowest *measured* integer error among MINIMAX, SQRT_CURVATURE, EVENLY and
                CURVATURE and refines its inner points by coordinate descent on that measured
                error (search.py), so MINIMAX is never worse than either vendor rule.
OPTIMAL:        ours: the smallest max error over every input code, through the integer evaluation
                itself, certified over a stated candidate set (optimal.py).
DATA:           ours: the smallest error weighted by the op's input histogram, with the max error
                at most ``LutSpec.data_error_factor`` x OPTIMAL's (data_weighted.py); needs the
                histogram (``build_lut(..., histogram=...)``).
MANUAL:         user points (``LutSpec.dividing_points``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

import torch
from torch import Tensor

from quantlab.numerics.lut.segments import target_values
from quantlab.numerics.rounding import Round, round_float

TargetFn = Callable[[Tensor], Tensor]

CURVATURE_INTERVALS = 256  # the vendor's accu_divide_num
SQRT_CURVATURE_INTERVALS = 4096
MINIMAX_PROBES_PER_STEP = 16  # error probes inside each table step (float model)
MINIMAX_ITERATIONS = 40
MODEL_GROUP = 1 << 15  # probes per group of ends in table_errors: torch's parallel grain for
# arithmetic (32768 elements), so the model's arithmetic runs on the calling thread


class Strategy(enum.Enum):
    """Dividing-point strategy of a segment LUT (see the module docstring for each rule)."""

    EVENLY = "evenly"
    CURVATURE = "curvature"
    SQRT_CURVATURE = "sqrt_curvature"
    MINIMAX = "minimax"
    OPTIMAL = "optimal"
    DATA = "data"
    MANUAL = "manual"


def _check_range(lo: float, hi: float, tables: int) -> None:
    if not (math.isfinite(lo) and math.isfinite(hi)) or not hi > lo:
        raise ValueError(f"table range must be finite with hi > lo, got [{lo}, {hi}]")
    if tables < 1:
        raise ValueError(f"tables must be >= 1, got {tables}")


def evenly_points(lo: float, hi: float, tables: int) -> list[float]:
    """``tables`` equal-width tables on [lo, hi]."""
    _check_range(lo, hi, tables)
    return [lo + i * (hi - lo) / tables for i in range(tables)] + [hi]


def _abs_second_difference(g: TargetFn, lo: float, hi: float, intervals: int) -> Tensor:
    """|g''| on ``intervals`` cells of [lo, hi] by finite differences, last value repeated."""
    x = torch.linspace(lo, hi, intervals + 1, dtype=torch.float64)
    step = (hi - lo) / intervals
    y = g(x)
    dy = (y[1:] - y[:-1]) / step
    ddy = ((dy[1:] - dy[:-1]) / step).abs()
    ddy = torch.nan_to_num(ddy, nan=0.0, posinf=1e300, neginf=1e300)
    return torch.cat([ddy, ddy[-1:]])


def curvature_points(g: TargetFn, lo: float, hi: float, tables: int) -> list[float]:
    """The vendor's rule: equal shares of cumsum|g''| on a 256-interval grid (module docstring)."""
    _check_range(lo, hi, tables)
    n = CURVATURE_INTERVALS
    x = torch.linspace(lo, hi, n + 1, dtype=torch.float64)
    acc = torch.cumsum(_abs_second_difference(g, lo, hi, n), 0)
    total = float(acc[-1])
    if total <= 0.0:  # a straight line: no curvature to share
        return evenly_points(lo, hi, tables)
    seg = round_float(acc / (total / tables), Round.FLOOR)
    points = [lo]
    for s, p in zip((seg + 1).tolist(), x[1:].tolist()):
        if s > tables:
            break
        if s > len(points) and len(points) < tables:
            points.append(p)
    points = points[:tables]
    points += [hi] * (tables + 1 - len(points))
    return points


def sqrt_curvature_points(g: TargetFn, lo: float, hi: float, tables: int) -> list[float]:
    """Ours: equal shares of the integral of sqrt|g''| (linear interpolation of the integral)."""
    _check_range(lo, hi, tables)
    n = SQRT_CURVATURE_INTERVALS
    x = torch.linspace(lo, hi, n + 1, dtype=torch.float64)
    dens = _abs_second_difference(g, lo, hi, n).sqrt()
    # a small floor keeps straight stretches from collapsing to zero width
    dens = dens + 1e-6 * float(dens.max().clamp_min(1e-300))
    cum = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(dens, 0)])
    total = float(cum[-1])
    targets = torch.arange(1, tables, dtype=torch.float64) * (total / tables)
    idx = torch.searchsorted(cum, targets).clamp(1, n)
    c0, c1 = cum[idx - 1], cum[idx]
    t = ((targets - c0) / (c1 - c0).clamp_min(1e-300)).clamp(0, 1)
    inner = (x[idx - 1] + t * (x[idx] - x[idx - 1])).tolist()
    return [lo] + inner + [hi]


def table_errors(
    g: TargetFn, a: float, ends: Tensor, entries: int, frac_bits: int | None = None
) -> Tensor:
    """Model of the max error of a table on [a, b] for each b in ``ends`` (float64, shape (K,)).

    ``entries`` uniform samples of g, linear interpolation L between them, probed at
    MINIMAX_PROBES_PER_STEP points of every step. With ``frac_bits`` = F the probes sit just
    below a 2^-F grid line of the step and L is read at the floored fraction, as the hardware's
    floored F-bit index does, so interpolation and index error add up where they really do.
    Table-entry and output rounding are not modelled (placement only; the integer error is
    measured separately). Ends are taken in groups whose probes stay within torch's parallel
    grain (MODEL_GROUP) and g is evaluated by ``segments.target_values``, so that no call waits
    for intra-op threads; the bits are those of one call over every end.
    """
    group = max(1, MODEL_GROUP // (entries * MINIMAX_PROBES_PER_STEP))
    if len(ends) > group:  # each end's error depends on its own values only
        parts = range(0, len(ends), group)
        return torch.cat(
            [table_errors(g, a, ends[i : i + group], entries, frac_bits) for i in parts]
        )
    steps = entries - 1
    k = torch.arange(entries, dtype=torch.float64)
    width = (ends - a).clamp_min(0.0)
    xs = a + width[:, None] * (k[None, :] / steps)  # (K, entries)
    ys = _on_calling_thread(g, xs)
    probes = (torch.arange(MINIMAX_PROBES_PER_STEP, dtype=torch.float64) + 0.5) / (
        MINIMAX_PROBES_PER_STEP
    )
    if frac_bits is None:
        frac = read = probes
    else:
        grid = float(1 << frac_bits)
        read = round_float(probes * grid, Round.FLOOR) / grid  # the floored index fraction
        frac = read + (1.0 - 1e-6) / grid  # the input just below the next grid line
    px = xs[:, :-1, None] + frac * (width[:, None, None] / steps)
    dy = ys[:, 1:] - ys[:, :-1]
    lin = ys[:, :-1, None] + read * dy[:, :, None]
    err = (_on_calling_thread(g, px) - lin).abs().amax(dim=(1, 2))
    return torch.where(width > 0, err, torch.zeros_like(err))


def _on_calling_thread(g: TargetFn, x: Tensor) -> Tensor:
    """g(x) (float64, shape of x) by ``segments.target_values``: calls small enough for torch's
    transcendental kernels to run on the calling thread, the vector kernel on every element."""
    return torch.from_numpy(target_values(g, x))


def interpolation_error(
    g: TargetFn, a: float, b: float, entries: int, frac_bits: int | None = None
) -> float:
    """``table_errors`` for one table [a, b]."""
    return float(table_errors(g, a, torch.tensor([b], dtype=torch.float64), entries, frac_bits)[0])


SEARCH_CANDIDATES = 48  # table ends tried at once (two rounds: geometric, then linear)


class _EndErrors:
    """The model errors (``table_errors``) of the candidate ends of a table starting at a, for
    one MINIMAX search (g, hi, entries, frac_bits, quantum fixed). The geometric candidates
    depend on a only and the linear ones on a and the geometric round's outcome, not on eps, so
    each is computed once and reused by every later bisection step that starts a table there
    (table starts lie on the code grid and repeat as eps converges)."""

    def __init__(self, g: TargetFn, hi: float, entries: int, frac_bits: int, quantum: float):
        self.g, self.hi, self.entries, self.frac_bits = g, hi, entries, frac_bits
        self.quantum = quantum
        self._memo: dict[tuple[float, int], tuple[Tensor, Tensor]] = {}

    def geometric(self, a: float) -> tuple[Tensor, Tensor]:
        """Ends from a + quantum to hi at SEARCH_CANDIDATES geometric steps, and their errors."""
        hit = self._memo.get((a, -1))
        if hit is None:
            total = self.hi - a
            ratio = torch.logspace(
                torch.log10(torch.tensor(self.quantum / total)), 0.0, SEARCH_CANDIDATES,
                dtype=torch.float64,
            )  # fmt: skip
            ends = a + ratio * total
            hit = self._memo[(a, -1)] = (ends, self._errors(a, ends))
        return hit

    def linear(self, a: float, n_ok: int) -> tuple[Tensor, Tensor]:
        """SEARCH_CANDIDATES ends evenly between geometric ends n_ok - 1 and n_ok, and errors."""
        hit = self._memo.get((a, n_ok))
        if hit is None:
            geo = self.geometric(a)[0]
            lo_end, hi_end = float(geo[n_ok - 1]), float(geo[n_ok])
            ends = torch.linspace(lo_end, hi_end, SEARCH_CANDIDATES, dtype=torch.float64)
            hit = self._memo[(a, n_ok)] = (ends, self._errors(a, ends))
        return hit

    def _errors(self, a: float, ends: Tensor) -> Tensor:
        return table_errors(self.g, a, ends, self.entries, self.frac_bits)


def _widest_table(model: _EndErrors, a: float, eps: float) -> float:
    """The largest end b in (a, hi] (on a grid of ``quantum``) whose table error is <= eps;
    a + quantum if none is (the table is then one code wide)."""
    hi, quantum = model.hi, model.quantum
    total = hi - a
    if total <= quantum:
        return hi
    ends, err = model.geometric(a)
    ok = err <= eps
    if bool(ok[-1]):
        return hi
    n_ok = int(ok.to(torch.int64).cumprod(0).sum())  # leading feasible candidates
    if n_ok == 0:
        return a + quantum
    ends, err = model.linear(a, n_ok)
    ok = err <= eps
    n_ok = max(1, int(ok.to(torch.int64).cumprod(0).sum()))
    b = float(ends[n_ok - 1])
    b = a + max(1.0, float(int((b - a) / quantum))) * quantum  # whole input codes
    return min(b, hi)


def _greedy(model: _EndErrors, lo: float, tables: int, eps: float) -> list[float] | None:
    """Lay tables from lo, each as wide as its modelled error allows (<= eps); None if hi is not
    reached. Table ends lie on a grid of ``quantum`` (one input code) from lo."""
    hi = model.hi
    points = [lo]
    a = lo
    for _ in range(tables):
        a = _widest_table(model, a, eps)
        points.append(a)
        if a >= hi:
            break
    if points[-1] < hi:
        return None
    points[-1] = hi
    while len(points) < tables + 1:  # reached hi early: split the widest table
        widths = [points[i + 1] - points[i] for i in range(len(points) - 1)]
        i = max(range(len(widths)), key=widths.__getitem__)
        points.insert(i + 1, points[i] + widths[i] / 2)
    return points


def minimax_points(
    g: TargetFn,
    lo: float,
    hi: float,
    tables: int,
    entries: int,
    quantum: float,
    frac_bits: int = 8,
) -> list[float]:
    """Ours: the smallest eps for which greedy tables reach hi (bisection on eps; the error
    model of ``table_errors`` with the index term)."""
    _check_range(lo, hi, tables)
    quantum = min(quantum, (hi - lo) / tables) if quantum > 0 else (hi - lo) / 65536
    start = evenly_points(lo, hi, tables)
    eps_hi = max(
        interpolation_error(g, a, b, entries, frac_bits) for a, b in zip(start[:-1], start[1:])
    )
    best = start
    if eps_hi <= 0.0:
        return best
    eps_lo = 0.0
    model = _EndErrors(g, hi, entries, frac_bits, quantum)
    for _ in range(MINIMAX_ITERATIONS):
        eps = 0.5 * (eps_lo + eps_hi)
        pts = _greedy(model, lo, tables, eps)
        if pts is None:
            eps_lo = eps
        else:
            eps_hi, best = eps, pts
        if eps_hi - eps_lo <= 1e-3 * eps_hi:
            break
    return best
