"""The state one run's ops share: its mode and per-op modes, the side tables of codes,
producers and grids, what it records or replays, and what it learned along the way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor

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
