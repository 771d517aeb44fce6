"""The functions a segment LUT can hold: float64 targets with documented clamps, and per-op specs
(``LutSpec`` itself, how a table is built, is ``lut.spec``'s).

A table never holds NaN or inf: every function is made finite everywhere by the rule in its
registry entry (``LutFunction.clamp_rule``), and table entries are then saturated to the output
dtype. The per-op defaults (``default_spec``) follow the vendor plugin (j6-numerics s.3,
horizon-plugin.md s.1.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.lut.spec import LutSpec, RangeRule
from quantlab.numerics.lut.strategies import Strategy

TINY = 1e-30  # smallest |x| fed to 1/x and 1/sqrt(x): keeps 1/x finite (1e30), saturated later
EXP_INPUT_MAX = 700.0  # exp input clamp: exp(700) ~ 1e304 is finite in float64
# atanh input clamp: the largest float64 below 1 (atanh ~ 18.7 there, finite; outputs saturate)
ATANH_INPUT_MAX = 1.0 - 2.0**-53


def _log(x: Tensor, spec: LutSpec) -> Tensor:
    return torch.log(x.clamp_min(0.0)).clamp_min(spec.log_floor)


def _log1p(x: Tensor, spec: LutSpec) -> Tensor:
    return torch.log1p(x.clamp_min(-1.0)).clamp_min(spec.log_floor)


def _celu(x: Tensor, spec: LutSpec) -> Tensor:
    return torch.nn.functional.celu(x, alpha=spec.alpha)


def _reciprocal(x: Tensor, spec: LutSpec) -> Tensor:
    mag = x.abs().clamp_min(TINY)
    return torch.where(x < 0, -1.0 / mag, 1.0 / mag)


def _rsqrt(x: Tensor, spec: LutSpec) -> Tensor:
    return torch.rsqrt((x + spec.eps).clamp_min(TINY))


def _inverse_sigmoid(x: Tensor, spec: LutSpec) -> Tensor:
    if spec.eps <= 0:
        raise ValueError(f"inverse_sigmoid needs LutSpec.eps > 0, got {spec.eps}")
    return torch.log(x.clamp_min(spec.eps) / (1 - x).clamp_min(spec.eps))


def _gelu(x: Tensor, spec: LutSpec) -> Tensor:
    if spec.approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + torch.tanh(inner))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _hardsigmoid(x: Tensor, spec: LutSpec) -> Tensor:
    return (x + 3.0).clamp(0.0, 6.0) / 6.0


def _hardswish(x: Tensor, spec: LutSpec) -> Tensor:
    return x * _hardsigmoid(x, spec)


def _leaky_relu(x: Tensor, spec: LutSpec) -> Tensor:
    return torch.where(x >= 0, x, x * spec.negative_slope)


# from beta x > 15, x + log1p(exp(-x)) rounds to x in float32 (ONNX's Softplus, which has no
# threshold, then computes torch's softplus at any threshold of at least 15)
SOFTPLUS_ONNX_MIN_THRESHOLD = 15.0


def softplus_in_onnx(beta: float, threshold: float) -> bool:
    """Whether ONNX's Softplus (beta 1, no threshold) computes torch's softplus(beta,
    threshold) in float32: beta 1 and a threshold of at least 15."""
    return beta == 1 and threshold >= SOFTPLUS_ONNX_MIN_THRESHOLD


def _elu(x: Tensor, spec: LutSpec) -> Tensor:
    return torch.nn.functional.elu(x, alpha=spec.alpha)


def _softplus(x: Tensor, spec: LutSpec) -> Tensor:
    return torch.nn.functional.softplus(x, beta=spec.beta, threshold=spec.threshold)


def _atanh(x: Tensor, spec: LutSpec) -> Tensor:
    return torch.atanh(x.clamp(-ATANH_INPUT_MAX, ATANH_INPUT_MAX))


def _hyperbolic(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor, LutSpec], Tensor]:
    """sinh or cosh of x clamped at +-EXP_INPUT_MAX (finite in float64)."""
    return lambda x, s: fn(x.clamp(-EXP_INPUT_MAX, EXP_INPUT_MAX))


def _unit_domain(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor, LutSpec], Tensor]:
    """asin or acos of x clamped to [-1, 1], their domain."""
    return lambda x, s: fn(x.clamp(-1.0, 1.0))


POW_MAX = 1e300  # |x ** e| clamp: finite in float64 (outputs saturate)
EXP2_INPUT_MAX = 1000.0  # exp2 input clamp: 2 ** 1000 ~ 1e301 is finite in float64


def _softsign(x: Tensor, spec: LutSpec) -> Tensor:
    return x / (1.0 + x.abs())


def _pow(x: Tensor, spec: LutSpec) -> Tensor:
    e = spec.exponent
    if e != int(e):  # defined for x >= 0 only
        x = x.clamp_min(TINY if e < 0 else 0.0)
    elif e < 0:  # 1 / x ** |e|: |x| floored as in reciprocal, the sign kept
        mag = x.abs().clamp_min(TINY)
        x = torch.where(x < 0, -mag, mag)
    return torch.pow(x, e).clamp(-POW_MAX, POW_MAX)


@dataclass(frozen=True)
class LutFunction:
    """One function of the registry.

    fn:           float64 target, finite for every finite input (clamp_rule says how).
    clamp_rule:   the documented rule that keeps fn finite where the math is undefined.
    range_rule:   RangeRule (exp cap or inverse-function narrowing).
    inverse:      inverse of fn on its monotone branch (for RangeRule.INVERSE / EXP_CAP).
    odd:          f(-x) = -f(x) mathematically (symmetric mode is then exact).
    sample_range: a typical input range (float), used by experiments to pick the input scale.
    sample_out_amax: a typical output magnitude for the output scale (None: max |f| on
                  sample_range); needed where f is unbounded (1/x, 1/sqrt(x)).
    """

    name: str
    fn: Callable[[Tensor, LutSpec], Tensor]
    clamp_rule: str
    range_rule: RangeRule = RangeRule.NONE
    inverse: Callable[[float, LutSpec], float] | None = None
    odd: bool = False
    sample_range: tuple[float, float] = (-8.0, 8.0)
    sample_out_amax: float | None = None

    def target(self, x: Tensor, spec: LutSpec) -> Tensor:
        """The function the table approximates, float64: fn, mirrored as -fn(-x) for x < 0 in
        symmetric mode. Finite for every finite x."""
        x = x.to(torch.float64)
        if not spec.symmetric:
            return self.fn(x, spec)
        y = self.fn(x.abs(), spec)
        return torch.where(x < 0, -y, y)


def _log_to(name: str, base: float) -> LutFunction:
    """log to ``base`` as ``_log``'s natural log over ln(base): its floor is log's, in the
    base's units (x below e ** log_floor reads the floor)."""
    ln_base = math.log(base)
    return LutFunction(
        name,
        lambda x, spec: _log(x, spec) / ln_base,
        f"log(max(x, 0)) / ln {base:g}, log(...) clamped below at LutSpec.log_floor as log's",
        range_rule=RangeRule.INVERSE,
        inverse=lambda y, s: base ** max(y, s.log_floor / ln_base),
        sample_range=(0.0, 16.0),
    )


