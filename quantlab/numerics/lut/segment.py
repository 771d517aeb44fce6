"""A built segment LUT (``SegmentLut``: integer parameters only) and its integer evaluation.

Integer contract for an input code x (table.py builds the parameters and has the geometry):
  1. symmetric mode and x < 0: evaluate a = min(-x, qmax) and return saturate(-y);
  2. a < d_0: left tail; a > d_T: right tail, ``y = round((a k + (b << lshift)) / 2**rshift)``;
  3. otherwise table i with d_i <= a (< d_{i+1}, or <= d_T for the last table):
     ``idx = min(((a - d_i) m_i) >> r_i, (entries - 1) << F)``, ``j = idx >> F``,
     ``w = idx & (2**F - 1)``, ``y = round((T[j] << F + (T[j+1] - T[j]) w) / 2**F)``
     (T[entries] := T[entries - 1]);
  4. saturate y to the output dtype.
Rounding: ``LutFormat.interp_round`` in steps 2 and 3 (HALF_UP assumed). Exactness: int64
throughout; every product is below 2**47.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.formats import LutFormat
from quantlab.numerics.lut.functions import LutFunction, get_function
from quantlab.numerics.lut.gather import gather
from quantlab.numerics.lut.spec import LutSpec
from quantlab.numerics.lut.strategies import Strategy
from quantlab.numerics.rounding import rshift_round_np


@dataclass(frozen=True)
class Tail:
    """Integer linear tail ``y = round((x * k + (b << lshift)) / 2**rshift)`` on input codes x."""

    k: int
    b: int
    lshift: int
    rshift: int


@dataclass(frozen=True, eq=False)
class SegmentLut:
    """A built table: integer parameters only (plus the float facts they came from).

    Evaluate with ``evaluate`` (fast: one gather through a cached code -> code map built by the
    exact integer path) or ``evaluate_reference`` (slow, numpy int64, obviously correct).
    Input: codes of ``in_dtype`` (torch int8/int16); output: codes of ``out_dtype``.
    """

    func: str
    in_dtype: DType
    in_scale: float
    out_dtype: DType
    out_scale: float
    spec: LutSpec
    fmt: LutFormat
    direct: bool
    direct_table: np.ndarray | None  # int64 [256], index q + 128 (direct mode only)
    points: tuple[int, ...]  # dividing points as input codes, strictly increasing
    tables: np.ndarray  # int64 [T, entries]
    index_mult: tuple[int, ...]
    index_shift: tuple[int, ...]
    left: Tail | None
    right: Tail | None
    table_range: tuple[float, float]  # the narrowed float range the points were placed on
    chosen_strategy: Strategy  # for MINIMAX: the candidate actually kept
    _map: list = field(default_factory=list, init=False, repr=False)  # cached code map (0 or 1)
    # code_map's derived forms (signed_code_map, min_output), each computed once
    _derived: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def symmetric(self) -> bool:
        return self.spec.symmetric

    @property
    def dividing_points_float(self) -> tuple[float, ...]:
        """The dividing points in float input units (codes * in_scale)."""
        return tuple(p * self.in_scale for p in self.points)

    @property
    def function(self) -> LutFunction:
        return get_function(self.func)

    def code_map(self) -> Tensor:
        """All outputs indexed by the input code as unsigned (code mod 2**bits), computed once by
        the exact integer path (``evaluate_codes_int``) and cached."""
        if not self._map:
            self._map.append(build_code_map(self))
        return self._map[0]

    def signed_code_map(self) -> Tensor:
        """All outputs indexed by ``code - qmin`` (codes ascending): ``code_map`` rotated by
        half its length, cached. Callers that already hold a code's offset from qmin as an
        index gather through it directly."""
        hit = self._derived.get("signed")
        if hit is None:
            m, half = self.code_map(), -self.in_dtype.qmin
            hit = self._derived["signed"] = torch.cat([m[half:], m[:half]])
        return hit

    def min_output(self, lowest_code: int | None = None) -> int:
        """The smallest output code over the input codes >= ``lowest_code`` (None: every input
        code), cached per ``lowest_code``."""
        lo = (
            self.in_dtype.qmin if lowest_code is None else max(int(lowest_code), self.in_dtype.qmin)
        )
        if lo > self.in_dtype.qmax:
            raise ValueError(f"lowest_code {lowest_code} is above {self.in_dtype.name}'s range")
        hit = self._derived.get(("min", lo))
        if hit is None:
            tail = self.signed_code_map()[lo - self.in_dtype.qmin :]
            hit = self._derived[("min", lo)] = int(tail.min())
        return hit

    def evaluate(self, codes: Tensor) -> Tensor:
        """Output codes for input ``codes`` (dtype ``in_dtype``): one gather, bit-exact with
        ``evaluate_reference``."""
        return evaluate_fast(self, codes)

    def evaluate_reference(self, codes: Tensor) -> Tensor:
        """Slow numpy-int64 reference of the integer evaluation (same contract as evaluate;
        ``quantlab.numerics.reference.evaluate_lut``)."""
        from quantlab.numerics.reference.lut import evaluate_lut

        return evaluate_lut(self, codes)


def segment_position(lut: SegmentLut, x: np.ndarray):
    """Where int64 input codes ``x`` fall in ``lut``'s inner tables: (neg, a, i, index) with
    ``neg`` the codes a symmetric table mirrors, ``a`` the (mirrored) code, ``i`` its table
    (clipped to the inner tables) and ``index`` = ((a - d[i]) * index_mult[i]) >> index_shift[i],
    the interpolation index before clipping (exact int64)."""
    neg = (x < 0) if lut.symmetric else np.zeros(x.shape, dtype=bool)
    a = np.where(neg, np.minimum(-x, lut.in_dtype.qmax), x)
    d = np.asarray(lut.points, dtype=np.int64)
    i = np.clip(np.searchsorted(d, a, side="right") - 1, 0, len(d) - 2)
    mult = np.asarray(lut.index_mult, dtype=np.int64)[i]
    shift = np.asarray(lut.index_shift, dtype=np.int64)[i]
    return neg, a, i, ((a - d[i]) * mult) >> shift


def evaluate_codes_int(lut: SegmentLut, codes: Tensor) -> Tensor:
    """Vectorised integer evaluation of input codes (numpy int64: gathers by table index and
    masks, no per-region loop); returns int64 output codes as a torch tensor.

    This is the exact path that builds the cached code map (and the analysis); numpy because
    small int64 torch ops are slow on a busy CPU.
    """
    x = codes.detach().cpu().numpy().astype(np.int64)
    if lut.direct:
        return torch.from_numpy(lut.direct_table[x + 128])
    fmt = lut.fmt
    omin, omax = lut.out_dtype.qmin, lut.out_dtype.qmax
    neg, a, i, raw = segment_position(lut, x)
    d = np.asarray(lut.points, dtype=np.int64)
    f = fmt.index_frac_bits
    idx = np.clip(raw, 0, (fmt.entries - 1) << f)
    j = idx >> f
    w = idx & ((1 << f) - 1)
    tab = np.concatenate([lut.tables, lut.tables[:, -1:]], axis=1)  # T[entries] := T[entries-1]
    t0 = tab[i, j]
    t1 = tab[i, j + 1]
    y = rshift_round_np((t0 << f) + (t1 - t0) * w, f, fmt.interp_round)
    for tail, mask in ((lut.left, a < d[0]), (lut.right, a > d[-1])):
        v = a * tail.k + (tail.b << tail.lshift)
        y = np.where(mask, rshift_round_np(v, tail.rshift, fmt.interp_round), y)
    y = np.clip(y, omin, omax)
    return torch.from_numpy(np.where(neg, np.clip(-y, omin, omax), y))


def all_codes(dtype: DType) -> Tensor:
    """Every code of an integer dtype, ascending, as int64 (filled by numpy: one thread, no
    parallel hand-off for a plan-time table)."""
    return torch.from_numpy(np.arange(dtype.qmin, dtype.qmax + 1, dtype=np.int64))


def build_code_map(lut: SegmentLut) -> Tensor:
    """The output code of every input code, indexed by the code read as unsigned
    (``code mod 2**bits``: 0..qmax, then qmin..-1), in the output torch dtype."""
    y = evaluate_codes_int(lut, all_codes(lut.in_dtype))
    half = -lut.in_dtype.qmin
    return torch.cat([y[half:], y[:half]]).to(lut.out_dtype.torch_dtype)


def evaluate_fast(lut: SegmentLut, codes: Tensor) -> Tensor:
    """One gather through the cached code map (``gather.gather``: serial, or compiled once the
    process has gathered enough). ``codes`` must have ``lut.in_dtype``'s torch dtype; the result
    has ``lut.out_dtype``'s torch dtype and the same shape."""
    want = lut.in_dtype.torch_dtype
    if codes.dtype != want:
        raise ValueError(
            f"{lut.func} LUT expects input codes of dtype {want} ({lut.in_dtype.name}), "
            f"got {codes.dtype}"
        )
    return gather(lut.code_map(), codes)
