"""A two-operand einsum as torch's own layout ops and bmm (quantlab.einsum_parts): torch's float
bits and result shape on random equations and sizes (implicit and explicit outputs, ellipses,
upper-case labels, broadcast size-1 dimensions, operands swapped), and no plan where torch
computes something other than one batched matrix product."""

from __future__ import annotations

import random

import pytest
import torch
from bits import assert_bits_equal

from quantlab.einsum_parts import contract, einsum_plan

EQUATIONS = (
    "ij,jk->ik",
    "ij,jk",  # implicit output
    "bij,bjk->bik",
    "bhqd,bhkd->bhqk",  # attention scores
    "bhqk,bhkd->bhqd",  # weighted sum
    "bqhd,bkhd->bhqk",
    "bld,dh->blh",
    "bld,hd->blh",
    "nchw,kc->nkhw",  # a 1x1 convolution
    "abcd,cdef->abef",  # two contracted labels
    "xyz,zyw->xw",
    "zyx,yzw->xw",  # contracted in label order (y, z), not in the order they appear
    "bi,ij->bj",
    "ji,bj->ib",
    "ij,ij->i",  # a row-wise dot product: batch i, contracted j
    "bik,bkj->bji",  # right-only before left-only in the output: torch swaps the operands
    "zb,bZ->Zz",  # upper case before lower case
    "ba,ca",
    "Ab,bA->",  # a full contraction to a scalar
    "...ij,...jk->...ik",
    "...d,...d->...",
    "b...d,bd->b...",
    "...qd,...kd->...qk",
    " i j , j k -> k i ",  # spaces
)


def _operands(eq: str, rng: random.Random, g: torch.Generator):
    lhs = eq.replace(" ", "").split("->")[0].split(",")
    size = {c: rng.choice([1, 2, 3, 7, 16, 33]) for c in set("".join(lhs)) if c.isalpha()}
    ell = [rng.choice([1, 2, 3]) for _ in range(rng.choice([0, 1, 2]))]

    def shape(side: str) -> list[int]:
        if "..." not in side:
            return [size[c] for c in side]
        pre, post = side.split("...")
        own = ell[rng.randint(0, len(ell)) :]  # a right-aligned part: broadcasts
        own = [n if rng.random() < 0.7 else 1 for n in own]
        return [size[c] for c in pre] + own + [size[c] for c in post]

    return (torch.randn(shape(s), generator=g) * rng.choice([0.01, 1.0, 300.0]) for s in lhs)


def test_a_planned_einsum_gives_torchs_bits_and_shape():
    """Every equation on 60 random size draws; each is planned on some of them (the others
    have a contracted label of size 1, which torch multiplies rather than multiplies out)."""
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    planned = dict.fromkeys(EQUATIONS, 0)
    for eq in EQUATIONS:
        for _ in range(60):
            a, b = _operands(eq, rng, g)
            want = torch.einsum(eq, a, b)
            plan = einsum_plan(eq, a.shape, b.shape)
            if plan is not None:
                planned[eq] += 1
                assert_bits_equal(contract(a, b, plan), want)
    assert min(planned.values()) >= 10, planned


def test_the_plan_is_torchs_lowering_on_typical_calls():
    """Attention scores are one bmm of (batch x heads) products with the operands' own
    layout steps, and an output whose right-only label comes first swaps the operands."""
    plan = einsum_plan("bhqd,bhkd->bhqk", (2, 4, 5, 8), (2, 4, 6, 8))
    assert plan.left_shape == (8, 5, 8) and plan.right_shape == (8, 8, 6) and not plan.swap
    assert plan.out_shape == (2, 4, 5, 6)
    swapped = einsum_plan("bik,bkj->bji", (3, 4, 5), (3, 5, 6))
    assert swapped.swap and swapped.left_shape == (3, 6, 5) and swapped.out_shape == (3, 6, 4)


@pytest.mark.parametrize(
    ("eq", "shapes"),
    [
        ("ii,ij->j", ((3, 3), (3, 4))),  # a diagonal
        ("ij,jk->k", ((2, 3), (3, 4))),  # i summed within the first operand
        ("ij,kj->ikj", ((2, 3), (4, 3))),  # nothing contracted: elementwise
        ("ij,jk->ik", ((2, 1), (1, 4))),  # the contracted label of size 1: an outer product
        ("ij->ji", ((2, 3), (3, 2))),  # one operand in the equation
        ("ij,jk,kl->il", ((2, 3), (3, 4))),  # three operands in the equation
        ("ij,jk->iq", ((2, 3), (3, 4))),  # an output label in no operand: torch refuses
        ("ij,jk->ii", ((2, 3), (3, 4))),  # repeated in the output: torch refuses
        ("ij,jk->ik", ((2, 3), (4, 4))),  # sizes that do not match: torch refuses
        ("i1,1k->ik", ((2, 3), (3, 4))),  # not a label
        ("ij,jk->i.k", ((2, 3), (3, 4))),  # a malformed output
        ("ij,jk->ik", ((2, 3, 1), (3, 4))),  # more dimensions than labels
    ],
)
def test_what_is_not_one_product_has_no_plan(eq, shapes):
    assert einsum_plan(eq, *shapes) is None
