"""Real constants and clamp bounds as integer codes.

``constant_codes``: a scalar constant operand as a code and scale (``CONSTANT_DTYPE``).
``bound_codes``: the code range a fused clamp (relu, relu6, clip) becomes at an output's scale
and zero point, by one of the runtimes' rounding rules (``BoundRule``).
"""

from __future__ import annotations

import enum
import functools
import math

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import check_zero_point
from quantlab.numerics.rounding import Round, round_float, round_scalar
from quantlab.numerics.scales import check_scale

CONSTANT_DTYPE = DType.INT16
"""A scalar constant operand is an int16 code +-32767 at scale |c| / 32767 (assumed)."""


def constant_codes(c: float, dtype: DType = CONSTANT_DTYPE) -> tuple[Tensor, Tensor]:
    """A nonzero scalar constant as (code, scale): code +-qmax (int64), scale fl32(|c| / qmax)
    (the division in float64, rounded once). Assumed for every platform (``CONSTANT_DTYPE``).
    The scale is one shared 0-d tensor per value, as cached scales are (never written); the
    code is a new tensor."""
    c = float(c)
    if c == 0 or not math.isfinite(c):
        raise ValueError(f"a constant operand must be finite and nonzero, got {c}")
    code = torch.tensor(dtype.qmax if c > 0 else -dtype.qmax, dtype=torch.int64)
    return code, _constant_scale(abs(c), dtype)


@functools.lru_cache(maxsize=1024)
def _constant_scale(magnitude: float, dtype: DType) -> Tensor:
    return check_scale(magnitude / dtype.qmax, "constant scale")


class BoundRule(enum.Enum):
    """How a fused activation's real bound f (relu: 0, relu6: 6) becomes an output code.

    FLOAT64_HALF_EVEN:          zp + round_half_even(f / s), the division in float64.
    FLOAT32_HALF_AWAY:          zp + roundf(fl32(f / s)), ties away from zero (TFLite
                                ``CalculateActivationRangeQuantized``).
    FLOAT32_ZERO_POINT_HALF_EVEN: lrintf(fl32(fl32(f / s) + zp)), ties to even (XNNPACK
                                ``xnn_qs8_quantize``).
    FLOAT32_HALF_EVEN:          zp + round_half_even(fl32(fl32(f) / s)) (a float32 Clip between
                                DequantizeLinear and QuantizeLinear, as ONNX Runtime runs it).
    Every rule then intersects the bound with the dtype's code range.
    """

    FLOAT64_HALF_EVEN = "float64_half_even"
    FLOAT32_HALF_AWAY = "float32_half_away"
    FLOAT32_ZERO_POINT_HALF_EVEN = "float32_zero_point_half_even"
    FLOAT32_HALF_EVEN = "float32_half_even"


_BEYOND = 1 << 31  # a code beyond every dtype's range: the clamp to the dtype decides


def _bound_code(f: float, s: float, zp: int, rule: BoundRule) -> int:
    """Bound ``f`` as a code by ``rule``; an infinite bound (an open side written as
    ``clamp(min=-inf)``, ``maximum(x, -inf)``) lies beyond every code."""
    if rule is BoundRule.FLOAT64_HALF_EVEN:
        if math.isinf(f):
            return _BEYOND if f > 0 else -_BEYOND
        return zp + round_scalar(float(f) / s)
    q = torch.tensor(float(f), dtype=torch.float32) / torch.tensor(s, dtype=torch.float32)
    big = float(_BEYOND)
    if rule is BoundRule.FLOAT32_HALF_AWAY:
        return zp + int(round_float(q, Round.HALF_AWAY).clamp(-big, big))
    if rule is BoundRule.FLOAT32_HALF_EVEN:
        return zp + int(round_float(q, Round.HALF_EVEN).clamp(-big, big))
    if rule is BoundRule.FLOAT32_ZERO_POINT_HALF_EVEN:
        v = q + torch.tensor(float(zp), dtype=torch.float32)
        return int(round_float(v, Round.HALF_EVEN).clamp(-big, big))
    raise ValueError(f"unknown bound rule {rule!r}; allowed: {[r.name for r in BoundRule]}")


def bound_codes(
    lo: float | None,
    hi: float | None,
    scale: Tensor | float,
    dtype: DType,
    zero_point: int = 0,
    rule: BoundRule = BoundRule.FLOAT64_HALF_EVEN,
) -> tuple[int, int]:
    """The code range a clamp to [lo, hi] (None: open) becomes at ``scale`` and
    ``zero_point``: each bound by ``rule``, intersected with ``dtype``'s range."""
    s = float(check_scale(scale, "scale"))
    zp = check_zero_point(zero_point, dtype)
    lo_c = dtype.qmin if lo is None else max(dtype.qmin, _bound_code(lo, s, zp, rule))
    hi_c = dtype.qmax if hi is None else min(dtype.qmax, _bound_code(hi, s, zp, rule))
    return lo_c, hi_c
