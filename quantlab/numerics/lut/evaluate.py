"""Integer evaluation of a built SegmentLut, its slow reference, and the exact "fake" counterpart.

Integer contract for an input code x (segment format; table.py has the geometry):
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

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.functions import LutSpec, default_spec, get_function
from quantlab.numerics.rounding import Round, round_float

if TYPE_CHECKING:
    from quantlab.numerics.lut.table import SegmentLut


def _rshift_round_bits(v: np.ndarray, n: int, mode: Round) -> np.ndarray:
    """v / 2**n rounded by ``mode`` with shifts and masks (numpy int64; exact)."""
    if n == 0:
        return v.copy()
    q = v >> n  # floor
    rem = v & ((1 << n) - 1)
    half = 1 << (n - 1)
    if mode is Round.FLOOR:
        return q
    if mode is Round.HALF_UP:
        return (v + half) >> n
    if mode is Round.HALF_EVEN:
        return q + ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    if mode is Round.HALF_AWAY:
        return q + ((rem > half) | ((rem == half) & (v >= 0)))
    if mode is Round.TRUNC:
        return q + ((rem != 0) & (v < 0))
    raise ValueError(f"unknown rounding mode {mode!r}")


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
    qmax, omin, omax = lut.in_dtype.qmax, lut.out_dtype.qmin, lut.out_dtype.qmax
    neg = (x < 0) if lut.symmetric else np.zeros(x.shape, dtype=bool)
    a = np.where(neg, np.minimum(-x, qmax), x)
    d = np.asarray(lut.points, dtype=np.int64)
    i = np.clip(np.searchsorted(d, a, side="right") - 1, 0, len(d) - 2)
    mult = np.asarray(lut.index_mult, dtype=np.int64)[i]
    shift = np.asarray(lut.index_shift, dtype=np.int64)[i]
    f = fmt.index_frac_bits
    idx = np.clip(((a - d[i]) * mult) >> shift, 0, (fmt.entries - 1) << f)
    j = idx >> f
    w = idx & ((1 << f) - 1)
    tab = np.concatenate([lut.tables, lut.tables[:, -1:]], axis=1)  # T[entries] := T[entries-1]
    t0 = tab[i, j]
    t1 = tab[i, j + 1]
    y = _rshift_round_bits((t0 << f) + (t1 - t0) * w, f, fmt.interp_round)
    for tail, mask in ((lut.left, a < d[0]), (lut.right, a > d[-1])):
        v = a * tail.k + (tail.b << tail.lshift)
        y = np.where(mask, _rshift_round_bits(v, tail.rshift, fmt.interp_round), y)
    y = np.clip(y, omin, omax)
    return torch.from_numpy(np.where(neg, np.clip(-y, omin, omax), y))


def all_codes(dtype: DType) -> Tensor:
    """Every code of an integer dtype, ascending, as int64."""
    return torch.arange(dtype.qmin, dtype.qmax + 1, dtype=torch.int64)


def build_code_map(lut: SegmentLut) -> Tensor:
    """The output code of every input code, indexed by the code read as unsigned
    (``code mod 2**bits``: 0..qmax, then qmin..-1), in the output torch dtype."""
    y = evaluate_codes_int(lut, all_codes(lut.in_dtype))
    half = -lut.in_dtype.qmin
    return torch.cat([y[half:], y[:half]]).to(lut.out_dtype.torch_dtype)


_UNSIGNED = {DType.INT8: (torch.uint8, np.uint8), DType.INT16: (torch.uint16, np.uint16)}


_CHUNK = 1 << 20  # elements per gather chunk (measured best of 2^16..2^21 on 2 cores)
_POOL: list = []  # lazily created thread pool for large gathers
_LOCAL = threading.local()


def evaluate_fast(lut: SegmentLut, codes: Tensor) -> Tensor:
    """One gather through the cached code map. ``codes`` must have ``lut.in_dtype``'s torch
    dtype; the result has ``lut.out_dtype``'s torch dtype and the same shape.

    The gather is torch.index_select with the codes read as unsigned int32 indices. Large CPU
    inputs are gathered in cache-sized chunks on ``torch.get_num_threads()`` threads (a pure
    gather: the result does not depend on the chunking).
    """
    want = lut.in_dtype.torch_dtype
    if codes.dtype != want:
        raise ValueError(
            f"{lut.func} LUT expects input codes of dtype {want} ({lut.in_dtype.name}), "
            f"got {codes.dtype}"
        )
    table = lut.code_map()
    threads = torch.get_num_threads()
    if codes.device.type != "cpu" or codes.numel() < 2 * _CHUNK or threads < 2:
        return gather_torch(table, codes, lut.in_dtype)
    flat = codes.reshape(-1).view(_UNSIGNED[lut.in_dtype][0])
    out = torch.empty(flat.numel(), dtype=table.dtype)
    if not _POOL or _POOL[0]._max_workers != threads:
        _POOL[:] = [ThreadPoolExecutor(threads, thread_name_prefix="quantlab-lut")]
    n = flat.numel()
    jobs = [
        _POOL[0].submit(_gather_chunk, table, flat, out, a, min(a + _CHUNK, n))
        for a in range(0, n, _CHUNK)
    ]
    for j in jobs:
        j.result()
    return out.reshape(codes.shape)


def _gather_chunk(table: Tensor, flat: Tensor, out: Tensor, a: int, b: int) -> None:
    buf = getattr(_LOCAL, "index", None)
    if buf is None or buf.numel() < b - a:
        buf = _LOCAL.index = torch.empty(_CHUNK, dtype=torch.int32)
    idx = buf[: b - a]
    idx.copy_(flat[a:b])
    torch.index_select(table, 0, idx, out=out[a:b])


def gather_torch(table: Tensor, codes: Tensor, in_dtype: DType) -> Tensor:
    """``table[codes mod 2**bits]`` by one torch.index_select (any device)."""
    index = codes.reshape(-1).view(_UNSIGNED[in_dtype][0]).to(torch.int32)
    return table.to(codes.device).index_select(0, index).reshape(codes.shape)


def _np_rshift_round(v: np.ndarray, n: int, mode: Round) -> np.ndarray:
    """v / 2**n rounded by ``mode`` (numpy int64, floor division and remainder)."""
    if n == 0:
        return v.copy()
    q, r = np.divmod(v, np.int64(1 << n))
    half = 1 << (n - 1)
    if mode is Round.FLOOR:
        return q
    if mode is Round.HALF_UP:
        return q + (r >= half)
    if mode is Round.HALF_EVEN:
        return q + ((r > half) | ((r == half) & (q % 2 == 1)))
    if mode is Round.HALF_AWAY:
        return q + ((r > half) | ((r == half) & (v >= 0)))
    if mode is Round.TRUNC:
        return q + ((r != 0) & (v < 0))
    raise ValueError(f"unknown rounding mode {mode!r}")


def evaluate_reference(lut: SegmentLut, codes: Tensor) -> Tensor:
    """Slow, obviously-correct numpy-int64 evaluation (the module docstring's steps, one region
    at a time). Same contract as SegmentLut.evaluate."""
    want = lut.in_dtype.torch_dtype
    if codes.dtype != want:
        raise ValueError(f"reference expects input codes of dtype {want}, got {codes.dtype}")
    x = codes.numpy().astype(np.int64).reshape(-1)
    if lut.direct:
        y = np.array([lut.direct_table[int(c) + 128] for c in x], dtype=np.int64)
        return torch.from_numpy(y.reshape(codes.shape)).to(lut.out_dtype.torch_dtype)
    fmt = lut.fmt
    f = fmt.index_frac_bits
    omin, omax = lut.out_dtype.qmin, lut.out_dtype.qmax
    neg = (x < 0) if lut.symmetric else np.zeros(x.shape, dtype=bool)
    a = np.where(neg, np.minimum(-x, lut.in_dtype.qmax), x)
    y = np.full(x.shape, np.iinfo(np.int64).min, dtype=np.int64)
    d = lut.points
    last = len(d) - 2
    for i in range(len(d) - 1):
        upper = (a <= d[i + 1]) if i == last else (a < d[i + 1])
        sel = (a >= d[i]) & upper
        rel = a[sel] - d[i]
        idx = np.minimum((rel * lut.index_mult[i]) >> lut.index_shift[i], (fmt.entries - 1) << f)
        j = idx >> f
        w = idx & ((1 << f) - 1)
        row = np.append(lut.tables[i], lut.tables[i][-1])
        t0, t1 = row[j], row[j + 1]
        y[sel] = _np_rshift_round(t0 * (1 << f) + (t1 - t0) * w, f, fmt.interp_round)
    for tail, sel in ((lut.left, a < d[0]), (lut.right, a > d[-1])):
        v = a[sel] * tail.k + tail.b * (1 << tail.lshift)
        y[sel] = _np_rshift_round(v, tail.rshift, fmt.interp_round)
    assert (y != np.iinfo(np.int64).min).all(), "a code fell in no region"
    y = np.clip(y, omin, omax)
    y = np.where(neg, np.clip(-y, omin, omax), y)
    return torch.from_numpy(y.reshape(codes.shape)).to(lut.out_dtype.torch_dtype)


def lut_fake_codes(
    x: Tensor,
    func: str,
    out_dtype: DType,
    out_scale: float,
    rounding: Round = Round.HALF_EVEN,
    spec: LutSpec | None = None,
) -> Tensor:
    """Output codes of the exact function: saturate(round(f(x) / out_scale)), int64.

    f is the table's target (clamp rules, symmetric mirroring) evaluated in float64; the
    division and rounding are float64 (the same arithmetic that fills a direct int8 table).
    Non-finite inputs: +-inf follow the function's limits and saturate; NaN gives code 0.
    """
    spec = default_spec(func) if spec is None else spec
    y = get_function(func).target(x.to(torch.float64), spec)
    r = round_float(y / float(out_scale), rounding)
    r = torch.nan_to_num(r, nan=0.0)  # NaN inputs -> code 0, as quantize does
    return r.clamp(out_dtype.qmin, out_dtype.qmax).to(torch.int64)


def lut_fake(
    x: Tensor,
    func: str,
    out_dtype: DType,
    out_scale: float,
    rounding: Round = Round.HALF_EVEN,
    spec: LutSpec | None = None,
) -> Tensor:
    """QAT numerics of a LUT op: the exact float function, then output fake quant (float32).

    This is what QAT/calibration computes (horizon-plugin.md s.1.6): no table error at all; the
    difference to ``SegmentLut.evaluate`` is the op-level QAT-to-deployed gap.
    """
    out_dtype = DType.parse(out_dtype)
    if not out_dtype.is_int:
        raise ValueError(f"lut_fake out_dtype must be INT8 or INT16, got {out_dtype.name}")
    codes = lut_fake_codes(x, func, out_dtype, out_scale, rounding, spec)
    return (codes.to(torch.float64) * float(out_scale)).to(torch.float32)
