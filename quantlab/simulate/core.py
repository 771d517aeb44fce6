"""Simulator: run one unmodified eager model in float, fake-quant and fixed-point modes.

Ops are captured as the model runs (quantlab.capture); each modelled op quantizes its
activation inputs that arrive unquantized (or in another dtype than its ``input_dtype``), its
weights per channel, and its output at ``output_dtype`` with a calibrated scale. Pass-through
ops keep their input's quantization. In fixed mode integer kernels decide the output codes
(quantlab.simulate.fixed_ops / fixed_gemm); ops without a fixed kernel evaluate their function
on the exact dequantized inputs and quantize the output once (listed as ``float_fallback``).
Quantized tensors carry (dtype, scale, codes) in a side table (quantlab.simulate.qtensor).

The first run (or calibration batch) discovers the op graph: which GEMM feeds a model output
and which ops build a grid_sample grid (platform templates, quantlab.qconfig), and which
Conv/Linear -> batch_norm -> relu6 chains a deployment fuses (quantlab.simulate.fusion).
In-place ops keep the model's aliasing; recorded traces (replay, isolated comparison) are
never changed by later runs.

``Simulator`` holds the public API and composes three parts, one module each: op discovery
(``discovery``: op records, fusions, output feeds, grid chains, validation, the op table),
quantization state (``quant_state``: observers, scales, weight codes, kernel caches) and op
dispatch (``dispatch``: what each captured call becomes in a run). What a call resolved is kept
per op (argument plans, routes: ``op_route``) and, for FAKE and FIXED runs that record nothing
beyond the op table, as a prepared call (``steady``; in FIXED mode, of a GEMM with a weight)
that later calls follow after checking everything it was made from.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from typing import Any

import pandas as pd
import torch
from torch import Tensor, nn
from tqdm import tqdm

from quantlab.capture import CaptureMode, ModuleTracker, model_constants
from quantlab.decompositions import DecomposingMode
from quantlab.op_kinds import OpCategory
from quantlab.platforms import PlatformConfig
from quantlab.qconfig import OpContext, QConfigSpec, ResolvedQConfig, resolve
from quantlab.simulate import blocked_layout
from quantlab.simulate.blocked_layout import BlockedConvs
from quantlab.simulate.discovery import OpDiscovery, _OpInfo
from quantlab.simulate.dispatch import OpDispatch
from quantlab.simulate.model_inputs import (
    InputQuants,
    copy_inputs,
    declared_input_quant,
    input_versions,
    mark_quantized_inputs,
)
from quantlab.simulate.modes import CallObserver, FakeOps, Mode, OpMode, Trace, View
from quantlab.simulate.non_finite import warn_non_finite
from quantlab.simulate.observers import ObserverBank, batch_rules
from quantlab.simulate.profiles import platform_config
from quantlab.simulate.quant_state import QuantizationState
from quantlab.simulate.run_state import RunState
from quantlab.simulate.steady_programs import SteadyPrograms
from quantlab.simulate.training import QatTraining


class Simulator(OpDiscovery, QuantizationState, OpDispatch, QatTraining):
    """Run ``model`` the way QAT (FAKE) and the deployed chip (FIXED) compute it, per platform.

    ``input_quant``: per positional input, an ``InputQuant`` when that input arrives as integer
    codes at a fixed scale (the deployed image input path, ``quantlab.models.input_path``), so
    the first op takes those codes in fake and fixed modes alike; None: what ``model`` declares
    in its ``input_quant`` attribute (nothing by default).

    ``fake_ops``: how FAKE mode computes segment-LUT ops (``FakeOps``: QAT's exact function, or
    the DEPLOYED table). ``steady_programs``: steady FAKE, HYBRID and FIXED runs (no per-op
    overrides or replay) switch to a traced program of the model (``Program``, guarded by torch
    dynamo) once runs of one mode and input signature have taken
    ``steady_programs.PROGRAM_AFTER_S`` seconds and ``PROGRAM_AFTER_RUNS`` runs; the
    same bits, without the per-op capture (``quantlab.simulate.steady_programs``); False keeps
    every run captured. ``blocked_replay``: a FLOAT replay run keeps the float convolutions
    after its studied op in oneDNN's blocked layout where that gives the same bits
    (``quantlab.simulate.blocked_layout``); False computes them as the model does.
    ``train_step`` fine-tunes the model through FAKE (or HYBRID) mode with
    straight-through gradients (``quantlab.simulate.training``). Every run evaluates the model
    in eval mode (BatchNorm running statistics, no Dropout) and
    then restores each module's own train flag; a run never changes the model's parameters,
    buffers or hooks (``train_step`` changes parameters, through its optimizer), and no global
    hook, mode or torch setting outlives a run.
    """

    def __init__(
        self,
        model: nn.Module,
        platform: PlatformConfig | str = "j6m",
        qconfig: QConfigSpec | None = None,
        input_quant: InputQuants | None = None,
        fake_ops: FakeOps = FakeOps.QAT,
        steady_programs: bool = True,
        blocked_replay: bool = True,
    ) -> None:
        self.model = model
        # positional inputs that arrive as codes at a fixed scale (None: what the model declares)
        self.input_quant = tuple(
            declared_input_quant(model) if input_quant is None else input_quant
        )
        if not isinstance(fake_ops, FakeOps):
            allowed = ", ".join(f.name for f in FakeOps)
            raise ValueError(f"fake_ops must be a FakeOps member ({allowed}), got {fake_ops!r}")
        self.fake_ops = fake_ops
        self._learned_scales: dict | None = None  # ScaleTraining.LEARNED: point -> parameter
        self.platform = platform_config(platform) if isinstance(platform, str) else platform
        self.spec = qconfig if qconfig is not None else QConfigSpec()
        self._applied_spec = copy.deepcopy(self.spec)  # as resolved (a spec may change in place)
        self._tracker = ModuleTracker(model)
        self._obs = ObserverBank()
        self._norm_obs: dict[str, list] = {}  # normalisation op -> its step statistics
        self._scale_cache: dict[tuple, Tensor] = {}
        self._wcache: dict[tuple, tuple] = {}
        self._info: dict[str, _OpInfo] = {}
        self._order: list[str] = []
        self._ctx: dict[str, OpContext] = {}
        self._resolved: dict[str, ResolvedQConfig] = {}
        self._discovered = False
        self._decomposes = False  # a captured run split a call into parts (DecomposingMode)
        self._calibrated = False
        # the model's forward writes into its inputs: every run gets a copy (``_forward``)
        self.writes_inputs = False
        self._state: RunState | None = None
        self._chain: dict[str, list[str]] = {}  # GEMM -> fused batch_norm / clamp ops after it
        self._fused_into: dict[str, str] = {}  # fused op -> its GEMM
        self._wide_moves: set[str] = set()  # layout ops moving a wide output (discovery)
        self._fold_cache: dict[str, tuple] = {}
        self._plans: dict[str, tuple] = {}  # op -> (argument layout, its ArgPlan)
        # (op, mode) -> its OpRoute in the latest configuration it ran in, in that mode
        self._routes: dict = {}
        # (op, mode) -> its steady.PreparedCall (steady FAKE and FIXED runs)
        self._prepared: dict = {}
        self._fast: dict[str, dict] = {}
        self._float16_overflow: dict[str, int] = {}  # op -> values beyond +-65504, latest run
        # modelled ops whose fixed kernel declined their latest fixed-mode call for an integer
        # output, so that it computed the float op and quantized its output (a padded pool on
        # a profile without that kernel, 16-bit codes with a zero point into a GEMM, ...)
        self._fixed_in_float: set[str] = set()
        # steady runs' traced programs, per mode and input signature (None: always captured)
        self.steady_programs = SteadyPrograms() if steady_programs else None
        self.blocked_replay = blocked_replay
        self._blocked_convs = BlockedConvs()
        self._blocked_plan: tuple[tuple, dict] = ((), {})  # (op order, blocked_layout.plan)

    # ------------------------------------------------------------------ public API
    def calibrate(
        self, batches: Iterable[tuple[Tensor, ...]], progress: bool = True, observers: Iterable = ()
    ) -> None:
        """Run float mode over ``batches`` (each a tuple of model inputs) and feed the observers
        (a progress bar on stderr unless ``progress`` is False).

        ``observers``: rules (``quantlab.calibration.ObserverChoice`` or ``ObserverKind``) to
        gather per-batch statistics for besides the qconfig's own, so that a later qconfig can
        use them (only MSE, MIX and PERCENTILE search each batch; every other rule, HISTOGRAM
        methods included, can be chosen after calibration anyway).
        """
        n = 0
        rules = batch_rules(self.spec, self.platform, observers)
        for batch in tqdm(batches, desc="calibrate") if progress else batches:
            batch = batch if isinstance(batch, (tuple, list)) else (batch,)
            if not self._discovered:  # find ops and fusions before observing anything
                self._forward(tuple(batch), RunState(Mode.FLOAT, {}))
            self._obs.start_batch(rules)
            st = RunState(Mode.FLOAT, {}, calibrating=True)
            self._forward(tuple(batch), st)
            n += 1
        if n == 0:
            raise ValueError("calibrate() needs at least one batch")
        self._calibrated = True
        self._scale_cache.clear()
        warn_non_finite(self.non_finite_points(), self.platform.quantize_cast)

    def non_finite_points(self) -> dict[str, tuple[int, int]]:
        """Activation point -> (NaN and +-inf values, all values) calibration saw there, for
        every point that saw any (``non_finite_words`` says what it means)."""
        return self._obs.non_finite()

    def share_calibration(self, other: Simulator, learned_scales: bool = False) -> None:
        """Calibrate by ``other``'s statistics and scales instead of running ``calibrate``: for
        a simulator of a copy of ``other``'s model (same ops) on the same platform and qconfig
        (e.g. one fine-tuning copy per training variant, or the deployed form of a fine-tuned
        model). The statistics are shared, not copied (a later ``calibrate`` on either adds to
        both); the scales computed so far are copied. ``learned_scales``: also run at
        ``other``'s learned activation scales (``learn_scales``; the same parameters)."""
        if not other._calibrated:
            raise ValueError("share_calibration: the other simulator is not calibrated")
        if other.platform != self.platform or other.spec != self.spec:
            raise ValueError("share_calibration needs the same platform and qconfig")
        self._obs = other._obs
        self._norm_obs = other._norm_obs
        self._scale_cache = dict(other._scale_cache)
        if learned_scales:
            self._learned_scales = other._learned_scales
        self._calibrated = True

    def histogram(self, op_name: str, input_index: int | None = 0) -> tuple[Tensor, Tensor]:
        """(bin_edges (bins + 1,), counts (bins,)), float64, of every finite value that reached
        activation input ``input_index`` of op ``op_name`` in the calibration runs (None: the
        op's output; for a fused Conv/Linear chain, the chain's output).

        Equal bins over [-M, M], M a power of two >= max |x| (doubled as values grow; counts
        are exact), exact zeros counted in the bin [0, width): ObserverKind.HISTOGRAM's
        histogram, kept whatever the op's observer. ValueError naming the op's calibrated
        points if that point saw no calibration value.
        """
        key = "out" if input_index is None else f"in{input_index}"
        obs = self._obs.get(f"{op_name}/{key}")
        if obs is None:
            known = [k for k, _ in self._obs.items() if k.startswith(f"{op_name}/")]
            raise ValueError(
                f"no calibration statistics for {op_name}/{key}; calibrate first (points of "
                f"this op: {', '.join(known) or 'none'})"
            )
        return obs.histogram()

    def run(
        self,
        *inputs: Any,
        mode: Mode | str = Mode.FIXED,
        op_modes: Mapping[str, OpMode] | None = None,
        replay: Trace | None = None,
    ) -> Any:
        """What ``model(*inputs)`` returns, computed in ``mode`` (with per-op overrides).

        With ``replay``, every op executed before the first op named in ``op_modes`` returns its
        recorded output instead of being recomputed. A FLOAT run without ``op_modes`` or
        ``replay`` (after the first run) is ``model(*inputs)`` in eval mode under no_grad,
        nothing captured. Any other run without them runs as a traced program once runs of the
        same mode and input signature have taken a few seconds (``steady_programs``), with the
        same bits.
        """
        st = self._new_state(mode, op_modes, replay)
        if (
            self.steady_programs is not None
            and st.mode is not Mode.FLOAT
            and not st.op_modes
            and st.replay is None
        ):
            run = self.steady_programs.run  # a program, or _forward: both copy the inputs
            return run(self, inputs, st.mode, lambda: self._forward(inputs, st))
        return self._forward(inputs, st)

    def program(self, *inputs: Any, mode: Mode | str = Mode.FIXED, leaves: Iterable[Callable] = ()):
        """``sim.run(..., mode=mode)`` (FAKE, HYBRID or FIXED) for inputs shaped like ``inputs``
        as generated code with the per-op capture traced away
        (``quantlab.simulate.program.Program``): the same bits, proven on ``inputs`` while
        building (two runs in ``mode``, a torch.fx trace and a named run of it). ProgramError (a
        ValueError) when torch.fx cannot trace the model or the traced graph does not run the
        model's ops as the model does.

        ``leaves``: functions the trace calls as they are instead of tracing into (library
        code that tests ``isinstance(x, torch.Tensor)``), besides the model's own
        ``trace_leaves`` attribute; torch.fx finds a leaf where the calling code names it by a
        global name not starting with ``_``. A leaf must not compute modelled ops."""
        from quantlab.simulate.program import Program

        return Program(self, inputs, Mode.parse(mode), leaves)

    def trace(
        self,
        *inputs: Any,
        mode: Mode | str = Mode.FIXED,
        op_modes: Mapping[str, OpMode] | None = None,
        replay: Trace | None = None,
        on_call: CallObserver | None = None,
        stop_after: str | None = None,
        _isolate: Trace | None = None,
    ):
        """Run once in ``mode`` (per-op overrides and replay as in ``run``) and record every
        captured op's output, each as the op returned it, whatever the run wrote into that
        memory later (``trace_record``); ``on_call``, when given, is told of every captured
        call after it ran (an ``ObservedCall``: the call, the quantization its activation
        inputs arrived with, its output), in execution order. ``stop_after``: the run ends
        once the op of that name has run (the trace holds it and every op before it,
        ``result`` None; nothing the simulator learns from a whole run is taken from it)."""
        st = self._new_state(mode, op_modes, replay)
        st.on_call = on_call if stop_after is None else _stopping(on_call, stop_after)
        st.trace = Trace(Mode.parse(mode))
        st.isolate = _isolate
        try:
            st.trace.result = self._forward(inputs, st)
        except _RunStopped:
            st.trace.result = None
        st.trace.float16_overflow = dict(st.float16_overflow)
        st.trace.float_ops = set(st.float_ops)
        st.trace.fused = set(st.fused_done)
        return st.trace

    def compare(
        self, *inputs: Any, a: Mode | str, b: Mode | str, view: View = View.ACCUMULATED
    ) -> pd.DataFrame:
        """Per-op comparison of modes ``a`` (reference) and ``b``; see analysis.compare."""
        from quantlab.analysis.compare import compare_modes

        return compare_modes(self, inputs, Mode.parse(a), Mode.parse(b), view)

    def set_qconfig(self, spec: QConfigSpec) -> None:
        """Replace the qconfig rules and re-resolve every op (calibration statistics are kept;
        where only ``by_name`` entries changed, only the ops they name: no other op's
        resolution reads them, ``qconfig.resolve``; compared with a copy of the spec last
        applied, as a caller may change one in place and apply it again)."""
        renamed = _by_name_changes(self._applied_spec, spec)
        self.spec, self._applied_spec = spec, copy.deepcopy(spec)
        if renamed is None:
            self._resolved.clear()
        for name in renamed or ():
            self._resolved.pop(name, None)
        # activation scales stay: their cache key holds every qconfig field a scale depends on
        self._fold_cache.clear()
        self._fast.clear()
        self._routes.clear()
        if self._discovered:
            self._validate()

    def supported(self, op_type: str, category: OpCategory | None) -> bool:
        """Whether ``op_type`` runs quantized on this platform (else it falls back to float;
        ``PlatformConfig.runs_quantized``)."""
        return self.platform.runs_quantized(op_type, category)

    @property
    def float16_overflow(self) -> dict[str, int]:
        """Per op of the latest run: how many finite values beyond +-65504 it cast to float16
        (before saturation; ops with none are left out). Replayed ops are not recounted."""
        return dict(self._float16_overflow)

    def qconfig_of(self, name: str) -> ResolvedQConfig:
        """The resolved qconfig of op ``name``."""
        rq = self._resolved.get(name)
        if rq is None:
            inf = self._info.get(name)
            ctx = self._ctx.get(name)
            if ctx is None:
                if inf is None:
                    raise ValueError(f"unknown op {name!r}; run the model first")
                ctx = OpContext(name, inf.op_type, inf.module)
            rq = resolve(self.spec, self.platform, ctx)
            self._resolved[name] = rq
        return rq

    # ------------------------------------------------------------------ running
    def _new_state(self, mode, op_modes, replay) -> RunState:
        mode = Mode.parse(mode)
        op_modes = dict(op_modes or {})
        if mode is not Mode.FLOAT or any(m.mode is not Mode.FLOAT for m in op_modes.values()):
            if not self._calibrated:
                raise ValueError("run in FAKE or FIXED mode needs calibrate(batches) first")
        if op_modes and self._discovered:
            unknown = [n for n in op_modes if n not in self._info]
            if unknown:
                listing = "\n  ".join(self._order)
                raise ValueError(f"op_modes names unknown op(s) {unknown}; ops:\n  {listing}")
        st = RunState(mode, op_modes, replay=replay, replay_active=replay is not None)
        if replay is not None:  # a studied op fused into a GEMM is computed with its chain
            st.replay_stops = frozenset(self._fused_into.get(n, n) for n in op_modes)
        return st

    def _blocked_convs_of_graph(self) -> dict | None:
        """``blocked_layout.plan`` of the discovered op graph (kept while the op order stays);
        None where torch has no oneDNN."""
        if not blocked_layout.available():
            return None
        order = tuple(self._order)
        if self._blocked_plan[0] != order:
            self._blocked_plan = (order, blocked_layout.plan(self._order, self._info, self._chain))
        return self._blocked_plan[1] or None

    def _plain(self, st: RunState) -> bool:
        """A FLOAT run that needs nothing recorded (ops discovered, no overrides, replay,
        trace or calibration): the model runs as written, with nothing captured (a call the
        capture splits into parts, attention, runs by its parts: ``DecomposingMode``)."""
        return (
            self._discovered
            and st.mode is Mode.FLOAT
            and not st.op_modes
            and st.replay is None
            and st.trace is None
            and st.isolate is None
            and not st.calibrating
        )

    def _forward(self, inputs: tuple, st: RunState) -> Any:
        """One run of the model on ``inputs`` as ``st`` says. A model found to write into its
        inputs (``writes_inputs``; checked by their version counters on every run until found,
        the first run on a copy) runs on a copy of them: a loop that reuses a batch (calibration,
        sensitivity, comparisons) hands every run the batch as given."""
        copied = self.writes_inputs or not self._discovered
        if copied:
            inputs = copy_inputs(inputs)
        versions = None if self.writes_inputs else input_versions(inputs)
        out = self._run_model(inputs, st)
        if versions is not None and not self.writes_inputs and input_versions(inputs) != versions:
            self.writes_inputs = True
            warnings.warn(
                f"{type(self.model).__name__}.forward writes into its input in place"
                + ("" if copied else " (this run wrote into the tensors it was given)")
                + "; every later run gets a copy of its inputs, so runs that reuse a batch see "
                "it as given",
                stacklevel=3,
            )
        return out

    def _run_model(self, inputs: tuple, st: RunState) -> Any:
        if not self._discovered and (st.mode is not Mode.FLOAT or st.op_modes):
            self._forward(inputs, RunState(Mode.FLOAT, {}))
        plain = self._plain(st)
        prev, self._state = self._state, st
        # modules added to the model after the tracker was made: a captured run in which no
        # known module trains leaves them to the tracker (it switches them to eval); otherwise
        # a walk finds them
        training = [] if plain else self._tracker.training_modules()
        if plain or training:
            training = _training_modules(self.model)
        try:
            if training:
                self.model.eval()
            if plain:  # as a captured FLOAT run computes: a split call by its parts
                with torch.no_grad(), DecomposingMode() if self._decomposes else nullcontext():
                    return self.model(*inputs)
            mark_quantized_inputs(st.qt, inputs, self.input_quant)
            if self.blocked_replay and st.defers_copies() and st.mode is Mode.FLOAT:
                st.blocked = self._blocked_convs_of_graph()
            capture = CaptureMode(
                self._tracker,
                self._handle,
                st.forget,
                st.before_call if st.watches_calls() else None,
                model_constants(self.model),
            )
            with torch.enable_grad() if st.grad else torch.no_grad(), self._tracker, capture:
                out = self.model(*inputs)
            if st.blocked_used:  # a run departing from the discovered graph returned one
                out = blocked_layout.dense_leaves(out)
            self._decomposes |= capture.decomposed
        finally:
            st.materialize_all()  # replayed outputs the model still holds get their values
            for m in training:
                m.training = True
            for m in self._tracker.switched:  # modules added to the model after the tracker
                m.training = True
            self._tracker.switched = []
            self._state = prev
        for name in st.order:
            self._info[name] = st.infos[name]
        self._order = list(st.order)
        self._float16_overflow = dict(st.float16_overflow)
        if not self._ctx.keys() >= set(st.order):
            self._discover(out, st)
        return out


