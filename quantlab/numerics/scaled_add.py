"""Additions of two quantized tensors with their own scales (j6-numerics s.7): the J6 add rule
(both operands brought to a shared inter scale, summed in int32, then requantized) and a
float-rescale add. The TFLite runtimes' integer adds are in ``add_rules``.

All functions are pure; integer work is done in int64 with stated bounds, float work in float32
exactly as the reference runtime does it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics import pair_table
from quantlab.numerics.dtypes import FLOAT64_EXACT, DType
from quantlab.numerics.quantize import QuantStats, centred_code_max, check_zero_point
from quantlab.numerics.requant import (
    ENCODED_LIMIT,
    INT32_MAX,
    INT32_MIN,
    Int32Requant,
    Requant,
    _saturate_codes,
    int32_requant,
    make_requant,
    requantize,
    requantize_int32,
)
from quantlab.numerics.rounding import Round, round_float
from quantlab.numerics.scales import check_tensor_scale


@dataclass(frozen=True)
class InterScale:
    """The J6 add rule's operands: inter = max(sx, sy) / 2**shift, mx = round(sx / inter), ..."""

    inter: Tensor  # float32 scale of the int32 sum
    mx: int
    my: int


def inter_scale(
    x_scale: Tensor | float, y_scale: Tensor | float, inter_shift: int = 14
) -> InterScale:
    """inter = max(sx, sy) / 2**inter_shift; mx = round(sx/inter), my = round(sy/inter).

    j6-numerics s.7 (assumed): float32 arithmetic (scales are float32); the divisions by a
    power of two are exact, the ratio sx/inter is rounded once to float32 and then to an integer
    half to even. The larger multiplier is exactly 2**inter_shift. Scales: finite, > 0.
    """
    if not 0 <= inter_shift <= 30:
        raise ValueError(f"inter_shift must be in [0, 30], got {inter_shift}")
    sx = check_tensor_scale(x_scale, "x_scale")
    sy = check_tensor_scale(y_scale, "y_scale")
    inter = torch.maximum(sx, sy) / float(1 << inter_shift)
    mx = int(round_float(sx / inter, Round.HALF_EVEN))
    my = int(round_float(sy / inter, Round.HALF_EVEN))
    return InterScale(inter, mx, my)


def add_inter_scale(
    x: Tensor,
    x_scale: Tensor | float,
    y: Tensor,
    y_scale: Tensor | float,
    out_scale: Tensor | float,
    out: DType,
    scheme: Requant,
    rounding: Round,
    inter_shift: int = 14,
    mult_bits: int = 31,
    stats: QuantStats | None = None,
    zero_points: tuple[int, int, int] = (0, 0, 0),
    constants: AddConstants | None = None,
) -> Tensor:
    """J6 add (s.7, assumed): acc = x*mx + y*my in int32, then requantize by inter / out_scale.

    x, y: integer codes (int8/int16, broadcastable). acc is exact in int64 and saturated to
    int32 (|x*mx| <= 2**15 * 2**inter_shift, so it never saturates for inter_shift <= 15).
    The requant multiplier inter/out_scale is formed in float32 (FLOAT_RESCALE) or float64.
    ``zero_points`` = (zx, zy, zo) (J6 activations have none; an extension): acc takes the
    centred codes x - zx and y - zy (int8: |x - zx| <= 255, no saturation either), and zo is
    added after rounding. ``constants``: ``add_constants`` of the same scales, dtype, scheme,
    rounding, shift and width, kept by the caller (no host reads of the scales).
    """
    _require_codes(x, "x")
    _require_codes(y, "y")
    if constants is None:
        constants = add_constants(
            x_scale, y_scale, out_scale, out, scheme, rounding, inter_shift, mult_bits
        )
    if stats is None:  # 8-bit codes read a table of every pair
        return _PAIR_TABLES.apply(
            _table_key(constants, out, rounding, zero_points),
            x,
            y,
            lambda a, b: _add_inter_scale_codes(a, b, constants, out, rounding, zero_points),
        )
    return _add_inter_scale_codes(x, y, constants, out, rounding, zero_points, stats)


def _add_inter_scale_codes(
    x: Tensor,
    y: Tensor,
    constants: AddConstants,
    out: DType,
    rounding: Round,
    zero_points: tuple[int, int, int],
    stats: QuantStats | None = None,
) -> Tensor:
    """``add_inter_scale``'s formula on each pair of codes (the float64 form where proven)."""
    zx, zy, zo = zero_points
    s, params = constants.inter, constants.requant.params
    if not (zx or zy or zo) and stats is None:
        form = _float64_form(constants, centred_code_max(x), centred_code_max(y))
        if form is not None:
            return _add_float64(x, y, form, out)
    xa, ya = x.to(torch.int64), y.to(torch.int64)
    if zx:
        xa = xa - zx
    if zy:
        ya = ya - zy
    acc = torch.add(xa * s.mx, ya, alpha=s.my)  # exact int64
    if centred_code_max(x, zx) * s.mx + centred_code_max(y, zy) * s.my > INT32_MAX:
        acc = acc.clamp(INT32_MIN, INT32_MAX)  # else no value can leave int32
    if constants.requant.fast and not zo and stats is None:  # acc is int32 (above)
        return requantize_int32(acc, constants.requant).to(out.torch_dtype)
    return requantize(acc, params, out, rounding, stats=stats, zero_point=check_zero_point(zo, out))


def _table_key(k: AddConstants, out: DType, rounding: Round, zero_points: tuple) -> tuple:
    """Every value ``_add_inter_scale_codes`` reads besides the codes (the pair table's key)."""
    return (*k.values, out, rounding, *zero_points)


