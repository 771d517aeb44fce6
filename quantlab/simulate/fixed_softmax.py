"""The J6 softmax in fixed and fake mode: the segment-LUT softmax (``lut_softmax``: x - max(x),
exp table, int16 row sum, reciprocal table, product) FIXED computes, the plugin's QAT
SegmentLUTSoftmax FAKE computes at the same intermediate scales (``softmax_fake_op``), and the
row sum's calibrated int16 scale both take (activation point ``<op>/sum``). Kernels return
``(value, QInfo)`` or None, as in ``fixed_ops``; log_softmax, built on it, is
``fixed_log_softmax``, and the deployed form FAKE and HYBRID runs ``fixed_lut.run_deployed``.
"""

from __future__ import annotations

import dataclasses

import torch

from quantlab.numerics.dtypes import DType
from quantlab.numerics.exp_table_softmax import exp_table_softmax
from quantlab.platforms import SoftmaxRule
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.composite import ResolvedComposite


def softmax_dim(args, kwargs) -> int | None:
    """The dim of a softmax call; None for a call without one or with a dtype argument (the
    LUT softmax and its QAT form run on the input's own codes)."""
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if kwargs.get("dtype") is not None or any(isinstance(v, torch.dtype) for v in args):
        return None
    return dim


def inner_point_rq(rq):
    """The resolved qconfig of an activation point inside a softmax (its row sum, log_softmax's
    inner softmax output): the op's (the plugin's modules hand their qconfig on), symmetric,
    MINMAX where the op's observer is FIXED."""
    from quantlab.calibration.kinds import ActivationSymmetry, ObserverKind

    observer = rq.observer if rq.observer is not ObserverKind.FIXED else ObserverKind.MINMAX
    return dataclasses.replace(
        rq, observer=observer, activation_symmetry=ActivationSymmetry.SYMMETRIC
    )


SOFTMAX_SUM_KEY = "sum"  # a J6 softmax's row sum of exp: activation point <op>/sum


def observe_softmax_sum(sim, call, plan) -> None:
    """Calibration: feed the row sums of exp(x - max(x)) of a segment-LUT softmax or
    log_softmax to ``<op>/sum``. The plugin's SegmentLUTSoftmax quantizes that sum with an int16
    qconfig of its own (its ``sum`` FloatFunctional), calibrated like any activation."""
    if sim.platform.softmax_rule is not SoftmaxRule.SEGMENT_LUT:
        return
    if not sim.platform.runs_quantized(call.op_type, call.category):
        return
    x = A.get(call.args, call.kwargs, plan.acts[0]) if plan.acts else None
    dim = softmax_dim(call.args, call.kwargs)
    if A.is_float_tensor(x) and dim is not None:
        xf = x.detach().float()
        rows = torch.exp(xf - xf.amax(dim, keepdim=True)).sum(dim, keepdim=True)
        sim._obs.observe(f"{call.name}/{SOFTMAX_SUM_KEY}", rows)


def softmax_sum_scale(sim, call, rq, n: int) -> tuple[tuple | None, float]:
    """(scale cache key, float scale) of a J6 softmax's int16 row sum: calibrated at
    ``<op>/sum`` with the op's observer, symmetric (``inner_point_rq``); where calibration
    saw no finite sum (a simulator calibrated before this point existed), the scale that cannot
    saturate, n * 2/65535, with no key. Warns where the QAT reciprocal's 32-code clip can bind:
    a scale above 1/32 (every row sums to at least 1)."""
    import warnings

    from quantlab.numerics.lut.composite import RECIPROCAL_CLIP_CODES_INT16, SOFTMAX_EXP_SCALE

    key, scale = None, n * SOFTMAX_EXP_SCALE
    seen = sim._obs.get(f"{call.name}/{SOFTMAX_SUM_KEY}")
    if seen is not None and seen.batches:  # some finite sum (a fully masked row's is NaN)
        srq = inner_point_rq(rq)
        key = sim.act_scale_key(call.name, SOFTMAX_SUM_KEY, DType.INT16, srq)
        scale = float(sim.act_scale(call.name, SOFTMAX_SUM_KEY, DType.INT16, srq))
    if RECIPROCAL_CLIP_CODES_INT16 * scale > 1.0:
        warnings.warn(
            f"softmax {call.name}: its row sum's int16 scale {scale:.3g} leaves a row whose sum "
            f"is below {RECIPROCAL_CLIP_CODES_INT16 * scale:.3g} fewer than 32 codes, which "
            "FAKE clips at 32 codes (the QAT reciprocal) and FIXED resolves on those few codes "
            "(the deployed table), so the modes part there (README, 'Softmax on J6')",
            stacklevel=1,  # one place: shown once per op, whichever mode resolves it first
        )
    return key, scale


