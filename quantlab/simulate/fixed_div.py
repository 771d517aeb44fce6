"""Division by a tensor in fixed mode under ``TensorDivRule.RECIPROCAL_TABLE`` (the J6 plugin's
Div): the divisor's codes go through a segment-LUT reciprocal whose output
(``platform.div_reciprocal_dtype``, int16 on J6) has a scale of its own, calibrated on 1 / y,
and the dividend is multiplied by it under the platform's mul rule (``fixed_common.product``).

Calibration records 1 / y at ``<op>/recip`` (finite values: y = 0 left out) with the op's
observer (MINMAX where the op's output scale is FIXED); the reciprocal table is the default
reciprocal spec (symmetric curvature; its inverse-function range rule spends no entries where
1 / y saturates, as the plugin's input clip |y| >= s_y does; ``_reciprocal_table``)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from quantlab.calibration.kinds import ActivationSymmetry, ObserverKind
from quantlab.numerics.dtypes import DType
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc

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


def reciprocal_scale(sim, name: str, rq) -> Tensor | None:
    """The calibrated scale of op ``name``'s reciprocal (symmetric, ``div_reciprocal_dtype``),
    or None when calibration never saw its divisor."""
    if sim._obs.get(f"{name}/{RECIPROCAL_KEY}") is None:
        return None
    observer = rq.observer if rq.observer is not ObserverKind.FIXED else ObserverKind.MINMAX
    rq = dataclasses.replace(
        rq, observer=observer, activation_symmetry=ActivationSymmetry.SYMMETRIC
    )
    return sim.act_scale(name, RECIPROCAL_KEY, sim.platform.div_reciprocal_dtype, rq)


def reciprocal_table_div(sim, call, plan, args, kwargs, in_infos, rq):
    """(value, QInfo) of x / y for an int8 / int16 tensor y without a zero point: x * T(y),
    T the reciprocal table; None where the rule does not apply (a float output, a divisor
    with a zero point, rounding_mode, no calibrated reciprocal scale)."""
    out = rq.output_dtype
    if not out.is_int or kwargs.get("rounding_mode") is not None or len(plan.acts) != 2:
        return None
    y_info = in_infos[1]
    if not fc.int_info(y_info) or y_info.dtype not in _TABLE_INPUTS:
        return None
    a = fc.operand(args, kwargs, plan.acts[0], in_infos[0], zero_point=True, native=True)
    sr = reciprocal_scale(sim, call.name, rq)
    if a is None or sr is None:
        return None
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
