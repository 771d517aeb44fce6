"""Making the prepared calls of ``steady``: from a call that just ran quantized through the
full path (``OpDispatch._run_quantized_value``), what its next steady run may replay, or None
for a call the prepared form does not cover (the ``steady`` module docstring says what each
form checks and computes)."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import Tensor

from quantlab.capture import OpCall
from quantlab.numerics.fake_quant_plan import fused_binary_fn
from quantlab.op_kinds import OpCategory
from quantlab.simulate import args as A
from quantlab.simulate import calls, fixed_ops, same_grid
from quantlab.simulate.modes import Mode
from quantlab.simulate.op_route import OpRoute
from quantlab.simulate.qtensor import QInfo
from quantlab.simulate.steady import OnGrid, PreparedCall, QuantizeHere


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
        binary=_fused_binary(r, weight, bias, point[2]),
    )


# the functions of an add or multiply of two operands in their written order (``x + y`` and
# ``torch.add(x, y)``: torch computes x + y; the reflected forms are left to torch)
_BINARY = {
    torch.add: "add",
    Tensor.add: "add",
    operator.add: "add",
    Tensor.__add__: "add",
    torch.mul: "mul",
    torch.multiply: "mul",
    Tensor.mul: "mul",
    Tensor.multiply: "mul",
    operator.mul: "mul",
    Tensor.__mul__: "mul",
}


def _fused_binary(r: OpRoute, weight, bias, fq) -> Any:
    """The add or multiply of a route whose function is one (``_BINARY``), with no weight or
    bias, fused with its output fake quant ``fq`` (``fake_quant_plan.fused_binary_fn``), or
    None."""
    op = _BINARY.get(r.fn) if weight is None and bias is None else None
    return None if op is None else fused_binary_fn(op, fq)


def prepare_fixed_gemm(
    sim: Any,
    call: OpCall,
    r: OpRoute,
    plan: A.ArgPlan,
    in_infos: list,
    arrived: list,
    wq: tuple,
    run: Any,
    used: tuple,
    out: Any,
    out_info: Any,
) -> PreparedCall | None:
    """The PreparedCall of a FIXED GEMM call that just ran by ``run`` (its
    ``fixed_gemm.GemmRun``) on ``used`` (the (args, kwargs) it ran with) and gave ``out`` /
    ``out_info``, either with a weight (``wq``: its (codes, scale, float weight)) or a matmul
    of two activations (``wq`` None): that run while the route, the output's scale-cache
    entries, the weight and bias versions, the inputs' shapes and scales (an input that came
    as a float tensor on its input point's grid: that point's entries) and the call's other
    arguments hold; None for a call this form does not cover (an input quantized here, a
    batch_norm fold, a float or high-precision output)."""
    rq = r.rq
    if (
        not _plain_route(r)
        or not r.quant_out
        or not rq.output_dtype.is_int
        or rq.high_precision_output
        or run.out_dtype is not rq.output_dtype
        or (plan.weight is None) != (wq is None)
        or (wq is None and (run.kind != "matmul" or len(plan.acts) != 2 or in_infos[1] is None))
        or any(sim._info[c].op_type == "batch_norm" for c in r.chain or ())
        or not _replaceable(sim, call, out)
        or not isinstance(out_info, QInfo)
    ):
        return None
    arrival = _arrival(sim, call, plan, in_infos, arrived, used, rq)
    statics = _statics(call, plan)
    if arrival is None or statics is None or in_infos[0] is None:
        return None
    weight = None if wq is None else wq[2]
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
        weight_version=0 if weight is None else weight._version,
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
        deps=deps + arrival[1],
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
    if r.om is not None or r.split_b or r.grid or r.deployed_kernel or r.single_period:
        return None
    held = _kernel_arguments(sim, call, plan, in_infos, arrived, out, out_info)
    if held is None:
        return None
    dtypes, statics = held
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


def _kernel_arguments(
    sim, call, plan, in_infos, arrived, out, out_info, quantize_here: bool = False
) -> tuple | None:
    """(how each activation input arrived, the other arguments as ``_statics``) of a call
    whose kernel a prepared call keeps (a FAKE composite, a FIXED op): no weight or bias, one
    tensor out, every input used as it came (``quantize_here``: or a float tensor quantized at
    the op's input point, ``_arrival``); None otherwise."""
    if (
        plan.weight is not None
        or plan.bias is not None
        or not _replaceable(sim, call, out)
        or not isinstance(out_info, QInfo)
    ):
        return None
    arrival = _arrival(sim, call, plan, in_infos, arrived, quantize_here=quantize_here)
    statics = _statics(call, plan)
    if arrival is None or statics is None:
        return None
    return arrival[0], statics


def prepare_fixed_op(
    sim: Any,
    call: OpCall,
    r: OpRoute,
    plan: A.ArgPlan,
    in_infos: list,
    arrived: list,
    out: Any,
    out_info: Any,
) -> PreparedCall | None:
    """The PreparedCall of a FIXED op other than a GEMM or a layout op (an add, multiply,
    LUT, softmax, norm, reduction, ...) that just ran by its fixed kernel
    (``fixed_ops.run_fixed``) on inputs that each arrived at its dtype or came as a float
    tensor with no QInfo and was quantized at the op's input point, and gave ``out`` /
    ``out_info``: the same kernel on the call's arguments and its inputs' QInfos, as the full
    path calls it once the route holds, such an input quantized by the same
    ``quantize_act`` first; the kernel and ``quantize_act`` look their scales and constants up
    themselves, as on the full path. None for a call this form does not cover (an input cast
    or requantized here, a weight, more than one tensor out)."""
    if not _plain_route(r) or call.category in (OpCategory.GEMM, OpCategory.PASS_THROUGH):
        return None
    held = _kernel_arguments(sim, call, plan, in_infos, arrived, out, out_info, True)
    if held is None:
        return None
    dtypes, statics = held
    here = {i: d.info.dtype for i, d in enumerate(dtypes) if type(d) is QuantizeHere}
    kernel = _fixed_kernel(sim, call, plan, r, here)
    return _without_weight(
        sim, r, dtypes, ("fixed_op", call.name), None, kernel=kernel, statics=statics
    )


def _fixed_kernel(sim: Any, call: OpCall, plan: A.ArgPlan, r: OpRoute, here: dict):
    """``compute(args, kwargs)`` of ``prepare_fixed_op``: (value, QInfo) of the call with these
    arguments, as ``OpDispatch._run_quantized_value`` gives it for inputs that arrived at their
    dtypes or (``here``: input index -> dtype) came as float tensors with no QInfo, which it
    quantizes at the op's input point (the fixed kernel, else the float function and its
    output's quantization)."""
    name, op_type, category = call.name, call.op_type, call.category
    module, call_index, func = call.module, call.call_index, call.func
    acts, rq, quant_out = tuple(plan.acts), r.rq, r.quant_out

    def compute(args: tuple, kwargs: dict) -> tuple:
        qt = sim._state.qt
        a, kw = list(args), dict(kwargs)
        infos = []
        for i, slot in enumerate(acts):
            v = A.get(args, kwargs, slot)
            if i in here:  # the full path's quantize_act of a float input
                v, info = sim.quantize_act(name, f"in{i}", v, here[i], rq, Mode.FIXED)
                A.put(a, kw, slot, v)
                infos.append(info)
                continue
            infos.append(qt.get(v) if isinstance(v, Tensor) and v.is_floating_point() else None)
        now = OpCall(name, op_type, category, module, call_index, func, args, kwargs, None)
        res = fixed_ops.run_fixed(sim, now, plan, a, kw, infos, None, rq, quant_out)
        if res is None:  # the full path's float fallback
            res = sim._quant_output(now, r.fn(*a, **kw), infos, rq, quant_out, Mode.FIXED, None)
        return res

    return compute


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


def prepare_fixed_layout(
    sim: Any,
    call: OpCall,
    r: OpRoute,
    plan: A.ArgPlan,
    in_infos: list,
    arrived: list,
    out: Any,
    out_info: Any,
) -> PreparedCall | None:
    """The PreparedCall of a FIXED layout op (``same_grid.LAYOUT_OPS``) that just ran through
    the full path: the pass-through form, its output's codes moved by the same function
    (``layout``); None for a call this form does not cover."""
    if call.category is not OpCategory.PASS_THROUGH or call.op_type not in same_grid.LAYOUT_OPS:
        return None
    prep = _prepare_pass_through(sim, call, r, plan, in_infos, arrived, out, out_info)
    if prep is not None:
        prep.layout = True
    return prep


def _prepare_pass_through(sim, call, r, plan, in_infos, arrived, out, out_info):
    """The PreparedCall of a pass-through op (a view, transpose, reshape, ...) that took one
    tensor quantized at an integer dtype as it came and gave one tensor: the function on the
    same arguments, the output keeping that input's quantization (``passes``); else None
    (an op ``same_grid.snaps``: some of its values are snapped to the grid)."""
    if (
        same_grid.snaps(call)
        or not _plain_route(r)
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
    fixed_rq: Any = None,
    quantize_here: bool = False,
) -> tuple | None:
    """(how each activation input arrived, the scale-cache entries that rests on) when every
    input was used as it came: its dtype, or None for what is not a quantized tensor (a Python
    number). With ``used``, the (args, kwargs) the op computed with, an input that came as a
    float tensor with no QInfo and went to its integer input point
    (``QuantizationState.quantize_act``) rests on that point's entry: an ``OnGrid`` when it was
    used unchanged (it was on the point's grid), else a ``QuantizeHere``. In a FIXED run
    (``fixed_rq``: the op's resolved qconfig) only the ``OnGrid`` form is covered, resting on
    the point's scale entry (and zero-point entry, for an asymmetric point). With
    ``quantize_here`` (a FIXED op whose kernel the prepared call runs), such an input becomes a
    ``QuantizeHere`` with no function: the prepared call quantizes it by ``quantize_act`` as
    the full path does, which reads the point's entries itself. None: a call the prepared form
    does not cover (an input requantized or cast here, or a float tensor left float, as a
    sensitivity run's float op feeds)."""
    dtypes, deps = [], []
    for i, (slot, u, came) in enumerate(zip(plan.acts, in_infos, arrived)):
        v = A.get(call.args, call.kwargs, slot)
        if u is came:
            if u is None and A.is_float_tensor(v):
                return None
            dtypes.append(None if u is None else u.dtype)
            continue
        if came is not None or u is None or not u.dtype.is_int:
            return None
        if quantize_here and A.is_float_tensor(v):
            dtypes.append(QuantizeHere(QInfo(u.dtype, u.scale, zero_point=u.zero_point), None))
            continue
        if used is None:
            return None
        if fixed_rq is not None:  # FIXED: the codes the input's grid holds, as they came
            keys = (
                sim.act_scale_key(call.name, f"in{i}", u.dtype, fixed_rq),
                sim.act_zero_point_key(call.name, f"in{i}", u.dtype, fixed_rq),
            )
            cache = sim._scale_cache
            if A.get(used[0], used[1], slot) is not v or cache.get(keys[0]) is not u.scale:
                return None
            p = QInfo(u.dtype, u.scale, zero_point=u.zero_point)
            dtypes.append(OnGrid(p, sim.platform.fake_round))
            deps.extend((k, cache[k]) for k in keys if k in cache)
            continue
        key = ("fake_point", call.name, f"in{i}", u.dtype, None)
        entry = sim._scale_cache.get(key)
        if entry is None or entry[3] is not u:
            return None
        if A.get(used[0], used[1], slot) is v:  # on the point's grid: used as it came
            dtypes.append(OnGrid(u, sim.platform.fake_round))
        else:  # fake-quantized here by the point's function
            dtypes.append(QuantizeHere(u, entry[2]))
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
