"""Normalizations and reductions as the ops they compose, the parts op capture sees instead of
one call (``quantlab.decompositions``): ``F.rms_norm`` (ATen's CPU steps, the call's bits),
order-2 norms as ``sqrt(sum(x * x))`` and ``var`` / ``std`` in two passes (the parts' bits:
torch's kernels reduce in another order), ``torch.logsumexp`` (ATen's CPU steps, the call's
bits). Each ``*_parts`` function takes a call's (args, kwargs) and gives its parts, or None for
a call that stays whole."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


def is_float(t) -> bool:
    """Whether ``t`` is a floating-point tensor (or a traced value of one)."""
    try:
        return t.dtype.is_floating_point
    except AttributeError:  # not a tensor
        return False


_RMS_NORM_PARAMS = ("input", "normalized_shape", "weight", "eps")
RMS_NORM_DTYPES = (torch.float32, torch.float64)  # computed in their own dtype (opmath)


def rms_norm_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``F.rms_norm`` / ``torch.rms_norm`` as ATen's CPU steps (``rms_norm_symint``): the
    squares, their mean over the normalized dims, eps added (its dtype's machine epsilon when
    None), rsqrt, the product by the input, then by the weight. float32 / float64 inputs only
    (ATen computes half types in float32 and casts back: whole)."""
    p = dict(zip(_RMS_NORM_PARAMS, args)) | kwargs
    if len(args) > len(_RMS_NORM_PARAMS) or not set(p) <= set(_RMS_NORM_PARAMS):
        return None
    x, shape, w, eps = (p.get(k) for k in _RMS_NORM_PARAMS)
    try:
        if x.dtype not in RMS_NORM_DTYPES or (w is not None and w.dtype != x.dtype):
            return None
    except AttributeError:  # not tensors
        return None
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (tuple, list, torch.Size)) or not shape:
        return None
    dims = tuple(range(-len(shape), 0))
    e = torch.finfo(x.dtype).eps if eps is None else eps

    def parts():
        y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + e)
        return y if w is None else y * w

    return parts


def two_norm_parts(names: tuple[str, str, str, str]) -> Callable:
    """The parts of a 2-norm call whose positional parameters are ``names`` (input, the order,
    dim, keepdim): ``sqrt(sum(x * x))`` over ``dim`` (all elements for None), a product, a
    sum and a square-root table. torch's own norm kernel sums the squares in another order:
    its float bits differ in the last place or two (README)."""
    order_name = names[1]

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        p = dict(zip(names, args)) | kwargs
        if "out" in p and p["out"] is None:  # torch.norm hands its mode out=None
            del p["out"]
        if len(args) > len(names) or not set(p) <= {*names, "dtype"} or p.get("dtype"):
            return None
        x, dim, keepdim = p.get(names[0]), p.get("dim"), p.get("keepdim", False)
        order = p.get(order_name, "fro" if order_name == "p" else 2)
        if isinstance(order, bool) or order not in (2, "fro") or not isinstance(keepdim, bool):
            return None
        if not is_float(x) or x.dim() == 0:
            return None
        if isinstance(dim, int):
            dim = (dim,)
        if dim is None:
            dim = tuple(range(x.dim())) if keepdim else None
        elif not (isinstance(dim, (tuple, list)) and dim and all(type(d) is int for d in dim)):
            return None

        def parts():
            squares = x * x
            total = squares.sum() if dim is None else squares.sum(tuple(dim), keepdim=keepdim)
            return torch.sqrt(total)

        return parts

    return split


_COSINE_PARAMS = ("x1", "x2", "dim", "eps")


def cosine_similarity_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``F.cosine_similarity(x1, x2, dim, eps)`` of float tensors as ATen computes it
    (``Distance.cpp``): the operands broadcast, each divided by its 2-norm over ``dim``
    clamped below at eps, their product summed over ``dim``. The norms are ``sqrt(sum(x *
    x))``, so the float bits differ from the call's in the last place or two (README)."""
    p = dict(zip(_COSINE_PARAMS, args)) | kwargs
    if len(args) > len(_COSINE_PARAMS) or not set(p) <= set(_COSINE_PARAMS):
        return None
    x1, x2, dim, eps = p.get("x1"), p.get("x2"), p.get("dim", 1), p.get("eps", 1e-8)
    if not (is_float(x1) and is_float(x2)) or x1.dtype != x2.dtype or type(dim) is not int:
        return None
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None
    try:
        shape = torch.broadcast_shapes(x1.shape, x2.shape)
    except RuntimeError:  # torch raises its own message
        return None
    if not shape or not -len(shape) <= dim < len(shape):
        return None

    def unit(x: Tensor) -> Tensor:
        norm = torch.sqrt((x * x).sum(dim, keepdim=True))
        return x / norm.clamp_min(eps)

    def parts():
        a, b = (x if x.shape == shape else x.expand(shape) for x in (x1, x2))
        return (unit(a) * unit(b)).sum(dim)

    return parts


