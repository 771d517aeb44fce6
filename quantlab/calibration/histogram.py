"""Histograms of calibration values and the expected quantization error under a histogram.

``SignedHistogram`` holds every finite calibration value of one activation point: ``bins``
equal bins over [-M, M], M a power of two (the first batch's absolute maximum rounded up, as the
vendor's HistogramObserver does); a later value beyond M doubles the range by merging bin pairs,
which is exact because the grids nest. Exact zeros (ReLU outputs) are counted apart: they cost
no error at any scale. ``AbsHistogram`` is the vendor KLObserver's histogram of |x|: the first
batch fixes the bin width (its absolute maximum / 512) and later batches append bins.

``expected_sq_error`` integrates the squared fake-quantization error over the histogram, each
bin taken as uniformly filled: for scale s and t = x / s, the error density s**2 (q(t) - t)**2
has the antiderivative s**3 Phi(t) in closed form (quantization cells inside [qmin - 0.5,
qmax + 0.5] contribute 1/12 each, the clipped tails a cubic), so every bin costs two evaluations
of Phi and no sampling. Ties of the rounding rule have measure zero under this model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

DEFAULT_BINS = 4096  # of the full histogram over [-M, M]: >= 1024 bins between 0 and amax
KL_BINS = 512  # the vendor KLObserver's histogram


def finite_values(x: Tensor) -> Tensor:
    """The finite values of ``x`` as a flat float32 tensor (NaN and +-inf dropped)."""
    x = x.detach().reshape(-1).to(torch.float32)
    mn, mx = torch.aminmax(x) if x.numel() else (x.new_zeros(()), x.new_zeros(()))
    if x.numel() and not (math.isfinite(float(mn)) and math.isfinite(float(mx))):
        x = x[torch.isfinite(x)]
    return x


class SignedHistogram:
    """Counts (float64) of finite values in ``bins`` equal bins over [-limit, limit]; zeros apart.

    ``bins`` is a power of two >= 4. Values exactly on an inner edge fall in the upper bin
    (torch.histc); ``limit`` is a power of two >= every value seen.
    """

    def __init__(self, bins: int = DEFAULT_BINS) -> None:
        if bins < 4 or bins & (bins - 1):
            raise ValueError(f"histogram bins must be a power of two >= 4, got {bins}")
        self.bins = bins
        self.counts: Tensor | None = None
        self.limit = 0.0
        self.zeros = 0
        self.amax = 0.0

    @property
    def total(self) -> float:
        """Every value counted (zeros included)."""
        return self.zeros + (0.0 if self.counts is None else float(self.counts.sum()))

    def update(self, x: Tensor, lo: float | None = None, hi: float | None = None) -> None:
        """Add the finite values of float32 tensor ``x`` (flat); ``lo``/``hi``: its min and max
        if known."""
        if lo is None or hi is None:
            lo, hi = (float(v) for v in torch.aminmax(x)) if x.numel() else (0.0, 0.0)
        zeros = int((x == 0).sum())
        self.zeros += zeros
        a = max(-lo, hi)
        if a == 0.0:
            return
        self.amax = max(self.amax, a)
        if self.counts is None:
            self.limit = _pow2_at_least(a)
            self.counts = torch.zeros(self.bins, dtype=torch.float64)
        while a > self.limit:
            self._double()
        lim = self.limit
        counts = _histc(x, self.bins, -lim, lim)
        counts[self.bins // 2] -= zeros  # zeros (and -0.0) land in the bin [0, width)
        self.counts += counts

    def _double(self) -> None:
        b = self.bins
        merged = self.counts.reshape(b // 2, 2).sum(1)
        self.counts = torch.zeros(b, dtype=torch.float64)
        self.counts[b // 4 : 3 * b // 4] = merged
        self.limit *= 2.0

    def edges(self) -> Tensor:
        """The ``bins + 1`` bin edges, float64."""
        return torch.linspace(-self.limit, self.limit, self.bins + 1, dtype=torch.float64)

    def counts_with_zeros(self) -> Tensor:
        """Counts with the exact zeros put back into the bin [0, width) (what ``histc`` gives)."""
        if self.counts is None:
            return torch.zeros(self.bins, dtype=torch.float64)
        c = self.counts.clone()
        c[self.bins // 2] += self.zeros
        return c

    def abs_counts(self) -> tuple[Tensor, float]:
        """(counts of |x| in ``bins / 2`` bins over [0, limit], zeros excluded; bin width)."""
        half = self.bins // 2
        c = self.counts
        folded = c[half:] + c[:half].flip(0)
        return folded, self.limit / half


class AbsHistogram:
    """The vendor KLObserver's |x| histogram: width = first nonzero batch's max|x| / 512; later
    batches append bins of that width (``bins = ceil(max|x| / width)``). Zeros go to bin 0."""

    def __init__(self, first_bins: int = KL_BINS) -> None:
        self.first_bins = first_bins
        self.counts: Tensor | None = None
        self.width = 0.0
        self._zeros = 0

    def update(self, x: Tensor) -> None:
        ax = x.abs()
        a = float(ax.max()) if ax.numel() else 0.0
        if self.counts is None:
            if a == 0.0:
                self._zeros += ax.numel()
                return
            self.width = a / self.first_bins
            self.counts = torch.zeros(self.first_bins, dtype=torch.float64)
            self.counts[0] += self._zeros
        n = self.counts.numel()
        if a > n * self.width:
            n = math.ceil(a / self.width)
            grown = torch.zeros(n, dtype=torch.float64)
            grown[: self.counts.numel()] = self.counts
            self.counts = grown
        self.counts += _histc(ax, n, 0.0, n * self.width)


F32_MAX = float(torch.finfo(torch.float32).max)


def _histc(x: Tensor, bins: int, lo: float, hi: float) -> Tensor:
    """``torch.histc`` counts (float64) of float32 ``x`` over [lo, hi]; in float64 where float32
    could overflow: a bound without a float32 form (2**128 for values near float32's largest,
    as an additive mask of its lowest value gives), where histc raises, or a range whose
    scaling to bins, (x - lo) * bins, leaves float32 (it puts values in wrong bins). Ranges of
    calibration values are far below that, and keep float32's bins."""
    if (abs(lo) + abs(hi)) * bins > F32_MAX:
        x = x.to(torch.float64)
    return torch.histc(x, bins, lo, hi).to(torch.float64)


