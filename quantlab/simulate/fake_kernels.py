"""The FAKE forms of ops whose FIXED kernel is a composite: per op category, the function that
resolves a call's QAT form (``composite.ResolvedComposite``) or gives None for the plain FAKE
path (the float function, then the output fake quant). The dispatch hands this table to
``op_route.make_route``."""

from __future__ import annotations

from quantlab.capture import OpCategory
from quantlab.simulate import fixed_div, fixed_embedding, fixed_lut, fixed_norm

FAKE_KERNELS = {
    OpCategory.DIV: fixed_div.div_fake_op,
    OpCategory.NORM: fixed_norm.norm_fake_op,
    OpCategory.EMBEDDING: fixed_embedding.embedding_fake_op,
    OpCategory.SOFTMAX: fixed_lut.softmax_fake_op,
}
