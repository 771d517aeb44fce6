"""Fake quantization as QAT computes it (the arithmetic is ``quantlab.numerics``).

QAT frameworks (torch.ao and the vendor plugin built on it) fake-quantize HALF_EVEN with
``torch.fake_quantize_per_tensor_affine`` / ``..._per_channel_affine``, which multiply by the
float32 reciprocal of the scale (``Divide.BY_RECIPROCAL``); the vendor's other tie rules
(``bpu_round`` = floor(x / s + 0.5)) divide (``Divide.BY_SCALE``). Deployed quantization
divides; the two differ only where ``x / s`` lies within an ulp of a rounding tie, which is
part of the fake-vs-fixed gap.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample import NanRule, fake_quant_grid
from quantlab.numerics.quantize import Divide, fake_quant
from quantlab.numerics.rounding import Round
from quantlab.platform_rules import FloatIslands
from quantlab.simulate import args as A


def qat_divide(rounding: Round) -> Divide:
    """How QAT forms x / s for ``rounding``: torch's kernels (HALF_EVEN) by the reciprocal."""
    return Divide.BY_RECIPROCAL if rounding is Round.HALF_EVEN else Divide.BY_SCALE


def qat_fake_quant(
    x: Tensor,
    scale: Tensor,
    dtype: DType,
    rounding: Round,
    axis: int | None = None,
    qmin: int | None = None,
    bounds: tuple[float | None, float | None] | None = None,
    zero_point: int = 0,
) -> Tensor:
    """float32 fake-quantized ``x`` (per tensor: with ``zero_point``) the way QAT computes it:
    ``numerics.quantize.fake_quant`` with ``qat_divide(rounding)``. Per-tensor (``axis`` None)
    or per-channel along ``axis``; range [qmin, qmax] (default: the full range of ``dtype``);
    ``bounds`` = (lo, hi) fake-quantizes ``clamp(x, lo, hi)`` (a fused relu6) in the same pass.
    """
    return fake_quant(
        x,
        scale,
        dtype,
        rounding,
        axis=axis,
        divide=qat_divide(rounding),
        qmin=qmin,
        bounds=bounds,
        zero_point=zero_point,
    )


def fake_grid(platform, args: list, kwargs: dict, plan: A.ArgPlan) -> None:
    """QAT numerics of a grid_sample grid: fake quant per axis at the fixed grid scale (s.4);
    nothing where the platform samples in float (``FloatIslands.ONNXRUNTIME_QDQ``: GridSample
    reads the grid's dequantized value)."""
    if not platform.grid_dtype.is_int or platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        return
    x = A.get(args, kwargs, plan.acts[0])
    grid = A.get(args, kwargs, plan.acts[1])
    align = A.grid_sample_options(args, kwargs)[2]
    if x.dim() != 4 or not A.is_float_tensor(grid):
        return
    fq = fake_quant_grid(
        grid,
        x.shape[2],
        x.shape[3],
        align,
        platform.grid_coord,
        platform.grid_dtype,
        platform.fake_round,
        NanRule.ZERO_CODE,
    )
    A.put(args, kwargs, plan.acts[1], fq)


def fake_single_period(platform, args: list, kwargs: dict, plan: A.ArgPlan, info) -> None:
    """QAT of the plugin's ``single_period`` sin/cos: an integer input wider than one period
    is reduced to one period by the exporter's steps (``numerics.periodic.period_reduce``)
    before the exact function; the gradient passes straight through (d x' / d x = 1)."""
    from quantlab.numerics.periodic import needs_period_reduction, period_reduce
    from quantlab.numerics.quantize import dequantize
    from quantlab.simulate.straight_through import through

    if info is None or not info.dtype.is_int or info.dtype.bits > 16:
        return
    x = A.get(args, kwargs, plan.acts[0])
    if not A.is_float_tensor(x) or not needs_period_reduction(float(info.scale), info.dtype):
        return
    codes, scale = period_reduce(
        info.codes_of(x), float(info.scale), info.dtype, platform.fake_round
    )
    value = dequantize(codes.to(torch.int64), torch.tensor(scale, dtype=torch.float32))
    A.put(args, kwargs, plan.acts[0], through(x, value))