def _pow2_at_least(a: float) -> float:
    p = 2.0 ** math.ceil(math.log2(a))
    return p * 2.0 if p < a else p


def _phi_round(t: Tensor, qmin: int, qmax: int) -> Tensor:
    """Antiderivative of (round(t) - t)**2 over the cells inside [qmin - 0.5, qmax + 0.5] (t is
    clamped to that interval), 0 at its lower end."""
    cells = qmax - qmin + 1
    u = (t - (qmin - 0.5)).clamp(0.0, float(cells))
    k = torch.floor(u)
    return k / 12.0 + ((u - k - 0.5) ** 3 + 0.125) / 3.0


def _phi_clip(t: Tensor, qmin: int, qmax: int) -> Tensor:
    """Antiderivative of the clipping error (t - qmax)**2 above qmax + 0.5 and (t - qmin)**2
    below qmin - 0.5; 0 inside."""
    hi = ((t - qmax).clamp_min(0.5) ** 3 - 0.125) / 3.0
    lo = ((t - qmin).clamp_max(-0.5) ** 3 + 0.125) / 3.0
    return hi + lo


def expected_sq_error(
    counts: Tensor, edges: Tensor, scales: Tensor, qmin: int, qmax: int, chunk: int = 64
) -> tuple[Tensor, Tensor]:
    """(rounding error, clipping error) summed over a histogram, per scale (float64, (K,)).

    Each bin [a, b) with n values contributes n / (b - a) * integral_a^b (q(x) - x)**2 dx, where
    q(x) = s * clamp(round(x / s), qmin, qmax); the two parts are the error of the values inside
    [(qmin - 0.5) s, (qmax + 0.5) s] and of those beyond it. Only the edges from the first to the
    last non-empty bin are evaluated (each edge once, shared by its two bins).
    """
    nz = torch.nonzero(counts > 0).reshape(-1)
    if nz.numel() == 0:
        z = torch.zeros(scales.numel(), dtype=torch.float64)
        return z, z.clone()
    first, last = int(nz[0]), int(nz[-1]) + 1
    e = edges[first : last + 1].to(torch.float64).reshape(1, -1)
    n = counts[first:last].to(torch.float64).reshape(1, -1)
    per_width = n / (e[:, 1:] - e[:, :-1])
    s_all = scales.to(torch.float64).reshape(-1, 1)
    rnd, clip = [], []
    for i in range(0, s_all.shape[0], chunk):
        s = s_all[i : i + chunk]
        t = e / s
        w = per_width * s**3
        r = _phi_round(t, qmin, qmax)
        c = _phi_clip(t, qmin, qmax)
        rnd.append(((r[:, 1:] - r[:, :-1]) * w).sum(1))
        clip.append(((c[:, 1:] - c[:, :-1]) * w).sum(1))
    return torch.cat(rnd), torch.cat(clip)