def _safe_exp_inverse(y: float, spec: LutSpec) -> float:
    return math.log(y) if y > 0 else -math.inf


FUNCTIONS: dict[str, LutFunction] = {
    f.name: f
    for f in (
        LutFunction("sigmoid", lambda x, s: torch.sigmoid(x), "none needed", odd=False),
        LutFunction(
            "tanh", lambda x, s: torch.tanh(x), "none needed", odd=True, sample_range=(-4.0, 4.0)
        ),
        LutFunction(
            "exp",
            lambda x, s: torch.exp(x.clamp_max(EXP_INPUT_MAX)),
            f"input clamped at {EXP_INPUT_MAX} (finite float64); outputs saturate",
            range_rule=RangeRule.EXP_CAP,
            inverse=_safe_exp_inverse,
            sample_range=(-10.0, 2.0),
        ),
        LutFunction(
            "log",
            _log,
            "log(max(x, 0)) clamped below at LutSpec.log_floor (-10: hard_log); x <= 0 -> floor",
            range_rule=RangeRule.INVERSE,
            inverse=lambda y, s: math.exp(max(y, s.log_floor)),
            sample_range=(0.0, 16.0),
        ),
        _log_to("log2", 2.0),
        _log_to("log10", 10.0),
        LutFunction(
            "log1p",
            _log1p,
            "log1p(max(x, -1)) clamped below at LutSpec.log_floor; x <= -1 -> floor",
            range_rule=RangeRule.INVERSE,
            inverse=lambda y, s: math.expm1(max(y, s.log_floor)),
            sample_range=(-0.9, 16.0),
        ),
        LutFunction(
            "reciprocal",
            _reciprocal,
            f"1/x with |x| floored at {TINY} (x = 0 gives +{1 / TINY:g}); outputs saturate",
            range_rule=RangeRule.INVERSE,
            inverse=lambda y, s: 1.0 / y if y > 0 else math.inf,
            odd=True,
            sample_range=(0.0, 16.0),
            sample_out_amax=64.0,
        ),
        LutFunction(
            "sqrt",
            lambda x, s: torch.sqrt(x.clamp_min(0.0)),
            "sqrt(max(x, 0))",
            sample_range=(0.0, 16.0),
        ),
        LutFunction(
            "rsqrt",
            _rsqrt,
            f"1/sqrt(x + eps) with x + eps floored at {TINY}; outputs saturate",
            range_rule=RangeRule.INVERSE,
            inverse=lambda y, s: 1.0 / (y * y) - s.eps if y > 0 else math.inf,
            sample_range=(0.0, 16.0),
            sample_out_amax=64.0,
        ),
        LutFunction(
            "sin",
            lambda x, s: torch.sin(x),
            "none needed",
            odd=True,
            sample_range=(-8.0, 8.0),
        ),
        LutFunction("cos", lambda x, s: torch.cos(x), "none needed", sample_range=(-8.0, 8.0)),
        LutFunction(
            "erf", lambda x, s: torch.erf(x), "none needed", odd=True, sample_range=(-4.0, 4.0)
        ),
        LutFunction(
            "tan",
            lambda x, s: torch.tan(x),
            "none needed (no float64 is a pole); outputs saturate",
            odd=True,
            sample_range=(-1.4, 1.4),
        ),
        LutFunction(
            "atan", lambda x, s: torch.atan(x), "none needed", odd=True, sample_range=(-8.0, 8.0)
        ),
        LutFunction(
            "sinh",
            _hyperbolic(torch.sinh),
            f"input clamped at +-{EXP_INPUT_MAX} (finite float64); outputs saturate",
            odd=True,
            sample_range=(-4.0, 4.0),
        ),
        LutFunction(
            "cosh",
            _hyperbolic(torch.cosh),
            f"input clamped at +-{EXP_INPUT_MAX} (finite float64); outputs saturate",
            sample_range=(-4.0, 4.0),
        ),
        LutFunction(
            "atanh",
            _atanh,
            "input clamped to +-(1 - 2**-53) (finite float64); outputs saturate",
            odd=True,
            sample_range=(-0.99, 0.99),
        ),
        LutFunction(
            "asinh",
            lambda x, s: torch.asinh(x),
            "none needed",
            range_rule=RangeRule.INVERSE,
            inverse=lambda y, s: math.sinh(max(min(y, EXP_INPUT_MAX), -EXP_INPUT_MAX)),
            odd=True,
            sample_range=(-8.0, 8.0),
        ),
        LutFunction(
            "asin",
            _unit_domain(torch.asin),
            "input clamped to [-1, 1], its domain",
            range_rule=RangeRule.INVERSE,
            inverse=lambda y, s: math.sin(y),
            odd=True,
            sample_range=(-1.0, 1.0),
        ),
        LutFunction(
            "acos",
            _unit_domain(torch.acos),
            "input clamped to [-1, 1], its domain",
            range_rule=RangeRule.INVERSE,
            inverse=lambda y, s: math.cos(y),
            sample_range=(-1.0, 1.0),
        ),
        LutFunction(
            "acosh",
            lambda x, s: torch.acosh(x.clamp_min(1.0)),
            "input floored at 1, its domain (acosh(x < 1) reads 0)",
            sample_range=(1.0, 8.0),
        ),
        LutFunction("silu", lambda x, s: torch.nn.functional.silu(x), "none needed"),
        LutFunction(
            "gelu",
            _gelu,
            "none needed (the erf form, or LutSpec.approximate's tanh form)",
            sample_range=(-8.0, 8.0),
        ),
        LutFunction("hardsigmoid", _hardsigmoid, "none needed (relu6(x + 3) / 6)"),
        LutFunction("hardswish", _hardswish, "none needed (x relu6(x + 3) / 6)"),
        LutFunction("leaky_relu", _leaky_relu, "none needed (LutSpec.negative_slope below 0)"),
        LutFunction("elu", _elu, "none needed (LutSpec.alpha * (exp(x) - 1) below 0)"),
        LutFunction("celu", _celu, "none needed (LutSpec.alpha * (exp(x / alpha) - 1) below 0)"),
        LutFunction(
            "softplus",
            _softplus,
            "none needed (log1p(exp(beta x)) / beta, x where beta x > threshold: LutSpec.beta, "
            "LutSpec.threshold)",
        ),
        LutFunction("mish", lambda x, s: torch.nn.functional.mish(x), "none needed"),
        LutFunction("log_sigmoid", lambda x, s: torch.nn.functional.logsigmoid(x), "none needed"),
        LutFunction("softsign", _softsign, "none needed (x / (1 + |x|))", odd=True),
        LutFunction("selu", lambda x, s: torch.nn.functional.selu(x), "none needed"),
        LutFunction(
            "tanhshrink", lambda x, s: x - torch.tanh(x), "none needed (x - tanh x)", odd=True
        ),
        LutFunction(
            "expm1",
            lambda x, s: torch.expm1(x.clamp_max(EXP_INPUT_MAX)),
            f"x clamped at {EXP_INPUT_MAX:g} (finite in float64); outputs saturate",
            sample_range=(-10.0, 2.0),
        ),
        LutFunction(
            "exp2",
            lambda x, s: torch.exp2(x.clamp_max(EXP2_INPUT_MAX)),
            f"x clamped at {EXP2_INPUT_MAX:g} (finite in float64); outputs saturate",
            sample_range=(-10.0, 2.0),
        ),
        LutFunction("erfc", lambda x, s: torch.erfc(x), "none needed", sample_range=(-4.0, 4.0)),
        LutFunction(
            "pow",
            _pow,
            f"x ** e (e = LutSpec.exponent): x floored at 0 for a fractional e; |x| floored at "
            f"{TINY} for e < 0 (the sign kept for an integer e); clamped at +-{POW_MAX:g}",
            sample_range=(0.0, 4.0),
        ),
        LutFunction(
            "inverse_sigmoid",
            _inverse_sigmoid,
            "log(max(x, eps) / max(1 - x, eps)), eps = LutSpec.eps > 0 (bounded by "
            "+-ln((1 - eps) / eps) on [0, 1])",
            range_rule=RangeRule.INVERSE,
            inverse=lambda y, s: 1.0 / (1.0 + math.exp(-y)),
            sample_range=(0.0, 1.0),
        ),
    )
}

