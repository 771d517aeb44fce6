"""A two-operand ``torch.einsum`` as the layout ops and the batched matrix product torch itself
lowers it to (ATen's ``einsum`` and ``sumproduct_pair``), so op capture sees a matmul.

``einsum_plan(equation, shape_a, shape_b)`` is pure arithmetic on the equation and the shapes:
torch's own steps, in its order. Labels are aligned as torch aligns them (the output's labels in
the output's order, the ellipsis where the output puts it, then the contracted labels in label
order, ``A``-``Z`` before ``a``-``z``); a label's dimension counts in an operand only where its
size is not 1 there (torch's broadcasting); the dimensions of both operands, of the left only
and of the right only (``lro``, ``lo``, ``ro``) become bmm's batch, rows and columns, the
operands swapped where every right-only dimension comes before every left-only one in the
output. ``contract(a, b, plan)`` runs those steps: per operand a view adding its missing labels
as trailing dimensions of size 1, one permute (torch's two, composed: the same strides) and a
reshape to (batch, rows, contracted) or (batch, contracted, columns); ``torch.bmm``; a view,
a permute and a view back to the output's shape. The result has torch's float bits
(``tests/test_einsum_parts.py``, on random equations and sizes).

The plan is None, and the call stays one op, where torch computes something other than one
batched matrix product: a number of operands other than 2, a label repeated within an operand
(a diagonal), a label summed within one operand before the product, no contracted label (torch
multiplies elementwise), or an equation torch refuses (torch's own call then raises its own
message). ``decompositions`` also leaves operands of different or non-float dtypes whole.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

_LETTERS = 26
_ELLIPSIS = 2 * _LETTERS  # torch's code for "..." among the labels 0..51


@dataclass(frozen=True)
class EinsumPlan:
    """torch's steps for one two-operand einsum on operands of fixed shapes."""

    a_view: tuple[int, ...] | None  # a with its missing labels as trailing 1s (None: as it is)
    b_view: tuple[int, ...] | None
    swap: bool  # b is bmm's left operand
    left_perm: tuple[int, ...]  # of the (unaligned, viewed) left operand
    right_perm: tuple[int, ...]
    left_shape: tuple[int, int, int]  # (batch, rows, contracted)
    right_shape: tuple[int, int, int]  # (batch, contracted, columns)
    product_shape: tuple[int, ...]  # bmm's result viewed per aligned dimension
    out_perm: tuple[int, ...]
    out_shape: tuple[int, ...]  # the einsum's result shape


def _label(ch: str) -> int | None:
    if "A" <= ch <= "Z":
        return ord(ch) - ord("A")
    if "a" <= ch <= "z":
        return ord(ch) - ord("a") + _LETTERS
    return None


def _parse(side: str) -> list[int] | None:
    """An operand's (or the output's) labels, "..." as _ELLIPSIS; None if malformed."""
    out, i = [], 0
    while i < len(side):
        if side.startswith("...", i):
            out.append(_ELLIPSIS)
            i += 3
            continue
        label = _label(side[i])
        if label is None:
            return None
        out.append(label)
        i += 1
    return out if out.count(_ELLIPSIS) <= 1 else None


