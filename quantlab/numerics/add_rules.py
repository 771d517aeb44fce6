"""Integer additions of two quantized tensors with their own scales and zero points, as the
TFLite runtimes compute them (the J6 and float-rescale adds are in ``scaled_add``).

``add_left_shift``: TFLite's reference ADD (int8: left shift 20; int16: 15), three integer
multipliers with double rounding. ``add_shared_shift``: XNNPACK's int8 add, two integer
multipliers sharing one right shift, a single rounding (ties toward +inf). Both are pure
integer arithmetic in int64 after plan-time float parameters; zero points are per tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import QuantStats, check_zero_point
from quantlab.numerics.requant import INT32_MIN, mul_shift_double, quantize_multiplier
from quantlab.numerics.rounding import Round, round_float
from quantlab.numerics.scales import check_tensor_scale


def _wrap32(v: Tensor) -> Tensor:
    """Two's complement wrap of int64 values to int32 (an int32 register)."""
    return ((v - INT32_MIN) % (1 << 32)) + INT32_MIN


def _multiplier(real: Tensor) -> tuple[Tensor, Tensor]:
    return quantize_multiplier(real.to(torch.float64).reshape(()))


def _codes(t: Tensor, name: str) -> Tensor:
    if t.is_floating_point() or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer codes (int8/uint8/int16), got {t.dtype}")
    return t.to(torch.int64)


def _saturate(v: Tensor, out: DType, stats: QuantStats | None) -> Tensor:
    if stats is not None:
        stats.total += v.numel()
        stats.saturated += int(((v < out.qmin) | (v > out.qmax)).sum())
    return v.clamp(out.qmin, out.qmax).to(out.torch_dtype)


def add_left_shift(
    x: Tensor,
    x_scale: Tensor | float,
    y: Tensor,
    y_scale: Tensor | float,
    out_scale: Tensor | float,
    out: DType,
    left_shift: int,
    zero_points: tuple[int, int, int] = (0, 0, 0),
    stats: QuantStats | None = None,
) -> Tensor:
    """TFLite reference ADD: codes (int8/int16, broadcastable) -> ``out`` codes.

    twice_max = fl32(2 * max(sx, sy)); mx = double(sx) / twice_max, my likewise, mo =
    twice_max / double(fl32(2**left_shift * so)), each ``quantize_multiplier``'d;
    x' = wrap32((x - zx) * 2**left_shift), x'' = MBQM(x', mx) (``mul_shift_double``, ties
    away), y'' likewise; s = wrap32(x'' + y''); codes = saturate(MBQM(s, mo) + zo).
    ``zero_points`` = (zx, zy, zo).
    """
    if not 0 <= left_shift <= 30:
        raise ValueError(f"left_shift must be in [0, 30], got {left_shift}")
    zx, zy, zo = zero_points
    zo = check_zero_point(zo, out)
    sx, sy, so = (
        check_tensor_scale(x_scale, "x_scale"),
        check_tensor_scale(y_scale, "y_scale"),
        check_tensor_scale(out_scale, "out_scale"),
    )
    twice_max = (2 * torch.maximum(sx, sy)).to(torch.float64)
    qx, ex = _multiplier(sx.to(torch.float64) / twice_max)
    qy, ey = _multiplier(sy.to(torch.float64) / twice_max)
    qo, eo = _multiplier(twice_max / (so * float(1 << left_shift)).to(torch.float64))
    xs = _wrap32((_codes(x, "x") - zx) << left_shift)
    ys = _wrap32((_codes(y, "y") - zy) << left_shift)
    total = _wrap32(mul_shift_double(xs, qx, ex) + mul_shift_double(ys, qy, ey))
    return _saturate(mul_shift_double(total, qo, eo) + zo, out, stats)


def add_shared_shift(
    x: Tensor,
    x_scale: Tensor | float,
    y: Tensor,
    y_scale: Tensor | float,
    out_scale: Tensor | float,
    out: DType,
    mult_bits: int = 20,
    zero_points: tuple[int, int, int] = (0, 0, 0),
    stats: QuantStats | None = None,
) -> Tensor:
    """XNNPACK int8 add: codes -> ``out`` codes with one rounding (ties toward +inf).

    rx = fl32(sx / so), ry likewise; e = the binary exponent of max(rx, ry); n = mult_bits -
    e; mx = round_half_even(rx * 2**n) (exact scaling), my likewise; acc = wrap32(2**(n-1) -
    mx*zx - my*zy + mx*x + my*y); codes = saturate((acc >> n) + zo).
    """
    zx, zy, zo = zero_points
    zo = check_zero_point(zo, out)
    so = check_tensor_scale(out_scale, "out_scale")
    rx = check_tensor_scale(x_scale, "x_scale") / so
    ry = check_tensor_scale(y_scale, "y_scale") / so
    _, e = torch.frexp(torch.maximum(rx, ry))
    shift = mult_bits - (int(e) - 1)  # frexp's fraction is in [0.5, 1): exponent e - 1
    if not 1 <= shift <= 62:
        raise ValueError(f"add_shared_shift: scale ratio gives a shift {shift} outside [1, 62]")
    scale = float(2.0**shift)
    mx = int(round_float(rx.to(torch.float64) * scale, Round.HALF_EVEN))
    my = int(round_float(ry.to(torch.float64) * scale, Round.HALF_EVEN))
    bias = (1 << (shift - 1)) - mx * zx - my * zy
    acc = _wrap32(bias + mx * _codes(x, "x") + my * _codes(y, "y"))
    return _saturate((acc >> shift) + zo, out, stats)
