"""The FAKE forms of ops whose QAT form is not the float function then the output fake quant
(ops whose FIXED kernel is a composite, and the segment-LUT ops whose QAT modules clip their
input or output, ``fixed_lut.QAT_CLIPPED``): ``fake_kernel(call, platform)`` gives the
function that resolves a call's QAT form (``composite.ResolvedComposite``, or None for the
plain FAKE path: the float function, then the output fake quant), or None where the op has no
such form. The dispatch hands it to ``op_route.make_route``."""

from __future__ import annotations

from collections.abc import Callable

from quantlab.op_kinds import OpCategory
from quantlab.simulate import (
    fixed_div,
    fixed_embedding,
    fixed_log_softmax,
    fixed_lut,
    fixed_norm,
    fixed_softmax,
)

FAKE_KERNELS = {
    OpCategory.DIV: fixed_div.div_fake_op,
    OpCategory.NORM: fixed_norm.norm_fake_op,
    OpCategory.EMBEDDING: fixed_embedding.embedding_fake_op,
    OpCategory.SOFTMAX: fixed_softmax.softmax_fake_op,
    OpCategory.LOG_SOFTMAX: fixed_log_softmax.log_softmax_fake_op,
}


def fake_kernel(call, platform) -> Callable | None:
    """The QAT form's resolver of ``call`` on ``platform`` (``FAKE_KERNELS`` by its category;
    for a segment-LUT op, ``fixed_lut.lut_fake_op`` where the platform's QAT clips it), or
    None."""
    if call.category is OpCategory.LUT:
        clipped = platform.qat_lut_clips and call.op_type in fixed_lut.QAT_CLIPPED
        return fixed_lut.lut_fake_op if clipped else None
    return FAKE_KERNELS.get(call.category)
