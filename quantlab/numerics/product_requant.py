"""Requantization of an elementwise product of codes in one float dtype, where a bound proves
every step exact: the same codes as ``requantize`` of the int64 product, without int64 passes.

For acc = (x - zx) * (y - zy) with |acc| <= ``bound`` and per-tensor ``params``:
  FLOAT_RESCALE:   bound <= 2**24: acc is a float32, so fl32(acc) * fl32(M) is the one IEEE
                   float32 product ``requantize`` takes, rounded by ``rounding``;
  FLOAT64_RESCALE: bound <= 2**53: the same in float64;
  MUL_SHIFT, HALF_UP, right shift n >= 1: floor((acc * q + 2**(n-1)) / 2**n) is
                   floor(acc * (q * 2**-n) + 1/2) in float64 when bound * q + 2**(n-1) <= 2**53
                   (every value an integer multiple of 2**-n below 2**53 of them).
Every form needs bound <= INT32_MAX, so the accumulator contract (int32) never acts. The
output zero point is added after saturating to [qmin - zp, qmax - zp]: the same integers as
``requantize``'s saturate(r + zp).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics import product_requant_native
from quantlab.numerics.dtypes import FLOAT32_EXACT, FLOAT64_EXACT, DType
from quantlab.numerics.requant import INT32_MAX, Requant, RequantParams
from quantlab.numerics.rounding import Round, round_float_


@dataclass(frozen=True)
class ProductForm:
    """``product_form``'s float form: ``dtype`` every step runs in, the ``multiplier`` the exact
    product is multiplied by (float32 M, float64 M, or q * 2**-n), and then either
    floor(. + 1/2) (``half_up``) or ``round_float_`` by ``rounding``."""

    dtype: torch.dtype
    multiplier: float
    half_up: bool
    rounding: Round


def product_form(params: RequantParams, rounding: Round, bound: int) -> ProductForm | None:
    """The exact float form of ``requantize(acc, params, rounding)`` for |acc| <= ``bound``
    (module docstring), or None when none is proven."""
    if params.per_channel or bound > INT32_MAX:
        return None
    scheme = params.scheme
    if scheme is Requant.FLOAT_RESCALE and bound <= FLOAT32_EXACT:
        return ProductForm(torch.float32, float(params.real.to(torch.float32)), False, rounding)
    if scheme is Requant.FLOAT64_RESCALE and bound <= FLOAT64_EXACT:
        return ProductForm(torch.float64, float(params.real.to(torch.float64)), False, rounding)
    if scheme is Requant.MUL_SHIFT and rounding is Round.HALF_UP:
        q, n = int(params.multiplier), params.mult_bits - int(params.shift)
        if 1 <= n <= 1000 and bound * q + (1 << (n - 1)) <= FLOAT64_EXACT:
            return ProductForm(torch.float64, q * 2.0**-n, True, rounding)
    return None


def requantize_product(
    x: Tensor,
    zx: int,
    y: Tensor | int,
    zy: int,
    form: ProductForm,
    out: DType,
    zero_point: int = 0,
) -> Tensor:
    """``out`` codes (its torch dtype) of requantize((x - zx) * (y - zy)) + ``zero_point`` by
    ``form`` (which the caller proved for a bound on |(x - zx) * (y - zy)|). x: integer codes;
    y: integer codes broadcastable with x, or one integer (a constant's code). Contiguous int8 /
    int16 codes take one C pass (``product_requant_native``, the same codes)."""
    fast = product_requant_native.requantize_product_native(x, zx, y, zy, form, out, zero_point)
    if fast is not None:
        return fast
    return requantize_product_torch(x, zx, y, zy, form, out, zero_point)


def requantize_product_torch(
    x: Tensor,
    zx: int,
    y: Tensor | int,
    zy: int,
    form: ProductForm,
    out: DType,
    zero_point: int = 0,
) -> Tensor:
    """``requantize_product`` by torch passes, one IEEE operation each (every input)."""
    t = x.to(form.dtype)  # exact: codes
    if zx:
        t.sub_(zx)
    if isinstance(y, Tensor) and y.dim():
        yf = y.to(form.dtype)
        if zy:
            yf.sub_(zy)
        t = t.mul_(yf) if t.shape == torch.broadcast_shapes(t.shape, yf.shape) else t * yf
    else:
        t.mul_(int(y) - zy)  # an integer below 2**24 (float32) or 2**53: converted exactly
    t.mul_(form.multiplier)
    if form.half_up:
        t.add_(0.5).floor_()
    else:
        round_float_(t, form.rounding)
    t.clamp_(out.qmin - zero_point, out.qmax - zero_point)
    if zero_point:
        t.add_(zero_point)
    return t.to(out.torch_dtype)
