"""Prepared calls of a steady FAKE run: an op's quantized run replayed from what it resolved.

After an op ran quantized in a FAKE run that records nothing beyond the op table (no per-op
overrides, replay, trace, observer, calibration or gradients), everything its next run would
look up again is kept in a ``PreparedCall``: its argument plan and route, the quantization its
activation inputs arrived with, its fake-quantized weight and bias (with the tensors and
versions they came from), its fused clamp and output fake-quant function (for a pass-through
op such as a view or transpose: its function only, the output keeping the quantization its
input came with). The next such call
checks that each of these still holds (identity of the tensors, scales, qconfig, platform and
cache entries; weight and bias versions) and, if so, computes the op with them: the same
functions on the same values as the full path, so the same bits. An add or multiply whose
output fake quant is the per-tensor HALF_EVEN one by the reciprocal computes the op and that
fake quant in one pass where its operands allow (``fake_quant_native.binary``: the bits of the
op followed by the fake quant). A failed check sends the call through the full path
(``OpDispatch._run_quantized_value``), which prepares it anew.

A composite whose FAKE form is not one function and one fake quant (normalisation, embedding)
keeps that form resolved (``composite.ResolvedComposite``: scales, contract and fake-quantized
parameters found once) and checks, besides the above, the scale-cache entries it was resolved
from and its other arguments (tensors by identity and version, plain values by equality).

A steady FIXED run keeps the same form for a layout op (a view, transpose, reshape, ...: a
pass-through op whose output codes are its function of the input's codes,
``same_grid.layout_codes``, as the full path moves them) and for a GEMM with a weight (a
convolution or linear with integer output codes) or a matmul of two activations: its
``fixed_gemm.GemmRun`` (``fixed``), every decision of the kernel that does not read the
operands' values, made once; the prepared call checks what the run was planned from besides the
above (the inputs' shapes, scale objects and zero points, the output's scale-cache entries, the
weight and bias versions, the other arguments) and computes the op by the same run, so the same
bits. Any other op that its fixed kernel computed on inputs used as they came (an add, multiply,
LUT, softmax, norm, reduction: ``steady_prepare.prepare_fixed_op``) keeps that kernel as a
composite: called again on the call's arguments and its inputs' QInfos, as the full path calls
it once the route and each input's dtype hold, it looks its scales and constants up itself.

This module holds the prepared form, its checks and its computation; ``steady_prepare`` makes
a prepared call from a call that just ran through the full path.

An activation input that came as a float tensor on the grid of the op's own input point (a
float op that keeps values made it: zero padding, eval-mode dropout; ``same_grid``) was used
as it came, since fake-quantizing it there changes no bit. The prepared call keeps that
point's QInfo (``OnGrid``) and its scale-cache entry, and takes the input as it comes only
while the entry is current and the input is on that grid again. One that came as a float tensor
with no quantization of its own (made by an op the simulator does not model: an integer mask
cast to float) was fake-quantized at that point: the prepared call keeps the point's function
and QInfo (``QuantizeHere``) on the same entry and applies the function to each such input
that again has no QInfo (on that point's grid, where the full path takes it as it comes, the
function changes no bit).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from quantlab.capture import OpCall
from quantlab.numerics.rounding import Round
from quantlab.simulate import args as A
from quantlab.simulate import same_grid
from quantlab.simulate.op_route import OpRoute
from quantlab.simulate.qtensor import QInfo


@dataclass(frozen=True, slots=True, eq=False)
class OnGrid:
    """An activation input that came as a float tensor on the grid of the op's input point
    ``info`` (``same_grid.codes_on_grid`` with ``rounding``) and was used unchanged."""

    info: QInfo
    rounding: Round


@dataclass(frozen=True, slots=True, eq=False)
class QuantizeHere:
    """An activation input that came as a float tensor with no QInfo and was quantized at the
    op's input point ``info`` (``QuantizationState.quantize_act``): in FAKE runs by that
    point's function ``fq``, which the prepared call applies too; ``fq`` None for a FIXED op,
    whose prepared kernel calls ``quantize_act`` itself."""

    info: QInfo
    fq: Callable | None


@dataclass(slots=True, eq=False)
class PreparedCall:
    """What one op's quantized FAKE run resolved (see the module docstring)."""

    route: OpRoute
    fake_ops: Any
    # how each activation input arrived: its dtype, an OnGrid, a QuantizeHere, or None (not a
    # float tensor)
    in_dtypes: tuple
    weight: Tensor | None
    weight_version: int
    weight_value: Tensor | None
    bias: Tensor | None
    bias_version: int
    x_scale: Tensor | None  # the first input's scale the bias value was made with
    bias_value: Tensor | None
    bounds: tuple | None  # the fused clamp applied by the output fake quant
    point_key: tuple  # the output fake-quant entry's key in the scale cache
    point: tuple  # that entry (scale-cache entries are replaced when scales change)
    fq: Callable | None  # the output fake quant (None for a pass-through op)
    out_info: Any  # the output's QInfo (None for a pass-through op: its input's quantization)
    owned: bool  # a GEMM: its result is always fresh (other results: args.fresh_result)
    passes: bool = False  # a pass-through op: the output keeps the first input's quantization
    # a composite (composite.ResolvedComposite): its compute replaces function and fake quant
    kernel: Callable | None = None
    deps: tuple = ()  # (scale-cache key, entry) pairs the composite was resolved from
    statics: tuple = ()  # its other arguments as (slot, value, tensor version or None)
    fixed: Any = None  # a FIXED GEMM's fixed_gemm.GemmRun: it computes the op
    layout: bool = False  # a FIXED layout op: its output codes move as its values do
    # an add or multiply: (x, other) -> its value fake-quantized by ``fq`` in one pass, or
    # None where that pass does not take the operands (``fake_quant_plan.fused_binary_fn``)
    binary: Callable | None = None
    # whether ``compute`` replaces an argument (an input quantized here, weight or bias)
    replaces: bool = field(init=False)

    def __post_init__(self) -> None:
        here = any(type(want) is QuantizeHere for want in self.in_dtypes)
        self.replaces = here or self.weight is not None or self.bias is not None


