"""Division by a tensor in fixed mode under ``TensorDivRule.RECIPROCAL_TABLE`` (the J6 plugin's
Div): the divisor's codes go through a segment-LUT reciprocal whose output
(``platform.div_reciprocal_dtype``, int16 on J6) has a scale of its own, calibrated on 1 / y,
and the dividend is multiplied by it under the platform's mul rule (``fixed_common.product``).

Calibration records 1 / y at ``<op>/recip`` (finite values: y = 0 left out) with the op's
observer (MINMAX where the op's output scale is FIXED); the reciprocal table is the default
reciprocal spec (symmetric curvature; its inverse-function range rule spends no entries where
1 / y saturates, as the plugin's input clip |y| >= s_y does; ``_reciprocal_table``).

FAKE mode computes the plugin's QAT Div (``div_fake_op``): x times the fake-quantized QAT
reciprocal of y (``numerics.lut.composite.qat_reciprocal``: |y| clipped below at 1 code of an
int8 divisor, 32 codes of an int16 one) at the same reciprocal scale, the product
fake-quantized at the op's output, wherever FIXED takes the table (elsewhere both divide in
float). The reciprocal's table error is FIXED's alone, as every segment LUT's is in QAT; a
deployed FAKE run (HYBRID) takes FIXED's table for the reciprocal, as it does for LUT ops."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from quantlab.calibration.kinds import ActivationSymmetry, ObserverKind
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.composite import qat_reciprocal
from quantlab.platform_rules import TensorDivRule
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.composite import ResolvedComposite
from quantlab.simulate.qat import qat_fake_quant
from quantlab.simulate.straight_through import range_mask, through

RECIPROCAL_KEY = "recip"
_TABLE_INPUTS = (DType.INT8, DType.INT16)


def observe_reciprocal(sim, call, plan) -> None:
    """Calibration: feed 1 / y of a division by a float tensor y to ``<op>/recip``."""
    if len(plan.acts) != 2:
        return
    y = A.get(call.args, call.kwargs, plan.acts[1])
    if not A.is_float_tensor(y):
        return
    r = torch.reciprocal(y.detach().float())
    r = r[torch.isfinite(r)]
    if r.numel():
        sim._obs.observe(f"{call.name}/{RECIPROCAL_KEY}", r)


def _reciprocal_rq(rq):
    """The resolved qconfig the reciprocal's scale is calibrated under: the op's observer
    (MINMAX where the op's is FIXED), symmetric."""
    observer = rq.observer if rq.observer is not ObserverKind.FIXED else ObserverKind.MINMAX
    return dataclasses.replace(
        rq, observer=observer, activation_symmetry=ActivationSymmetry.SYMMETRIC
    )


def reciprocal_scale(sim, name: str, rq) -> Tensor | None:
    """The calibrated scale of op ``name``'s reciprocal (symmetric, ``div_reciprocal_dtype``),
    or None when calibration never saw its divisor."""
    if sim._obs.get(f"{name}/{RECIPROCAL_KEY}") is None:
        return None
    rdt = sim.platform.div_reciprocal_dtype
    return sim.act_scale(name, RECIPROCAL_KEY, rdt, _reciprocal_rq(rq))


def _table_applies(sim, call, plan, args, kwargs, in_infos, rq) -> Tensor | None:
    """The reciprocal's scale where x / y takes the reciprocal table: an integer output, no
    rounding_mode, a divisor y of int8 / int16 codes without a zero point, a dividend of
    integer codes (a zero point allowed) or a nonzero scalar, a calibrated reciprocal; None
    otherwise (the division runs in float)."""
    if not rq.output_dtype.is_int or kwargs.get("rounding_mode") is not None:
        return None
    if len(plan.acts) != 2 or not isinstance(A.get(args, kwargs, plan.acts[1]), Tensor):
        return None
    y_info = in_infos[1]
    if not fc.int_info(y_info) or y_info.dtype not in _TABLE_INPUTS:
        return None
    x = A.get(args, kwargs, plan.acts[0])
    if not (fc.zp_info(in_infos[0]) if isinstance(x, Tensor) else _nonzero_number(x)):
        return None
    return reciprocal_scale(sim, call.name, rq)


def _nonzero_number(v) -> bool:
    return isinstance(v, (int, float)) and v != 0  # a constant ``fc.operand`` takes


def reciprocal_table_div(sim, call, plan, args, kwargs, in_infos, rq):
    """(value, QInfo) of x / y for an int8 / int16 tensor y without a zero point: x * T(y),
    T the reciprocal table; None where the rule does not apply (``_table_applies``)."""
    sr = _table_applies(sim, call, plan, args, kwargs, in_infos, rq)
    if sr is None:
        return None
    y_info = in_infos[1]
    a = fc.operand(args, kwargs, plan.acts[0], in_infos[0], zero_point=True, native=True)
    table = _reciprocal_table(sim, call.name, y_info, sr)
    r = table.evaluate(fc.codes(args, kwargs, plan.acts[1], y_info))
    rdt = sim.platform.div_reciprocal_dtype
    x_const = not isinstance(A.get(args, kwargs, plan.acts[0]), Tensor)
    x_dtype = fc.operand_dtype(args, kwargs, plan.acts[0], in_infos[0])
    bound = fc.centred_bound(in_infos, 0, a[2], x_const) * max(-rdt.qmin, rdt.qmax)
    xk = ("const", float(A.get(args, kwargs, plan.acts[0]))) if x_const else a[1]
    return fc.product(sim, call, rq, a, (r, sr, 0), (x_dtype, rdt), bound, (xk, sr))


def _reciprocal_table(sim, name: str, y_info, sr: Tensor):
    """The reciprocal table of op ``name``, made once per divisor scale, reciprocal scale and
    calibrated range. Where the inverse-function rule would leave less than one input code (a
    divisor of nearly one value, whose reciprocal's calibrated scale saturates every code),
    ``build_lut`` covers the divisor's range without it."""
    from quantlab.numerics.lut import build_lut

    p = sim.platform
    seen = sim.observed_range(name, "in1")

    def make():
        args = (y_info.dtype, float(y_info.scale), p.div_reciprocal_dtype, float(sr))
        return build_lut("reciprocal", *args, p.lut_spec("reciprocal"), p.lut_format(), seen)

    return sim.op_memo(name, RECIPROCAL_KEY, (y_info.dtype, y_info.scale, sr, seen, p), make)


def div_fake_op(sim, call, plan, in_infos, rq, deployed=False) -> ResolvedComposite | None:
    """FAKE: the plugin's QAT Div of a call FIXED divides by the reciprocal table, resolved
    for this call: fq_out(x * fq_r(qat_reciprocal(y))), fq_r the reciprocal's symmetric
    fake quant (``div_reciprocal_dtype`` at its calibrated scale, the platform's rounding),
    fq_out the op's output point; ``deployed`` (HYBRID, ``FakeOps.DEPLOYED``): the reciprocal
    is FIXED's table on y's codes, times its scale. None for the float path (another rule, or
    ``_table_applies`` fails). With a gradient, straight through the QAT reciprocal's fake
    quant (or the table) and the output's."""
    from quantlab.simulate.modes import Mode

    if sim.platform.tensor_div_rule is not TensorDivRule.RECIPROCAL_TABLE:
        return None
    sr = _table_applies(sim, call, plan, call.args, call.kwargs, in_infos, rq)
    if sr is None:
        return None
    y_info, out = in_infos[1], rq.output_dtype
    rdt, fr = sim.platform.div_reciprocal_dtype, sim.platform.fake_round
    x_slot, y_slot = plan.acts
    lo, hi = rdt.qmin, rdt.qmax
    table = _reciprocal_table(sim, call.name, y_info, sr) if deployed else None

    def compute(args, kwargs):
        y = A.get(args, kwargs, y_slot)
        r = qat_reciprocal(y, y_info.scale, y_info.dtype)
        if table is None:
            r_q = qat_fake_quant(r.detach(), sr, rdt, fr)
        else:  # y is on its grid: its codes are exact
            r_q = fc.emit(table.evaluate(y_info.codes_native(y.detach())), sr, rdt)[0]
        if r.requires_grad:
            r_q = through(r, r_q, range_mask(r, sr, lo, hi, None))
        product = A.get(args, kwargs, x_slot) * r_q
        return sim.quantize_act(call.name, "out", product, out, rq, Mode.FAKE, owned=True)

    so = fc.out_scale(sim, call, rq)  # the output point's cache entry, for ``deps``
    out_key = sim.act_scale_key(call.name, "out", out, rq)
    recip_key = sim.act_scale_key(call.name, RECIPROCAL_KEY, rdt, _reciprocal_rq(rq))
    deps = ((out_key, so), (recip_key, sr))
    return ResolvedComposite(compute, deps=deps)
