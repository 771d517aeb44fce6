"""Fake quantization as QAT computes it: torch's own fake-quant kernels.

QAT frameworks (torch.ao and the vendor plugin built on it) fake-quantize with
``torch.fake_quantize_per_tensor_affine`` / ``..._per_channel_affine``:
``clamp(nearbyint(x * fl32(1 / s)), qmin, qmax) * s`` (round half to even, multiplying by the
float32 reciprocal of the scale). Deployed quantization (ONNX QuantizeLinear,
``quantlab.numerics.quantize``) divides by the scale instead; the two differ only where
``x / s`` lies within an ulp of a rounding tie, which is part of the fake-vs-fixed gap.
For rounding modes other than HALF_EVEN the numerics package's fake_quant is used.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import fake_quant
from quantlab.numerics.rounding import Round
from quantlab.simulate import args as A


def qat_fake_quant(
    x: Tensor,
    scale: Tensor,
    dtype: DType,
    rounding: Round,
    axis: int | None = None,
    qmin: int | None = None,
    bounds: tuple[float | None, float | None] | None = None,
) -> Tensor:
    """float32 fake-quantized ``x`` (symmetric, zero point 0) the way QAT computes it.

    Per-tensor (``axis`` None, one scale) or per-channel along ``axis``; range [qmin, qmax]
    (default: the full range of ``dtype``). ``bounds`` = (lo, hi) fake-quantizes
    ``clamp(x, lo, hi)`` (a fused relu6) in the same pass.
    Per-tensor HALF_EVEN is computed as ``round(x * r) -> clamp -> * s`` with ``r = fl32(1/s)``:
    the same float32 operations as torch's kernel, bit for bit (tests), several times faster on
    CPU. A clamp commutes with the monotone ``fl32(. * r)`` and ``round``, so
    ``fq(clamp(x, lo, hi))`` clamps the codes to ``[round(lo * r), round(hi * r)]``. NaN inputs
    stay NaN (torch's kernel gives an unspecified code).
    """
    lo = dtype.qmin if qmin is None else qmin
    hi = dtype.qmax
    if rounding is not Round.HALF_EVEN:
        if bounds is not None:
            x = torch.clamp(x, bounds[0], bounds[1])
        return fake_quant(x, scale, dtype, rounding, axis=axis)
    xf = x.detach().to(torch.float32)
    s = torch.as_tensor(scale, dtype=torch.float32)
    if axis is not None:
        if bounds is not None:
            xf = torch.clamp(xf, bounds[0], bounds[1])
        zp = torch.zeros(s.shape, dtype=torch.int32)
        return torch.fake_quantize_per_channel_affine(xf, s, zp, axis, lo, hi)
    lo, hi, rf, sf = _per_tensor_constants(s, lo, hi, bounds)
    q = torch.mul(xf, rf)
    return q.round_().clamp_(lo, hi).add_(0.0).mul_(sf)  # + 0.0: code -0 -> +0, as torch


def fake_grid(platform, args: list, kwargs: dict, plan: A.ArgPlan) -> None:
    """QAT numerics of a grid_sample grid: fake quant per axis at the fixed grid scale (s.4)."""
    from quantlab.numerics.grid_sample import NanRule, quantize_grid

    if not platform.grid_dtype.is_int:
        return
    x = A.get(args, kwargs, plan.acts[0])
    grid = A.get(args, kwargs, plan.acts[1])
    align = kwargs.get("align_corners", args[4] if len(args) > 4 else None) or False
    if x.dim() != 4 or not A.is_float_tensor(grid):
        return
    qg = quantize_grid(
        grid,
        x.shape[2],
        x.shape[3],
        align,
        platform.grid_coord,
        platform.grid_dtype,
        platform.fake_round,
        NanRule.ZERO_CODE,
    )
    if qg.coord.name == "NORMALIZED":
        scale = torch.tensor([qg.scale_x, qg.scale_y], dtype=torch.float32)
        A.put(args, kwargs, plan.acts[1], qg.codes.to(torch.float32) * scale)
    else:
        from quantlab.numerics.grid_sample import normalize

        pos = qg.codes.to(torch.float64) / (1 << qg.frac_bits)
        gx = normalize(pos[..., 0], x.shape[3], align)
        gy = normalize(pos[..., 1], x.shape[2], align)
        A.put(args, kwargs, plan.acts[1], torch.stack([gx, gy], -1).to(torch.float32))


_CONSTANTS: dict[tuple, tuple] = {}


def _per_tensor_constants(s: Tensor, lo: int, hi: int, bounds) -> tuple[int, int, float, float]:
    """(code lo, code hi, fl32(1/s), s) for one scale and optional clamp bounds, cached while
    the scale tensor object lives (the cache holds it, so its id is not reused)."""
    key = (id(s), s._version, lo, hi, bounds)
    hit = _CONSTANTS.get(key)
    if hit is not None:
        return hit[0]
    s0 = s.reshape(())
    r = torch.ones((), dtype=torch.float32) / s0
    if bounds is not None:
        if bounds[0] is not None:
            lo = max(lo, int(torch.round(torch.tensor(bounds[0], dtype=torch.float32) * r)))
        if bounds[1] is not None:
            hi = min(hi, int(torch.round(torch.tensor(bounds[1], dtype=torch.float32) * r)))
    value = (lo, hi, float(r), float(s0))
    if len(_CONSTANTS) > 4096:
        _CONSTANTS.clear()
    _CONSTANTS[key] = (value, s)
    return value
