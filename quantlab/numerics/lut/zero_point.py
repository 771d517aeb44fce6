"""Look-up tables on activations with zero points (asymmetric int8 / uint8 codes).

A ``ZeroPointLut`` maps input codes x (``in_dtype``, zero point zx, scale s_in) to output codes
(``out_dtype``, zero point zo, scale s_out):
  * both 8-bit and ``LutFormat.direct_int8``: one direct table over the 256 input codes,
    ``T[x] = saturate(round(f((x - zx) s_in) / s_out) + zo)``: the function and the quotient in
    float64, rounded by ``LutFormat.table_round``, the zero point added after rounding (as the
    8-bit lookup tables of TFLite and ONNX Runtime do); with zx = zo = 0 on int8 this is the
    symmetric direct table of ``build_lut``.
  * ``LutFormat.values`` RUNTIME_FLOAT32: one direct table over every input code (8 or 16
    bits), each entry as onnxruntime computes it (``runtime_values``).
  * otherwise: the segment LUT of ``build_lut`` indexed by the centred code x - zx (int16 codes
    when they leave int8) with output codes before the zero point (int16 when the output has
    one, so nothing saturates before it is added), its tables placed over the centred code range
    narrowed by the observed range; then ``saturate(y + zo)``.
16-bit codes with a nonzero zero point are refused (their centred codes leave int16).
Evaluation is one gather through a code map built by the exact integer path; the slow twin is
``quantlab.numerics.reference.evaluate_zero_point_lut``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.data_weighted import InputHistogram
from quantlab.numerics.lut.formats import J6_FORMAT, LutFormat, TableValues
from quantlab.numerics.lut.functions import default_spec, get_function
from quantlab.numerics.lut.runtime_values import runtime_codes
from quantlab.numerics.lut.segment import SegmentLut, evaluate_codes_int
from quantlab.numerics.lut.slope import segment_slope
from quantlab.numerics.lut.spec import LutSpec
from quantlab.numerics.lut.table import build_lut
from quantlab.numerics.rounding import round_float
from quantlab.numerics.scales import check_scale_float

_DTYPES = (DType.INT8, DType.UINT8, DType.INT16)


@dataclass(frozen=True, eq=False)
class ZeroPointLut:
    """A built table on codes with zero points. ``direct_table`` (int64, one entry per input
    code from ``in_dtype.qmin``, zero point included) in direct mode; else ``lut``, the segment
    LUT on centred codes whose outputs get ``out_zero_point`` added and saturate."""

    func: str
    in_dtype: DType
    in_scale: float
    in_zero_point: int
    out_dtype: DType
    out_scale: float
    out_zero_point: int
    spec: LutSpec
    fmt: LutFormat
    direct_table: np.ndarray | None
    lut: SegmentLut | None
    _map: list = field(default_factory=list, init=False, repr=False)

    @property
    def direct(self) -> bool:
        return self.direct_table is not None

    def centred(self, codes: Tensor) -> Tensor:
        """x - zx as codes of the segment LUT's input dtype (segment mode only)."""
        return (codes.to(torch.int64) - self.in_zero_point).to(self.lut.in_dtype.torch_dtype)

    def code_map(self) -> Tensor:
        """The output code of every input code (index ``code - in_dtype.qmin``), in the output
        torch dtype, built once by the exact integer path."""
        if not self._map:
            if self.direct:
                y = torch.from_numpy(self.direct_table)
            else:
                x = torch.arange(self.in_dtype.qmin, self.in_dtype.qmax + 1, dtype=torch.int64)
                y = evaluate_codes_int(self.lut, x - self.in_zero_point) + self.out_zero_point
                y = y.clamp(self.out_dtype.qmin, self.out_dtype.qmax)
            self._map.append(y.to(self.out_dtype.torch_dtype))
        return self._map[0]

    def evaluate(self, codes: Tensor) -> Tensor:
        """Output codes (``out_dtype``'s torch dtype, same shape) of input ``codes`` (any integer
        dtype holding ``in_dtype`` codes): one gather, bit-exact with the reference."""
        index = codes.reshape(-1).to(torch.int64) - self.in_dtype.qmin
        table = self.code_map().to(codes.device)
        return table.index_select(0, index).reshape(codes.shape)

    def evaluate_reference(self, codes: Tensor) -> Tensor:
        """Slow twin of ``evaluate`` (``quantlab.numerics.reference.evaluate_zero_point_lut``)."""
        from quantlab.numerics.reference.lut_zero_point import evaluate_zero_point_lut

        return evaluate_zero_point_lut(self, codes)

    def slope(self, codes: Tensor) -> Tensor:
        """d(output code)/d(input code) at each input code (float64): the direct table's central
        difference, or the segment LUT's slope (``segment_slope``); 0 where the output sits at
        a saturation bound of ``out_dtype``."""
        if self.direct:
            d = np.gradient(self.direct_table.astype(np.float64))
            s = torch.from_numpy(d)[codes.reshape(-1).to(torch.int64) - self.in_dtype.qmin]
            return s.reshape(codes.shape)
        s = segment_slope(self.lut, self.centred(codes))
        y = self.evaluate(codes).to(torch.int64)
        at_bound = (y == self.out_dtype.qmin) | (y == self.out_dtype.qmax)
        return torch.where(at_bound, torch.zeros_like(s), s)


