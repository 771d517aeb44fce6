"""Requantization: an exact integer accumulator -> int8/int16 output codes (j6-numerics s.7).

A real multiplier ``M = s_x * s_w / s_out`` (per tensor or per output channel) is applied to the
accumulator by one of four schemes (bit-exact-emulation s.1); ``make_requant`` encodes M once
and ``requantize`` applies it. The J6 add rule and a float-rescale add are in ``scaled_add``.

All functions are pure; integer work is done in int64 with stated bounds, float work in float32
exactly as the reference runtime does it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import QuantStats, check_zero_point
from quantlab.numerics.rounding import (
    Round,
    half_up_offset,
    round_float,
    rshift_round,
    rshift_round_half_up_,
)
from quantlab.numerics.scales import check_multiplier, check_scale
from quantlab.numerics.shapes import along_axis

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
MAX_MULTIPLIER_SHIFT = 30
"""TFLite QuantizeMultiplier (single-rounding build) saturates a shift above 30 to 30 with the
largest multiplier; a real multiplier >= 2**30 saturates every nonzero int8/int16 output anyway."""


class Requant(enum.Enum):
    """How an accumulator is rescaled to output codes.

    FLOAT_RESCALE:    float32(acc) * float32(s_in*s_w/s_out), rounded (ONNX Runtime QLinear ops,
                      XNNPACK).
    FLOAT64_RESCALE:  float64(acc) * float64(s_in*s_w/s_out), rounded (TFLite's reference
                      FULLY_CONNECTED: ``std::round(double(acc) * M)``).
    MUL_SHIFT:        integer multiplier + shift with a single rounding (TFLite single rounding,
                      TOSA SINGLE_ROUND); tie rule from the platform's ``requant_round``.
    MUL_SHIFT_DOUBLE: gemmlowp/TFLite default double rounding (SRDHM half up, then
                      RoundingDivideByPOT half away).
    MUL_SHIFT_INT64:  TFLite 16x8 int64 path: 16-bit reduced multiplier, one half-up rounding.
    """

    FLOAT_RESCALE = "float_rescale"
    FLOAT64_RESCALE = "float64_rescale"
    MUL_SHIFT = "mul_shift"
    MUL_SHIFT_DOUBLE = "mul_shift_double"
    MUL_SHIFT_INT64 = "mul_shift_int64"


@dataclass(frozen=True)
class RequantParams:
    """An encoded real multiplier M (0-d per tensor, 1-d per channel).

    ``real``: FLOAT_RESCALE: the float32 M that is multiplied; FLOAT64_RESCALE: the float64 M
    that is multiplied; integer schemes: the float64 M that was encoded.
    ``multiplier``/``shift`` (int64): M ~= multiplier * 2**(shift - mult_bits), multiplier in
    [2**(mult_bits-1), 2**mult_bits) or 0 (TFLite QuantizeMultiplier convention: shift > 0
    scales up). FLOAT_RESCALE carries the same encoding for information only.
    """

    scheme: Requant
    real: Tensor
    multiplier: Tensor
    shift: Tensor
    mult_bits: int = 31

    @property
    def per_channel(self) -> bool:
        return self.real.dim() == 1


def requant_scale(
    x_scale: Tensor | float,
    w_scale: Tensor | float,
    out_scale: Tensor | float,
    scheme: Requant,
) -> Tensor:
    """The real multiplier M = x_scale * w_scale / out_scale as each runtime forms it.

    FLOAT_RESCALE (ONNX Runtime qlinearconv.cc / qlinearmatmul.cc): float32, left to right,
    ``fl32(fl32(x_scale * w_scale) / out_scale)``; returns float32.
    FLOAT64_RESCALE and the integer schemes (TFLite per-channel ``QuantizeMultiplier`` input):
    float64
    ``double(x_scale) * double(w_scale) / double(out_scale)``; returns float64.
    ``w_scale`` may be per channel (1-d); the others are scalars. Every scale is finite and > 0
    in float32 (else ValueError naming it).
    """
    sx = check_scale(x_scale, "x_scale")
    sw = check_scale(w_scale, "w_scale")
    so = check_scale(out_scale, "out_scale")
    if scheme is Requant.FLOAT_RESCALE:
        return (sx * sw) / so
    return sx.to(torch.float64) * sw.to(torch.float64) / so.to(torch.float64)


def rescale_multiplier(
    in_scale: Tensor | float, out_scale: Tensor | float, scheme: Requant, count: int = 1
) -> Tensor:
    """M = in_scale / (out_scale * count) as ``requant_scale`` forms it (w_scale = 1), with
    the divisor ``out_scale * count`` taken in float64 and rounded once to float32 (a mean of
    ``count`` values rescaled to ``out_scale``; count = 1: a plain rescale)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    so = check_scale(out_scale, "out_scale")
    den = so if count == 1 else check_scale(float(so) * count, "out_scale * count")
    return requant_scale(in_scale, 1.0, den, scheme)