def prepared_value(sim: Any, prep: PreparedCall, call: OpCall, st: Any) -> tuple | None:
    """(plan, value, QInfo) of ``call`` by ``prep``, or None when any of its checks fails
    (then nothing was changed)."""
    name = call.name
    plan = A.plan_of(call, sim._plans)
    if plan is not prep.route.plan or not holds(sim, name, prep):
        return None
    args, kwargs = call.args, call.kwargs
    if kwargs and kwargs.get("inplace"):
        return None
    x_info = arrived_info(zip(plan.acts, prep.in_dtypes), args, kwargs, st.qt, st.grid)
    if x_info is MISMATCH:
        return None
    if prep.weight is not None:
        w = A.get(args, kwargs, plan.weight)
        if w is not prep.weight or w._version != prep.weight_version:
            return None
    if prep.bias is not None:
        b = A.get(args, kwargs, plan.bias)
        if b is not prep.bias or b._version != prep.bias_version:
            return None
    elif plan.bias is not None and A.get(args, kwargs, plan.bias) is not None:
        return None
    if not arguments_hold(prep, args, kwargs, x_info, st.qt):
        return None
    value, info = compute(prep, name, args, kwargs, x_info, st)
    # the full path's _quant_output gives a pass-through op's output quantization as a list
    return plan, value, [info] if prep.passes else info


def arguments_hold(prep: PreparedCall, args: tuple, kwargs: dict, x_info: Any, qt: Any) -> bool:
    """What ``prep`` assumed about a call's arguments besides how its activation inputs arrived
    (``arrived_info``, which gave ``x_info``) and the identity of its weight and bias: the first
    input's scale object where a bias value or a FIXED GEMM's run was made with it, that run's
    input shapes, scales and zero points (a second activation operand's QInfo from ``qt``),
    and the call's other arguments (``statics``)."""
    if prep.x_scale is not None and (x_info is None or x_info.scale is not prep.x_scale):
        return False
    run = prep.fixed
    if run is not None:
        acts = prep.route.plan.acts
        if not run.takes(A.get(args, kwargs, acts[0]), x_info):
            return False
        if run.w_codes is None:  # a matmul of two activations: the second as planned too
            b = A.get(args, kwargs, acts[1])
            if not run.takes_second(b, qt.get(b)):
                return False
    return not prep.statics or statics_hold(prep.statics, args, kwargs)


def holds(sim: Any, name: str, prep: PreparedCall) -> bool:
    """Whether what ``prep`` assumed about the simulator for op ``name`` still holds (not
    about a call's arguments): its route, resolved qconfig, platform, fake ops, fused chain and
    clamp and output scale-cache entry are current, and no scales are being learned."""
    r = prep.route
    if (
        sim._routes.get((name, r.mode)) is not r
        or sim._resolved.get(name) is not r.rq
        or sim.platform is not r.platform
        or sim.fake_ops is not prep.fake_ops
        or sim._learned_scales is not None
        or (r.chain is not None and sim._chain.get(name) is not r.chain)
        or (r.chain and sim._fused_clamp(name) != prep.bounds)
    ):
        return False
    cache = sim._scale_cache
    if not prep.passes and cache.get(prep.point_key) is not prep.point:
        return False
    for k, v in prep.deps:
        if cache.get(k) is not v:
            return False
    return True


