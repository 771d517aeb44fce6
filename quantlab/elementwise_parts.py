"""The parts of elementwise calls that split into ops quantlab models (``decompositions``'
module doc lists what each becomes): ``-x``, ``c / y``, clamps with tensor bounds, the
maximum / minimum with a held number, threshold and the shrinks, ``torch.square`` and
``F.glu``. Each ``*_parts(args, kwargs)`` returns a zero-argument function computing the call
by its parts, or None where the call stays whole."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.norm_parts import is_float


def _neg_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``-x`` of a float tensor as ``x * -1.0``, a product by a constant: the same bits (both
    flip the sign bit alone) except a NaN's sign (the product returns the NaN as it is)."""
    if len(args) != 1 or kwargs or not is_float(args[0]):
        return None
    x = args[0]
    return lambda: x * -1.0


def _rdiv_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``c / y`` (``y.__rtruediv__(c)``) of a nonzero Python number c and a float tensor y as
    torch's own code for it (``Tensor.__rdiv__``): ``y.reciprocal() * c``, the call's bits
    (c = 1: the reciprocal alone, the same bits: a product by 1 changes none)."""
    if len(args) != 2 or kwargs:
        return None
    y, c = args
    if not is_float(y) or isinstance(c, bool) or not isinstance(c, (int, float)) or c == 0:
        return None
    if c == 1:
        return lambda: y.reciprocal()
    return lambda: y.reciprocal() * c


def _truediv_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """torch.fx's trace of ``c / y`` (``operator.truediv(c, y)``): ``_rdiv_parts``; any other
    division stays whole."""
    if len(args) != 2 or kwargs or isinstance(args[0], Tensor) or not is_float(args[1]):
        return None
    return _rdiv_parts((args[1], args[0]), {})


def _held_number(b: Tensor) -> bool:
    """Whether tensor ``b`` is one number that needs no gradient (0-d: a buffer, a constant);
    a parameter bound stays a tensor in every mode, so training and evaluation run the same
    ops."""
    return b.dim() == 0 and not b.requires_grad


def _clamp_parts(which: str) -> Callable:
    """The parts of ``clamp`` / ``clip`` (``which`` "both"), ``clamp_min`` ("min") or
    ``clamp_max`` ("max") of a float tensor with tensor bounds: ``torch.maximum`` with the
    lower bound, then ``torch.minimum`` with the upper, each picking one operand's value: the
    call's bits. Number bounds stay the clamp op, and so do bounds that are numbers held in
    0-d tensors needing no gradient (buffers): the clamp with their values, the same bits
    (torch compares in the tensor's dtype either way)."""
    names = {"both": ("input", "min", "max"), "min": ("input", "min"), "max": ("input", "max")}
    params = names[which]

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        p = dict(zip(params, args)) | kwargs
        if len(args) > len(params) or not set(p) <= set(params):
            return None
        x, lo, hi = p.get("input"), p.get("min"), p.get("max")
        bounds = [b for b in (lo, hi) if b is not None]
        if not is_float(x) or not any(isinstance(b, Tensor) for b in bounds):
            return None
        if not all(isinstance(b, Tensor) and is_float(b) and b.dtype == x.dtype for b in bounds):
            return None  # a number beside a tensor bound: torch raises its own message
        if all(_held_number(b) for b in bounds):
            lo_v, hi_v = (None if b is None else b.item() for b in (lo, hi))
            return lambda: torch.clamp(x, min=lo_v, max=hi_v)

        def parts():
            y = x if lo is None else torch.maximum(x, lo)
            return y if hi is None else torch.minimum(y, hi)

        return parts

    return split


def _held_bound_parts(which: str) -> Callable:
    """The parts of ``torch.maximum`` / ``torch.max`` (``which`` "max") or ``torch.minimum`` /
    ``torch.min`` ("min") of a float tensor and a number held in a 0-d tensor of its dtype
    needing no gradient (``Max(x, 0.0)`` of a TF or JAX export, ``torch.maximum(x,
    torch.tensor(0.))``), either order: the clamp with that number, the same values (the sign
    of a zero or a NaN aside: ``minimum(-0.0, 0.0)`` and the clamp may keep either zero). A NaN
    bound, two tensors with values and any other form stay whole."""

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        if len(args) != 2 or kwargs:
            return None
        a, b = args
        for x, c in ((a, b), (b, a)):
            if not (is_float(x) and x.dim() > 0 and isinstance(c, Tensor) and is_float(c)):
                continue
            if c.dtype != x.dtype or not _held_number(c) or bool(c.isnan()):
                continue
            bound = c.item()
            if which == "max":
                return lambda: torch.clamp(x, min=bound)
            return lambda: torch.clamp(x, max=bound)
        return None

    return split


def _shrink_parts(kind: str) -> Callable:
    """The parts of ``F.threshold`` (``kind`` "threshold": ``where(x <= th, value, x)``),
    ``F.hardshrink`` ("hard": ``where(-l <= x <= l, 0, x)``) and ``F.softshrink`` ("soft":
    ``where(-l <= x <= l, 0, where(x > 0, x - l, x + l))``) of a float tensor: ATen's
    comparisons and arithmetic, the call's bits, NaN included (softshrink: a zero's sign
    aside, which ATen's vector loop and scalar tail give differently); in-place calls stay
    whole."""
    names = {
        "threshold": ("input", "threshold", "value", "inplace"),
        "hard": ("input", "lambd"),
        "soft": ("input", "lambd"),
    }[kind]

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        p = dict(zip(names, args)) | kwargs
        if len(args) > len(names) or not set(p) <= set(names) or p.get("inplace"):
            return None
        x = p.get("input")
        numbers = [p.get(n, 0.5) for n in names[1:] if n != "inplace"]
        if not is_float(x) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers
        ):
            return None
        if kind == "threshold":
            th, value = numbers
            return lambda: torch.where(x <= th, value, x)
        (lam,) = numbers
        if kind == "hard":
            return lambda: torch.where((x >= -lam) & (x <= lam), 0.0, x)
        return lambda: torch.where(
            (x >= -lam) & (x <= lam), 0.0, torch.where(x > 0, x - lam, x + lam)
        )

    return split


