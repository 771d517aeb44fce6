"""The normalisation composite in float: its steps (what observers calibrate) and its QAT form.

``norm_steps`` evaluates the eight steps of ``quantlab.numerics.norm`` in float64 on the float
input, the values the vendor's QAT LayerNorm observes during calibration;
``scales_from_steps`` turns their absolute maxima into ``NormScales``; ``norm_fake`` is what
QAT computes: each step on the previous step's fake-quantized value, then fake-quantized itself
(the exact rsqrt, not the table: LUT error is invisible to QAT, j6-numerics s.2).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.fake_quant_plan import fake_quant_fn
from quantlab.numerics.norm import (
    CODE_DTYPES,
    J6_NORM,
    NormContract,
    NormLayout,
    NormScales,
    check_eps,
)
from quantlab.numerics.norm_native import rows_kernel
from quantlab.numerics.quantize import ScaleRule, code_range, compute_scale, fake_quant_by_scale
from quantlab.numerics.rounding import Round
from quantlab.numerics.scales import check_scale


@dataclass(frozen=True)
class NormSteps:
    """Float64 values of the composite's steps for one input (module docstring of norm.py).

    mean / var: one value per row (rows, 1); diff, square, normed: (rows, N); scaled, out: the
    input's shape (scaled is None without gamma). gamma / beta: the parameters (or None).
    """

    mean: Tensor
    diff: Tensor
    square: Tensor
    var: Tensor
    rsqrt: Tensor
    normed: Tensor
    scaled: Tensor | None
    out: Tensor
    gamma: Tensor | None
    beta: Tensor | None


def norm_steps(
    x: Tensor, layout: NormLayout, weight: Tensor | None, bias: Tensor | None, eps: float
) -> NormSteps:
    """The float steps of the normalisation of ``x`` (float64 throughout)."""
    eps = check_eps(eps)
    xf = x.to(torch.float64)
    rows = layout.rows(xf)
    mean = rows.mean(1, keepdim=True)
    diff = rows - mean
    square = diff * diff
    var = square.mean(1, keepdim=True)
    rsqrt = torch.rsqrt(var + eps)
    normed = diff * rsqrt
    y = normed.reshape(x.shape)
    g = b = scaled = None
    if weight is not None:
        g = weight.detach().to(torch.float64)
        scaled = y * layout.affine(g, xf, "weight")
        y = scaled
    if bias is not None:
        b = bias.detach().to(torch.float64)
        y = y + layout.affine(b, xf, "bias")
    return NormSteps(mean, diff, square, var, rsqrt, normed, scaled, y, g, b)


def _amax(t: Tensor | None) -> float:
    return 0.0 if t is None or t.numel() == 0 else float(t.abs().max())


def scales_from_steps(
    steps: list[NormSteps] | NormSteps,
    contract: NormContract = J6_NORM,
    rule: ScaleRule = ScaleRule.HALF_RANGE,
) -> NormScales:
    """NormScales from the absolute maxima of the steps over one or more inputs (a MinMax
    observer): ``compute_scale(amax, dtype, rule)`` with ``contract.inter_dtype`` for the
    intermediates and ``contract.affine_dtype`` for gamma / beta; ``var_range`` is the observed
    variance range."""
    steps = [steps] if isinstance(steps, NormSteps) else list(steps)
    if not steps:
        raise ValueError("scales_from_steps needs at least one NormSteps")

    def scale(name: str, dtype: DType) -> float | None:
        vals = [getattr(s, name) for s in steps]
        if all(v is None for v in vals):
            return None
        return float(compute_scale(max(_amax(v) for v in vals), dtype, rule))

    first = steps[0]
    has_g, has_b = first.gamma is not None, first.beta is not None
    inter, aff = contract.inter_dtype, contract.affine_dtype
    lo = min(float(s.var.min()) for s in steps)
    hi = max(float(s.var.max()) for s in steps)
    return NormScales(
        mean=scale("mean", inter),
        diff=scale("diff", inter),
        square=scale("square", inter),
        var=scale("var", inter),
        rsqrt=scale("rsqrt", inter),
        normed=scale("normed", inter) if (has_g or has_b) else None,
        scaled=scale("scaled", inter) if (has_g and has_b) else None,
        gamma=scale("gamma", aff) if has_g else None,
        beta=scale("beta", aff) if has_b else None,
        var_range=(lo, hi),
    )


def output_scale(
    steps: list[NormSteps] | NormSteps, out_dtype: DType, rule: ScaleRule = ScaleRule.HALF_RANGE
) -> float:
    """The output's scale from the absolute maximum of ``steps.out`` (a MinMax observer)."""
    steps = [steps] if isinstance(steps, NormSteps) else list(steps)
    return float(compute_scale(max(_amax(s.out) for s in steps), DType.parse(out_dtype), rule))


def norm_fake(
    x: Tensor,
    layout: NormLayout,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    scales: NormScales,
    out_scale: float,
    out_dtype: DType,
    contract: NormContract = J6_NORM,
    rounding: Round = Round.HALF_EVEN,
    affine: tuple[Tensor | None, Tensor | None] | None = None,
) -> Tensor:
    """The QAT form (float32): every step of norm.py on fake-quantized operands, fake-quantized
    to its scale and dtype by ``rounding`` (the plugin's FloatFunctional ops with int16 qconfig;
    rsqrt exact, then fake quant). ``x`` is taken as given (already on its input grid).
    ``affine``: ``fake_affine`` of the same weight, bias, scales, contract and rounding, kept
    by a caller that runs the norm again (else computed here).

    LayerNorm rows (HALF_EVEN, a contiguous float32 input without gradient) run their
    elementwise steps in C (``norm_native``, the same bits). Otherwise the torch steps run,
    first with every step's NaN kept (one pass fewer per step): a NaN made by any step reaches
    an output of its row (every step propagates NaN, and mean, var and rsqrt cover the row), so
    an output free of NaN shows no step made one, and then turning NaN into code 0 changed
    nothing. Otherwise the steps run again with it."""
    f = norm_fake_fn(
        layout, weight, bias, eps, scales, out_scale, out_dtype, contract, rounding, affine
    )
    return f(x)