def quantize_multiplier(real: Tensor, mult_bits: int = 31) -> tuple[Tensor, Tensor]:
    """Encode M >= 0 (float64) as (q, shift) with M ~= q * 2**(shift - mult_bits).

    TFLite ``QuantizeMultiplier``: frexp gives M = f * 2**e, f in [0.5, 1); q = round(f *
    2**mult_bits) with ties away from zero (``std::round``); q == 2**mult_bits becomes
    2**(mult_bits-1) with e + 1; e < -31 flushes to q = 0, shift = 0; e > 30 saturates to
    q = 2**mult_bits - 1, shift = 30 (TFLite's single-rounding build; every scheme here, so a
    left shift never exceeds 30). M = 0 gives (0, 0).
    Exactness: f * 2**mult_bits is exact in float64 (a power-of-two scaling).
    """
    m = check_multiplier(real, "requantization multiplier")
    frac, exp = torch.frexp(m)
    q = round_float(frac * float(1 << mult_bits), Round.HALF_AWAY).to(torch.int64)
    e = exp.to(torch.int64)
    full = q == (1 << mult_bits)
    q = torch.where(full, q // 2, q)
    e = torch.where(full, e + 1, e)
    flush = (e < -31) | (m == 0)
    q = torch.where(flush, torch.zeros_like(q), q)
    e = torch.where(flush, torch.zeros_like(e), e)
    big = e > MAX_MULTIPLIER_SHIFT
    q = torch.where(big, torch.full_like(q, (1 << mult_bits) - 1), q)
    e = torch.where(big, torch.full_like(e, MAX_MULTIPLIER_SHIFT), e)
    return q, e


def make_requant(real_scale: Tensor | float, scheme: Requant, mult_bits: int = 31) -> RequantParams:
    """Encode the real multiplier ``real_scale`` (scalar or 1-d per channel) for ``scheme``
    (once per distinct value: the result is cached by value and shared; never modify it).

    FLOAT_RESCALE keeps ``real_scale`` rounded once to float32 (pass ``requant_scale(...,
    FLOAT_RESCALE)`` to reproduce ONNX Runtime); FLOAT64_RESCALE keeps it in float64. The
    integer schemes encode it in float64 with ``quantize_multiplier``; MUL_SHIFT_DOUBLE and
    MUL_SHIFT_INT64 need ``mult_bits=31`` (TFLite), MUL_SHIFT takes 31 or 15.
    """
    if not isinstance(scheme, Requant):
        raise ValueError(f"scheme must be a Requant, got {scheme!r}; allowed: {_names(Requant)}")
    if mult_bits not in (15, 31):
        raise ValueError(f"mult_bits must be 15 or 31, got {mult_bits}")
    if scheme in (Requant.MUL_SHIFT_DOUBLE, Requant.MUL_SHIFT_INT64) and mult_bits != 31:
        raise ValueError(f"{scheme.name} uses a 31-bit multiplier (mult_bits=31), got {mult_bits}")
    # a Python float is taken in full (float64) precision, a tensor in its own dtype
    r = (
        real_scale
        if isinstance(real_scale, Tensor)
        else torch.tensor(real_scale, dtype=torch.float64)
    )
    key = (str(r.dtype), tuple(r.shape), r.detach().cpu().contiguous().numpy().tobytes())
    key = (*key, scheme, mult_bits)
    hit = _ENCODED.get(key)
    if hit is not None:
        return hit
    check_multiplier(r, "real_scale")
    if r.dim() > 1:
        raise ValueError(
            f"real_scale must be a scalar or 1-d per channel, got shape {tuple(r.shape)}"
        )
    if scheme is Requant.FLOAT_RESCALE:
        real = r.to(torch.float32)
        q, e = quantize_multiplier(real.to(torch.float64), mult_bits)
    else:
        real = r.to(torch.float64)
        q, e = quantize_multiplier(real, mult_bits)
    value = RequantParams(scheme, real, q, e, mult_bits)
    if len(_ENCODED) >= ENCODED_LIMIT:
        _ENCODED.clear()
    _ENCODED[key] = value
    return value


ENCODED_LIMIT = 4096  # encoded multipliers kept (one per distinct value, scheme and width)
# (dtype, shape, bytes of real_scale, scheme, mult_bits) -> RequantParams: the encoding is a
# pure function of the value, so it is computed once per value (a plan-time cache)
_ENCODED: dict[tuple, RequantParams] = {}


def _names(enum_cls) -> str:
    return ", ".join(m.name for m in enum_cls)


def _along(p: Tensor, acc: Tensor, axis: int | None) -> Tensor:
    """Shape a per-tensor (0-d) or per-channel (1-d) parameter to broadcast along ``axis``."""
    if p.dim() == 0:
        return p
    if axis is None:
        raise ValueError("per-channel requant parameters need axis= (the output channel axis)")
    return along_axis(p.reshape(-1), acc, axis, f"per-channel requant with {p.numel()} channels")


def srdhm(a: Tensor, b: Tensor) -> Tensor:
    """gemmlowp SaturatingRoundingDoublingHighMul: round(a * b / 2**31), ties toward +inf.

    Domain: int32 values carried in int64. Saturation: only a = b = INT32_MIN -> INT32_MAX.
    Exactness: |a * b| <= 2**62 in int64. Same bits as NEON VQRDMULH.
    """
    out = rshift_round(a * b, 31, Round.HALF_UP)
    both_min = (a == INT32_MIN) & (b == INT32_MIN)
    return torch.where(both_min, torch.full_like(out, INT32_MAX), out)


def mul_shift_double(a: Tensor, q: Tensor, e: Tensor, rounding: Round = Round.HALF_AWAY) -> Tensor:
    """TFLite MultiplyByQuantizedMultiplier (double rounding) of int32 values ``a`` (int64):
    x = sat32(a * 2**max(e, 0)), SRDHM(x, q) (ties toward +inf), then a right shift by
    max(-e, 0) rounded by ``rounding`` (RoundingDivideByPOT: HALF_AWAY). Returns int64,
    unsaturated (|result| <= 2**31)."""
    left = e.clamp_min(0)  # <= MAX_MULTIPLIER_SHIFT: |acc << left| < 2**61
    right = (-e).clamp_min(0)
    x = (a << left).clamp(INT32_MIN, INT32_MAX)
    return rshift_round(srdhm(x, q), right, rounding)


def requantize(
    acc: Tensor,
    params: RequantParams,
    out: DType,
    rounding: Round,
    axis: int | None = None,
    stats: QuantStats | None = None,
    zero_point: int = 0,
) -> Tensor:
    """Output codes = saturate(round(acc * M) + zero_point) in ``out``'s torch dtype.

    acc: integer tensor (int32 values; int64 for MUL_SHIFT_INT64, |acc| < 2**47, and for
    FLOAT64_RESCALE, |acc| < 2**53). Per-channel params broadcast along ``axis`` of acc.
    ``zero_point``: the output's (per tensor), added exactly after rounding. Saturation: clamps
    to [out.qmin, out.qmax] (counted in ``stats.saturated`` when given).
    FLOAT_RESCALE: float32(acc) * float32 M (one IEEE product; acc is rounded to float32 when
      |acc| > 2**24, as ONNX Runtime does), then ``rounding`` (ONNX Runtime: HALF_EVEN).
    FLOAT64_RESCALE: float64(acc) * float64 M (one IEEE product; acc exact), then ``rounding``
      (TFLite: HALF_AWAY).
    MUL_SHIFT: round(acc * q / 2**(mult_bits - shift)) with one rounding by ``rounding``; exact
      in int64 (|acc * q| < 2**62). With HALF_UP and a right shift n >= 1 (every real
      multiplier below 1 with 31-bit multipliers) it runs as floor((acc * q + 2**(n-1)) / 2**n),
      the same integer, in four passes.
    MUL_SHIFT_DOUBLE: TFLite MultiplyByQuantizedMultiplier: x = sat32(acc * 2**max(shift, 0)),
      SRDHM(x, q) (ties toward +inf), then a right shift by max(-shift, 0) rounded by
      ``rounding`` (TFLite RoundingDivideByPOT = HALF_AWAY). TFLite's C code overflows (undefined
      behaviour) where this saturates, as gemmlowp's saturating shifts do; only multipliers
      >= 1 shift left.
    MUL_SHIFT_INT64: TFLite int64 overload (16x8): r = (q + 2**15) >> 16 (0x7FFF if q >=
      0x7FFF0000), round(acc * r / 2**(15 - shift)) once by ``rounding`` (TFLite: HALF_UP).
    """
    if acc.is_floating_point() or acc.dtype == torch.bool:
        raise TypeError(f"requantize expects an integer accumulator, got {acc.dtype}")
    if out not in (DType.INT8, DType.UINT8, DType.INT16):
        raise ValueError(f"requantize output must be INT8, UINT8 or INT16, got {out.name}")
    zp = check_zero_point(zero_point, out)
    a = acc.to(torch.int64)
    scheme = params.scheme
    wide = {Requant.MUL_SHIFT_INT64: 1 << 47, Requant.FLOAT64_RESCALE: 1 << 53}.get(scheme)
    if a.numel():
        lo, hi = torch.aminmax(a)
        if wide is None and (int(lo) < INT32_MIN or int(hi) > INT32_MAX):
            raise ValueError(
                f"{scheme.name} takes int32 accumulator values; apply accumulate() first"
            )
        if wide is not None and max(-int(lo), int(hi)) >= wide:
            raise ValueError(f"{scheme.name} needs |acc| < 2**{wide.bit_length() - 1}")
    if scheme in (Requant.FLOAT_RESCALE, Requant.FLOAT64_RESCALE):
        fdt = torch.float32 if scheme is Requant.FLOAT_RESCALE else torch.float64
        m = _along(params.real.to(fdt), a, axis)
        r = round_float(a.to(fdt) * m, rounding)
        return _saturate_codes(r.to(torch.float64) + zp if zp else r, out, stats)
    q = _along(params.multiplier, a, axis)
    e = _along(params.shift, a, axis)
    if scheme is Requant.MUL_SHIFT:
        n = params.mult_bits - e  # right shift; negative means a left shift
        if rounding is Round.HALF_UP and stats is None and bool((n >= 1).all()):
            r = rshift_round_half_up_(a * q, n, half_up_offset(n))
            if zp:
                r.add_(zp)
            return r.clamp_(out.qmin, out.qmax).to(out.torch_dtype)
        prod = a * q
        # a left shift only grows |prod|; clamp first so the shift cannot wrap int64
        left = (-n).clamp_min(0).clamp_max(30)
        prod = torch.where(n < 0, prod.clamp(-(1 << 32), 1 << 32) << left, prod)
        r = rshift_round(prod, n.clamp_min(0), rounding)
    elif scheme is Requant.MUL_SHIFT_DOUBLE:
        r = mul_shift_double(a, q, e, rounding)
    elif scheme is Requant.MUL_SHIFT_INT64:
        reduced = rshift_round(q, 16, Round.HALF_UP)  # (q + 2**15) >> 16 for q >= 0
        red = torch.where(q < 0x7FFF0000, reduced, torch.full_like(q, 0x7FFF))
        total = 15 - e
        prod = a * red
        left = (-total).clamp_min(0).clamp_max(30)
        prod = torch.where(total < 0, prod.clamp(-(1 << 32), 1 << 32) << left, prod)
        r = rshift_round(prod, total.clamp_min(0), rounding)
    else:
        raise ValueError(f"unknown requant scheme {scheme!r}; allowed: {_names(Requant)}")
    return _saturate_codes(r + zp if zp else r, out, stats)


def _saturate_codes(r: Tensor, out: DType, stats: QuantStats | None) -> Tensor:
    if stats is not None:
        stats.total += r.numel()
        stats.saturated += int(((r < out.qmin) | (r > out.qmax)).sum())
    return r.clamp(out.qmin, out.qmax).to(out.torch_dtype)


@dataclass(frozen=True)
class Int32Requant:
    """``requantize`` by per-tensor ``params`` to ``out`` with ``rounding``, prepared for
    ``requantize_int32``. ``fast``: MUL_SHIFT, HALF_UP and right shift n = mult_bits - shift
    >= 1; then ``shift`` is n and ``offset`` 2**(n-1) (int64)."""

    params: RequantParams
    out: DType
    rounding: Round
    fast: bool
    shift: Tensor | None = None
    offset: Tensor | None = None


def int32_requant(params: RequantParams, out: DType, rounding: Round) -> Int32Requant:
    """Prepare ``requantize_int32`` (one host read of the shift; per-channel params take the
    general form)."""
    if out not in (DType.INT8, DType.UINT8, DType.INT16):
        raise ValueError(f"requantize output must be INT8, UINT8 or INT16, got {out.name}")
    n = params.mult_bits - params.shift
    fast = params.scheme is Requant.MUL_SHIFT and rounding is Round.HALF_UP
    if not fast or params.per_channel or int(n) < 1:
        return Int32Requant(params, out, rounding, False)
    return Int32Requant(params, out, rounding, True, n, half_up_offset(n))


def requantize_int32(acc: Tensor, r: Int32Requant) -> Tensor:
    """``requantize(acc, r.params, r.out, r.rounding)`` as int64 codes (same values) for an
    integer ``acc`` whose values the caller has proven to lie in int32 (not checked: no host
    read). Fast form (``r.fast``): floor((acc * q + 2**(n-1)) / 2**n) in int64 (|acc * q| <
    2**62), saturated to ``r.out``'s range; otherwise the general ``requantize``."""
    if not r.fast:
        return requantize(acc, r.params, r.out, r.rounding).to(torch.int64)
    v = acc.to(torch.int64) * r.params.multiplier
    return rshift_round_half_up_(v, r.shift, r.offset).clamp_(r.out.qmin, r.out.qmax)
