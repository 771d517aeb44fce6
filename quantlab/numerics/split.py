"""High/low int8 splitting of GEMM operands ("int8 x 2 ~ int15"), j6-numerics s.6.

Weight split (seed recipe): per output channel, with the weight scale ``s``,
``w_hi = clamp(round(w / s), -128, 127)`` and ``w_lo = round((w - s*w_hi) / (s / 2**k))`` in
int8, so ``w ~ s * (w_hi + w_lo / 2**k)`` and a GEMM becomes two int8 GEMMs:
``acc = acc_hi + acc_lo / 2**k`` (in units of ``s_x * s``).

Operand split (MatMul, int16 operands on an int8 MAC array): an int16 code ``c`` in
[-32768, 32639] is exactly ``hi * 256 + lo`` with int8 ``hi`` and ``lo``, so
``A (B_hi 2**8 + B_lo) = (A B_hi) 2**8 + A B_lo`` for either operand, and int16 x int16 takes
four int8 passes. Partial accumulators are carried as ``(acc, exponent)`` pairs whose value is
``sum(acc * 2**exponent)`` in units of the product of the operand scales.

How the hardware adds the partials is not public (bit-exact-emulation s.6.3); both ways are
modelled by ``SplitCombine``: one wide accumulator and one requantization, or each partial
requantized on its own and the rounded results added.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch
from torch import Tensor

from quantlab.numerics import gemm
from quantlab.numerics.accumulator import Overflow, accumulate
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import fake_cast
from quantlab.numerics.requant import Requant, quantize_multiplier
from quantlab.numerics.rounding import Round, round_float, rshift_round
from quantlab.numerics.scales import check_scale
from quantlab.numerics.shapes import along_axis

SPLIT_K_ALLOWED = tuple(range(1, 9))
"""Allowed low-part shifts k. |residual| <= s/2 gives |w_lo| <= 2**(k-1): k <= 7 never clips,
k = 8 clips the single value w_lo = +128 to 127; k >= 9 would clip most low parts."""

INT16_SPLIT_MAX = 32639
"""Largest int16 code that splits into int8 halves (hi*256 + lo, hi <= 127): 32767 - 128."""


class SplitCombine(enum.Enum):
    """How the partial accumulators of a split GEMM become output codes.

    WIDE_ACCUMULATOR: partials aligned and added exactly in one wide accumulator
                      (``wide_bits``, assumed 48 like TOSA's int48), then ONE requantization.
    SEPARATE_REQUANT: each partial requantized to the output scale on its own (one rounding
                      each), the integers added, then saturated to the output dtype.
    """

    WIDE_ACCUMULATOR = "wide_accumulator"
    SEPARATE_REQUANT = "separate_requant"


def check_split_k(k: int) -> int:
    """Validate the low-part shift; ValueError naming ``weight_split`` k and the allowed values."""
    if isinstance(k, bool) or not isinstance(k, int) or k not in SPLIT_K_ALLOWED:
        raise ValueError(
            f"weight_split k={k!r} is not allowed: the int8 low part holds residuals up to "
            f"2**(k-1), so k must be one of {list(SPLIT_K_ALLOWED)} (7: no clipping, "
            "8: full int8 range)"
        )
    return k


SPLIT_OP_TYPES = ("conv1d", "conv2d", "linear")
"""Op types whose weight can be split (a MatMul splits its second operand instead:
``numerics.split_matmul``)."""


def check_split_target(op_name: str, op_type: str, has_weight: bool, k: int) -> int:
    """Validate ``weight_split=k`` for one op: k allowed, and the op has a weight to split
    (conv/linear) or is a MatMul (its second operand is split, ``numerics.split_matmul``).

    ValueError names the op, its type and what is allowed.
    """
    check_split_k(k)
    if op_type == "matmul":
        return k
    if op_type not in SPLIT_OP_TYPES or not has_weight:
        raise ValueError(
            f"weight_split={k} requested on op {op_name!r} ({op_type}), which has no weight: "
            f"the high/low split applies to {', '.join(SPLIT_OP_TYPES)} weights and to the "
            "second operand of a matmul"
        )
    return k


def _channel_scale(scale: Tensor | float, w: Tensor, axis: int | None) -> Tensor:
    s = check_scale(scale, "scale")
    if s.numel() == 1 and (axis is None or w.dim() == 0):
        return s.reshape(())
    if axis is None:
        raise ValueError(f"split: {s.numel()} scales given but axis=None (per-tensor)")
    return along_axis(s, w, axis, "split: per-channel scale")


def split_weight(
    w: Tensor,
    scale: Tensor | float,
    k: int,
    axis: int | None = 0,
    rounding: Round = Round.HALF_EVEN,
) -> tuple[Tensor, Tensor]:
    """(w_hi, w_lo) int8 codes with w ~ s * (w_hi + w_lo / 2**k); s per channel on ``axis``.

    w_hi = clamp(round(w / s), -128, 127): w / s in float32 (IEEE division), like ``quantize``.
    w_lo = clamp(round((w - s*w_hi) * 2**k / s), -128, 127).
    Rounding: ``rounding`` for both halves. Saturation: both clamp to int8; with |w| <= 127.5 s
    and k <= 7 the low part never clips and |w - s (w_hi + w_lo/2**k)| <= s / 2**(k+1).
    Exactness: the residual is exact in float64 (w float32, s*w_hi needs <= 32 bits, and
    w_hi != 0 implies |w| >= s/2, so all bits lie within 34 binary places); the quotient's
    rounding direction is exact too (its distance to a tie is at least ~2**-40 relative).
    """
    check_split_k(k)
    if not w.is_floating_point():
        raise TypeError(f"split_weight expects float weights, got {w.dtype}")
    wf = w.to(torch.float32)
    s = _channel_scale(scale, wf, axis)
    hi = round_float(wf / s, rounding).clamp(-128, 127)
    resid = wf.double() - s.double() * hi.double()
    lo = round_float(resid * float(1 << k) / s.double(), rounding).clamp(-128, 127)
    return hi.to(torch.int8), lo.to(torch.int8)


def split_fake_weight(
    w: Tensor,
    scale: Tensor | float,
    k: int,
    axis: int | None = 0,
    rounding: Round = Round.HALF_EVEN,
) -> Tensor:
    """Float32 weights the split represents: s * (w_hi + w_lo / 2**k).

    Exactness: computed exactly in float64 (an int16-sized integer times a float32 scale),
    then rounded once to float32 (nearest even).
    """
    hi, lo = split_weight(w, scale, k, axis, rounding)
    s = _channel_scale(scale, w, axis).double()
    code = hi.double() * float(1 << k) + lo.double()
    return (s * code / float(1 << k)).to(torch.float32)


def split_error_bound(scale: Tensor | float, k: int) -> Tensor:
    """Largest |w - split_fake_weight(w)| without clipping: s / 2**(k+1) (float64)."""
    check_split_k(k)
    return check_scale(scale, "scale", torch.float64) / float(1 << (k + 1))


def split_int16_codes(codes: Tensor) -> tuple[Tensor, Tensor]:
    """Exact byte split of int16 codes: codes = hi * 256 + lo, hi and lo int8.

    lo = ((c + 128) mod 256) - 128 in [-128, 127] (signed low byte), hi = (c - lo) / 256.
    Domain: codes in [-32768, 32639] (j6-numerics s.6: the usable int16 operand range); a code
    above 32639 would need hi = 128 and raises ValueError. Exactness: integer ops only.
    """
    if codes.is_floating_point():
        raise TypeError(f"split_int16_codes expects integer codes, got {codes.dtype}")
    c = codes.to(torch.int64)
    if c.numel() and (int(c.max()) > INT16_SPLIT_MAX or int(c.min()) < -32768):
        raise ValueError(
            f"int16 operand codes must lie in [-32768, {INT16_SPLIT_MAX}] to split into int8 "
            f"halves (hi*256 + lo); got [{int(c.min())}, {int(c.max())}]. Quantize the operand "
            "with qmax = platform.int16_operand_max"
        )
    lo = torch.remainder(c + 128, 256) - 128
    hi = torch.div(c - lo, 256, rounding_mode="floor")
    return hi.to(torch.int8), lo.to(torch.int8)


def weight_split_parts(acc_hi: Tensor, acc_lo: Tensor, k: int) -> list[tuple[Tensor, int]]:
    """The two partials of a weight split as (acc, exponent): acc_hi * 2**0 + acc_lo * 2**-k."""
    check_split_k(k)
    return [(acc_hi, 0), (acc_lo, -k)]


def combine_split(
    acc_hi: Tensor,
    acc_lo: Tensor,
    k: int,
    real_scale: Tensor | float,
    out: DType,
    combine: SplitCombine,
    rounding: Round = Round.HALF_UP,
    scheme: Requant = Requant.MUL_SHIFT,
    mult_bits: int = 31,
    wide_mult_bits: int = 15,
    wide_bits: int = 48,
    axis: int | None = None,
) -> Tensor:
    """Output of a weight-split GEMM: requant((acc_hi + acc_lo / 2**k) * real_scale).

    ``real_scale`` = s_x * s_w / s_out (per tensor, or per channel on ``axis`` of the
    accumulators); for a float ``out`` (FLOAT16/FLOAT32) it is s_x * s_w and floats come back.
    Contract of each combine mode: ``combine_partials``.
    """
    return combine_partials(
        weight_split_parts(acc_hi, acc_lo, k),
        real_scale,
        out,
        combine,
        rounding=rounding,
        scheme=scheme,
        mult_bits=mult_bits,
        wide_mult_bits=wide_mult_bits,
        wide_bits=wide_bits,
        axis=axis,
    )


def combine_partials(
    parts: Sequence[tuple[Tensor, int]],
    real_scale: Tensor | float,
    out: DType,
    combine: SplitCombine,
    rounding: Round = Round.HALF_UP,
    scheme: Requant = Requant.MUL_SHIFT,
    mult_bits: int = 31,
    wide_mult_bits: int = 15,
    wide_bits: int = 48,
    axis: int | None = None,
) -> Tensor:
    """Requantize sum(acc_i * 2**e_i) * real_scale to ``out`` codes (floats for a float out).

    WIDE_ACCUMULATOR: W = sum(acc_i << (e_i - e_min)) exactly, saturated to a signed
      ``wide_bits`` accumulator (assumed 48, TOSA's int48), then ONE requantization of W by
      real_scale * 2**e_min with a ``wide_mult_bits``-bit multiplier (assumed 15: a 48-bit
      accumulator takes a 16-bit signed multiplier, as TOSA RESCALE and TFLite's int64 path do).
    SEPARATE_REQUANT: y_i = requant(acc_i, real_scale * 2**e_i) with a ``mult_bits``-bit
      multiplier per partial (one rounding each), y = saturate(sum y_i): up to len(parts) - 1
      output LSBs more error than one exact rounding.
    Requantization (``requant_partial``): MUL_SHIFT = one rounding of acc * M / 2**n by
      ``rounding``; FLOAT_RESCALE = round(float32(acc) * float32(real)).
    Saturation: the final sum clamps to [out.qmin, out.qmax].
    Float ``out`` (FLOAT16/FLOAT32, J6H/P): WIDE rounds float64(W) * real * 2**e_min once to
      ``out``; SEPARATE rounds each partial to ``out`` and adds in ``out`` (float32 sums of two
      float16 values rounded to float16 equal the float16 sum: 24 >= 2 * 11 + 2).
    Domain: acc_i int32 values (each int8 pass accumulates in int32; saturate or wrap them
      first per ``platform.accumulator_overflow``); real_scale > 0.
    """
    if not parts:
        raise ValueError("combine_partials needs at least one partial accumulator")
    if not isinstance(combine, SplitCombine):
        raise ValueError(
            f"combine={combine!r} is not allowed; allowed: {[m.name for m in SplitCombine]}"
        )
    if not 33 <= wide_bits <= 48:
        raise ValueError(f"wide_bits must be in [33, 48], got {wide_bits}")
    real = check_scale(real_scale, "real_scale", torch.float64)
    accs = [a.to(torch.int64) for a, _ in parts]
    exps = [int(e) for _, e in parts]
    e_min = min(exps)
    wide = combine is SplitCombine.WIDE_ACCUMULATOR

    if out.is_float:
        if wide:
            w = _wide_sum(accs, exps, e_min, wide_bits)
            return fake_cast(w.double() * _bcast(real * 2.0**e_min, w, axis), out)
        total = None
        for a, e in zip(accs, exps):
            y = fake_cast(a.double() * _bcast(real * 2.0**e, a, axis), out)
            total = y if total is None else fake_cast(total + y, out)
        return total

    if wide:
        w = _wide_sum(accs, exps, e_min, wide_bits)
        total = requant_partial(w, real * 2.0**e_min, rounding, scheme, wide_mult_bits, axis)
    else:
        total = torch.zeros((), dtype=torch.int64)
        for a, e in zip(accs, exps):
            if bool((a.abs() > 2**31).any()):
                raise ValueError("combine_partials: partial accumulators must be int32 values")
            total = total + requant_partial(a, real * 2.0**e, rounding, scheme, mult_bits, axis)
    return total.clamp(out.qmin, out.qmax).to(out.torch_dtype)


def multiplier_shift(real: Tensor | float, mult_bits: int) -> tuple[Tensor, Tensor]:
    """(M, n) int64 with real ~ M / 2**n and 2**(mult_bits-1) <= M <= 2**mult_bits - 1.

    M comes from ``requant.quantize_multiplier`` (TFLite QuantizeMultiplier: frexp, ties away),
    so a split partial uses the same multiplier as an unsplit GEMM; n = mult_bits - exponent.
    A real below 2**-32 flushes to M = 0 (output 0), as there. Domain: 0 < real < 2**30.
    """
    if mult_bits not in (15, 31):
        raise ValueError(f"mult_bits must be 15 or 31, got {mult_bits}")
    r = check_scale(real, "real", torch.float64)
    if bool((r >= 2.0**30).any()):
        raise ValueError(
            f"requantization scale {r.tolist()} is outside [2**-31, 2**30) (the multiplier's "
            "shift saturates at 30)"
        )
    big, e = quantize_multiplier(r, mult_bits)
    n = mult_bits - e
    if bool((n < 0).any()) or bool((n > 62).any()):
        raise ValueError(f"requantization scale {r.tolist()} is outside [2**-31, 2**31]")
    return big, n


def requant_partial(
    acc: Tensor,
    real: Tensor | float,
    rounding: Round,
    scheme: Requant,
    mult_bits: int,
    axis: int | None = None,
) -> Tensor:
    """round(acc * real) as int64, unsaturated; per-tensor or per-channel (``axis``) ``real``.

    MUL_SHIFT: (M, n) = multiplier_shift(real); rshift_round(acc * M, n, rounding): one
      rounding, exact in int64 while |acc| * 2**mult_bits < 2**62.
    FLOAT_RESCALE: round_float(float32(acc) * float32(real), rounding) (ONNX Runtime style;
      float32(acc) is inexact beyond 2**24, as in that scheme).
    Other schemes are defined for int32 accumulators only and raise ValueError here.
    """
    acc = acc.to(torch.int64)
    r = check_scale(real, "real", torch.float64)
    if scheme is Requant.FLOAT_RESCALE:
        y = acc.to(torch.float32) * _bcast(r.to(torch.float32), acc, axis)
        return round_float(y, rounding).to(torch.int64)
    if scheme is not Requant.MUL_SHIFT:
        raise ValueError(
            f"split requantization scheme {scheme.name} is not modelled; allowed: MUL_SHIFT, "
            "FLOAT_RESCALE"
        )
    big, n = multiplier_shift(r, mult_bits)
    if acc.numel() and int(acc.abs().max()) > 1 << (62 - mult_bits):
        raise ValueError(
            f"accumulator magnitude {int(acc.abs().max())} too large for a {mult_bits}-bit "
            f"multiplier (limit 2**{62 - mult_bits})"
        )
    return rshift_round(acc * _bcast(big, acc, axis), _bcast(n, acc, axis), rounding)


def _bcast(v: Tensor, like: Tensor, axis: int | None) -> Tensor:
    if v.numel() == 1:
        return v.reshape(())
    if axis is None:
        raise ValueError(f"{v.numel()} per-channel scales given but axis=None")
    shape = [1] * like.dim()
    shape[axis % like.dim()] = -1
    return v.reshape(shape)


def _wide_sum(accs: list[Tensor], exps: list[int], e_min: int, wide_bits: int) -> Tensor:
    w = torch.zeros((), dtype=torch.int64)
    for a, e in zip(accs, exps):
        w = w + torch.bitwise_left_shift(a, e - e_min)
    lim = 1 << (wide_bits - 1)
    return w.clamp(-lim, lim - 1)


def int32_accumulate(acc: Tensor, overflow: Overflow) -> Tensor:
    """An exact int64 sum as an int32 accumulator holds it: SATURATE clamps, WRAP wraps
    (``accumulator.accumulate`` with INT32, without the count)."""
    return accumulate(acc, DType.INT32, overflow)[0]


def exact_conv2d(x_codes: Tensor, w_codes: Tensor, **conv_args) -> Tensor:
    """Exact int64 conv2d accumulator of int8/int16 codes (``gemm.int_conv2d``: provably exact
    float fast paths; F.conv2d arguments in ``conv_args``)."""
    return gemm.int_conv2d(x_codes, w_codes, **conv_args)


def exact_matmul(a_codes: Tensor, b_codes: Tensor) -> Tensor:
    """Exact int64 ``a @ b`` of int8/int16 codes (``gemm.int_matmul``; matmul broadcasting)."""
    return gemm.int_matmul(a_codes, b_codes)


def _unit_scale(x_scale, w_scale) -> Tensor:
    """s_x * s_w per output channel in float64 (the scale of the split accumulator units)."""
    sx = float(check_scale(x_scale, "x_scale", torch.float64))
    return sx * check_scale(w_scale, "w_scale", torch.float64).reshape(-1)


def split_conv2d(
    x_codes: Tensor,
    x_scale: float,
    w: Tensor,
    w_scale: Tensor,
    k: int,
    out_scale: float,
    out: DType,
    combine: SplitCombine,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    rounding: Round = Round.HALF_UP,
    weight_rounding: Round = Round.HALF_EVEN,
    scheme: Requant = Requant.MUL_SHIFT,
    overflow: Overflow = Overflow.SATURATE,
) -> Tensor:
    """Fixed-point conv2d with a high/low split weight: output codes in ``out``.

    acc_hi = conv(x, w_hi) (+ the int32 bias codes of every GEMM, ``gemm.quantize_bias``:
    round_half_even(fl32(bias / fl32(s_x * s_w))) saturated to int32, in hi units),
    acc_lo = conv(x, w_lo), each an int32 accumulator (``overflow``), combined by
    ``combine_split`` with real scale s_x * s_w / s_out per output channel (axis 1).
    For a float ``out`` pass out_scale=1.0: the result is floats (s_x * s_w * acc).
    """
    w_hi, w_lo = split_weight(w, w_scale, k, axis=0, rounding=weight_rounding)
    args = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    acc_hi = exact_conv2d(x_codes, w_hi, **args)
    acc_lo = exact_conv2d(x_codes, w_lo, **args)
    unit = _unit_scale(x_scale, w_scale)
    if bias is not None:
        acc_hi = acc_hi + gemm.quantize_bias(bias, x_scale, w_scale).reshape(1, -1, 1, 1)
    acc_hi = int32_accumulate(acc_hi, overflow)
    acc_lo = int32_accumulate(acc_lo, overflow)
    real = unit / float(check_scale(out_scale, "out_scale", torch.float64))
    return combine_split(
        acc_hi, acc_lo, k, real, out, combine, rounding=rounding, scheme=scheme, axis=1
    )


def split_linear(
    x_codes: Tensor,
    x_scale: float,
    w: Tensor,
    w_scale: Tensor,
    k: int,
    out_scale: float,
    out: DType,
    combine: SplitCombine,
    bias: Tensor | None = None,
    rounding: Round = Round.HALF_UP,
    weight_rounding: Round = Round.HALF_EVEN,
    scheme: Requant = Requant.MUL_SHIFT,
    overflow: Overflow = Overflow.SATURATE,
) -> Tensor:
    """Fixed-point linear (x (..., in) @ w (out, in)^T) with a high/low split weight; the same
    contract as ``split_conv2d`` with the output channel on the last axis."""
    w_hi, w_lo = split_weight(w, w_scale, k, axis=0, rounding=weight_rounding)
    acc_hi = gemm.int_linear(x_codes, w_hi)
    acc_lo = gemm.int_linear(x_codes, w_lo)
    unit = _unit_scale(x_scale, w_scale)
    if bias is not None:
        acc_hi = acc_hi + gemm.quantize_bias(bias, x_scale, w_scale)
    acc_hi = int32_accumulate(acc_hi, overflow)
    acc_lo = int32_accumulate(acc_lo, overflow)
    real = unit / float(check_scale(out_scale, "out_scale", torch.float64))
    return combine_split(
        acc_hi, acc_lo, k, real, out, combine, rounding=rounding, scheme=scheme, axis=-1
    )


def split_matmul(
    a_codes: Tensor,
    b_codes: Tensor,
    split_a: bool,
    split_b: bool,
    real_scale: float,
    out: DType,
    combine: SplitCombine,
    rounding: Round = Round.HALF_UP,
    scheme: Requant = Requant.MUL_SHIFT,
    overflow: Overflow = Overflow.SATURATE,
) -> Tensor:
    """a @ b on an int8 MAC array: each operand marked split is an int16 operand taken as
    hi * 256 + lo (``split_int16_codes``), so A (B_hi 2**8 + B_lo) = (A B_hi) 2**8 + A B_lo;
    int16 x int16 takes four int8 passes. Each pass is an int32 accumulator (``overflow``);
    partials are combined by ``combine_partials`` with ``real_scale`` = s_a * s_b / s_out.
    """
    a_parts = list(zip(split_int16_codes(a_codes), (8, 0))) if split_a else [(a_codes, 0)]
    b_parts = list(zip(split_int16_codes(b_codes), (8, 0))) if split_b else [(b_codes, 0)]
    parts = [
        (int32_accumulate(exact_matmul(a, b), overflow), ea + eb)
        for a, ea in a_parts
        for b, eb in b_parts
    ]
    return combine_partials(parts, real_scale, out, combine, rounding=rounding, scheme=scheme)
