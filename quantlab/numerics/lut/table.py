"""Building a segment LUT's integer parameters from a function, scales and dtypes.

Geometry (j6-numerics s.3, horizon-plugin.md s.1.2), all parameters integers:
  * int8 in and int8 out (``LutFormat.direct_int8``): one direct table, ``T[q] = Q(f(q s_in))``
    for every code q; only output rounding.
  * otherwise: dividing points ``d_0 < ... < d_T`` as input codes (T = ``tables`` or fewer when
    points merge after rounding); table i holds ``entries`` samples of f at
    ``(d_i + k (d_{i+1} - d_i) / (entries - 1)) s_in``, k = 0..entries-1 (both ends), quantized
    to the output dtype/scale; codes below d_0 / above d_T use integer linear tails
    ``y = (x k + (b << lshift)) >> rshift`` with a ``slope_bits`` slope mantissa (segment.py).
    Tail slope: ``LutSpec.gradients``, else the secant of the (unsaturated) target between the
    table edge and the end of the input range, or of the adjacent table step when the table
    reaches that end (horizon-plugin.md s.1.2). The intercept keeps ``slope_bits`` significant
    bits and a left shift, ``|b << lshift| < 2**31``; a slope too steep for the mantissa
    saturates (the output saturates within one code anyway).
  * table index (assumed, s.3): ``idx = ((x - d_i) * m_i) >> r_i`` with an index multiplier
    ``m_i = round((entries - 1) 2^F 2^r_i / (d_{i+1} - d_i))`` of ``slope_bits`` bits (F =
    ``index_frac_bits``), clamped to ``(entries - 1) << F``; ``idx >> F`` picks the entry and the
    low F bits weight the linear interpolation.
Table entries are quantized with ``LutFormat.table_round`` (HALF_EVEN, like fake quant).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.analysis import _max_error_lsb, exact_lsb
from quantlab.numerics.lut.data_weighted import InputHistogram, data_points
from quantlab.numerics.lut.formats import J6_FORMAT, LutFormat, TableValues
from quantlab.numerics.lut.functions import LutFunction, default_spec, get_function
from quantlab.numerics.lut.optimal import optimal_points
from quantlab.numerics.lut.ranges import input_range
from quantlab.numerics.lut.runtime_values import runtime_codes
from quantlab.numerics.lut.search import MINIMAX_CANDIDATES, refine
from quantlab.numerics.lut.segment import SegmentLut, Tail, all_codes, evaluate_codes_int
from quantlab.numerics.lut.segment_cost import SegmentCosts, SegmentProblem
from quantlab.numerics.lut.segments import table_entries
from quantlab.numerics.lut.spec import LutSpec
from quantlab.numerics.lut.strategies import (
    Strategy,
    curvature_points,
    evenly_points,
    minimax_points,
    sqrt_curvature_points,
)
from quantlab.numerics.lut.table_store import TableStore
from quantlab.numerics.rounding import Round, round_float, round_scalar
from quantlab.numerics.scales import check_scale_float

# OPTIMAL's and DATA's seeds: each strategy's built table (MINIMAX's with its refined points)
SEED_STRATEGIES = (Strategy.EVENLY, Strategy.CURVATURE, Strategy.SQRT_CURVATURE, Strategy.MINIMAX)
TAIL_VALUE_LIMIT = 1e30  # |target| in output LSBs used for tail secants (keeps slopes finite)


def _frozen(a: np.ndarray) -> np.ndarray:
    """Read-only: a built table is shared through the build cache."""
    a.setflags(write=False)
    return a


def _check_dtype(name: str, dt: DType) -> DType:
    dt = DType.parse(dt)
    if dt not in (DType.INT8, DType.INT16):
        raise ValueError(f"{name} must be INT8 or INT16 for a LUT, got {dt.name}")
    return dt


def _round_code(v: float, in_dtype: DType, lowest: int) -> int:
    """Nearest input code (ties to even, like torch.round), clamped to [lowest, qmax]."""
    if math.isnan(v):
        raise ValueError("a dividing point is NaN")
    if math.isinf(v):
        return lowest if v < 0 else in_dtype.qmax
    return int(min(max(round_scalar(v), lowest), in_dtype.qmax))


def _quantize_values(y: Tensor, out_scale: float, out_dtype: DType, mode: Round) -> Tensor:
    """round(y / out_scale) by ``mode`` in float64, saturated to ``out_dtype`` (int64 codes)."""
    if not bool(torch.isfinite(y).all()):
        raise ValueError("a LUT target produced a non-finite value (a clamp rule is missing)")
    r = round_float(y / out_scale, mode)
    return r.clamp(out_dtype.qmin, out_dtype.qmax).to(torch.int64)


def _fit_mantissa(value: float, bits: int, max_shift: int = 31) -> tuple[int, int]:
    """(m, r) with m = round(value * 2**r) and |m| <= 2**(bits-1) - 1, r as large as possible in
    [0, max_shift]; the mantissa saturates when even r = 0 does not fit."""
    lim = (1 << (bits - 1)) - 1
    for r in range(max_shift, -1, -1):
        m = round_scalar(value * (1 << r))
        if abs(m) <= lim:
            return int(m), r
    return int(max(-lim, min(lim, round_scalar(value)))), 0


def _tail(x_anchor: int, y_anchor: float, slope: float, bits: int) -> Tail:
    """Integer tail through (x_anchor, y_anchor) (input code, output code units) with ``slope``
    output codes per input code; ``|b << lshift| < 2**31`` (horizon-plugin.md s.1.2)."""
    lim = (1 << (bits - 1)) - 1
    k, rshift = _fit_mantissa(slope, bits)
    while True:
        big_b = round_scalar(y_anchor * (1 << rshift) - x_anchor * k)
        if abs(big_b) < (1 << 31) or rshift == 0:
            break
        rshift -= 1
        k = int(max(-lim, min(lim, round_scalar(slope * (1 << rshift)))))
    big_b = max(-(1 << 31) + 1, min((1 << 31) - 1, big_b))  # the intercept saturates at int31
    lshift = 0
    b = big_b
    while abs(b) > lim:
        lshift += 1
        b = round_scalar(big_b / (1 << lshift))
    return Tail(int(k), int(b), lshift, rshift)


def _index_multiplier(width: int, entries: int, frac_bits: int, bits: int) -> tuple[int, int]:
    """(m, r) with ``((x - d) * m) >> r`` ~ ``(x - d) (entries - 1) 2^F / width``."""
    target = ((entries - 1) << frac_bits) / width
    lim = (1 << (bits - 1)) - 1
    if round_scalar(target) > lim:
        raise ValueError(
            f"a table {width} input code(s) wide cannot index {entries} entries with "
            f"{frac_bits} fraction bits in a {bits}-bit multiplier; use fewer entries or a "
            "wider input range"
        )
    return _fit_mantissa(target, bits)


def _strategy_points(
    fn: LutFunction,
    spec: LutSpec,
    strategy: Strategy,
    lo: float,
    hi: float,
    fmt: LutFormat,
    in_scale: float,
) -> list[float]:
    def g(x: Tensor) -> Tensor:
        return fn.target(x, spec)

    if strategy is Strategy.EVENLY:
        return evenly_points(lo, hi, fmt.tables)
    if strategy is Strategy.CURVATURE:
        return curvature_points(g, lo, hi, fmt.tables)
    if strategy is Strategy.SQRT_CURVATURE:
        return sqrt_curvature_points(g, lo, hi, fmt.tables)
    if strategy is Strategy.MINIMAX:
        return minimax_points(g, lo, hi, fmt.tables, fmt.entries, in_scale, fmt.index_frac_bits)
    if strategy is Strategy.MANUAL:
        pts = list(spec.dividing_points or ())
        if len(pts) not in (fmt.tables + 1, fmt.tables + 2):
            raise ValueError(
                f"dividing_points must have tables + 1 = {fmt.tables + 1} values (or the "
                f"vendor's tables + 2 = {fmt.tables + 2}), got {len(pts)}"
            )
        return pts[: fmt.tables + 1]
    raise ValueError(f"unknown strategy {strategy!r}; allowed: {[s.name for s in Strategy]}")


def _assemble(
    func: str,
    in_dtype: DType,
    in_scale: float,
    out_dtype: DType,
    out_scale: float,
    spec: LutSpec,
    fmt: LutFormat,
    rng: tuple[float, float],
    float_points: list[float],
    chosen: Strategy,
) -> SegmentLut:
    """Integer parameters from float points: codes, tables, index multipliers, tails."""
    fn = get_function(func)
    lowest = 0 if spec.symmetric else in_dtype.qmin
    codes: list[int] = []
    for p in float_points:
        c = _round_code(p / in_scale, in_dtype, lowest)
        if not codes or c > codes[-1]:
            codes.append(c)
    if len(codes) < 2:
        raise ValueError(
            f"{func}: the dividing points {float_points} collapse to one input code; the table "
            "range has zero width"
        )
    n, f = fmt.entries, fmt.index_frac_bits
    mults, shifts = [], []
    for d0, d1 in zip(codes[:-1], codes[1:]):
        m, r = _index_multiplier(d1 - d0, n, f, fmt.slope_bits)
        mults.append(m)
        shifts.append(r)
    d = np.asarray(codes, dtype=np.int64)
    target = _target_of(fn, spec)
    tab = _frozen(table_entries(target, d[:-1], d[1:], fmt, in_scale, out_scale, out_dtype))

    def val(code: float) -> float:  # the unsaturated target, like the vendor's secants
        y = float(fn.target(torch.tensor([code * in_scale], dtype=torch.float64), spec)[0])
        return max(-TAIL_VALUE_LIMIT, min(TAIL_VALUE_LIMIT, y / out_scale))  # finite slopes

    step0 = (codes[1] - codes[0]) / (n - 1)
    step1 = (codes[-1] - codes[-2]) / (n - 1)
    grad_l, grad_r = spec.gradients
    if grad_l is not None:
        slope_l = grad_l * in_scale / out_scale
    elif codes[0] == lowest:
        slope_l = (val(codes[0] + step0) - val(codes[0])) / step0
    else:
        slope_l = (val(codes[0]) - val(lowest)) / (codes[0] - lowest)
    if grad_r is not None:
        slope_r = grad_r * in_scale / out_scale
    elif codes[-1] == in_dtype.qmax:
        slope_r = (val(codes[-1]) - val(codes[-1] - step1)) / step1
    else:
        slope_r = (val(in_dtype.qmax) - val(codes[-1])) / (in_dtype.qmax - codes[-1])
    left = _tail(codes[0], val(codes[0]), slope_l, fmt.slope_bits)
    right = _tail(codes[-1], val(codes[-1]), slope_r, fmt.slope_bits)
    return SegmentLut(
        func=func,
        in_dtype=in_dtype,
        in_scale=in_scale,
        out_dtype=out_dtype,
        out_scale=out_scale,
        spec=spec,
        fmt=fmt,
        direct=False,
        direct_table=None,
        points=tuple(codes),
        tables=tab,
        index_mult=tuple(mults),
        index_shift=tuple(shifts),
        left=left,
        right=right,
        table_range=rng,
        chosen_strategy=chosen,
    )


def _direct(
    func: str, in_scale: float, out_scale: float, spec: LutSpec, fmt: LutFormat
) -> SegmentLut:
    if fmt.values is TableValues.RUNTIME_FLOAT32:
        q = torch.arange(-128, 128, dtype=torch.int64)
        table = runtime_codes(func, spec, q, in_scale, 0, DType.INT8, out_scale, 0)
    else:
        fn = get_function(func)
        q = torch.arange(-128, 128, dtype=torch.float64)
        table = fn.target(q * in_scale, spec)
        table = _quantize_values(table, out_scale, DType.INT8, fmt.table_round)
    return SegmentLut(
        func=func,
        in_dtype=DType.INT8,
        in_scale=in_scale,
        out_dtype=DType.INT8,
        out_scale=out_scale,
        spec=spec,
        fmt=fmt,
        direct=True,
        direct_table=_frozen(table.numpy().astype(np.int64)),
        points=(-128, 127),
        tables=np.zeros((0, fmt.entries), dtype=np.int64),
        index_mult=(),
        index_shift=(),
        left=None,
        right=None,
        table_range=(-128 * in_scale, 127 * in_scale),
        chosen_strategy=spec.strategy,
    )


def _target_of(fn: LutFunction, spec: LutSpec):
    return lambda x: fn.target(x, spec)


def _searched(args: tuple, histogram: InputHistogram | None, observed_range) -> SegmentLut:
    """OPTIMAL and DATA: seeds from the vendor rules, SQRT_CURVATURE and MINIMAX's built table,
    then the certified search (optimal.py, data_weighted.py); DATA first builds (or fetches)
    OPTIMAL's table for its error bound."""
    func, in_dtype, in_scale, out_dtype, out_scale, spec, fmt, rng = args
    fn = get_function(func)
    seeds = [
        _build_cached(
            *args[:5], replace(spec, strategy=st, dividing_points=None), fmt, observed_range
        ).points
        for st in SEED_STRATEGIES
    ]
    problem = SegmentProblem(
        _target_of(fn, spec), in_dtype, in_scale, out_dtype, out_scale, fmt, spec.symmetric,
        seeds[0][0], seeds[0][-1],
    )  # fmt: skip
    ends = (problem.first, problem.last)
    store = _table_store(*args[:5], replace(spec, strategy=Strategy.OPTIMAL), fmt, *ends)
    if spec.strategy is Strategy.OPTIMAL:
        pts = optimal_points(SegmentCosts(problem, store=store), seeds).points
    else:
        if histogram is None:
            raise ValueError(
                f"{func}: strategy DATA needs the op's input histogram "
                "(build_lut(..., histogram=InputHistogram(...)))"
            )
        opt = _build_cached(*args[:5], replace(spec, strategy=Strategy.OPTIMAL), fmt,
                            observed_range, None)  # fmt: skip
        costs = SegmentCosts(problem, histogram.code_weights(in_dtype, in_scale), store)
        worst = float(costs.code_errors(evaluate_codes_int(opt, all_codes(in_dtype)).numpy()).max())
        pts = data_points(costs, opt.points, spec.data_error_factor * worst, seeds).points
    lut = _assemble(*args, [c * in_scale for c in pts], spec.strategy)
    assert lut.points == tuple(pts), (lut.points, pts)
    return lut


