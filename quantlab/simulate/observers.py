"""Calibration observers: activation statistics gathered in float mode, turned into scales.

One ``ActivationObserver`` per activation point (``op/in0``, ``op/out``) keeps what every rule of
``quantlab.calibration.kinds.ObserverKind`` needs, so the rule can be chosen (or changed) after
calibration: per-batch min, max, mean and std; the running extremes; a full signed histogram;
the pooled subsample of MSE_POOLED. The vendor rules that need each batch's own values (MSE,
MIX, PERCENTILE at a given percentile, KL's |x| histogram) are gathered during calibration when
a rule asks for them (``BatchRules``: the qconfig's rules plus ``calibrate(observers=...)``).
Scales follow the platform's ``scale_rule`` through ``quantlab.numerics.compute_scale``; the
observer only decides ``amax``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.calibration import vendor
from quantlab.calibration.histogram import AbsHistogram, SignedHistogram, finite_values
from quantlab.calibration.kinds import ObserverKind
from quantlab.calibration.kl import kl_threshold
from quantlab.calibration.mse_search import BatchValues
from quantlab.calibration.search import histogram_amax
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import ScaleRule, compute_scale
from quantlab.numerics.rounding import Round, round_float

EMA_MOMENTUM = vendor.EMA_CONSTANT  # MinMax observer: new = old + 0.01 * (cur - old)
MSE_CANDIDATES = vendor.MSE_STEPS  # amax * (1 - 0.01 i), i = 0..94
SAMPLE_CAP = 1 << 15  # MSE_POOLED: values kept per batch
TOTAL_CAP = 1 << 17  # MSE_POOLED: values kept across batches (thinned by 2, extremes kept)
SEARCH_CAP = 1 << 14  # MSE_POOLED: values its search evaluates (strided, extremes kept)
DEFAULT_PERCENTILE = 99.99  # the vendor PercentileObserver's default


_NOT_GATHERED = (
    "observer {what} needs statistics gathered during calibration (gathered: {have}); "
    "calibrate with it in the qconfig or pass it to Simulator.calibrate(batches, observers=[...])"
)


@dataclass(frozen=True)
class BatchRules:
    """The per-batch vendor rules every observer evaluates on each calibration batch.

    mse_dtypes / mix_dtypes: integer dtypes MSE / MIX are searched for (their errors depend on
    the dtype); kl: whether KL's own |x| histogram is kept; percentiles: the percentiles
    PERCENTILE is gathered at; scale_rule / rounding: the platform's, used by the searches.
    """

    mse_dtypes: tuple[DType, ...] = ()
    mix_dtypes: tuple[DType, ...] = ()
    kl: bool = False
    percentiles: tuple[float, ...] = ()
    scale_rule: ScaleRule = ScaleRule.HALF_RANGE
    rounding: Round = Round.HALF_EVEN


def batch_rules(spec, platform, extra: Iterable = ()) -> BatchRules:
    """The BatchRules a calibration under ``spec`` (a QConfigSpec) on ``platform`` needs, plus
    the rules of ``extra`` (ObserverChoice or ObserverKind values).

    Dtypes: every integer dtype the platform template or the spec can give an activation
    (global, GEMM input, grid chain, sensitive and ceiling dtypes), so a later qconfig that
    raises ops to int16 finds its statistics.
    """
    rules = [spec.global_, *spec.by_type.values(), *spec.by_module.values()]
    rules += list(spec.by_name.values())
    kinds = {platform.default_observer}
    percentiles = {DEFAULT_PERCENTILE}
    dtypes = {
        platform.global_dtype,
        platform.gemm_input_dtype,
        platform.grid_chain_dtype,
        platform.sensitive_dtype,
        platform.ceiling_dtype,
    }
    for r in rules:
        if r is None:
            continue
        if r.observer is not None:
            kinds.add(r.observer)
        if r.percentile is not None:
            percentiles.add(float(r.percentile))
        dtypes |= {d for d in (r.input_dtype, r.output_dtype) if d is not None}
    for e in extra:
        kinds.add(e if isinstance(e, ObserverKind) else e.kind)
        if getattr(e, "percentile", None) is not None:
            percentiles.add(float(e.percentile))
    ints = tuple(d for d in (DType.INT8, DType.INT16) if d in dtypes)  # activation codes
    return BatchRules(
        mse_dtypes=ints if ObserverKind.MSE in kinds else (),
        mix_dtypes=ints if ObserverKind.MIX in kinds else (),
        kl=ObserverKind.KL in kinds,
        percentiles=tuple(sorted(percentiles)) if ObserverKind.PERCENTILE in kinds else (),
        scale_rule=platform.scale_rule,
        rounding=platform.fake_round,
    )


class ActivationObserver:
    """Statistics of one activation tensor (per-tensor) across calibration batches."""

    def __init__(self, rules: BatchRules | None = None) -> None:
        self.rules = rules or BatchRules()
        self.ema_min: float | None = None
        self.ema_max: float | None = None
        self.run_min = float("inf")
        self.run_max = float("-inf")
        self.ranges: list[vendor.Range] = []  # per batch (min, max)
        self.moments: list[tuple[float, float]] = []  # per batch (mean, unbiased std)
        self.per_batch: dict[tuple, list[vendor.Range]] = {}  # vendor rule -> per-batch ranges
        self.hist = SignedHistogram()
        self.kl_hist = AbsHistogram()
        self.samples: list[Tensor] = []  # MSE_POOLED
        self.extremes: list[Tensor] = []
        self.batches = 0
        self.values = 0  # values seen, non-finite ones included
        self.non_finite = 0  # of those, NaN and +-inf (dropped from every statistic)
        self._amax: dict[tuple, float] = {}

    def update(self, x: Tensor) -> None:
        """Add one batch of values (non-finite values are dropped)."""
        self._amax.clear()
        self.values += x.numel()
        seen = x.numel()
        x = finite_values(x)
        self.non_finite += seen - x.numel()
        if x.numel() == 0:
            return
        mn, mx = torch.aminmax(x)
        lo, hi = float(mn), float(mx)
        if self.ema_min is None:
            self.ema_min, self.ema_max = lo, hi
        else:
            self.ema_min += EMA_MOMENTUM * (lo - self.ema_min)
            self.ema_max += EMA_MOMENTUM * (hi - self.ema_max)
        self.run_min, self.run_max = min(self.run_min, lo), max(self.run_max, hi)
        self.ranges.append((lo, hi))
        r = self.rules
        self.moments.append(_mean_std(x))
        self.hist.update(x, lo, hi)
        if r.kl:
            self.kl_hist.update(x)
        self._pool(x, lo, hi)
        values = BatchValues(x) if r.mse_dtypes else None  # selected and sorted once
        for dt in r.mse_dtypes:
            rng = vendor.mse_batch(x, dt, r.scale_rule, r.rounding, values)
            self._per_batch("mse", dt).append(rng)
        for dt in r.mix_dtypes:
            self._per_batch("mix", dt).append(vendor.mix_batch(x, dt, r.scale_rule, r.rounding))
        if r.percentiles:
            clips = vendor.percentile_clips(x, r.percentiles)
            for p, c in zip(r.percentiles, clips):
                self._per_batch("percentile", p).append(vendor.clipped((lo, hi), c))
        self.batches += 1

    def _per_batch(self, rule: str, param) -> list[vendor.Range]:
        return self.per_batch.setdefault((rule, param), [])

    def _pool(self, x: Tensor, lo: float, hi: float) -> None:
        step = max(1, x.numel() // SAMPLE_CAP)
        sample = x[::step].float()
        self.samples.append(torch.cat([sample, sample.new_tensor([lo, hi])]))
        self.extremes.append(sample.new_tensor([lo, hi]))
        if sum(t.numel() for t in self.samples) > TOTAL_CAP:
            pool = torch.cat(self.samples)[::2]
            self.samples = [torch.cat([pool, *self.extremes])]

    def min_max(self, rq) -> tuple[float, float]:
        """The (min, max) an asymmetric activation is quantized over: the moving averages
        (MINMAX) or the extremes of every batch (GLOBAL_MINMAX); ValueError for any other
        observer (asymmetric ranges come from min and max only)."""
        if self.ema_min is None:
            return self._nothing_seen()
        if rq.observer is ObserverKind.MINMAX:
            return self.ema_min, self.ema_max
        if rq.observer is ObserverKind.GLOBAL_MINMAX:
            return self.run_min, self.run_max
        raise ValueError(
            f"activation_symmetry=ASYMMETRIC takes its range from a MINMAX or GLOBAL_MINMAX "
            f"observer, got observer={rq.observer.name}"
        )

    def amax(self, rq, dtype: DType, rule: ScaleRule, rounding: Round) -> float:
        """The calibrated absolute maximum of rule ``rq.observer`` (with ``rq.percentile``,
        ``rq.histogram_method``, ``rq.clip_range``) at integer ``dtype`` (FIXED: the caller);
        remembered per rule until the next batch."""
        key = (observer_key(rq), dtype, rule, rounding)
        if key not in self._amax:
            self._amax[key] = self._compute_amax(rq, dtype, rule, rounding)
        return self._amax[key]

    def _nothing_seen(self) -> tuple[float, float]:
        """The range of a point that only ever held empty tensors (a cache's first, empty
        part of a cat): (0, 0), as for zeros; ValueError where it held only non-finite
        values."""
        if self.values:
            raise ValueError("observer saw no finite values")
        return 0.0, 0.0

    def _compute_amax(self, rq, dtype: DType, rule: ScaleRule, rounding: Round) -> float:
        if self.ema_min is None:
            return max(self._nothing_seen())
        kind = rq.observer
        if kind is ObserverKind.MINMAX:
            return max(-self.ema_min, self.ema_max, 0.0)
        if kind is ObserverKind.GLOBAL_MINMAX:
            return max(-self.run_min, self.run_max, 0.0)
        if kind is ObserverKind.MSE_POOLED:
            return mse_amax(torch.cat(self.samples), dtype, rounding, rule)
        if kind is ObserverKind.MSE:
            return vendor.range_amax(vendor.ema(self._gathered(kind, "mse", dtype)))
        if kind is ObserverKind.MIX:
            return vendor.range_amax(vendor.ema(self._gathered(kind, "mix", dtype)))
        if kind is ObserverKind.PERCENTILE:
            got = self._gathered(kind, "percentile", float(rq.percentile))
            return vendor.range_amax(vendor.ema(got))
        if kind is ObserverKind.CLIP:
            return vendor.range_amax(vendor.clip_range(self.ranges, rq.clip_range))
        if kind is ObserverKind.CLIPSTD:
            per = [vendor.clipstd_batch(*r, *m) for r, m in zip(self.ranges, self.moments)]
            return vendor.range_amax(vendor.ema(per))
        if kind is ObserverKind.KL:
            h = self.kl_hist
            if not self.rules.kl:
                raise ValueError(_NOT_GATHERED.format(what="KL (its |x| histogram)", have="no"))
            return 0.0 if h.counts is None else kl_threshold(h.counts, h.width, -dtype.qmin)
        if kind is ObserverKind.HISTOGRAM:
            return histogram_amax(self.hist, rq.histogram_method, dtype, rule, rq.percentile)
        allowed = ", ".join(k.name for k in ObserverKind if k is not ObserverKind.FIXED)
        raise ValueError(f"observer {kind} has no amax; allowed: {allowed}")

    def _gathered(self, kind: ObserverKind, rule: str, param) -> list[vendor.Range]:
        got = self.per_batch.get((rule, param))
        if not got:
            have = [
                p.name if isinstance(p, DType) else str(p) for r, p in self.per_batch if r == rule
            ]
            what = f"{kind.name} at {param.name if isinstance(param, DType) else param}"
            raise ValueError(_NOT_GATHERED.format(what=what, have=", ".join(have) or "none"))
        return got

    def histogram(self) -> tuple[Tensor, Tensor]:
        """(bin_edges (bins + 1,), counts (bins,)), float64, of every finite value observed;
        equal bins over [-M, M] (M a power of two >= max |x|); zeros in the bin [0, width)."""
        return self.hist.edges(), self.hist.counts_with_zeros()


class ObserverBank:
    """The activation observers of one Simulator, keyed by point (``op/in0``, ``op/out``).

    A tensor observed at two points of one batch (a producer's output reaching a consumer's
    input unchanged: same object, same version) is observed once; both points share the
    observer, whose statistics are those of that tensor either way.
    """

    def __init__(self) -> None:
        self._points: dict[str, ActivationObserver] = {}
        self._seen: dict[int, tuple] = {}
        self.rules = BatchRules()

    def start_batch(self, rules: BatchRules) -> None:
        """Begin a calibration batch whose new observers evaluate ``rules``."""
        self.rules = rules
        self._seen.clear()

    def observe(self, key: str, x: Tensor) -> None:
        hit = self._seen.get(id(x))
        if hit is not None and hit[0]() is x and hit[1] == x._version:
            obs = self._points.setdefault(key, hit[2])
            if obs is not hit[2]:
                obs.update(x)
            return
        obs = self._points.get(key)
        if obs is None:
            obs = self._points[key] = ActivationObserver(self.rules)
        obs.update(x)
        self._seen[id(x)] = (weakref.ref(x), x._version, obs)

    def get(self, key: str) -> ActivationObserver | None:
        return self._points.get(key)

    def non_finite(self) -> dict[str, tuple[int, int]]:
        """point -> (NaN and +-inf values, all values) seen there, for every point that saw
        any NaN or infinity."""
        return {k: (o.non_finite, o.values) for k, o in self._points.items() if o.non_finite}

    def __len__(self) -> int:
        return len(self._points)

    def items(self):
        return self._points.items()


def _mean_std(x: Tensor) -> tuple[float, float]:
    """(mean, unbiased std) of flat float32 ``x`` from its sum and sum of squares (float32
    reductions, combined in float64)."""
    n = x.numel()
    s, ss = float(x.sum()), float(torch.dot(x, x))
    mean = s / n
    var = max(ss - s * mean, 0.0) / (n - 1) if n > 1 else 0.0
    return mean, var**0.5


def observer_key(rq) -> tuple:
    """The qconfig fields an activation scale depends on (a scale cache key)."""
    return (
        rq.observer,
        rq.fixed_scale,
        rq.percentile,
        rq.histogram_method,
        rq.clip_range,
        rq.activation_symmetry,
    )


def mse_amax(
    data: Tensor, dtype: DType, rounding: Round, rule: ScaleRule = ScaleRule.HALF_RANGE
) -> float:
    """MSE_POOLED: the candidate ``amax * (1 - 0.01 i)`` (i = 0..94) whose scale under ``rule``
    gives the lowest L2 fake-quant error, over at most ``SEARCH_CAP`` values (a strided
    subsample that keeps both extremes), all candidates at once."""
    data = data.reshape(-1).float()
    amax = float(data.abs().max())
    if amax == 0.0:
        return 0.0
    if data.numel() > SEARCH_CAP:
        step = data.numel() // SEARCH_CAP + 1
        data = torch.cat([data[::step], data.new_tensor([float(data.min()), float(data.max())])])
    cands = amax * (1 - 0.01 * torch.arange(MSE_CANDIDATES, dtype=torch.float64))
    scales = compute_scale(cands, dtype, rule).reshape(-1, 1)
    q = round_float(data.reshape(1, -1) / scales, rounding).clamp_(dtype.qmin, dtype.qmax)
    err = q.mul_(scales).sub_(data.reshape(1, -1)).square_().sum(dim=1)
    return float(cands[int(torch.argmin(err))])


def weight_amax(w: Tensor, per_channel: bool, axis: int = 0) -> Tensor:
    """Per-channel (along ``axis``) or per-tensor MinMax absolute maximum of a weight,
    float32."""
    w = w.detach().float()
    if per_channel and w.dim() > 1:
        return w.abs().movedim(axis, 0).reshape(w.shape[axis], -1).amax(dim=1)
    return w.abs().max().reshape(1) if per_channel else w.abs().max()


__all__ = [
    "ActivationObserver",
    "BatchRules",
    "ObserverBank",
    "batch_rules",
    "mse_amax",
    "observer_key",
    "weight_amax",
]
