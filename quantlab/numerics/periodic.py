"""sin/cos inputs wider than one period: the exporter's single-period reduction and the in-model
wrap (j6-numerics s.5; horizon-plugin.md s.6).

The exporter, when ``s_in * qmax > 2*pi``, inserts before the LUT (each step re-quantized, all
in the input's dtype, whose qmax is used below):
  1. ``t = x / 2pi``                     scale ``s_t = s_in / 2pi``
  2. ``n = floor(t)``                    scale ``s_n = ceil(s_in * qmax / 2pi) / qmax``
  3. ``f = t - n``                       scale ``1 / qmax``
  4. ``x' = 2pi * f``                    scale ``2pi / qmax``; the LUT is built on [0, 2pi).
How the compiler lowers each step to integers is not public: each step here is the exact real
result of the previous step's codes and float32 scales (float64 arithmetic: every product of a
code and a float32 scale is exact, the one division by 2pi is correctly rounded), rounded once
with ``rounding`` and saturated to the dtype (assumed; it is what a float fake-quant of each step
gives, up to ties of the float32 quotient).

The in-model wrap is the fix done upstream, in float, before quantization: ``wrap_to_pi``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.rounding import Round, round_float
from quantlab.numerics.scales import check_scale_float

TWO_PI = 2.0 * math.pi


def _f32(v: float) -> float:
    return float(np.float32(v))


def needs_period_reduction(x_scale: float, dtype: DType) -> bool:
    """True when the input's range ``x_scale * qmax`` exceeds one period 2pi (s.5)."""
    if not dtype.is_int:
        raise ValueError(f"period reduction applies to integer inputs, got {dtype.name}")
    return check_scale_float(x_scale, "x_scale") * dtype.qmax > TWO_PI


@dataclass(frozen=True)
class PeriodReduction:
    """Codes and float32 scales of each step (t, floor, frac, x'); x' feeds the LUT."""

    t_codes: Tensor
    t_scale: float
    floor_codes: Tensor
    floor_scale: float
    frac_codes: Tensor
    frac_scale: float
    codes: Tensor
    scale: float
    saturated: int  # codes clamped in any step (a frac outside [-1, 1] after a coarse floor)


def _requant(v: Tensor, scale: float, dtype: DType, rounding: Round) -> tuple[Tensor, int]:
    r = round_float(v / scale, rounding)
    sat = int(((r < dtype.qmin) | (r > dtype.qmax)).sum())
    return r.clamp(dtype.qmin, dtype.qmax).to(torch.int64), sat


def period_reduce_steps(
    x_codes: Tensor, x_scale: float, in_dtype: DType, rounding: Round = Round.HALF_EVEN
) -> PeriodReduction:
    """All four steps of the exporter's reduction (module docstring); codes in ``in_dtype``.

    Rounding: each step rounded once by ``rounding``; saturation: each step clamped to
    ``in_dtype`` (counted). Exactness: float64 from codes and float32 scales (module docstring).
    """
    if not in_dtype.is_int or in_dtype is DType.INT32:
        raise ValueError(f"in_dtype must be INT8 or INT16, got {in_dtype.name}")
    x_scale = check_scale_float(x_scale, "x_scale")
    qmax = in_dtype.qmax
    s_in = _f32(x_scale)
    x = x_codes.to(torch.float64) * s_in
    s_t = _f32(s_in / TWO_PI)
    t_codes, sat_t = _requant(x / TWO_PI, s_t, in_dtype, rounding)
    t = t_codes.to(torch.float64) * s_t
    s_n = _f32(math.ceil(s_in * qmax / TWO_PI) / qmax)
    n_codes, sat_n = _requant(round_float(t, Round.FLOOR), s_n, in_dtype, rounding)
    s_f = _f32(1.0 / qmax)
    f_codes, sat_f = _requant(t - n_codes.to(torch.float64) * s_n, s_f, in_dtype, rounding)
    s_out = _f32(TWO_PI / qmax)
    out_codes, sat_o = _requant(f_codes.to(torch.float64) * s_f * TWO_PI, s_out, in_dtype, rounding)
    td = in_dtype.torch_dtype
    return PeriodReduction(
        t_codes.to(td),
        s_t,
        n_codes.to(td),
        s_n,
        f_codes.to(td),
        s_f,
        out_codes.to(td),
        s_out,
        sat_t + sat_n + sat_f + sat_o,
    )


def period_reduce(
    x_codes: Tensor, x_scale: float, in_dtype: DType, rounding: Round = Round.HALF_EVEN
) -> tuple[Tensor, float]:
    """The exporter's reduction of sin/cos input codes to one period: returns (codes, scale).

    Output: codes in ``in_dtype`` with scale ``float32(2pi / qmax)``, values in [0, 2pi] (a frac
    rounded up to 1 gives 2pi; a floor coarser than 1 can push a frac slightly outside [0, 1]).
    Apply it when ``needs_period_reduction``; the steps are in ``period_reduce_steps``.
    """
    r = period_reduce_steps(x_codes, x_scale, in_dtype, rounding)
    return r.codes, r.scale


def wrap_to_pi(x: Tensor) -> Tensor:
    """``x - 2pi * floor((x + pi) / 2pi)``: the angle in [-pi, pi), computed in float64 and
    returned in x's dtype (rounding to float32 can give float32(pi) at the top end).

    This is the in-model fix: done in float, upstream of quantization, so the quantizer then
    sees a one-period range. sin/cos of the result equal sin/cos of x up to float64 rounding
    of the reduction (|x| * 2**-52 rad).
    """
    if not x.is_floating_point():
        raise TypeError(f"wrap_to_pi expects a float tensor, got {x.dtype}")
    xd = x.to(torch.float64)
    r = xd - TWO_PI * round_float((xd + math.pi) / TWO_PI, Round.FLOOR)
    r = torch.where(r >= math.pi, r - TWO_PI, r)
    return r.to(x.dtype)