def norm_fake_fn(
    layout: NormLayout,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    scales: NormScales,
    out_scale: float,
    out_dtype: DType,
    contract: NormContract = J6_NORM,
    rounding: Round = Round.HALF_EVEN,
    affine: tuple[Tensor | None, Tensor | None] | None = None,
) -> Callable[[Tensor], Tensor]:
    """``x -> norm_fake(x, layout, weight, bias, eps, ...)``, the same bits, with its constants
    (checked arguments, the fake-quantized affine, the C kernels' steps) worked out here, for a
    caller that runs the norm again on new inputs with the same parameters; bad arguments
    raise here, as ``norm_fake`` would on a call."""
    eps = check_eps(eps)
    out_dtype = DType.parse(out_dtype)
    if out_dtype not in CODE_DTYPES:
        raise ValueError(f"out_dtype must be INT8 or INT16, got {out_dtype.name}")
    scales.require(weight is not None, bias is not None)
    gamma, beta = affine or fake_affine(weight, bias, scales, contract, rounding)
    kernel = None
    if rounding is Round.HALF_EVEN:  # the elementwise steps in C, where they apply
        kernel = rows_kernel(
            layout, eps, scales, out_scale, out_dtype, contract.inter_dtype, gamma, beta
        )
    run = (layout, eps, scales, out_scale, out_dtype, contract, rounding, gamma, beta)

    def f(x: Tensor) -> Tensor:
        if kernel is not None:
            y = kernel(x)
            if y is not None:
                return y
        y = _norm_fake_steps(x, *run, keep_nan=True)
        if math.isnan(y.sum()):  # a NaN anywhere makes the sum NaN
            y = _norm_fake_steps(x, *run, keep_nan=False)
        return y

    return f


def _norm_fake_steps(
    x, layout, eps, scales, out_scale, out_dtype, contract, rounding, gamma, beta, keep_nan
) -> Tensor:
    """norm_fake's steps (gamma, beta: fake-quantized, or None); every fake quant in place on
    the fresh tensor its step made."""
    s, dt = scales, contract.inter_dtype

    def fq(t: Tensor, scale: float, dtype: DType = dt) -> Tensor:
        return _step_fake_quant(scale, dtype, rounding)(t, keep_nan=keep_nan)

    xf = x.to(torch.float32)
    rows = layout.rows(xf)
    mu = fq(rows.mean(1, keepdim=True), s.mean)
    d = fq(rows - mu, s.diff)
    v = fq(fq(d * d, s.square).mean(1, keepdim=True), s.var)
    r = fq(torch.rsqrt(v + eps), s.rsqrt)
    last = gamma is None and beta is None
    y = fq(d * r, out_scale if last else s.normed, out_dtype if last else dt).reshape(x.shape)
    if gamma is not None:
        g = layout.affine(gamma, xf, "weight")
        y = fq(y * g, out_scale, out_dtype) if beta is None else fq(y * g, s.scaled)
    if beta is not None:
        y = fq(y + layout.affine(beta, xf, "bias"), out_scale, out_dtype)
    return y


def fake_affine(
    weight: Tensor | None,
    bias: Tensor | None,
    scales: NormScales,
    contract: NormContract = J6_NORM,
    rounding: Round = Round.HALF_EVEN,
) -> tuple[Tensor | None, Tensor | None]:
    """gamma and beta fake-quantized at their scales and the contract's affine dtype by
    ``rounding`` (float32, their own shapes), as ``norm_fake`` uses them."""
    scales.require(weight is not None, bias is not None)
    dt = contract.affine_dtype
    g = (
        _planned_fake_quant(scales.gamma, dt, rounding)(weight.detach())
        if weight is not None
        else None
    )
    b = _planned_fake_quant(scales.beta, dt, rounding)(bias.detach()) if bias is not None else None
    return g, b


@functools.lru_cache(maxsize=4096)
def _planned_fake_quant(scale: float, dtype: DType, rounding: Round):
    """``fake_quant(., scale, dtype, rounding)`` (BY_SCALE) as a ``fake_quant_fn`` built once
    per value: the same float32 bits, without checking the scale on every step of every run."""
    return fake_quant_fn(torch.tensor(scale, dtype=torch.float32), dtype, rounding)


@functools.lru_cache(maxsize=4096)
def _step_fake_quant(scale: float, dtype: DType, rounding: Round):
    """A step's ``fake_quant(., scale, dtype, rounding)`` (BY_SCALE, integer ``dtype``) built
    once per value, as ``f(t, keep_nan)``: in place on the fresh float32 step value ``t``
    (``fake_quant_by_scale``); the same float32 bits, NaN kept when ``keep_nan``."""
    s = check_scale(torch.tensor(scale, dtype=torch.float32), "scale").reshape(())
    lo, hi = code_range(dtype)
    return functools.partial(
        fake_quant_by_scale, s=s, lo=lo, hi=hi, rounding=rounding, sf=s.item(), inplace=True
    )
