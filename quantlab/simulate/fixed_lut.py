"""Fixed-point kernels of the segment-LUT ops (sigmoid, tanh, exp, ..., sin/cos with period
reduction): the table each op's codes go through, built from the platform's LUT format and the
op's spec, and the deployed form FAKE and HYBRID runs use for these ops and for softmax and
log_softmax (``run_deployed``); the QAT forms of sqrt, reciprocal, log, tan, atanh, asin and
acos (``lut_fake_op``). Kernels return ``(value, QInfo)`` or None, as in ``fixed_ops``;
softmax is ``fixed_softmax``, and log_softmax, built on softmax and the log table,
``fixed_log_softmax``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.op_kinds import OpCategory, pow_exponent
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.composite import ResolvedComposite
from quantlab.simulate.fixed_softmax import softmax_op

LUT_FUNCS = frozenset(
    "sigmoid tanh exp log sqrt rsqrt reciprocal sin cos erf gelu silu hardsigmoid hardswish "
    "leaky_relu prelu inverse_sigmoid pow elu softplus tan atan sinh cosh atanh asinh asin acos "
    "acosh mish log_sigmoid softsign selu tanhshrink expm1 exp2 erfc log2 log10 log1p celu "
    "logit".split()
)


def _table_func(op_type: str) -> str:
    """The LUT function an op's table holds: prelu's is leaky_relu at each channel's slope,
    logit's inverse_sigmoid at the call's eps."""
    return {"prelu": "leaky_relu", "logit": "inverse_sigmoid"}.get(op_type, op_type)


@dataclass(frozen=True)
class ChannelTables:
    """One table per channel along axis 1 (prelu's per-channel slopes), each evaluated on its
    channel's codes."""

    tables: tuple

    def evaluate(self, xc: Tensor) -> Tensor:
        return torch.stack([t.evaluate(x) for t, x in zip(self.tables, xc.unbind(1))], 1)

    def slope(self, xc: Tensor) -> Tensor:
        return torch.stack([_lut_slope(t, x) for t, x in zip(self.tables, xc.unbind(1))], 1)


def _prelu_slopes(call, x: Tensor) -> list[float] | None:
    """prelu's slopes, one per channel (a list of one for a single slope or an input without a
    channel axis); None for a weight that is not a float tensor of 1 or C values."""
    w = call.kwargs.get("weight", call.args[1] if len(call.args) > 1 else None)
    if not (isinstance(w, Tensor) and w.is_floating_point() and w.dim() <= 1):
        return None
    if w.numel() == 1:
        return [float(w.reshape(()))]
    if x.dim() < 2 or w.numel() != x.shape[1]:
        return None
    return w.detach().to(torch.float64).tolist()


def _arg(call, index: int, name: str, default):
    """The call's argument at ``index`` or keyword ``name``, else ``default``."""
    if name in call.kwargs:
        return call.kwargs[name]
    return call.args[index] if len(call.args) > index else default


def _lut_spec(call, rq, platform):
    func = _table_func(call.op_type)
    spec = platform.lut_spec(func)
    if func == "inverse_sigmoid":  # logit's too
        eps = _arg(call, 1, "eps", None)
        if eps is not None:
            spec = dataclasses.replace(spec, eps=float(eps))
    if call.op_type == "pow":  # a scalar exponent other than 2 (op_kinds.pow_exponent)
        spec = dataclasses.replace(spec, exponent=pow_exponent(call.args, call.kwargs))
    if call.op_type == "leaky_relu":
        slope = _arg(call, 1, "negative_slope", None)
        if slope is not None:
            spec = dataclasses.replace(spec, negative_slope=float(slope))
    if call.op_type in ("elu", "celu"):
        spec = dataclasses.replace(spec, alpha=float(_arg(call, 1, "alpha", 1.0)))
    if call.op_type == "softplus":
        beta, threshold = _arg(call, 1, "beta", 1.0), _arg(call, 2, "threshold", 20.0)
        spec = dataclasses.replace(spec, beta=float(beta), threshold=float(threshold))
    if call.op_type == "gelu":
        spec = dataclasses.replace(spec, approximate=call.kwargs.get("approximate", "none"))
    return with_op_strategy(spec, rq)


def with_op_strategy(spec, rq):
    """``spec`` with the op's ``lut_strategy`` (its qconfig's), where one is set and is not
    MANUAL."""
    from quantlab.numerics.lut import Strategy

    if rq.lut_strategy is not None:
        st = rq.lut_strategy
        if not isinstance(st, Strategy):
            st = Strategy[str(st)]
        if st is not Strategy.MANUAL:
            spec = dataclasses.replace(spec, strategy=st, dividing_points=None)
    return spec


def _calibrated_histogram(sim, call, spec, reduced: bool):
    """The op's calibrated input histogram (``Simulator.histogram``) as the DATA strategy's
    ``InputHistogram``; None for every other strategy."""
    from quantlab.numerics.lut import InputHistogram, Strategy

    if spec.strategy is not Strategy.DATA:
        return None
    if reduced:
        raise ValueError(
            f"op {call.name} ({call.op_type}): lut_strategy=DATA weighs the calibrated input "
            "histogram, but this input is period-reduced first (platform.sincos_period_reduction)"
            "; choose OPTIMAL or another strategy for it"
        )
    edges, counts = sim.histogram(call.name, 0)
    return InputHistogram(float(edges[0]), float(edges[-1]), tuple(counts.tolist()))


def _period_reduced(sim, call, rq, xc: Tensor, xs: float, in_dt) -> tuple | None:
    """(codes, scale) of a sin/cos input reduced to one period, or None when it is not: the
    platform's exporter (``sincos_period_reduction``) or the op's ``single_period`` reduce an
    input wider than one period (numerics.periodic)."""
    from quantlab.numerics.periodic import needs_period_reduction, period_reduce

    if call.op_type not in ("sin", "cos"):
        return None
    if not (sim.platform.sincos_period_reduction or rq.single_period):
        return None
    if not needs_period_reduction(xs, in_dt):
        return None
    return period_reduce(xc, xs, in_dt, sim.platform.fake_round)


def _lut_table(sim, call, plan, args, kwargs, in_infos, rq):
    """(table, input codes, input scale, output scale, output zero point) of a LUT op in fixed
    mode (the input period-reduced when it applies), or None when the integer table does not
    apply. Codes with a zero point (or uint8), and every table of a profile whose runtime
    computes each code in float32 (``TableValues.RUNTIME_FLOAT32``), take a ``ZeroPointLut``
    (numerics.lut.zero_point); other symmetric int8 / int16 codes the ``SegmentLut``."""
    from quantlab.numerics.lut import TableValues

    p = sim.platform
    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    if call.op_type not in LUT_FUNCS or not fc.zp_info(info) or not out.is_int:
        return None
    approximate = kwargs.get("approximate", "none") if call.op_type == "gelu" else "none"
    if approximate != "none" and p.lut_table_values is TableValues.RUNTIME_FLOAT32:
        return None  # the runtime's kernel of this form is not emulated: float, quantized
    xc = fc.codes(args, kwargs, plan.acts[0], info)
    xs, in_dt, zx = float(info.scale), info.dtype, info.zero_point
    observed = sim.observed_range(call.name, "in0")
    reduced = _period_reduced(sim, call, rq, xc, xs, in_dt)
    if reduced is not None:
        if zx:
            fc.warn_float(call, "the sin/cos period reduction takes codes without a zero point")
            return None
        xc, xs = reduced
        observed = (0.0, 2 * math.pi)  # the reduced input covers one period (j6-numerics s.5)
    so = fc.out_scale(sim, call, rq)
    zo = fc.out_zero_point(sim, call, rq)
    spec = _lut_spec(call, rq, p)
    hist = _calibrated_histogram(sim, call, spec, reduced=reduced is not None)
    fmt = p.lut_format()
    slopes = None
    if call.op_type == "prelu":
        slopes = _prelu_slopes(call, xc)
        if slopes is None:
            return None
    zero_point_table = zx or zo or DType.UINT8 in (in_dt, out)
    if zero_point_table or fmt.values is TableValues.RUNTIME_FLOAT32:
        if (zx and in_dt.bits > 8) or (zo and out.bits > 8):
            fc.warn_float(call, "a LUT takes 16-bit codes without a zero point only")
            return None
        zero_point_table = True
    else:
        xc, zo = xc.to(in_dt.torch_dtype), 0
    key = _TableKey(in_dt, xs, zx, out, float(so), zo, spec, fmt, observed, hist)
    if slopes is None:
        table = _build(_table_func(call.op_type), zero_point_table, key)
    elif len(slopes) == 1:
        table = _build("leaky_relu", zero_point_table, _with_slope(key, slopes[0]))
    else:
        table = _channel_tables(zero_point_table, key, tuple(slopes))
    return table, xc, xs, so, zo


class _TableKey(NamedTuple):
    """What a LUT op's table is built from (``_lut_table``); hashable, so tables cache on it."""

    in_dt: DType
    xs: float
    zx: int
    out: DType
    so: float
    zo: int
    spec: Any  # LutSpec
    fmt: Any  # LutFormat
    observed: Any
    hist: Any


def _build(func: str, zero_point_table: bool, key: _TableKey):
    """``func``'s table for ``key``: a ZeroPointLut or a SegmentLut."""
    from quantlab.numerics.lut import build_lut
    from quantlab.numerics.lut.zero_point import build_zero_point_lut

    k = key
    if zero_point_table:
        return build_zero_point_lut(
            func, k.in_dt, k.xs, k.zx, k.out, k.so, k.zo, k.spec, k.fmt, k.observed, k.hist
        )
    return build_lut(func, k.in_dt, k.xs, k.out, k.so, k.spec, k.fmt, k.observed, k.hist)


def _with_slope(key: _TableKey, slope: float) -> _TableKey:
    return key._replace(spec=dataclasses.replace(key.spec, negative_slope=slope))


@lru_cache(maxsize=64)
def _channel_tables(zero_point_table: bool, key: _TableKey, slopes: tuple) -> ChannelTables:
    """prelu's tables, one leaky_relu table per channel's slope, built once per key."""
    return ChannelTables(
        tuple(_build("leaky_relu", zero_point_table, _with_slope(key, s)) for s in slopes)
    )


def _lut_slope(table, xc: Tensor) -> Tensor:
    """d(output code)/d(input code) of a built table at the input codes (float64)."""
    from quantlab.numerics.lut.slope import segment_slope
    from quantlab.numerics.lut.zero_point import ZeroPointLut

    if isinstance(table, (ZeroPointLut, ChannelTables)):
        return table.slope(xc)
    return segment_slope(table, xc)


def lut_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    t = _lut_table(sim, call, plan, args, kwargs, in_infos, rq)
    if t is None:
        return None
    lut, xc, _, so, zo = t
    return fc.emit(lut.evaluate(xc), so, rq.output_dtype, zo)


DEPLOYED_CATEGORIES = frozenset({OpCategory.LUT, OpCategory.SOFTMAX, OpCategory.LOG_SOFTMAX})
"""Ops that FakeOps.DEPLOYED and Mode.HYBRID compute as deployed: segment-LUT ops."""


def run_deployed(sim, call, plan, args, kwargs, in_infos, rq) -> Any:
    """(value, QInfo) of a segment-LUT op as FIXED computes it from the (fake-quantized) input,
    or None where the integer table does not apply. When a gradient is recorded: a LUT op's
    gradient is its table's own slope (``numerics.lut.segment_slope``), d out / d in in real
    units; softmax's (log_softmax's) is the float softmax's (log_softmax's)."""
    from quantlab.simulate import calls
    from quantlab.simulate.straight_through import through

    x = A.get(args, kwargs, plan.acts[0]) if plan.acts else None
    grad = torch.is_grad_enabled() and isinstance(x, Tensor) and x.requires_grad
    if call.category in (OpCategory.SOFTMAX, OpCategory.LOG_SOFTMAX):
        from quantlab.simulate.fixed_log_softmax import log_softmax_op  # it imports this module

        op = softmax_op if call.category is OpCategory.SOFTMAX else log_softmax_op
        res = op(sim, call, plan, args, kwargs, in_infos, None, rq)
        if res is None or not grad:
            return res
        return through(calls.out_of_place(call)(*args, **kwargs), res[0]), res[1]
    t = _lut_table(sim, call, plan, args, kwargs, in_infos, rq)
    if t is None:
        return None
    lut, xc, xs, so, zo = t
    value, info = fc.emit(lut.evaluate(xc), so, rq.output_dtype, zo)
    if not grad:
        return value, info
    slope = _lut_slope(lut, xc) * (float(so) / xs)
    return through(x, value, slope.to(torch.float32)), info


# ops whose QAT form clips (lut_fake_op)
QAT_CLIPPED = frozenset(("sqrt", "reciprocal", "log", "tan", "atanh", "asin", "acos"))


def qat_domain_clip(op_type: str, x: Tensor, scale: float, dtype: DType) -> Tensor:
    """x clipped as the vendor's QAT tan, atanh, asin and acos clip their input before the
    function, in float32 as the plugin computes the bounds from the input scale ``s``: tan to
    [-pi + e, pi - e] and atanh to [-1 + e, 1 - e], e = 1 code (int8) or 32 codes (int16)
    of s; asin and acos to +-floor(1 / s) * s. The clip passes no gradient."""
    from quantlab.numerics.lut.composite import reciprocal_clip_codes

    s = torch.tensor(scale, dtype=torch.float32)
    if op_type in ("asin", "acos"):
        bound = torch.floor(1.0 / s) * s
        return torch.clamp(x, -bound, bound)
    e = s * reciprocal_clip_codes(dtype)  # times 2**k: exact
    edge = torch.tensor(math.pi if op_type == "tan" else 1.0, dtype=torch.float32)
    return torch.clamp(x, -edge + e, edge - e)


def qat_log(x: Tensor, floor: float) -> Tensor:
    """The vendor's QAT log (hard_log): max(log(x), floor), NaN for x < 0; its gradient 1 / x
    where log(x) > floor, else 0 (finite at x = 0)."""
    from quantlab.simulate.straight_through import through

    value = torch.log(x).clamp_min(floor)
    if not (torch.is_grad_enabled() and x.requires_grad):
        return value
    kept = value > floor
    return through(torch.log(torch.where(kept, x, torch.ones_like(x))), value)


# the QAT input clips calibration observes (``qat_observed``)
OBSERVED_DOMAIN_CLIPS = frozenset(("atanh", "asin", "acos"))


def qat_observed(platform, call, out: Tensor, in_dtype: DType | None = None) -> Tensor:
    """What calibration observes at ``call``'s output: its float output, or where the
    platform's QAT clips it, the clipped output: log's hard_log (``qat_lut_clips``) and the
    hard_log that ends a composed log_softmax (``fixed_log_softmax``); asin and acos of the
    input clipped to [-1, 1] and atanh of it clipped at +-(1 - e), the QAT clips
    (``qat_domain_clip``) at the input scale 1 / qmax of ``in_dtype``, a [-1, 1] input's
    (an assumption: the clip depends on the input scale, which the same calibration decides;
    asin's and acos's bound floor(1 / s) * s is within one code of 1 at any scale). An
    in-place call's input is its output: observed as it is."""
    lut = platform.qat_lut_clips and call.category is OpCategory.LUT
    if (lut and call.op_type == "log") or (
        call.category is OpCategory.LOG_SOFTMAX
        and platform.runs_quantized(call.op_type, call.category)
    ):
        return out.clamp_min(platform.lut_spec("log").log_floor)
    x = call.args[0] if call.args else None
    if not (lut and call.op_type in OBSERVED_DOMAIN_CLIPS and in_dtype and in_dtype.is_int):
        return out
    if not isinstance(x, Tensor) or x is out or x.shape != out.shape:
        return out
    if call.op_type == "atanh":
        x = qat_domain_clip("atanh", x, 1.0 / in_dtype.qmax, in_dtype)
    return getattr(torch, call.op_type)(x.clamp(-1.0, 1.0)).to(out.dtype)


def lut_fake_op(sim, call, plan, in_infos, rq, deployed=False) -> ResolvedComposite | None:
    """FAKE: sqrt, reciprocal, log, tan, atanh, asin and acos as the vendor's QAT modules
    compute them (``platform.qat_lut_clips``): fq_out(sqrt(max(x, s_x))); fq_out of
    ``numerics.lut.composite.qat_reciprocal`` (|x| >= 1 code (int8) or 32 codes (int16) of x,
    the sign kept); fq_out(``qat_log``(x)) (log floored at the log spec's ``log_floor``, -10);
    fq_out(f(``qat_domain_clip``(x))) for the other four, x the input as the dispatch
    fake-quantized it, fq_out the op's output point. None (the plain FAKE path, fq_out(f(x)))
    for HYBRID (the deployed table) and a float input or output; the route hands it these ops
    where the platform clips them (``fake_kernels.fake_kernel``). With a gradient: the clipped
    function's (0 where it clips, as in QAT), straight through the output's fake quant."""
    from quantlab.numerics.lut.composite import qat_reciprocal
    from quantlab.simulate.modes import Mode

    info = in_infos[0] if in_infos else None
    out = rq.output_dtype
    if deployed or not fc.zp_info(info) or not out.is_int:
        return None
    so = fc.out_scale(sim, call, rq)  # the output point's cache entry, for ``deps``
    x_slot, s, dtype = plan.acts[0], float(info.scale), info.dtype
    if call.op_type == "sqrt":

        def clipped(x: Tensor) -> Tensor:
            return torch.sqrt(x.clamp_min(s))

    elif call.op_type == "reciprocal":

        def clipped(x: Tensor) -> Tensor:
            return qat_reciprocal(x, s, dtype)

    elif call.op_type == "log":
        floor = sim.platform.lut_spec("log").log_floor

        def clipped(x: Tensor) -> Tensor:
            return qat_log(x, floor)

    else:  # tan, atanh, asin, acos: the function of the clipped input
        fn = getattr(torch, call.op_type)

        def clipped(x: Tensor) -> Tensor:
            return fn(qat_domain_clip(call.op_type, x, s, dtype))

    def compute(args, kwargs):
        value = clipped(A.get(args, kwargs, x_slot))
        return sim.quantize_act(call.name, "out", value, out, rq, Mode.FAKE, owned=True)

    out_key = sim.act_scale_key(call.name, "out", out, rq)
    return ResolvedComposite(compute, deps=((out_key, so),))