@lru_cache(maxsize=1)
def _table_store(
    func: str,
    in_dtype: DType,
    in_scale: float,
    out_dtype: DType,
    out_scale: float,
    spec: LutSpec,
    fmt: LutFormat,
    first: int,
    last: int,
) -> TableStore:
    """The candidate tables computed for one table problem, shared by its OPTIMAL and DATA
    searches (a DATA build searches OPTIMAL's problem again, under a histogram). ``spec`` with
    strategy OPTIMAL; ``first``/``last``: the fixed outer points. One store is kept (a DATA
    build searches right after its OPTIMAL build; an int16 store holds tens of MB)."""
    fn = get_function(func)
    return TableStore(_target_of(fn, spec), in_scale, out_scale, out_dtype, fmt)


@lru_cache(maxsize=512)
def _build_cached(
    func: str,
    in_dtype: DType,
    in_scale: float,
    out_dtype: DType,
    out_scale: float,
    spec: LutSpec,
    fmt: LutFormat,
    observed_range: tuple[float, float] | None,
    histogram: InputHistogram | None = None,
) -> SegmentLut:
    if fmt.direct_int8 and in_dtype is DType.INT8 and out_dtype is DType.INT8:
        return _direct(func, in_scale, out_scale, spec, fmt)
    fn = get_function(func)
    rng = input_range(fn, spec, in_dtype, in_scale, out_dtype, out_scale, observed_range)
    args = (func, in_dtype, in_scale, out_dtype, out_scale, spec, fmt, rng)
    if spec.strategy in (Strategy.OPTIMAL, Strategy.DATA):
        return _searched(args, histogram, observed_range)
    if spec.strategy is not Strategy.MINIMAX:
        pts = _strategy_points(fn, spec, spec.strategy, *rng, fmt, in_scale)
        return _assemble(*args, pts, spec.strategy)
    best, best_err, exact = None, math.inf, None
    for strategy in MINIMAX_CANDIDATES:
        pts = _strategy_points(fn, spec, strategy, *rng, fmt, in_scale)
        lut = _assemble(*args, pts, strategy)
        exact = exact_lsb(lut) if exact is None else exact
        err = _max_error_lsb(lut, exact)
        if err < best_err:
            best, best_err = lut, err
    return refine(best, best_err, lambda pts, st: _assemble(*args, pts, st), exact)