def _check(name: str, dt, zp: int) -> DType:
    dt = DType.parse(dt)
    if dt not in _DTYPES:
        allowed = ", ".join(d.name for d in _DTYPES)
        raise ValueError(f"{name} must be one of {allowed} for a LUT, got {dt.name}")
    if not dt.qmin <= int(zp) <= dt.qmax:
        raise ValueError(f"{name}'s zero point {zp} is outside [{dt.qmin}, {dt.qmax}]")
    if dt.bits > 8 and zp:
        raise ValueError(
            f"{name} is {dt.name} with zero point {zp}: a LUT takes 16-bit codes without a zero "
            "point only (the centred codes leave int16); use activation_symmetry SYMMETRIC for "
            "16-bit activations"
        )
    return dt


def direct_table(
    func: str,
    spec: LutSpec,
    in_dtype: DType,
    in_scale: float,
    in_zero_point: int,
    out_dtype: DType,
    out_scale: float,
    out_zero_point: int,
    fmt: LutFormat,
) -> np.ndarray:
    """The output code (int64) of every input code x from ``in_dtype.qmin``: by default
    ``saturate(round(f((x - zx) s_in) / s_out) + zo)`` (float64 function and quotient,
    ``fmt.table_round``); with ``fmt.values`` RUNTIME_FLOAT32, as onnxruntime computes each
    (``runtime_values``)."""
    if fmt.values is TableValues.RUNTIME_FLOAT32:
        q = torch.arange(in_dtype.qmin, in_dtype.qmax + 1, dtype=torch.int64)
        args = (in_scale, in_zero_point, out_dtype, out_scale, out_zero_point)
        return runtime_codes(func, spec, q, *args).numpy()
    fn = get_function(func)
    q = torch.arange(in_dtype.qmin, in_dtype.qmax + 1, dtype=torch.float64)
    y = fn.target((q - in_zero_point) * in_scale, spec)
    if not bool(torch.isfinite(y).all()):
        raise ValueError(f"{func}: the table target produced a non-finite value")
    codes = round_float(y / out_scale, fmt.table_round) + out_zero_point
    return codes.clamp(out_dtype.qmin, out_dtype.qmax).to(torch.int64).numpy()


def build_zero_point_lut(
    func: str,
    in_dtype: DType,
    in_scale: float,
    in_zero_point: int,
    out_dtype: DType,
    out_scale: float,
    out_zero_point: int,
    spec: LutSpec | None = None,
    fmt: LutFormat = J6_FORMAT,
    observed_range: tuple[float, float] | None = None,
    histogram: InputHistogram | None = None,
) -> ZeroPointLut:
    """Build (or fetch from the cache) the table of ``func`` on codes with zero points (module
    docstring). Raises ValueError for a dtype other than INT8 / UINT8 / INT16, a zero point
    outside its code range or on 16-bit codes, a non-positive scale, and what ``build_lut``
    raises."""
    in_dtype = _check("in_dtype", in_dtype, in_zero_point)
    out_dtype = _check("out_dtype", out_dtype, out_zero_point)
    in_scale = check_scale_float(in_scale, "in_scale")
    out_scale = check_scale_float(out_scale, "out_scale")
    spec = default_spec(func) if spec is None else spec
    obs = None if observed_range is None else tuple(float(v) for v in observed_range)
    return _build(
        func, in_dtype, in_scale, int(in_zero_point), out_dtype, out_scale, int(out_zero_point),
        spec, fmt, obs, histogram,
    )  # fmt: skip


@lru_cache(maxsize=256)
def _build(
    func, in_dtype, in_scale, zx, out_dtype, out_scale, zo, spec, fmt, observed, histogram
) -> ZeroPointLut:
    parts = (func, in_dtype, in_scale, zx, out_dtype, out_scale, zo, spec, fmt)
    runtime = fmt.values is TableValues.RUNTIME_FLOAT32  # the runtime computes every code
    if runtime or (fmt.direct_int8 and in_dtype.bits == 8 and out_dtype.bits == 8):
        table = direct_table(func, spec, in_dtype, in_scale, zx, out_dtype, out_scale, zo, fmt)
        return ZeroPointLut(*parts, direct_table=table, lut=None)
    lo_c, hi_c = in_dtype.qmin - zx, in_dtype.qmax - zx
    centred = DType.INT8 if DType.INT8.qmin <= lo_c and hi_c <= DType.INT8.qmax else DType.INT16
    shifted = out_dtype is DType.INT8 and zo == 0
    out_codes = DType.INT8 if shifted else DType.INT16
    rng = (lo_c * in_scale, hi_c * in_scale)  # what the centred codes can reach
    if observed is not None:
        lo, hi = max(rng[0], observed[0]), min(rng[1], observed[1])
        rng = (lo, hi) if hi - lo >= in_scale else rng
    lut = build_lut(func, centred, in_scale, out_codes, out_scale, spec, fmt, rng, histogram)
    return ZeroPointLut(*parts, direct_table=None, lut=lut)


def clear_build_cache() -> None:
    """Forget every built zero-point table."""
    _build.cache_clear()
