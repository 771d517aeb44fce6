"""log_softmax as the J6 plugin composes its LogSoftmax: its softmax, then its log table
(hard_log). FIXED: the segment-LUT softmax (``lut_softmax``) to codes of the op's output dtype
at a scale calibrated on softmax(x) (activation point ``<op>/softmax``), then the log table;
FAKE: the QAT softmax, fake-quantized there, then hard_log (``fixed_lut.qat_log``). Kernels
return ``(value, QInfo)`` or None, as in ``fixed_ops``; a profile that lists log_softmax in
``float_fallback_ops`` never reaches them."""

from __future__ import annotations

import torch

from quantlab.numerics.dtypes import DType
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.composite import ResolvedComposite
from quantlab.simulate.fixed_lut import qat_log, with_op_strategy
from quantlab.simulate.fixed_softmax import inner_point_rq, softmax_dim, softmax_sum_scale

LOG_SOFTMAX_KEY = "softmax"  # log_softmax's inner softmax output: activation point <op>/softmax


def observe_log_softmax(sim, call, plan) -> None:
    """Calibration: feed softmax(x) of a log_softmax call to ``<op>/softmax`` (the plugin's
    LogSoftmax calibrates its inner softmax's output)."""
    if not sim.platform.runs_quantized(call.op_type, call.category):
        return
    x = A.get(call.args, call.kwargs, plan.acts[0]) if plan.acts else None
    dim = softmax_dim(call.args, call.kwargs)
    if A.is_float_tensor(x) and dim is not None:
        sim._obs.observe(f"{call.name}/{LOG_SOFTMAX_KEY}", torch.softmax(x.detach().float(), dim))


def _log_softmax_parts(sim, call, plan, in_infos, rq):
    """(dim, input info, inner softmax scale, output scale) of a log_softmax (dispatched only
    where the platform runs it quantized, ``PlatformConfig.runs_quantized``) on int8/int16
    codes without zero points, at an int8/int16 output without one; None otherwise (float)."""
    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    dim = softmax_dim(call.args, call.kwargs)
    if (
        not fc.int_info(info)
        or info.dtype not in (DType.INT8, DType.INT16)
        or out not in (DType.INT8, DType.INT16)
        or dim is None
        or sim._obs.get(f"{call.name}/{LOG_SOFTMAX_KEY}") is None
    ):
        return None
    so = fc.out_scale(sim, call, rq)
    if fc.out_zero_point(sim, call, rq):
        return None
    sm = sim.act_scale(call.name, LOG_SOFTMAX_KEY, out, inner_point_rq(rq))
    return dim, info, sm, so


def _log_table(sim, call, rq, sm, so):
    """log_softmax's log table: the platform's log spec (hard_log, the op's ``lut_strategy``
    if set) from the inner softmax's codes (the op's output dtype, scale ``sm``) to the op's
    output (scale ``so``), its range from the inner softmax's calibrated one."""
    from quantlab.numerics.lut import build_lut

    spec = with_op_strategy(sim.platform.lut_spec("log"), rq)
    out = rq.output_dtype
    observed = sim.observed_range(call.name, LOG_SOFTMAX_KEY)
    fmt = sim.platform.lut_format()
    return build_lut("log", out, float(sm), out, float(so), spec, fmt, observed)


def log_softmax_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    """FIXED log_softmax as the J6 plugin's LogSoftmax: the segment-LUT softmax
    (``lut_softmax``) to codes of the op's output dtype at the inner softmax's calibrated
    scale, then the log table (hard_log) on those codes to the op's output."""
    from quantlab.numerics.lut import lut_softmax

    parts = _log_softmax_parts(sim, call, plan, in_infos, rq)
    if parts is None:
        return None
    _, info, sm, so = parts
    out = rq.output_dtype
    xc = fc.codes(args, kwargs, plan.acts[0], info).to(info.dtype.torch_dtype)
    fmt, dim = sim.platform.lut_format(), softmax_dim(args, kwargs)
    _, sum_scale = softmax_sum_scale(sim, call, rq, xc.shape[dim])
    mid = lut_softmax(
        xc, float(info.scale), info.dtype, dim, float(sm), out, fmt, sum_scale=sum_scale
    )
    return fc.emit(_log_table(sim, call, rq, sm, so).evaluate(mid), so, out)


def log_softmax_fake_op(sim, call, plan, in_infos, rq, deployed=False) -> ResolvedComposite | None:
    """FAKE: the J6 plugin's QAT LogSoftmax, resolved for this call: fq_out(hard_log(fq_s(
    ``qat_softmax``(x)))), fq_s the inner softmax's fake quant (the op's output dtype at its
    calibrated scale, the platform's rounding), hard_log ``qat_log`` at the log spec's floor,
    fq_out the op's output point. None for HYBRID (its deployed form is FIXED's,
    ``run_deployed``) and where ``log_softmax_op`` does not apply or rows are longer than
    ``QAT_SOFTMAX_MAX_ROW``. With a gradient: the float log_softmax's, straight through."""
    from quantlab.numerics.lut.composite import QAT_SOFTMAX_MAX_ROW, qat_softmax
    from quantlab.simulate.modes import Mode
    from quantlab.simulate.qat import qat_divide, qat_fake_quant
    from quantlab.simulate.straight_through import through

    parts = None if deployed else _log_softmax_parts(sim, call, plan, in_infos, rq)
    if parts is None:
        return None
    dim, info, sm, so = parts
    if A.get(call.args, call.kwargs, plan.acts[0]).shape[dim] > QAT_SOFTMAX_MAX_ROW:
        return None
    out, x_slot, rounding = rq.output_dtype, plan.acts[0], sim.platform.fake_round
    divide, in_scale = qat_divide(rounding), float(info.scale)
    floor = sim.platform.lut_spec("log").log_floor
    n = A.get(call.args, call.kwargs, x_slot).shape[dim]
    sum_key, sum_scale = softmax_sum_scale(sim, call, rq, n)

    def compute(args, kwargs):
        x = A.get(args, kwargs, x_slot)
        dim = softmax_dim(args, kwargs)
        qs = qat_softmax(x.detach(), dim, in_scale, rounding, divide, sum_scale=sum_scale)
        p = qat_fake_quant(qs, sm, out, rounding)
        value = qat_log(p, floor)
        if torch.is_grad_enabled() and x.requires_grad:
            value = through(torch.log_softmax(x, dim), value)
        return sim.quantize_act(call.name, "out", value, out, rq, Mode.FAKE, owned=True)

    out_key = sim.act_scale_key(call.name, "out", out, rq)
    inner_key = sim.act_scale_key(call.name, LOG_SOFTMAX_KEY, out, inner_point_rq(rq))
    deps = ((out_key, so), (inner_key, sm))
    return ResolvedComposite(
        compute, deps=deps + (() if sum_key is None else ((sum_key, sum_scale),))
    )
