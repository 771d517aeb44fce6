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
functions on the same values as the full path, so the same bits. A failed check sends the
call through the full path (``OpDispatch._run_quantized_value``), which prepares it anew.

A composite whose FAKE form is not one function and one fake quant (normalisation, embedding)
keeps that form resolved (``composite.ResolvedComposite``: scales, contract and fake-quantized
parameters found once) and checks, besides the above, the scale-cache entries it was resolved
from and its other arguments (tensors by identity and version, plain values by equality).

A steady FIXED run keeps the same form for a GEMM with a weight (a convolution or linear
with integer output codes): its ``fixed_gemm.GemmRun`` (``fixed``), every decision of the
kernel that does not read the operands' values, made once; the prepared call checks what the
run was planned from besides the above (the input's shape, scale object and zero point, the
output's scale-cache entries, the weight and bias versions, the other arguments) and computes
the op by the same run, so the same bits.

An activation input that came as a float tensor on the grid of the op's own input point (a
float op that keeps values made it: zero padding, eval-mode dropout; ``same_grid``) was used
as it came, since fake-quantizing it there changes no bit. The prepared call keeps that
point's QInfo (``OnGrid``) and its scale-cache entry, and takes the input as it comes only
while the entry is current and the input is on that grid again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from quantlab.capture import OpCall, OpCategory
from quantlab.numerics.rounding import Round
from quantlab.simulate import args as A
from quantlab.simulate import calls, same_grid
from quantlab.simulate.op_route import OpRoute
from quantlab.simulate.qtensor import QInfo


@dataclass(frozen=True, slots=True, eq=False)
class OnGrid:
    """An activation input that came as a float tensor on the grid of the op's input point
    ``info`` (``same_grid.codes_on_grid`` with ``rounding``) and was used unchanged."""

    info: QInfo
    rounding: Round


@dataclass(slots=True, eq=False)
class PreparedCall:
    """What one op's quantized FAKE run resolved (see the module docstring)."""

    route: OpRoute
    fake_ops: Any
    # how each activation input arrived: its dtype, an OnGrid, or None (not a float tensor)
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
    owned: bool  # the function's result is a fresh tensor the fake quant may overwrite
    passes: bool = False  # a pass-through op: the output keeps the first input's quantization
    # a composite (composite.ResolvedComposite): its compute replaces function and fake quant
    kernel: Callable | None = None
    deps: tuple = ()  # (scale-cache key, entry) pairs the composite was resolved from
    statics: tuple = ()  # its other arguments as (slot, value, tensor version or None)
    fixed: Any = None  # a FIXED GEMM's fixed_gemm.GemmRun: it computes the op


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
    if not arguments_hold(prep, args, kwargs, x_info):
        return None
    value, info = compute(prep, name, args, kwargs, x_info, st)
    # the full path's _quant_output gives a pass-through op's output quantization as a list
    return plan, value, [info] if prep.passes else info


def arguments_hold(prep: PreparedCall, args: tuple, kwargs: dict, x_info: Any) -> bool:
    """What ``prep`` assumed about a call's arguments besides how its activation inputs arrived
    (``arrived_info``, which gave ``x_info``) and the identity of its weight and bias: the first
    input's scale object where a bias value or a FIXED GEMM's run was made with it, that run's
    input shape and zero point, and the call's other arguments (``statics``)."""
    if prep.x_scale is not None and (x_info is None or x_info.scale is not prep.x_scale):
        return False
    run = prep.fixed
    if run is not None and not run.takes(A.get(args, kwargs, prep.route.plan.acts[0]), x_info):
        return False
    return not prep.statics or statics_hold(prep.statics, args, kwargs)


