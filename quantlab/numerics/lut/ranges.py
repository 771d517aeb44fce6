"""The input range a segment LUT's tables cover (horizon-plugin.md s.1.3)."""

from __future__ import annotations

import math

import torch

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.functions import LutFunction, LutSpec, RangeRule


def input_range(
    fn: LutFunction,
    spec: LutSpec,
    in_dtype: DType,
    in_scale: float,
    out_dtype: DType,
    out_scale: float,
    observed_range: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """The float range the tables cover (horizon-plugin.md s.1.3), in this order: the input
    quantization range; the function's RangeRule (exp cap, inverse rule); ``spec.input_range``;
    ``observed_range``; symmetric mode then uses [0, max(|lo|, |hi|)]. Raises ValueError when the
    result is empty or narrower than one input code."""
    lo, hi = in_dtype.qmin * in_scale, in_dtype.qmax * in_scale
    out_lo, out_hi = out_dtype.qmin * out_scale, out_dtype.qmax * out_scale
    if spec.range_rule and fn.range_rule is RangeRule.EXP_CAP and fn.inverse is not None:
        hi = min(hi, fn.inverse(out_hi, spec))
    elif spec.range_rule and fn.range_rule is RangeRule.INVERSE and fn.inverse is not None:
        probe = hi if hi > 0 else 1.0
        a, b = (
            float(fn.fn(torch.tensor([probe / d], dtype=torch.float64), spec)[0]) for d in (4, 2)
        )
        bound = fn.inverse(out_hi, spec) if a > b else fn.inverse(out_lo, spec)
        if math.isfinite(bound):
            lo = max(lo, bound)
    for rng, name in ((spec.input_range, "spec.input_range"), (observed_range, "observed_range")):
        if rng is None:
            continue
        r_lo, r_hi = rng
        if r_lo is not None and r_hi is not None and not r_hi > r_lo:
            raise ValueError(f"{name} has zero or negative width: {rng}")
        if r_lo is not None:
            lo = max(lo, float(r_lo))
        if r_hi is not None:
            hi = min(hi, float(r_hi))
    if spec.symmetric and lo < 0:
        lo, hi = 0.0, min(max(hi, -lo), in_dtype.qmax * in_scale)
    if not hi - lo >= in_scale:
        raise ValueError(
            f"{fn.name}: the table input range [{lo:.6g}, {hi:.6g}] is narrower than one input "
            f"code ({in_scale:.6g}); widen spec.input_range / observed_range or the input scale"
        )
    return lo, hi
