"""The state one run's ops share: its mode and per-op modes, the side tables of codes,
producers and grids, what it records or replays, and what it learned along the way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor

from quantlab.capture import mutates
from quantlab.simulate.modes import CallObserver, Mode, OpMode, Trace
from quantlab.simulate.qtensor import QTable


@dataclass
class RunState:
    mode: Mode
    op_modes: Mapping[str, OpMode]
    replay: Trace | None = None
    replay_active: bool = False
    calibrating: bool = False
    trace: Trace | None = None
    isolate: Trace | None = None
    qt: QTable = field(default_factory=QTable)
    producers: QTable = field(default_factory=QTable)
    grid: QTable = field(default_factory=QTable)  # float ops' outputs on their input's grid
    order: list = field(default_factory=list)
    infos: dict = field(default_factory=dict)
    float_ops: set = field(default_factory=set)  # ops run in float by choice of mode
    fused_done: set = field(default_factory=set)  # GEMMs that ran with their fused chain
    on_call: CallObserver | None = None  # told of every call after it ran (trace(on_call=))
    float16_overflow: dict = field(default_factory=dict)  # op -> values beyond +-65504 cast
    grad: bool = False  # record gradients (training runs: straight-through estimators)
    prepared_hits: set | None = None  # when a set: the ops that followed their prepared call
    # a replayed op's output whose recorded values are not copied in yet (``before_call``)
    pending: tuple[Tensor, Tensor] | None = None

    def defers_copies(self) -> bool:
        """A replay run that only computes (nothing recorded, observed, isolated or trained):
        a replayed output may take its recorded values when the next call needs them."""
        return self.replay is not None and not (
            self.trace is not None
            or self.isolate is not None
            or self.on_call is not None
            or self.calibrating
            or self.grad
        )

    def materialize(self) -> None:
        """Copy the recorded values into the pending replayed output (``pending``), if any."""
        if self.pending is not None:
            out, recorded = self.pending
            self.pending = None
            out.copy_(recorded)

    def before_call(self, func, args: tuple, kwargs: dict, kind) -> None:
        """Told of every torch call of the run first (``CaptureMode``'s ``before``): the
        pending replayed output takes its recorded values now, unless this call is a modelled
        in-place op on it, which the dispatch hands to the op's own replay (a full overwrite
        leaves nothing to copy). No other call can read it before: every torch function and
        tensor method the model calls comes here first, while the run lasts, and a pending
        output left at the end takes its values then (``Simulator._forward``)."""
        p = self.pending
        if p is None:
            return
        if (
            kind is not None
            and kind[1] is not None
            and args
            and args[0] is p[0]
            and (kwargs.get("inplace") or mutates(func))
        ):
            return
        self.materialize()

    def forget(self, t: Tensor) -> None:
        """A float op changed ``t`` in place: its codes and its grid no longer hold."""
        self.qt.drop(t)
        self.grid.drop(t)

    def steady(self) -> bool:
        """A run that needs nothing per op beyond the op table (``steady``: prepared calls)."""
        return not (
            self.op_modes
            or self.replay is not None
            or self.trace is not None
            or self.isolate is not None
            or self.on_call is not None
            or self.calibrating
            or self.grad
        )
