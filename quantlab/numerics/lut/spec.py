"""How one op's segment-LUT table is built: its ``LutSpec`` (dividing strategy, symmetry, input
range, tail slopes and the function's parameters), frozen and hashable so built tables are
cached on it, and the ``RangeRule`` a function narrows its input range by."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from quantlab.numerics.lut.strategies import Strategy


class RangeRule(enum.Enum):
    """How a function narrows the table's input range (horizon-plugin.md s.1.3).

    NONE:      the full input range.
    EXP_CAP:   the maximum is capped at log(largest output) (vendor rule for exp).
    INVERSE:   the minimum becomes f^-1(out_max) for a decreasing f, f^-1(out_min) for an
               increasing f (decided by comparing f(max/4) with f(max/2), as the vendor does):
               no table entries are spent where the output saturates.
    """

    NONE = "none"
    EXP_CAP = "exp_cap"
    INVERSE = "inverse"


@dataclass(frozen=True)
class LutSpec:
    """How one op's table is built. Frozen and hashable (built tables are cached on it).

    strategy:        dividing-point rule (Strategy); MANUAL needs ``dividing_points``.
    symmetric:       centrosymmetric mode: tables cover [0, max], x < 0 answers -f(-x).
    dividing_points: MANUAL points in float input units, ``tables + 1`` values (or the vendor's
                     ``tables + 2``: the last is the right tail's bound and is ignored, it is
                     always the input qmax). Points are rounded to input codes and clamped to the
                     input range; duplicates after rounding merge (fewer active tables).
    input_range:     user (lo, hi) intersected with the range; either bound may be None.
    gradients:       (left, right) tail slopes in output units per input unit; None: the secant
                     between the table edge and the range end, or of the adjacent table step.
    eps:             inverse_sigmoid: clamp of x and 1 - x (must be > 0); rsqrt: added to x.
    log_floor:       log: outputs below this are clamped (the vendor's hard_log, -10).
    negative_slope:  leaky_relu: the slope below 0 (prelu: one table per channel's slope).
    exponent:        pow: the exponent e of x ** e (the call's).
    alpha:           elu: alpha * (exp(x) - 1) below 0 (the call's).
    beta, threshold: softplus: log(1 + exp(beta x)) / beta, x itself where beta x > threshold
                     (the call's).
    approximate:     gelu: "none" (the erf form) or "tanh" (0.5 x (1 + tanh(sqrt(2/pi)
                     (x + 0.044715 x^3)))), the call's.
    range_rule:      apply the function's RangeRule (exp cap, inverse-function rule).
    data_error_factor: DATA: the max error over every input code may be at most this many times
                     OPTIMAL's (>= 1).
    """

    strategy: Strategy = Strategy.EVENLY
    symmetric: bool = False
    dividing_points: tuple[float, ...] | None = None
    input_range: tuple[float | None, float | None] | None = None
    gradients: tuple[float | None, float | None] = (None, None)
    eps: float = 0.0
    log_floor: float = -10.0
    negative_slope: float = 0.01
    exponent: float = 2.0
    alpha: float = 1.0
    beta: float = 1.0
    threshold: float = 20.0
    approximate: str = "none"
    range_rule: bool = True
    data_error_factor: float = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, Strategy):
            allowed = ", ".join(s.name for s in Strategy)
            raise ValueError(
                f"LutSpec.strategy must be a Strategy ({allowed}), got {self.strategy!r}"
            )
        if (self.strategy is Strategy.MANUAL) != (self.dividing_points is not None):
            raise ValueError(
                "LutSpec.dividing_points must be given exactly when strategy is MANUAL "
                f"(strategy={self.strategy.name}, dividing_points={self.dividing_points})"
            )
        if self.dividing_points is not None:
            pts = tuple(float(p) for p in self.dividing_points)
            if any(math.isnan(p) for p in pts) or list(pts) != sorted(pts):
                raise ValueError(f"LutSpec.dividing_points must be non-decreasing, got {pts}")
            object.__setattr__(self, "dividing_points", pts)
        if self.input_range is not None:
            if len(self.input_range) != 2:
                raise ValueError(f"LutSpec.input_range must be (lo, hi), got {self.input_range}")
            lo, hi = self.input_range
            if any(v is not None and math.isnan(v) for v in (lo, hi)):
                raise ValueError(f"LutSpec.input_range must not hold NaN, got {self.input_range}")
            if lo is not None and hi is not None and not hi > lo:
                raise ValueError(
                    f"LutSpec.input_range has zero or negative width: {self.input_range}"
                )
            object.__setattr__(self, "input_range", (lo, hi))
        if len(self.gradients) != 2 or any(
            g is not None and not math.isfinite(g) for g in self.gradients
        ):
            raise ValueError(
                f"LutSpec.gradients must be (left, right), each finite or None, got "
                f"{self.gradients}"
            )
        object.__setattr__(self, "gradients", tuple(self.gradients))
        if not math.isfinite(self.eps) or self.eps < 0:
            raise ValueError(f"LutSpec.eps must be finite and >= 0, got {self.eps}")
        if not (math.isfinite(self.data_error_factor) and self.data_error_factor >= 1):
            raise ValueError(
                f"LutSpec.data_error_factor must be finite and >= 1, got {self.data_error_factor}"
            )
        if not math.isfinite(self.log_floor):
            raise ValueError(f"LutSpec.log_floor must be finite, got {self.log_floor}")
        if not math.isfinite(self.negative_slope):
            raise ValueError(f"LutSpec.negative_slope must be finite, got {self.negative_slope}")
        if not math.isfinite(self.exponent):
            raise ValueError(f"LutSpec.exponent must be finite, got {self.exponent}")
        if not math.isfinite(self.alpha):
            raise ValueError(f"LutSpec.alpha must be finite, got {self.alpha}")
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"LutSpec.beta must be finite and > 0, got {self.beta}")
        if not math.isfinite(self.threshold):
            raise ValueError(f"LutSpec.threshold must be finite, got {self.threshold}")
        if self.approximate not in ("none", "tanh"):
            raise ValueError(
                f"LutSpec.approximate must be 'none' or 'tanh', got {self.approximate!r}"
            )