GELU_POINTS = (-5.0, -3.0, -2.0, -1.0, -0.75, 0.0, 5.5, math.inf)
# hardsigmoid / hardswish: table edges on their kinks at -3 and 3 (assumed; see default_spec)
HARD_POINTS = (-3.0, -1.5, 0.0, 1.5, 3.0, 6.0, math.inf)
# leaky_relu: two tables, below and above its kink at 0 (each holds a line)
KINK_AT_ZERO = (-math.inf, -math.inf, -math.inf, 0.0, math.inf, math.inf, math.inf)
INVERSE_SIGMOID_EPS = 1e-5

_DEFAULTS: dict[str, LutSpec] = {
    "sigmoid": LutSpec(Strategy.EVENLY),
    "tanh": LutSpec(Strategy.EVENLY, symmetric=True),
    "exp": LutSpec(Strategy.CURVATURE),
    "log": LutSpec(Strategy.CURVATURE, symmetric=True, log_floor=-10.0),
    "reciprocal": LutSpec(Strategy.CURVATURE, symmetric=True, gradients=(0.0, None)),
    "sqrt": LutSpec(Strategy.CURVATURE, symmetric=True),
    "rsqrt": LutSpec(Strategy.CURVATURE, symmetric=True),
    "sin": LutSpec(Strategy.CURVATURE, symmetric=True),
    "cos": LutSpec(Strategy.CURVATURE),
    "erf": LutSpec(Strategy.EVENLY, symmetric=True),
    "tan": LutSpec(Strategy.CURVATURE, symmetric=True),
    "atan": LutSpec(Strategy.CURVATURE, symmetric=True),
    "sinh": LutSpec(Strategy.CURVATURE, symmetric=True),
    "cosh": LutSpec(Strategy.EVENLY),
    "atanh": LutSpec(Strategy.CURVATURE, symmetric=True, input_range=(-1.0, 1.0)),
    "asinh": LutSpec(Strategy.CURVATURE, symmetric=True),
    "asin": LutSpec(Strategy.CURVATURE, symmetric=True),
    "acos": LutSpec(Strategy.CURVATURE),
    "acosh": LutSpec(Strategy.CURVATURE, input_range=(1.0, None)),
    "silu": LutSpec(Strategy.CURVATURE),
    "gelu": LutSpec(Strategy.MANUAL, dividing_points=GELU_POINTS),
    "hardsigmoid": LutSpec(Strategy.MANUAL, dividing_points=HARD_POINTS),
    "hardswish": LutSpec(Strategy.MANUAL, dividing_points=HARD_POINTS),
    "leaky_relu": LutSpec(Strategy.MANUAL, dividing_points=KINK_AT_ZERO),
    "inverse_sigmoid": LutSpec(Strategy.EVENLY, eps=INVERSE_SIGMOID_EPS),
    "pow": LutSpec(Strategy.CURVATURE),
    "elu": LutSpec(Strategy.CURVATURE),
    "celu": LutSpec(Strategy.CURVATURE),
    "log2": LutSpec(Strategy.CURVATURE, symmetric=True, log_floor=-10.0),
    "log10": LutSpec(Strategy.CURVATURE, symmetric=True, log_floor=-10.0),
    "log1p": LutSpec(Strategy.CURVATURE, log_floor=-10.0),
    "softplus": LutSpec(Strategy.CURVATURE),
    "mish": LutSpec(Strategy.CURVATURE),
    "log_sigmoid": LutSpec(Strategy.CURVATURE),
    "softsign": LutSpec(Strategy.CURVATURE, symmetric=True),
    "selu": LutSpec(Strategy.CURVATURE),
    "tanhshrink": LutSpec(Strategy.CURVATURE, symmetric=True),
    "expm1": LutSpec(Strategy.CURVATURE),
    "exp2": LutSpec(Strategy.CURVATURE),
    "erfc": LutSpec(Strategy.EVENLY),
}


