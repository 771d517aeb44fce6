"""Per-tensor fake quantization with its constants worked out once (a plan-time form).

``fake_quant_fn(scale, dtype, ...)`` returns ``f`` with ``f(x)`` equal, bit for bit, to
``fake_quant(x, scale, dtype, ...)`` (float32; tests): the code range, the zero point, the
checked scale and, for ``Divide.BY_RECIPROCAL``, fl32(1 / s) and the code bounds of a fused
clamp are derived when ``f`` is made, so a call is only the float32 passes. For an activation
point whose scale is fixed by calibration.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from quantlab.numerics import fake_quant_native
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import (
    Divide,
    _reciprocal_constants,
    check_zero_point,
    code_range,
    fake_quant,
    fake_quant_by_scale,
    times_scale_,
)
from quantlab.numerics.rounding import Round, round_float_
from quantlab.numerics.scales import check_scale


def fake_quant_fn(
    scale: Tensor | float,
    dtype: DType,
    rounding: Round = Round.HALF_EVEN,
    divide: Divide = Divide.BY_SCALE,
    qmin: int | None = None,
    qmax: int | None = None,
    bounds: tuple[float | None, float | None] | None = None,
    zero_point: int = 0,
) -> Callable[[Tensor], Tensor]:
    """``x -> fake_quant(x, scale, dtype, rounding, divide=divide, qmin=qmin, qmax=qmax,
    bounds=bounds, zero_point=zero_point)`` per tensor (float32 result, the same bits), its
    constants derived here; bad arguments raise here, as ``fake_quant`` would on a call.
    ``f(x, inplace=True)`` may write the result into a float32 ``x`` the caller owns (no new
    tensor; the same values)."""
    args = dict(divide=divide, qmin=qmin, qmax=qmax, bounds=bounds, zero_point=zero_point)
    generic = functools.partial(_generic, scale=scale, dtype=dtype, rounding=rounding, **args)
    if dtype.is_float or dtype.bits > 16:
        return generic
    lo, hi = code_range(dtype, qmin, qmax)
    zp = check_zero_point(zero_point, dtype)
    s = check_scale(scale, "scale")
    if s.numel() != 1:
        return generic  # fake_quant raises its per-tensor error on the call
    s = s.reshape(())
    if divide is Divide.BY_RECIPROCAL:
        if not (isinstance(scale, Tensor) and scale.dtype == torch.float32):
            return generic
        return _Reciprocal(
            *_reciprocal_constants(s.item(), lo - zp, hi - zp, bounds, rounding), rounding
        )
    if divide is not Divide.BY_SCALE:
        return generic
    return functools.partial(
        _by_scale, s=s, sf=s.item(), lo=lo - zp, hi=hi - zp, rounding=rounding, bounds=bounds
    )


def native_constants(fq: Callable) -> tuple[float, float, int, int] | None:
    """(rf, sf, lo, hi) of ``fq`` when it is ``fake_quant_fn``'s HALF_EVEN BY_RECIPROCAL form
    that ``fake_quant_native.reciprocal`` computes (so a C loop may apply it, bit for bit, as
    that pass does), else None."""
    if type(fq) is not _Reciprocal or not fq.native:
        return None
    if max(abs(fq.lo), abs(fq.hi)) > fake_quant_native.MAX_CODE:
        return None
    return fq.rf, fq.sf, fq.lo, fq.hi


def fused_binary_fn(op: str, fq: Callable) -> Callable | None:
    """``(x, other) -> fq(x + other)`` (op "add") or ``fq(x * other)`` (op "mul") in one C
    pass (``fake_quant_native.binary``: the same bits as torch's op then ``fq``, or None
    where the pass does not take the operands) when ``fq`` is the form that pass computes
    (``native_constants``), else None."""
    constants = native_constants(fq)
    if constants is None:
        return None
    rf, sf, lo, hi = constants

    def fused(x: Tensor, other: Tensor | float) -> Tensor | None:
        return fake_quant_native.binary(op, x, other, rf, sf, lo, hi)

    return fused


def _generic(x: Tensor, inplace: bool = False, **kw) -> Tensor:
    return fake_quant(x, **kw)


class _Reciprocal:
    """``fake_quant`` BY_RECIPROCAL per tensor, its constants bound: round(fl32(x * rf))
    clamped to [lo, hi], then ``times_scale_`` (code -0 -> +0, as torch; one float32 product).
    HALF_EVEN takes the one C pass where it applies (the same bits); a call is a few checks
    and that pass, as it runs on every op's output of a fake run."""

    __slots__ = ("lo", "hi", "rf", "sf", "rounding", "native")

    def __init__(self, lo: int, hi: int, rf: float, sf: float, rounding: Round) -> None:
        self.lo, self.hi, self.rf, self.sf, self.rounding = lo, hi, rf, sf, rounding
        self.native = rounding is Round.HALF_EVEN

    def __call__(self, x: Tensor, inplace: bool = False) -> Tensor:
        xf = x.detach() if x.requires_grad else x  # the same values and storage
        own = inplace and xf.dtype == torch.float32
        if self.native:
            y = fake_quant_native.reciprocal(
                xf, self.rf, self.sf, self.lo, self.hi, out=xf if own else None
            )
            if y is not None:
                return y
        q = xf.mul_(self.rf) if own else torch.mul(xf.to(torch.float32), self.rf)
        return times_scale_(round_float_(q, self.rounding).clamp_(self.lo, self.hi), self.sf)


def _by_scale(
    x: Tensor,
    inplace: bool = False,
    *,
    s: Tensor,
    sf: float,
    lo: int,
    hi: int,
    rounding: Round,
    bounds,
) -> Tensor:
    if not x.is_floating_point():
        raise TypeError(f"quantize expects a float tensor, got {x.dtype}")
    if bounds is not None:
        x = torch.clamp(x, bounds[0], bounds[1])
    return fake_quant_by_scale(x, s, lo, hi, rounding, sf)