def clear_build_cache() -> None:
    """Forget every built table (benchmarks time builds from scratch)."""
    _build_cached.cache_clear()
    _table_store.cache_clear()


def build_lut(
    func: str,
    in_dtype: DType,
    in_scale: float,
    out_dtype: DType,
    out_scale: float,
    spec: LutSpec | None = None,
    fmt: LutFormat = J6_FORMAT,
    observed_range: tuple[float, float] | None = None,
    histogram: InputHistogram | None = None,
) -> SegmentLut:
    """Build (or fetch from the cache) the integer LUT of ``func`` for these scales and dtypes.

    ``spec`` defaults to ``default_spec(func)``. int8 -> int8 gives the direct 256-entry table
    when ``fmt.direct_int8``; everything else the segment format (module docstring). Raises
    ValueError for an unknown function, a non-int8/int16 dtype, a non-positive scale, a table
    range narrower than one input code, or points that collapse to one code. ``histogram``
    (the op's calibrated input distribution) is used by the DATA strategy only, which needs it.
    """
    get_function(func)
    in_dtype = _check_dtype("in_dtype", in_dtype)
    out_dtype = _check_dtype("out_dtype", out_dtype)
    in_scale = check_scale_float(in_scale, "in_scale")
    out_scale = check_scale_float(out_scale, "out_scale")
    spec = default_spec(func) if spec is None else spec
    if not isinstance(spec, LutSpec):
        raise ValueError(f"spec must be a LutSpec or None, got {type(spec).__name__}")
    if not isinstance(fmt, LutFormat):
        raise ValueError(f"fmt must be a LutFormat, got {type(fmt).__name__}")
    obs = None
    if observed_range is not None:
        obs = (float(observed_range[0]), float(observed_range[1]))
        if not obs[1] > obs[0]:
            raise ValueError(f"observed_range has zero or negative width: {observed_range}")
    if histogram is not None and not isinstance(histogram, InputHistogram):
        raise ValueError(f"histogram must be an InputHistogram or None, got {type(histogram)}")
    hist = histogram if spec.strategy is Strategy.DATA else None
    return _build_cached(func, in_dtype, in_scale, out_dtype, out_scale, spec, fmt, obs, hist)