def _square_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``torch.square(x)`` of a float tensor as ``x.pow(2)`` (torch computes both as x * x)."""
    if len(args) != 1 or kwargs or not is_float(args[0]):
        return None
    x = args[0]
    return lambda: x.pow(2)


_GLU_PARAMS = ("input", "dim")


def _glu_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``F.glu(x, dim)`` of a float tensor as ``a * sigmoid(b)``, a and b the halves of x along
    dim (ATen's GLU computes the same two roundings); an odd size or a scalar stays whole (torch
    raises its own message)."""
    p = dict(zip(_GLU_PARAMS, args)) | kwargs
    if len(args) > len(_GLU_PARAMS) or not set(p) <= set(_GLU_PARAMS):
        return None
    x, dim = p.get("input"), p.get("dim", -1)
    try:
        if not is_float(x) or not isinstance(dim, int) or x.dim() == 0 or x.shape[dim] % 2:
            return None
    except (AttributeError, IndexError, TypeError):
        return None

    def parts():
        a, b = x.chunk(2, dim)
        return a * torch.sigmoid(b)

    return parts


# every elementwise function whose calls may split -> its parts (``decompositions.PARTS``)
ELEMENTWISE: dict[Callable, Callable[[tuple, dict], Callable[[], Any] | None]] = {
    # operator.neg: torch.fx's trace of ``-x``
    **dict.fromkeys(
        (Tensor.__neg__, Tensor.neg, Tensor.negative, torch.neg, torch.negative, operator.neg),
        _neg_parts,
    ),
    **dict.fromkeys((torch.clamp, torch.clip, Tensor.clamp, Tensor.clip), _clamp_parts("both")),
    **dict.fromkeys((torch.clamp_min, Tensor.clamp_min), _clamp_parts("min")),
    **dict.fromkeys((torch.clamp_max, Tensor.clamp_max), _clamp_parts("max")),
    **dict.fromkeys(
        (torch.maximum, Tensor.maximum, torch.max, Tensor.max), _held_bound_parts("max")
    ),
    **dict.fromkeys(
        (torch.minimum, Tensor.minimum, torch.min, Tensor.min), _held_bound_parts("min")
    ),
    F.threshold: _shrink_parts("threshold"),
    F.hardshrink: _shrink_parts("hard"),
    Tensor.hardshrink: _shrink_parts("hard"),
    F.softshrink: _shrink_parts("soft"),
    Tensor.__rtruediv__: _rdiv_parts,
    Tensor.__rdiv__: _rdiv_parts,
    operator.truediv: _truediv_parts,  # torch.fx's trace of ``c / y``
    torch.square: _square_parts,
    Tensor.square: _square_parts,
    F.glu: _glu_parts,
}