# (_table_key, x dtype, y dtype) -> the J6 add of every pair of 8-bit codes
_PAIR_TABLES = pair_table.PairTables()


@dataclass(frozen=True)
class AddConstants:
    """What ``add_inter_scale`` derives from its scales, output dtype and contract fields."""

    inter: InterScale
    requant: Int32Requant  # by inter / out_scale (its params: the encoded multiplier)
    values: tuple  # mx, my and the requantization's numbers and fields, as Python values

    @staticmethod
    def of(inter: InterScale, requant: Int32Requant) -> AddConstants:
        p = requant.params
        numbers = (inter.mx, inter.my, float(p.real), int(p.multiplier), int(p.shift))
        fields = (p.scheme, p.mult_bits, requant.out, requant.rounding, requant.fast)
        return AddConstants(inter, requant, (*numbers, *fields))


def _float64_form(k: AddConstants, cx: int, cy: int) -> tuple[float, float, float] | None:
    """(mx * q * 2**-n, my * q * 2**-n, 2**(n-1) * 2**-n) when the fast requantization
    floor((x * mx * q + y * my * q + 2**(n-1)) / 2**n) is exact in float64 for |x| <= cx,
    |y| <= cy: every term and partial sum is an integer multiple of 2**-n below 2**53 of them
    (``cx * mx * q + cy * my * q + 2**(n-1) <= 2**53``), and the accumulator never leaves
    int32 (so the contract's clamp is idle); else None."""
    r, s = k.requant, k.inter
    if not r.fast or cx * s.mx + cy * s.my > INT32_MAX:
        return None
    q, n = int(r.params.multiplier), int(r.shift)
    if cx * s.mx * q + cy * s.my * q + (1 << (n - 1)) > FLOAT64_EXACT or n > 1000:
        return None
    step = 2.0**-n
    return float(s.mx * q) * step, float(s.my * q) * step, 0.5


def _add_float64(x: Tensor, y: Tensor, form: tuple[float, float, float], out: DType) -> Tensor:
    """``_float64_form``'s sum, floored, saturated to ``out`` (its codes): each step exact."""
    a, b, half = form
    t = x.to(torch.float64)
    t.mul_(a)
    if t.shape == torch.broadcast_shapes(t.shape, y.shape):
        t.add_(y, alpha=b)  # y widened to float64 inside the kernel: y * b, then the sum
    else:
        t = t + y.to(torch.float64).mul_(b)
    return t.add_(half).floor_().clamp_(out.qmin, out.qmax).to(out.torch_dtype)


# (scale values, out, scheme, rounding, inter_shift, mult_bits) -> AddConstants: pure
# functions of those values, computed once per value (a plan-time cache)
_ADD_CONSTANTS: dict[tuple, AddConstants] = {}
_ADD = ("x_scale", "y_scale", "out_scale")


def add_constants(
    x_scale: Tensor | float,
    y_scale: Tensor | float,
    out_scale: Tensor | float,
    out: DType,
    scheme: Requant,
    rounding: Round,
    inter_shift: int = 14,
    mult_bits: int = 31,
) -> AddConstants:
    """The J6 add rule's constants (``inter_scale`` and the requantization by inter /
    out_scale, formed in float32 for FLOAT_RESCALE, else float64), cached by value."""
    sx, sy, so = (check_tensor_scale(v, n) for v, n in zip((x_scale, y_scale, out_scale), _ADD))
    key = (float(sx), float(sy), float(so), sx.dtype, sy.dtype, so.dtype, out, scheme, rounding)
    key = (*key, inter_shift, mult_bits)
    hit = _ADD_CONSTANTS.get(key)
    if hit is not None:
        return hit
    s = inter_scale(sx, sy, inter_shift)
    if scheme is Requant.FLOAT_RESCALE:
        real = s.inter / so
    else:
        real = s.inter.to(torch.float64) / so.to(torch.float64)
    value = AddConstants.of(s, int32_requant(make_requant(real, scheme, mult_bits), out, rounding))
    if len(_ADD_CONSTANTS) >= ENCODED_LIMIT:
        _ADD_CONSTANTS.clear()
    _ADD_CONSTANTS[key] = value
    return value


def add_float_rescale(
    x: Tensor,
    x_scale: Tensor | float,
    y: Tensor,
    y_scale: Tensor | float,
    out_scale: Tensor | float,
    out: DType,
    rounding: Round = Round.HALF_EVEN,
    stats: QuantStats | None = None,
    zero_points: tuple[int, int, int] = (0, 0, 0),
) -> Tensor:
    """Float-rescale add (ONNX Runtime QLinearAdd, MLAS scalar formula).

    v = fl32(fl32((x - zx) * fl32(sx/so)) + fl32((y - zy) * fl32(sy/so))), rounded by
    ``rounding`` (ONNX: HALF_EVEN), + zo, saturated to ``out``. ``zero_points`` = (zx, zy,
    zo), per tensor. Every step is one IEEE float32 operation (no FMA; x - zx is exact).
    """
    _require_codes(x, "x")
    _require_codes(y, "y")
    zx, zy, zo = zero_points
    so = check_tensor_scale(out_scale, "out_scale")
    rx = check_tensor_scale(x_scale, "x_scale") / so
    ry = check_tensor_scale(y_scale, "y_scale") / so
    v = (x.to(torch.float32) - zx) * rx + (y.to(torch.float32) - zy) * ry
    r = round_float(v, rounding)
    return _saturate_codes(r + check_zero_point(zo, out) if zo else r, out, stats)


def _require_codes(t: Tensor, name: str) -> None:
    if t.is_floating_point() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer codes (int8/uint8/int16), got {t.dtype}")