def _by_name_changes(old: QConfigSpec, new: QConfigSpec) -> set[str] | None:
    """The op names whose ``by_name`` rule differs between ``old`` and ``new`` where nothing
    else does; None where anything else differs."""
    if dataclasses.replace(new, by_name=old.by_name) != old:
        return None
    names = old.by_name.keys() | new.by_name.keys()
    return {n for n in names if old.by_name.get(n) != new.by_name.get(n)}


class _RunStopped(BaseException):
    """Ends a ``trace(stop_after=...)`` run (a BaseException: a model's own ``except
    Exception`` does not take it)."""


def _stopping(on_call: CallObserver | None, name: str) -> CallObserver:
    """``on_call`` (where given), then the end of the run once the op ``name`` has run."""

    def observe(observed) -> None:
        if on_call is not None:
            on_call(observed)
        if observed.call.name == name:
            raise _RunStopped

    return observe


def _training_modules(model: nn.Module) -> list[nn.Module]:
    """Every module of ``model`` whose train flag is set (each once)."""
    found, todo, seen = [], [model], {id(model)}
    while todo:
        m = todo.pop()
        if m.training:
            found.append(m)
        for c in m._modules.values():
            if c is not None and id(c) not in seen:
                seen.add(id(c))
                todo.append(c)
    return found