def holds(sim: Any, name: str, prep: PreparedCall) -> bool:
    """Whether what ``prep`` assumed about the simulator for op ``name`` still holds (not
    about a call's arguments): its route, resolved qconfig, platform, fake ops, fused chain and
    clamp and output scale-cache entry are current, and no scales are being learned."""
    r = prep.route
    return not (
        sim._routes.get((name, r.mode)) is not r
        or sim._resolved.get(name) is not r.rq
        or sim.platform is not r.platform
        or sim.fake_ops is not prep.fake_ops
        or sim._learned_scales is not None
        or (r.chain is not None and sim._chain.get(name) is not r.chain)
        or (r.chain and sim._fused_clamp(name) != prep.bounds)
        or (not prep.passes and sim._scale_cache.get(prep.point_key) is not prep.point)
        or any(sim._scale_cache.get(k) is not v for k, v in prep.deps)
    )


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
    ``OnGrid`` (a float tensor with no QInfo of its own, on that grid in ``grid``), or None
    (not a float tensor); else ``MISMATCH``."""
    x_info = None
    for i, (slot, want) in enumerate(acts):
        v = A.get(args, kwargs, slot)
        if want is None:
            if isinstance(v, Tensor) and v.is_floating_point():
                return MISMATCH
            continue
        if type(want) is OnGrid:
            p = want.info
            if (
                not isinstance(v, Tensor)
                or qt.get(v) is not None
                or same_grid.codes_on_grid(grid, v, p.dtype, p.scale, p.zero_point, want.rounding)
                is None
            ):
                return MISMATCH
            info = p
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
        return r.fn(*args, **kwargs), info
    if r.chain:
        st.fused_done.add(name)
    if prep.fixed is not None:  # a FIXED GEMM: its run on the input's codes
        return prep.fixed(x_info.codes_native(A.get(args, kwargs, r.plan.acts[0])))
    a = list(args)
    kw = dict(kwargs) if kwargs else {}
    if prep.weight is not None:
        A.put(a, kw, r.plan.weight, prep.weight_value)
    if prep.bias is not None:
        A.put(a, kw, r.plan.bias, prep.bias_value)
    return prep.fq(r.fn(*a, **kw), inplace=prep.owned), prep.out_info


def prepare(
    sim: Any,
    call: OpCall,
    r: OpRoute,
    plan: A.ArgPlan,
    in_infos: list,
    arrived: list,
    wq: tuple | None,
    args: list,
    kwargs: dict,
    bounds: tuple | None,
    out: Any,
    out_info: Any,
) -> PreparedCall | None:
    """The PreparedCall of a FAKE call that just ran quantized through the full path (its
    route ``r``; ``in_infos`` as used, ``arrived`` as the inputs came; ``args`` / ``kwargs``
    with the values it computed with; ``bounds`` the fused clamp given to the output fake
    quant; ``out`` / ``out_info`` its result), or None for a call this form does not cover."""
    rq = r.rq
    if call.category is OpCategory.PASS_THROUGH:
        return _prepare_pass_through(sim, call, r, plan, in_infos, arrived, out, out_info)
    if (
        not _plain_route(r)
        or not r.quant_out
        or not rq.output_dtype.is_int
        or (r.gemm and rq.high_precision_output)
        or (r.chain and bounds is None)  # a batch_norm fold or an unfused clamp
        or any(sim._info[c].op_type == "batch_norm" for c in r.chain or ())
        or not _replaceable(sim, call, out)
    ):
        return None
    arrival = _arrival(sim, call, plan, in_infos, arrived, (args, kwargs))
    if arrival is None:
        return None
    dtypes, grid_deps = arrival
    weight = weight_value = bias = bias_value = x_scale = None
    weight_version = bias_version = 0
    if plan.weight is not None:
        if wq is None:
            return None
        weight, weight_version = wq[2], wq[2]._version
        weight_value = A.get(args, kwargs, plan.weight)
    if plan.bias is not None and A.get(call.args, call.kwargs, plan.bias) is not None:
        x_info = in_infos[0] if in_infos else None
        if wq is None or x_info is None or not x_info.dtype.is_int:
            return None  # the bias is not replaced by its FAKE value
        bias = A.get(call.args, call.kwargs, plan.bias)
        bias_version, x_scale = bias._version, x_info.scale
        bias_value = A.get(args, kwargs, plan.bias)
    key = ("fake_point", call.name, "out", rq.output_dtype, bounds)
    point = sim._scale_cache.get(key)
    if point is None or point[0] is not rq or point[3] is not out_info:
        return None
    return PreparedCall(
        r,
        sim.fake_ops,
        dtypes,
        weight,
        weight_version,
        weight_value,
        bias,
        bias_version,
        x_scale,
        bias_value,
        bounds,
        key,
        point,
        point[2],
        out_info,
        r.gemm,
        deps=grid_deps,
    )


def prepare_fixed_gemm(
    sim: Any,
    call: OpCall,
    r: OpRoute,
    plan: A.ArgPlan,
    in_infos: list,
    arrived: list,
    wq: tuple,
    run: Any,
    out: Any,
    out_info: Any,
) -> PreparedCall | None:
    """The PreparedCall of a FIXED GEMM call with a weight that just ran by ``run`` (its
    ``fixed_gemm.GemmRun``; ``wq``: the weight's (codes, scale, float weight)) and gave ``out``
    / ``out_info``: that run while the route, the output's scale-cache entries, the weight and
    bias versions, the input's shape and scale and the call's other arguments hold; None for a
    call this form does not cover (an input quantized here, a batch_norm fold, a float or
    high-precision output)."""
    rq = r.rq
    if (
        not _plain_route(r)
        or not r.quant_out
        or not rq.output_dtype.is_int
        or rq.high_precision_output
        or run.out_dtype is not rq.output_dtype
        or plan.weight is None
        or any(sim._info[c].op_type == "batch_norm" for c in r.chain or ())
        or not _replaceable(sim, call, out)
        or not isinstance(out_info, QInfo)
    ):
        return None
    arrival = _arrival(sim, call, plan, in_infos, arrived)
    statics = _statics(call, plan)
    if arrival is None or statics is None or in_infos[0] is None:
        return None
    weight = wq[2]
    bias = A.get(call.args, call.kwargs, plan.bias) if plan.bias is not None else None
    cache = sim._scale_cache
    keys = (  # the output's scale and, for an asymmetric point, its zero point's entry
        sim.act_scale_key(call.name, "out", rq.output_dtype, rq),
        sim.act_zero_point_key(call.name, "out", rq.output_dtype, rq),
    )
    deps = tuple((k, cache[k]) for k in keys if k in cache)
    if not deps or deps[0][0] != keys[0]:
        return None
    return PreparedCall(
        route=r,
        fake_ops=sim.fake_ops,
        in_dtypes=arrival[0],
        weight=weight,
        weight_version=weight._version,
        weight_value=None,
        bias=bias,
        bias_version=0 if bias is None else bias._version,
        x_scale=in_infos[0].scale,
        bias_value=None,
        bounds=run.clamp,
        point_key=("fixed", call.name),  # no entry: its scale entries are ``deps``
        point=None,
        fq=None,
        out_info=None,
        owned=False,
        deps=deps,
        statics=statics,
        fixed=run,
    )


def prepare_composite(
    sim: Any,
    call: OpCall,
    r: OpRoute,
    plan: A.ArgPlan,
    in_infos: list,
    arrived: list,
    made: Any,
    out: Any,
    out_info: Any,
) -> PreparedCall | None:
    """The PreparedCall of a FAKE composite call that just ran by ``made`` (a
    ``composite.ResolvedComposite`` with deps) and gave ``out`` / ``out_info``: ``made``'s
    compute while the route, its scale-cache entries and the call's other arguments hold; None
    for a call this form does not cover (an input quantized here, an argument that is neither
    a tensor nor a plain value)."""
    if (
        r.om is not None
        or r.split_b
        or r.grid
        or r.deployed_kernel
        or r.single_period
        or plan.weight is not None
        or plan.bias is not None
        or not _replaceable(sim, call, out)
        or not isinstance(out_info, QInfo)
    ):
        return None
    arrival = _arrival(sim, call, plan, in_infos, arrived)
    statics = _statics(call, plan)
    if arrival is None or statics is None:
        return None
    dtypes = arrival[0]
    return _without_weight(
        sim,
        r,
        dtypes,
        ("composite", call.name),  # no entry: its scale entries are ``deps``
        out_info,
        kernel=made.compute,
        deps=made.deps,
        statics=statics,
    )


_PLAIN = (bool, int, float, str, type(None))


def _statics(call: OpCall, plan: A.ArgPlan) -> tuple | None:
    """(slot, value, version) of every argument of ``call`` that is not an activation: a
    tensor with its version, a plain value (or a tuple / list of them) with None; None when an
    argument is neither."""
    acts = set(plan.acts)
    slots = [("a", i) for i in range(len(call.args))] + [("k", k) for k in call.kwargs]
    out = []
    for slot in slots:
        if slot in acts:
            continue
        v = A.get(call.args, call.kwargs, slot)
        if isinstance(v, Tensor):
            out.append((slot, v, v._version))
        elif isinstance(v, _PLAIN) or (
            isinstance(v, (tuple, list)) and all(isinstance(e, _PLAIN) for e in v)
        ):
            out.append((slot, v, None))
        else:
            return None
    return tuple(out)


def _prepare_pass_through(sim, call, r, plan, in_infos, arrived, out, out_info):
    """The PreparedCall of a pass-through op (a view, transpose, reshape, ...) that took one
    tensor quantized at an integer dtype as it came and gave one tensor: the function on the
    same arguments, the output keeping that input's quantization (``passes``); else None."""
    if (
        not _plain_route(r)
        or plan.weight is not None
        or plan.bias is not None
        or not _replaceable(sim, call, out)
        or not in_infos
        or in_infos[0] is None
        or not in_infos[0].dtype.is_int
        or not isinstance(out_info, list)
        or len(out_info) != 1
    ):
        return None
    arrival = _arrival(sim, call, plan, in_infos, arrived)
    if arrival is None:
        return None
    return _without_weight(sim, r, arrival[0], ("pass_through", call.name), None, passes=True)


def _without_weight(sim, r, dtypes, point_key, out_info, **kw) -> PreparedCall:
    """A PreparedCall with no weight, bias, fused clamp or output fake quant of its own (a
    pass-through op or a composite); ``point_key`` names no scale-cache entry."""
    return PreparedCall(
        route=r,
        fake_ops=sim.fake_ops,
        in_dtypes=dtypes,
        weight=None,
        weight_version=0,
        weight_value=None,
        bias=None,
        bias_version=0,
        x_scale=None,
        bias_value=None,
        bounds=None,
        point_key=point_key,
        point=None,
        fq=None,
        out_info=out_info,
        owned=False,
        **kw,
    )


def _arrival(
    sim: Any,
    call: OpCall,
    plan: A.ArgPlan,
    in_infos: list,
    arrived: list,
    used: tuple | None = None,
) -> tuple | None:
    """(how each activation input arrived, the scale-cache entries that rests on) when every
    input was used as it came: its dtype, or None for what is not a quantized tensor (a Python
    number). With ``used``, the (args, kwargs) the op computed with, an input that came as a
    float tensor and was used unchanged at its integer input point (so it was on that point's
    grid, ``QuantizationState.quantize_act``) is an ``OnGrid`` resting on the point's entry. None: a
    call the prepared form does not cover (an input quantized or cast here, or a float tensor
    left float, as a sensitivity run's float op feeds)."""
    dtypes, deps = [], []
    for i, (slot, u, came) in enumerate(zip(plan.acts, in_infos, arrived)):
        v = A.get(call.args, call.kwargs, slot)
        if u is came:
            if u is None and A.is_float_tensor(v):
                return None
            dtypes.append(None if u is None else u.dtype)
            continue
        if (
            used is None
            or came is not None
            or u is None
            or not u.dtype.is_int
            or A.get(used[0], used[1], slot) is not v
        ):
            return None
        key = ("fake_point", call.name, f"in{i}", u.dtype, None)
        entry = sim._scale_cache.get(key)
        if entry is None or entry[3] is not u:
            return None
        dtypes.append(OnGrid(u, sim.platform.fake_round))
        deps.append((key, entry))
    return tuple(dtypes), tuple(deps)


def _replaceable(sim: Any, call: OpCall, out: Any) -> bool:
    """A call a prepared form may stand in for: not in place, not fused into a GEMM, one tensor
    out, no scales being learned."""
    return not (
        calls.is_inplace(call)
        or call.name in sim._fused_into
        or not isinstance(out, Tensor)
        or sim._learned_scales is not None
    )


def _plain_route(r: OpRoute) -> bool:
    """A route the prepared form covers: no per-op mode, split operand, grid, deployed or
    single-period kernel, or FAKE composite."""
    return not (
        r.om is not None
        or r.split_b
        or r.grid
        or r.deployed_kernel
        or r.single_period
        or r.fake_kernel is not None
    )
