"""The input range a segment LUT's tables cover (horizon-plugin.md s.1.3)."""

from __future__ import annotations

import math

import torch

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.functions import LutFunction
from quantlab.numerics.lut.spec import LutSpec, RangeRule
from quantlab.numerics.scales import check_scale_float


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
    ``observed_range``; symmetric mode then uses [0, max(|lo|, |hi|)]. Raises ValueError when a
    given range has zero width or the result (before the observed range) is empty or narrower
    than one input code. A RangeRule that would leave less than one code of that range (every
    input's output saturates: a softmax over one value, whose sum's reciprocal saturates at
    every code; softmax's exp table on the one code [-in_scale, 0] of a huge input scale) and an
    observed range (calibration data) that would are skipped instead: they do not narrow the
    table."""
    in_scale = check_scale_float(in_scale, "in_scale")
    out_scale = check_scale_float(out_scale, "out_scale")
    lo, hi = in_dtype.qmin * in_scale, in_dtype.qmax * in_scale
    out_lo, out_hi = out_dtype.qmin * out_scale, out_dtype.qmax * out_scale
    rule_lo, rule_hi = lo, hi
    if spec.range_rule and fn.range_rule is RangeRule.EXP_CAP and fn.inverse is not None:
        rule_hi = min(hi, fn.inverse(out_hi, spec))
    elif spec.range_rule and fn.range_rule is RangeRule.INVERSE and fn.inverse is not None:
        probe = hi if hi > 0 else 1.0
        a, b = (
            float(fn.fn(torch.tensor([probe / d], dtype=torch.float64), spec)[0]) for d in (4, 2)
        )
        bound = fn.inverse(out_hi, spec) if a > b else fn.inverse(out_lo, spec)
        if math.isfinite(bound):
            rule_lo = max(lo, bound)
    ruled = _intersect(rule_lo, rule_hi, spec.input_range, "spec.input_range")
    if ruled[1] - ruled[0] >= in_scale:
        lo, hi = ruled
    else:  # the rule would leave less than one code of the spec's range: skipped
        lo, hi = _intersect(lo, hi, spec.input_range, "spec.input_range")
    base = _finish(fn, spec, in_dtype, in_scale, lo, hi, "spec.input_range or the input scale")
    if observed_range is None:
        return base
    o_lo, o_hi = _intersect(lo, hi, observed_range, "observed_range")
    try:
        return _finish(fn, spec, in_dtype, in_scale, o_lo, o_hi, "observed_range")
    except ValueError:
        return base  # data that leaves less than one code does not narrow the table


def _intersect(lo: float, hi: float, rng, name: str) -> tuple[float, float]:
    """[lo, hi] narrowed by ``rng`` = (lo or None, hi or None); zero width is an error."""
    if rng is None:
        return lo, hi
    r_lo, r_hi = rng
    if r_lo is not None and r_hi is not None and not r_hi > r_lo:
        raise ValueError(f"{name} has zero or negative width: {rng}")
    if r_lo is not None:
        lo = max(lo, float(r_lo))
    if r_hi is not None:
        hi = min(hi, float(r_hi))
    return lo, hi


def _symmetric(
    spec: LutSpec, in_dtype: DType, in_scale: float, lo: float, hi: float
) -> tuple[float, float]:
    """Symmetric mode covers [0, max |x|] when the range reaches below 0."""
    if spec.symmetric and lo < 0:
        return 0.0, min(max(hi, -lo), in_dtype.qmax * in_scale)
    return lo, hi


def _finish(
    fn: LutFunction,
    spec: LutSpec,
    in_dtype: DType,
    in_scale: float,
    lo: float,
    hi: float,
    what: str,
) -> tuple[float, float]:
    lo, hi = _symmetric(spec, in_dtype, in_scale, lo, hi)
    if not hi - lo >= in_scale:
        raise ValueError(
            f"{fn.name}: the table input range [{lo:.6g}, {hi:.6g}] is narrower than one input "
            f"code ({in_scale:.6g}); widen {what}"
        )
    return lo, hi