def get_function(func: str) -> LutFunction:
    """The registry entry of ``func``; ValueError listing the known names otherwise."""
    try:
        return FUNCTIONS[func]
    except KeyError:
        raise ValueError(
            f"unknown LUT function {func!r}; allowed: {', '.join(sorted(FUNCTIONS))}"
        ) from None


def default_spec(func: str) -> LutSpec:
    """The vendor's per-op default (j6-numerics s.3): sigmoid evenly; tanh symmetric evenly; exp
    curvature (+ cap); log symmetric curvature, floor -10; reciprocal/sqrt/rsqrt symmetric
    curvature (reciprocal's left tail flat); sin symmetric curvature, cos curvature; erf
    symmetric evenly (the plugin's Erf: a centrosymmetric SegmentLUT, its default strategy);
    the plugin's other SegmentLUT modules as it builds them: tan, atan, sinh, atanh (input
    range (-1, 1)), asinh and asin symmetric curvature, cosh evenly, acos curvature, acosh
    curvature (input range [1, inf)), asinh, asin and acos with the inverse-function range
    rule (their ``inverse_func``); silu
    curvature; gelu the fixed points [-5, -3, -2, -1, -0.75, 0, 5.5, inf]; inverse_sigmoid evenly
    (the plugin's SegmentLUT default) with eps = 1e-5; hardsigmoid and hardswish the points
    HARD_POINTS, table edges on their kinks at -3 and 3 (assumed: the seeds and the plugin's
    defaults do not name them; the plugin makes its other plain unary functions, elu and
    softplus among them, SegmentLUTs. On an int16 hardswish over +-8 the curvature rule's
    edges miss the kinks and it errs by up to 29 output LSB, these points by 1.35); leaky_relu
    two tables meeting at its kink at 0 (assumed likewise), its slope the call's; pow (an
    exponent other than 2, which is a mul) curvature, its exponent the call's (assumed: the
    plugin's Pow is a SegmentLUT of torch.pow whose strategy the documents do not give); elu and
    softplus curvature, their alpha, beta and threshold the call's (assumed likewise: the
    plugin makes both SegmentLUTs without a strategy the documents give); mish, log_sigmoid,
    selu, expm1 and exp2 curvature, softsign and tanhshrink symmetric curvature (odd
    functions), erfc evenly as erf (assumed: the documents name none of them); log2 and log10
    as log (symmetric curvature, log's floor of -10 in natural-log units), log1p curvature, celu
    curvature as elu at the call's alpha, logit as inverse_sigmoid at the call's eps (assumed
    likewise)."""
    get_function(func)
    return _DEFAULTS[func]