def statics_hold(statics: tuple, args: tuple, kwargs: dict) -> bool:
    """Whether a composite's other arguments are those it was resolved for: each tensor the
    same object at the same version, each other value equal."""
    for slot, value, version in statics:
        v = A.get(args, kwargs, slot)
        if version is None:
            if isinstance(v, Tensor) or v != value:
                return False
        elif v is not value or v._version != version:
            return False
    return True


MISMATCH = object()  # arrived_info: an input did not arrive as the prepared call wants


def arrived_info(acts: Iterable, args: tuple, kwargs: dict, qt: Any, grid: Any) -> Any:
    """The first activation input's QInfo (None: not quantized) when every activation input
    arrived as prepared, ``acts`` giving each one's (slot, how it arrived): a dtype, an
    ``OnGrid`` (a float tensor with no QInfo of its own, on that grid in ``grid``), a
    ``QuantizeHere`` (a float tensor with no QInfo of its own), or None (not a float tensor);
    else ``MISMATCH``."""
    x_info = None
    for i, (slot, want) in enumerate(acts):
        v = A.get(args, kwargs, slot)
        if want is None:
            if isinstance(v, Tensor) and v.is_floating_point():
                return MISMATCH
            continue
        if type(want) is QuantizeHere:
            if not isinstance(v, Tensor) or not v.is_floating_point() or qt.get(v) is not None:
                return MISMATCH
            info = want.info
        elif type(want) is OnGrid:
            p = want.info
            if not isinstance(v, Tensor) or qt.get(v) is not None:
                return MISMATCH
            info = same_grid.codes_on_grid(grid, v, p.dtype, p.scale, p.zero_point, want.rounding)
            if info is None:  # else p with the grid's codes (FIXED), as quantize_act finds them
                return MISMATCH
        else:
            info = qt.get(v)
            if info is None or info.dtype is not want:
                return MISMATCH
        if i == 0:
            x_info = info
    return x_info


def compute(
    prep: PreparedCall, name: str, args: tuple, kwargs: dict, x_info: Any, st: Any
) -> tuple:
    """(value, QInfo) of op ``name`` by ``prep``, every check of it having passed: the same
    functions on the same values as the full path (``x_info``: the first input's QInfo)."""
    r = prep.route
    if prep.kernel is not None:  # a composite, resolved once
        return prep.kernel(args, kwargs)
    if prep.passes:  # the full path's _quant_output of a pass-through op, for one tensor
        info = QInfo(x_info.dtype, x_info.scale, zero_point=x_info.zero_point)
        out = r.fn(*args, **kwargs)
        if prep.layout:  # and, in FIXED mode, its codes moved by the same function
            slot = r.plan.acts[0]
            info = same_grid.layout_codes(r.fn, args, kwargs, slot, x_info, out, [info])[0]
        return out, info
    if r.chain:
        st.fused_done.add(name)
    run = prep.fixed
    if run is not None:  # a FIXED GEMM: its run on the inputs' codes
        x = A.get(args, kwargs, r.plan.acts[0])
        if run.w_codes is not None:
            return run(x_info.codes_native(x))
        b = A.get(args, kwargs, r.plan.acts[1])
        return run(x_info.codes_native(x), st.qt.get(b).codes_native(b))
    a, kw = args, kwargs or {}
    if prep.replaces:  # the arguments with inputs quantized here, the FAKE weight and bias
        a = list(args)
        kw = dict(kwargs) if kwargs else {}
        for slot, want in zip(r.plan.acts, prep.in_dtypes):
            if type(want) is QuantizeHere:
                A.put(a, kw, slot, want.fq(A.get(args, kwargs, slot)))
        if prep.weight is not None:
            A.put(a, kw, r.plan.weight, prep.weight_value)
        if prep.bias is not None:
            A.put(a, kw, r.plan.bias, prep.bias_value)
    if prep.binary is not None and not kw and len(a) == 2:
        out = prep.binary(a[0], a[1])
        if out is not None:
            return out, prep.out_info
    out = r.fn(*a, **kw)
    return prep.fq(out, inplace=prep.owned or A.fresh_result(out, a, kw)), prep.out_info
