"""What a replayed op becomes in a run that replays a recorded trace (``Simulator.run(replay=)``).

Until the first op named in its ``op_modes`` (or the GEMM a named op is fused into,
``RunState.replay_stops``), every op the trace recorded returns its recorded output instead of
being computed (``replayed_output``; an op that returned its input, or a view of it, returns
that input or the view again), booked as kept in float where the recorded run booked it
(``kept_float``); a replayed GEMM that ran with its fused chain (``Trace.fused``) leaves the
chain's ops reached after the stop passing its output through, as in the naive run. In a run
that only computes, a replayed output is a new tensor whose record is copied in when a call
reads it (``RunState.pending``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

from quantlab.simulate import calls
from quantlab.simulate.modes import Mode
from quantlab.simulate.run_state import RunState


def replayed_output(call, st: RunState) -> Any:
    """A replayed op's output, its arguments not read. An op whose recorded output shared an
    input's memory (``Trace.aliases``) returns that input itself again, or recomputes its torch
    view of it, so the model's aliases hold as in the recorded run. Any other: its recorded
    value (``calls.substitute``), or, in a run that defers copies (``RunState.defers_copies``),
    for one tensor, a new tensor like the record (the same shape, strides and dtype) whose values
    are copied in when a call reads it (``RunState.pending``); an in-place op whose target is
    pending and whose record has the target's shape leaves the target pending with its own
    record (a full overwrite; a record of another shape, which ``calls.substitute`` does not
    write into the target, leaves it pending as it was). A replayed block's tensors that only
    other replayed ops take are then never copied; the values any call reads are the copy's."""
    aliases = st.replay.aliases
    if call.name in aliases:  # the model's aliases hold; nothing is read
        i = aliases[call.name]
        if i is not None:
            return tree_flatten((call.args, call.kwargs))[0][i]
        return call.result if call.result is not None else call.run()
    recorded = st.replay.outputs[call.name]
    if not (isinstance(recorded, Tensor) and st.defers_copies()):
        return calls.substitute(call, recorded)
    target = calls.inplace_target(call)
    if target is None:
        out = torch.empty_like(recorded)
        st.pending.set(out, recorded)
        return out
    if st.pending.get(target) is not None and recorded.shape == target.shape:
        st.pending.set(target, recorded)
        return target
    st.materialize(target)  # a view of a pending output: its base takes its values first
    return calls.substitute(call, recorded)  # a target not pending: written as before


def kept_float(name: str, st: RunState) -> bool:
    """Whether replayed op ``name`` is booked as kept in float (``RunState.float_ops``): as the
    recorded run booked it when the trace is of this run's mode (the naive run books the same),
    else every replayed op of a FLOAT run."""
    if st.replay.mode is st.mode:
        return name in st.replay.float_ops
    return st.mode is Mode.FLOAT