def softmax_fake_op(sim, call, plan, in_infos, rq, deployed=False) -> ResolvedComposite | None:
    """FAKE: the vendor's QAT SegmentLUTSoftmax of a call FIXED computes by ``lut_softmax``,
    resolved for this call: fq_out(``numerics.lut.composite.qat_softmax``(x)), its fake
    quants the platform's QAT ones at FIXED's intermediate scales, fq_out the op's output
    point. None (the plain FAKE path, fq_out(softmax(x))) for another softmax rule, a float or
    zero-pointed input or output, a dtype argument, rows longer than ``QAT_SOFTMAX_MAX_ROW``,
    and where HYBRID's deployed softmax (``run_deployed``) did not apply. With a gradient:
    the float softmax's, straight through the output's fake quant (as the deployed
    softmax's)."""
    from quantlab.numerics.lut.composite import QAT_SOFTMAX_MAX_ROW, qat_softmax
    from quantlab.simulate.modes import Mode
    from quantlab.simulate.qat import qat_divide
    from quantlab.simulate.straight_through import through

    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    dim = softmax_dim(call.args, call.kwargs)
    if (
        deployed
        or sim.platform.softmax_rule is not SoftmaxRule.SEGMENT_LUT
        or not fc.zp_info(info)
        or info.zero_point
        or not info.dtype.is_int
        or not out.is_int
        or dim is None
        or A.get(call.args, call.kwargs, plan.acts[0]).shape[dim] > QAT_SOFTMAX_MAX_ROW
    ):
        return None
    so = fc.out_scale(sim, call, rq)  # the output point's cache entry, for ``deps``
    if fc.out_zero_point(sim, call, rq):
        return None
    n = A.get(call.args, call.kwargs, plan.acts[0]).shape[dim]
    sum_key, sum_scale = softmax_sum_scale(sim, call, rq, n)
    x_slot, rounding = plan.acts[0], sim.platform.fake_round
    divide, in_scale = qat_divide(rounding), float(info.scale)

    def compute(args, kwargs):
        x = A.get(args, kwargs, x_slot)
        dim = softmax_dim(args, kwargs)
        grad = torch.is_grad_enabled() and x.requires_grad
        point = None if grad else sim.plain_fake_point(call.name, "out", out, rq)
        if point is not None:  # the output's fake quant as quantize_act applies it, fused
            value = qat_softmax(
                x, dim, in_scale, rounding, divide, sum_scale=sum_scale, out_quant=point[0]
            )
            return value, point[1]
        value = qat_softmax(x, dim, in_scale, rounding, divide, sum_scale=sum_scale)
        if grad:
            value = through(torch.softmax(x, dim), value)
        return sim.quantize_act(call.name, "out", value, out, rq, Mode.FAKE, owned=True)

    out_key = sim.act_scale_key(call.name, "out", out, rq)
    deps = ((out_key, so),) + (() if sum_key is None else ((sum_key, sum_scale),))
    return ResolvedComposite(compute, deps=deps)


def softmax_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    from quantlab.numerics.lut import lut_softmax

    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    table_rule = sim.platform.softmax_rule is SoftmaxRule.FLOAT_EXP_TABLE
    if not fc.zp_info(info) or not out.is_int:
        return None
    dim = softmax_dim(args, kwargs)
    if dim is None:
        return None
    xc = fc.codes(args, kwargs, plan.acts[0], info).to(info.dtype.torch_dtype)
    so = fc.out_scale(sim, call, rq)
    zo = fc.out_zero_point(sim, call, rq)
    if table_rule:  # the input's zero point cancels (only max(x) - x enters)
        if info.dtype.bits != 8 or out.bits != 8:
            return None  # the runtime fuses 8-bit softmax only; float between DQ and Q
        codes = exp_table_softmax(xc, float(info.scale), dim, float(so), out, zo)
        return fc.emit(codes, so, out, zo)
    zx = info.zero_point
    _, sum_scale = softmax_sum_scale(sim, call, rq, xc.shape[dim])
    fmt = sim.platform.lut_format()
    if not (zx or zo or DType.UINT8 in (info.dtype, out)):
        codes = lut_softmax(
            xc, float(info.scale), info.dtype, dim, float(so), out, fmt, sum_scale=sum_scale
        )
        return fc.emit(codes, so, out)
    if (zx and info.dtype.bits > 8) or (zo and out.bits > 8):
        fc.warn_float(call, "the LUT softmax takes 16-bit codes without a zero point only")
        return None
    # 8-bit codes with zero points: the input's cancels in x - max(x) (codes taken as int16);
    # the output codes are formed in int16 (nothing saturates before zo is added)
    x16 = xc.to(torch.int16)
    codes = lut_softmax(
        x16, float(info.scale), DType.INT16, dim, float(so), DType.INT16, fmt, sum_scale=sum_scale
    )
    codes = (codes.to(torch.int64) + zo).clamp(out.qmin, out.qmax)
    return fc.emit(codes, so, out, zo)