def variance_parts(root: bool, with_mean: bool = False) -> Callable:
    """The parts of ``var`` (``root``: ``std``) of a float tensor: the mean over ``dim`` (all
    elements for None), the difference, its square, their sum divided by N - correction
    (``unbiased``: correction 1, the default), and for std the square root (a table); the two
    passes torch's Welford reduction replaces, so the parts' float bits differ from the call's
    in the last places (README). ``with_mean``: ``var_mean`` / ``std_mean``, the pair (var or
    std, the mean), the mean kept over ``dim`` as ``keepdim`` says."""

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        if not args or not is_float(args[0]) or args[0].dim() == 0:
            return None
        x, rest = args[0], list(args[1:])
        p: dict[str, Any] = {}
        if rest and isinstance(rest[0], bool):  # var(x, unbiased)
            p["unbiased"] = rest.pop(0)
            if rest:
                return None
        for name, value in zip(("dim", "unbiased", "keepdim"), rest):
            p[name] = value
        if len(rest) > 3 or set(p) & set(kwargs):
            return None
        p |= kwargs
        if not set(p) <= {"dim", "unbiased", "correction", "keepdim"}:
            return None
        if "unbiased" in p and "correction" in p:
            return None
        correction = p.get("correction", 1 if p.get("unbiased", True) else 0)
        keepdim = p.get("keepdim", False)
        if type(correction) not in (int, float) or not isinstance(keepdim, bool):
            return None
        dim = p.get("dim")
        dims = tuple(range(x.dim())) if dim is None else (dim,) if type(dim) is int else dim
        if not (isinstance(dims, (tuple, list)) and dims and all(type(d) is int for d in dims)):
            return None
        dims = tuple(dims)
        n = math.prod(x.shape[d] for d in dims)
        if n - correction <= 0:  # torch's inf / nan: whole
            return None

        def parts():
            mean = x.mean(dims, keepdim=True)
            diff = x - mean
            var = (diff * diff).sum(dims, keepdim=keepdim) / (n - correction)
            spread = torch.sqrt(var) if root else var
            if not with_mean:
                return spread
            return spread, mean if keepdim else mean.squeeze(dims)

        return parts

    return split


_LOGSUMEXP_PARAMS = ("input", "dim", "keepdim")


def logsumexp_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``torch.logsumexp(x, dim, keepdim)`` of a float tensor as ATen's CPU steps
    (``logsumexp_out_impl``): the maximum over ``dim`` (an infinite one taken as 0), the
    exp of x minus it (a table), their sum, its log (a table) plus the maximum; with the call's
    float bits."""
    p = dict(zip(_LOGSUMEXP_PARAMS, args)) | kwargs
    if len(args) > 3 or not set(p) <= set(_LOGSUMEXP_PARAMS):
        return None
    x, dim, keepdim = p.get("input"), p.get("dim"), p.get("keepdim", False)
    if not is_float(x) or x.dim() == 0 or x.numel() == 0 or not isinstance(keepdim, bool):
        return None
    dims = (dim,) if type(dim) is int else dim
    if not (isinstance(dims, (tuple, list)) and dims and all(type(d) is int for d in dims)):
        return None
    dims = tuple(dims)

    def parts():
        top = x.amax(dims, keepdim=True)
        top = top.masked_fill(torch.isinf(top), 0.0)
        total = torch.exp(x - top).sum(dims, keepdim=keepdim)
        return torch.log(total) + (top if keepdim else top.squeeze(dims))

    return parts


_LRN_PARAMS = ("input", "size", "alpha", "beta", "k")


def local_response_norm_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``F.local_response_norm`` (``nn.LocalResponseNorm``) of a float tensor of 3 or more
    dims as torch's own steps on its channels, x seen as (N, C, L): the squares, zero-padded
    along C (size // 2 before, (size - 1) // 2 after), their average over windows of ``size``
    channels (an average pool of a (size, 1) window), times alpha, plus k, to the power beta
    (a table); x divided by that. torch pools a tensor of 4 or more dims by avg_pool3d over
    the same windows: the same float bits (checked on random shapes)."""
    p = dict(zip(_LRN_PARAMS, args)) | kwargs
    if len(args) > len(_LRN_PARAMS) or not set(p) <= set(_LRN_PARAMS):
        return None
    x, size = p.get("input"), p.get("size")
    alpha, beta, k = p.get("alpha", 1e-4), p.get("beta", 0.75), p.get("k", 1.0)
    if not is_float(x) or x.dim() < 3 or x.numel() == 0 or type(size) is not int or size < 1:
        return None

    def parts():
        n, c = x.shape[:2]
        flat = x.reshape(n, c, -1)
        div = flat.mul(flat).unsqueeze(1)
        div = torch.nn.functional.pad(div, (0, 0, size // 2, (size - 1) // 2))
        div = torch.nn.functional.avg_pool2d(div, (size, 1), stride=1).squeeze(1)
        div = div.mul(alpha).add(k).pow(beta)
        return (flat / div).reshape(x.shape)

    return parts
