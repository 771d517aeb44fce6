"""Symmetric quantization (zero point 0): scales, quantize, dequantize, fake_quant, fake_cast.

Conventions (j6-numerics s.1): symmetric, zero point 0, full integer range; activations
per-tensor, weights per-channel on ``axis`` (0 for conv/linear weights).

Non-finite inputs (one documented behaviour, counted in ``QuantStats``):
  +inf -> qmax, -inf -> qmin (saturation, like any out-of-range value); NaN -> code 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.rounding import Round, round_float
from quantlab.numerics.shapes import along_axis

FLOAT32_EPS = float(torch.finfo(torch.float32).eps)


class ScaleRule(enum.Enum):
    """How a scale is derived from an observed absolute maximum ``amax``.

    HALF_RANGE: amax / ((qmax - qmin) / 2), i.e. amax/127.5 (int8), amax/32767.5 (int16): J6 (s.1).
    QMAX:       amax / qmax, the common convention (TFLite, torch.ao symmetric).
    POT:        the smallest power of two >= amax / qmax (older BPU architectures; option).
    """

    HALF_RANGE = "half_range"
    QMAX = "qmax"
    POT = "pot"


@dataclass
class QuantStats:
    """Counts of what quantization had to force: NaN codes, infinities, saturated values."""

    total: int = 0
    nan: int = 0
    inf: int = 0
    saturated: int = 0  # finite values outside [qmin, qmax] after rounding

    def add(self, other: QuantStats) -> None:
        self.total += other.total
        self.nan += other.nan
        self.inf += other.inf
        self.saturated += other.saturated


def compute_scale(
    amax: Tensor | float,
    dtype: DType,
    rule: ScaleRule = ScaleRule.HALF_RANGE,
    narrow_range: bool = False,
) -> Tensor:
    """Scale (float32) for symmetric integer ``dtype`` from ``amax`` >= 0 (per-tensor or channel).

    HALF_RANGE: amax / ((qmax - qmin) / 2); QMAX: amax / qmax (qmax = qmax for narrow ranges too);
    POT: 2**ceil(log2(amax / qmax)). The result is floored at float32 eps so it is never 0.
    The division is done in float64 and rounded once to float32.
    """
    if not dtype.is_int:
        raise ValueError(f"compute_scale needs an integer dtype, got {dtype.name}")
    a = torch.as_tensor(amax, dtype=torch.float64).clamp_min(0)
    if not bool(torch.isfinite(a).all()):
        raise ValueError("compute_scale: amax must be finite")
    if rule is ScaleRule.HALF_RANGE and not narrow_range:
        s = a / ((dtype.qmax - dtype.qmin) / 2)
    elif rule in (ScaleRule.QMAX, ScaleRule.HALF_RANGE):
        s = a / dtype.qmax
    elif rule is ScaleRule.POT:
        s = torch.exp2(torch.ceil(torch.log2((a / dtype.qmax).clamp_min(FLOAT32_EPS))))
    else:
        raise ValueError(f"unknown scale rule {rule!r}; allowed: {[r.name for r in ScaleRule]}")
    return s.to(torch.float32).clamp_min(FLOAT32_EPS)


def _broadcast_scale(scale: Tensor, x: Tensor, axis: int | None) -> Tensor:
    scale = torch.as_tensor(scale, dtype=torch.float32)
    if axis is None:
        if scale.numel() != 1:
            raise ValueError(
                f"per-tensor quantization needs one scale, got {scale.numel()}; pass axis= for "
                "per-channel scales"
            )
        return scale.reshape(())
    return along_axis(scale, x, axis, "per-channel scale")


def quantize(
    x: Tensor,
    scale: Tensor | float,
    dtype: DType,
    rounding: Round = Round.HALF_EVEN,
    axis: int | None = None,
    qmin: int | None = None,
    qmax: int | None = None,
    stats: QuantStats | None = None,
) -> Tensor:
    """codes = clamp(round(x / scale), qmin, qmax), returned in ``dtype``'s torch dtype.

    Rounding: ``rounding`` applied once to x / scale computed in float32 (x is cast to float32
    first; the division is IEEE correctly rounded, like torch.ao and ONNX QuantizeLinear).
    Saturation: clamps to [qmin, qmax] (defaults: the full range of ``dtype``).
    Non-finite: +inf -> qmax, -inf -> qmin, NaN -> 0; counted into ``stats`` when given.
    """
    if not dtype.is_int:
        raise ValueError(f"quantize needs an integer dtype, got {dtype.name}; use fake_cast")
    if not x.is_floating_point():
        raise TypeError(f"quantize expects a float tensor, got {x.dtype}")
    lo = dtype.qmin if qmin is None else qmin
    hi = dtype.qmax if qmax is None else qmax
    xf = x.to(torch.float32)
    s = _broadcast_scale(scale, xf, axis)
    r = round_float(xf / s, rounding)
    nan = torch.isnan(r)
    if stats is not None:
        stats.total += r.numel()
        stats.nan += int(nan.sum())
        stats.inf += int(torch.isinf(xf).sum())
        stats.saturated += int((((r < lo) | (r > hi)) & torch.isfinite(xf)).sum())
    r = torch.where(nan, torch.zeros((), dtype=r.dtype), r)
    return r.clamp(lo, hi).to(dtype.torch_dtype)


def dequantize(codes: Tensor, scale: Tensor | float, axis: int | None = None) -> Tensor:
    """x = codes * scale in float32 (exact: |codes| < 2**24 and one float32 product)."""
    c = codes.to(torch.float32)
    return c * _broadcast_scale(scale, c, axis)


def fake_cast(x: Tensor, dtype: DType, saturate: bool = True) -> Tensor:
    """Round float values to ``dtype`` (FLOAT16 or FLOAT32) and back to float32.

    Rounding: IEEE round to nearest even, once (float64 inputs are rounded straight to float16,
    not through float32, which would round twice). Saturation: with ``saturate`` finite
    values beyond +-65504 clamp to +-65504 (instead of becoming inf); inf and NaN pass through.
    """
    if dtype is DType.FLOAT32:
        return x.to(torch.float32)
    if dtype is not DType.FLOAT16:
        raise ValueError(f"fake_cast takes FLOAT16 or FLOAT32, got {dtype.name}")
    from quantlab.numerics.float16 import round_to_float16

    xf = x if x.dtype == torch.float64 else x.to(torch.float32)
    if saturate:
        m = DType.FLOAT16.max_finite
        xf = torch.where(torch.isfinite(xf), xf.clamp(-m, m), xf)
    return round_to_float16(xf).to(torch.float32)


def fake_quant(
    x: Tensor,
    scale: Tensor | float | None,
    dtype: DType,
    rounding: Round = Round.HALF_EVEN,
    axis: int | None = None,
    stats: QuantStats | None = None,
    saturate_float: bool = True,
) -> Tensor:
    """QAT numerics: dequantize(quantize(x)) for integer dtypes, fake_cast for float dtypes.

    Returns float32. For FLOAT16/FLOAT32 ``scale`` is ignored (may be None).
    """
    if dtype.is_float:
        return fake_cast(x, dtype, saturate=saturate_float)
    if scale is None:
        raise ValueError(f"fake_quant to {dtype.name} needs a scale")
    codes = quantize(x, scale, dtype, rounding, axis=axis, stats=stats)
    return dequantize(codes, scale, axis=axis)
