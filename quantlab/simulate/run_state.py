"""The state one run's ops share: its mode and per-op modes, the side tables of codes,
producers and grids, what it records or replays, and what it learned along the way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor
from torch.utils._pytree import tree_flatten

from quantlab.simulate import blocked_layout, trace_record
from quantlab.simulate.modes import CallObserver, Mode, OpMode, Trace
from quantlab.simulate.qtensor import QTable, values_hold


@dataclass
class RunState:
    mode: Mode
    op_modes: Mapping[str, OpMode]
    replay: Trace | None = None
    replay_active: bool = False
    # the ops a replay stops before: the ops in op_modes, or the GEMM a fused one belongs to
    replay_stops: frozenset = frozenset()
    calibrating: bool = False
    trace: Trace | None = None
    isolate: Trace | None = None
    # the codes a tensor carries, and the grid of float ops' outputs on their input's grid:
    # checked again after a write into the tensor's memory (``QTable``)
    qt: QTable = field(default_factory=lambda: QTable(values_hold))
    producers: QTable = field(default_factory=QTable)
    grid: QTable = field(default_factory=lambda: QTable(values_hold))
    order: list = field(default_factory=list)
    infos: dict = field(default_factory=dict)
    float_ops: set = field(default_factory=set)  # ops run in float by choice of mode
    fused_done: set = field(default_factory=set)  # GEMMs that ran with their fused chain
    on_call: CallObserver | None = None  # told of every call after it ran (trace(on_call=))
    float16_overflow: dict = field(default_factory=dict)  # op -> values beyond +-65504 cast
    grad: bool = False  # record gradients (training runs: straight-through estimators)
    prepared_hits: set | None = None  # when a set: the ops that followed their prepared call
    # replayed outputs whose recorded values are not copied in yet: tensor -> its record
    pending: QTable = field(default_factory=QTable)
    # while recording a trace: storage address -> the ops whose record holds that storage
    record_storages: dict = field(default_factory=dict)
    # a replay run's convolutions whose output may stay blocked (``blocked_layout.plan``)
    blocked: dict | None = None
    blocked_used: bool = False  # a blocked tensor was made in this run
    # blocked tensor -> the bound shown on its magnitude (``blocked_layout.BlockedConvs``)
    blocked_bounds: QTable = field(default_factory=QTable)

    def only_computes(self) -> bool:
        """A run that records, observes, isolates and trains nothing: it only computes."""
        return not (
            self.trace is not None
            or self.isolate is not None
            or self.on_call is not None
            or self.calibrating
            or self.grad
        )

    def defers_copies(self) -> bool:
        """A replay run that only computes: a replayed output may take its recorded values
        when a call reads it."""
        return self.replay is not None and self.only_computes()

    def watches_calls(self) -> bool:
        """Whether the run is told of every torch call first (``before_call``): it records a
        trace, or defers replayed outputs' copies."""
        return self.trace is not None or self.defers_copies()

    def materialize(self, t: object) -> None:
        """If ``t`` is a pending replayed output, or a view of one, copy its record into it."""
        if not isinstance(t, Tensor):
            return
        base = t._base
        for x in (t,) if base is None else (t, base):
            recorded = self.pending.get(x)
            if recorded is not None:
                self.pending.drop(x)
                # through .data: no version bump, so the side-table entries of x and its views,
                # which describe these values, still hold (``QTable``)
                x.data.copy_(recorded)

    def materialize_read(self, args: tuple, kwargs: dict) -> None:
        """Every pending replayed output among a call's arguments (at any depth) takes its
        values: the call is about to read them."""
        if self.pending:
            for leaf in tree_flatten((args, kwargs))[0]:
                if isinstance(leaf, Tensor):
                    self.materialize(leaf)

    def materialize_all(self) -> None:
        """Every pending replayed output still alive takes its values (the end of a run: the
        model's output or state may hold one)."""
        for t, _ in self.pending.live():
            self.materialize(t)

    def before_call(self, func, args: tuple, kwargs: dict, kind) -> tuple[tuple, dict] | None:
        """Told of every torch call of the run first (``CaptureMode``'s ``before``). A call
        that is not a modelled op runs before the dispatch sees it, or without it: the pending
        replayed outputs among its arguments take their values now. A modelled op's call goes
        to the dispatch first, which replays it without reading its arguments or gives them
        their values before computing (``replay.replayed_output``). No call reads a pending
        output otherwise: every torch function and tensor method the model calls comes here
        first while the run lasts (unless the model turns torch's function handling off
        itself), and the end of the run gives the rest their values (``Simulator._forward``).
        While recording a trace, a call about to write into a tensor first makes every record
        sharing its memory a copy (``trace_record.before_write``). A call that is not a
        modelled op and reads a blocked convolution output (``blocked_layout``) gets its
        arguments back made dense (returned: the call runs on them); None: run as given."""
        if self.trace is not None:
            target = trace_record.written_tensor(func, args, kwargs)
            if target is not None:
                trace_record.before_write(target, self)
        if self.pending and (kind is None or kind[1] is None):
            self.materialize_read(args, kwargs)
        if self.blocked_used and (kind is None or kind[1] is None):
            return blocked_layout.dense_args(func, args, kwargs)
        return None

    def forget(self, t: Tensor) -> None:
        """A float op changed ``t`` in place: its codes and its grid no longer hold."""
        self.qt.drop(t)
        self.grid.drop(t)

    def steady(self) -> bool:
        """A run that needs nothing per op beyond the op table (``steady``: prepared calls)."""
        return not self.op_modes and self.replay is None and self.only_computes()
