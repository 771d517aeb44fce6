"""What a call of a FLOAT replay run becomes when the run keeps convolution outputs in oneDNN's
blocked layout (``RunState.blocked``, ``blocked_layout``): computed on blocked tensors and booked
as the dense call would be (``blocked_value``), or given its blocked arguments made dense
(``dense_read``). The dispatch (``OpDispatch._dispatch``) asks here first for every call of such
a run."""

from __future__ import annotations

import dataclasses

from torch import Tensor

from quantlab.capture import OpCall
from quantlab.simulate import blocked_layout, calls
from quantlab.simulate.run_state import RunState


def blocked_value(sim, call: OpCall, plan, inf, om, st: RunState) -> Tensor | None:
    """``call`` computed on the blocked layout, booked as the dense call would be: a
    convolution of the plan with its fused chain (whose ops then pass its output through, as
    after a fused GEMM), an add / ReLU of blocked tensors, or another op writing in place into a
    blocked tensor (``blocked_layout.write_into``); None where it is computed as the model does
    (another op, an op with a mode of its own, a chain op studied in this run, a blocked form
    not shown to give its bits)."""
    if om is not None:
        return None
    post = st.blocked.get(call.name)
    if post is not None:
        if any(n in st.op_modes for n in sim._chain.get(call.name, ())):
            return None
        out = sim._blocked_convs.run(call, post, st.blocked_bounds)
        if out is None:
            return None
        st.blocked_used = True
        st.fused_done.add(call.name)
    elif st.blocked_used:
        if sim._fused_into.get(call.name) in st.fused_done:
            return None  # passes its blocked convolution's output through
        operands = None
        if call.op_type in blocked_layout.NATIVE_OPS:
            operands = blocked_layout.native_operands(call, st.blocked_bounds)
        if operands is not None:
            out = call.run(operands[0])
            st.blocked_bounds.set(out, operands[1])
        else:
            target = calls.inplace_target(call)
            if target is None or not target.is_mkldnn:
                return None
            out = blocked_layout.write_into(target, call, st.blocked_bounds)
    else:
        return None
    st.float_ops.add(call.name)
    inf.output_shape = tuple(out.shape)
    inf.flops = calls.flops(call, plan, out)
    sim._set_out_info(out, None, st, call.name)
    return out


def dense_read(sim, call: OpCall, st: RunState) -> OpCall:
    """``call`` as it reads the run's blocked tensors: as they are by an op fused into a
    blocked convolution (it passes the output through), else with its arguments made dense
    (``blocked_layout.dense_args``)."""
    if not st.blocked_used or sim._fused_into.get(call.name) in st.fused_done:
        return call
    swapped = blocked_layout.dense_args(call.func, call.args, call.kwargs)
    if swapped is None:
        return call
    return dataclasses.replace(call, args=swapped[0], kwargs=swapped[1])