def einsum_plan(equation: str, shape_a: Sequence[int], shape_b: Sequence[int]) -> EinsumPlan | None:
    """torch's steps for ``torch.einsum(equation, a, b)`` on these shapes, or None where the
    call is not one batched matrix product (module docstring)."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    sides = lhs.split(",")
    labels = [_parse(s) for s in sides]
    shapes = [tuple(int(n) for n in shape_a), tuple(int(n) for n in shape_b)]
    if len(sides) != 2 or any(lab is None or not _fits(lab, n) for lab, n in zip(labels, shapes)):
        return None
    count = [0] * _ELLIPSIS
    for lab in labels:
        for x in lab:
            if x != _ELLIPSIS:
                count[x] += 1
    ell_dims = max(
        (len(n) - len(lab) + 1 for lab, n in zip(labels, shapes) if _ELLIPSIS in lab), default=0
    )
    out = _parse(rhs) if arrow else None
    if arrow and out is None:
        return None
    layout = _aligned_layout(count, ell_dims, out)
    if layout is None:
        return None
    position, ell_index, out_dims, ndim = layout
    aligned, perms, views = [], [], []
    for lab, shape in zip(labels, shapes, strict=True):
        perm, dim = [-1] * ndim, 0
        for x in lab:
            if x == _ELLIPSIS:  # this operand's ellipsis dimensions, right-aligned
                covered = len(shape) - len(lab) + 1
                spots = range(ell_index + ell_dims - covered, ell_index + ell_dims)
            else:
                spots = (position[x],)
            for p in spots:
                perm[p] = dim
                dim += 1
        missing = [p for p in range(ndim) if perm[p] == -1]
        for p in missing:  # torch's unsqueeze at the end
            perm[p] = dim
            dim += 1
        full = shape + (1,) * len(missing)
        views.append(full if missing else None)
        perms.append(perm)
        aligned.append([full[perm[p]] for p in range(ndim)])
    for p in range(ndim):  # a size other than 1 in both operands must be the same
        if 1 not in (aligned[0][p], aligned[1][p]) and aligned[0][p] != aligned[1][p]:
            return None  # torch refuses
    sum_dims = []
    for p in range(out_dims, ndim):
        sa, sb = aligned[0][p] != 1, aligned[1][p] != 1
        if sa and sb:
            sum_dims.append(p)
        elif sa or sb:  # summed within one operand first: not one product
            return None
    if not sum_dims:  # torch multiplies elementwise
        return None
    return _pair_plan(aligned, perms, views, sum_dims, out_dims, ndim)


def _fits(labels: list[int], shape: tuple[int, ...]) -> bool:
    """Whether an operand's labels name its dimensions as torch requires, with no label
    repeated (a diagonal, which torch takes first)."""
    named = [x for x in labels if x != _ELLIPSIS]
    if len(set(named)) != len(named):
        return False
    return len(named) <= len(shape) if _ELLIPSIS in labels else len(named) == len(shape)


def _aligned_layout(
    count: list[int], ell_dims: int, out: list[int] | None
) -> tuple[list[int], int, int, int] | None:
    """torch's aligned order (its ``label_perm_index``): each label's position, where the
    ellipsis dimensions start, how many dimensions the output has, and how many in all.
    ``out``: the explicit output's labels, or None for the implicit output (the ellipsis,
    then the labels seen once, in label order). None where torch refuses the output."""
    position = [-1] * _ELLIPSIS
    ell_index, index = 0, 0
    if out is None:
        index, ell_in_out = ell_dims, True
        for x in range(_ELLIPSIS):
            if count[x] == 1:
                position[x], index = index, index + 1
    else:
        ell_in_out = _ELLIPSIS in out
        for x in out:
            if x == _ELLIPSIS:
                ell_index, index = index, index + ell_dims
            elif count[x] == 0 or position[x] != -1:
                return None
            else:
                position[x], index = index, index + 1
    out_dims = index
    if not ell_in_out:  # the ellipsis dimensions are contracted
        ell_index, index = index, index + ell_dims
    for x in range(_ELLIPSIS):  # the contracted labels, in label order
        if count[x] > 0 and position[x] == -1:
            position[x], index = index, index + 1
    return position, ell_index, out_dims, index


def _pair_plan(
    aligned: list[list[int]],
    perms: list[list[int]],
    views: list[tuple[int, ...] | None],
    sum_dims: list[int],
    out_dims: int,
    ndim: int,
) -> EinsumPlan:
    """ATen's ``sumproduct_pair`` on the aligned operands (``aligned``: each one's size per
    aligned dimension; ``perms``: the permutation that aligns it), keeping dimensions, then
    the view that drops the contracted ones."""
    left, right = aligned
    is_sum = set(sum_dims)
    lro, lo, ro = [], [], []
    for p in range(ndim):
        if p in is_sum:
            continue
        sl, sr = left[p] != 1, right[p] != 1
        if sl and sr:
            lro.append(p)
        elif sl:
            lo.append(p)
        else:
            ro.append(p)
    swap = bool(lo) and bool(ro) and ro[-1] < lo[0]
    lperm_aligned, rperm_aligned = perms
    if swap:
        left, right = right, left
        lo, ro = ro, lo
        lperm_aligned, rperm_aligned = rperm_aligned, lperm_aligned
    lperm = lro + lo + sum_dims + ro
    rperm = lro + sum_dims + ro + lo
    size = math.prod
    lro_n, lo_n = size(left[p] for p in lro), size(left[p] for p in lo)
    sum_n, ro_n = size(left[p] for p in sum_dims), size(right[p] for p in ro)
    product_shape = [left[p] for p in lro + lo] + [1] * len(sum_dims) + [right[p] for p in ro]
    out_perm = [0] * ndim
    for i, p in enumerate(lro + lo + sum_dims + ro):
        out_perm[p] = i
    out_shape = [
        left[p] if p in lro or p in lo else right[p] if p in ro else 1 for p in range(out_dims)
    ]
    a_view, b_view = views
    return EinsumPlan(
        a_view=a_view,
        b_view=b_view,
        swap=swap,
        left_perm=tuple(lperm_aligned[p] for p in lperm),  # torch's two permutes composed
        right_perm=tuple(rperm_aligned[p] for p in rperm),
        left_shape=(lro_n, lo_n, sum_n),
        right_shape=(lro_n, sum_n, ro_n),
        product_shape=tuple(product_shape),
        out_perm=tuple(out_perm),
        out_shape=tuple(out_shape),
    )


def contract(a, b, plan: EinsumPlan):
    """``torch.einsum``'s result by ``plan``'s steps (tensors, or traced values that answer
    layout questions); identity permutes and views to the same shape are left out."""
    if plan.a_view is not None:
        a = a.view(plan.a_view)
    if plan.b_view is not None:
        b = b.view(plan.b_view)
    left, right = (b, a) if plan.swap else (a, b)
    left = _reshaped(_permuted(left, plan.left_perm), plan.left_shape)
    right = _reshaped(_permuted(right, plan.right_perm), plan.right_shape)
    out = torch.bmm(left, right)
    out = _permuted(_viewed(out, plan.product_shape), plan.out_perm)
    return _viewed(out, plan.out_shape)


def _permuted(t, perm: tuple[int, ...]):
    return t if perm == tuple(range(len(perm))) else t.permute(perm)


def _reshaped(t, shape: tuple[int, ...]):
    return t if tuple(t.shape) == shape else t.reshape(shape)


def _viewed(t, shape: tuple[int, ...]):
    return t if tuple(t.shape) == shape else t.view(shape)
