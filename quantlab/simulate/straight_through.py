"""Straight-through gradients for the simulator's quantized values (QAT's estimator).

Every function here returns, as its forward value, exactly the tensor the no-gradient run
computes (the same float32 bits: the value is computed first, without gradient, by the unchanged
arithmetic) and only decides what flows back:

- ``through(x, value, mask)``: value's gradient goes to ``x`` (times ``mask``): the STE of
  fake quantization (mask: 1 where x lies inside the quantization range and the fused clamp),
  of a segment table (mask: the table's own slope, ``numerics.lut.segment_slope``), or of a
  kernel whose float function stands in for its gradient (``x`` = the float output).
- ``learned_scale(x, s, value, qmin, qmax)``: LSQ (Esser et al. 2020): the gradient of x as
  above, and d value / d s = round(x/s) - x/s inside the range, the bound code outside,
  scaled by 1 / sqrt(numel * qmax).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class _Through(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, value: Tensor, mask: Tensor | None) -> Tensor:
        ctx.save_for_backward(mask)
        return value.clone()

    @staticmethod
    def backward(ctx, g: Tensor):
        (mask,) = ctx.saved_tensors
        return (g if mask is None else g * mask.to(g.dtype)), None, None


class _LearnedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s, value, qmin: int, qmax: int):
        ctx.save_for_backward(x, s, value)
        ctx.bounds = (qmin, qmax)
        return value.clone()

    @staticmethod
    def backward(ctx, g: Tensor):
        x, s, value = ctx.saved_tensors
        qmin, qmax = ctx.bounds
        sd = s.detach()
        v = x.detach() / sd
        q = value / sd  # the codes (value = codes * s)
        inside = (v >= qmin) & (v <= qmax)
        gx = g * inside.to(g.dtype)
        ds = torch.where(inside, q - v, q)
        grad_scale = 1.0 / math.sqrt(max(x.numel(), 1) * qmax)
        gs = (g * ds).sum() * grad_scale
        return gx, gs.reshape(s.shape), None, None, None


def through(x: Tensor, value: Tensor, mask: Tensor | None = None) -> Tensor:
    """``value`` (its exact bits) with the gradient of ``x`` (times ``mask``); ``value`` itself
    when no gradient is being recorded for ``x``."""
    if not (torch.is_grad_enabled() and isinstance(x, Tensor) and x.requires_grad):
        return value
    return _Through.apply(x, value.detach(), mask)


def learned_scale(x: Tensor, s: Tensor, value: Tensor, qmin: int, qmax: int) -> Tensor:
    """``value`` (computed at ``s``) with LSQ gradients for ``x`` and the scale ``s``."""
    if not torch.is_grad_enabled():
        return value
    return _LearnedScale.apply(x, s, value.detach(), qmin, qmax)


def range_mask(x: Tensor, s: Tensor, qmin: int, qmax: int, bounds=None, axis=None) -> Tensor:
    """1 where ``x`` quantizes without saturation (x / s in [qmin, qmax]) and lies inside the
    fused clamp ``bounds`` = (lo, hi) (None for an open side), else 0 (bool)."""
    x = x.detach()
    sb = s.detach()
    if axis is not None and sb.dim() == 1:
        shape = [1] * x.dim()
        shape[axis] = -1
        sb = sb.reshape(shape)
    v = x / sb
    m = (v >= qmin) & (v <= qmax)
    if bounds is not None:
        lo, hi = bounds
        if lo is not None:
            m &= x >= lo
        if hi is not None:
            m &= x <= hi
    return m
