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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten

from quantlab.capture import CaptureMode, ModuleTracker, OpCall, OpCategory
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import compute_scale, dequantize, fake_cast, quantize
from quantlab.numerics.split import check_split_target, split_fake_weight
from quantlab.platforms import PlatformConfig
from quantlab.qconfig import (
    GEMM_TYPES,
    ObserverKind,
    OpContext,
    QConfigSpec,
    ResolvedQConfig,
    resolve,
    validate_names,
)
from quantlab.simulate import args as A
from quantlab.simulate import calls, fixed_ops
from quantlab.simulate.fusion import find_fusions, fold_batch_norm
from quantlab.simulate.modes import Mode, OpMode, Trace, View
from quantlab.simulate.observers import ObserverBank, batch_rules, observer_key, weight_amax
from quantlab.simulate.profiles import platform_config
from quantlab.simulate.qat import fake_grid, qat_fake_quant
from quantlab.simulate.qtensor import QInfo, QTable


@dataclass
class _OpInfo:
    name: str
    op_type: str
    category: OpCategory | None
    module: str
    call_index: int
    input_shapes: list
    output_shape: tuple | None
    has_weight: bool
    flops: int
    producers: list  # producer op name (or None) of each activation input
    input_dtypes: list = field(default_factory=list)
    post: tuple | None = None  # batch_norm: (mean, var, weight, bias, eps); clamp: (lo, hi)


@dataclass
class _RunState:
    mode: Mode
    op_modes: Mapping[str, OpMode]
    replay: Trace | None = None
    replay_active: bool = False
    calibrating: bool = False
    trace: Trace | None = None
    isolate: Trace | None = None
    qt: QTable = field(default_factory=QTable)
    producers: QTable = field(default_factory=QTable)
    order: list = field(default_factory=list)
    infos: dict = field(default_factory=dict)
    float_ops: set = field(default_factory=set)  # ops run in float by choice of mode
    fused_done: set = field(default_factory=set)  # GEMMs that ran with their fused chain


class Simulator:
    """Run ``model`` the way QAT (FAKE) and the deployed chip (FIXED) compute it, per platform."""

    def __init__(
        self,
        model: nn.Module,
        platform: PlatformConfig | str = "j6m",
        qconfig: QConfigSpec | None = None,
    ) -> None:
        self.model = model.eval()
        self.platform = platform_config(platform) if isinstance(platform, str) else platform
        self.spec = qconfig if qconfig is not None else QConfigSpec()
        self._tracker = ModuleTracker(model)
        self._obs = ObserverBank()
        self._scale_cache: dict[tuple, Tensor] = {}
        self._wcache: dict[tuple, tuple] = {}
        self._info: dict[str, _OpInfo] = {}
        self._order: list[str] = []
        self._ctx: dict[str, OpContext] = {}
        self._resolved: dict[str, ResolvedQConfig] = {}
        self._discovered = False
        self._calibrated = False
        self._state: _RunState | None = None
        self._chain: dict[str, list[str]] = {}  # GEMM -> fused batch_norm / clamp ops after it
        self._fused_into: dict[str, str] = {}  # fused op -> its GEMM
        self._fold_cache: dict[str, tuple] = {}
        self._fast: dict[str, dict] = {}

    # ------------------------------------------------------------------ public API
    def calibrate(self, batches: Iterable[tuple[Tensor, ...]], observers: Iterable = ()) -> None:
        """Run float mode over ``batches`` (each a tuple of model inputs) and feed the observers.

        ``observers``: rules (``quantlab.calibration.ObserverChoice`` or ``ObserverKind``) to
        gather per-batch statistics for besides the qconfig's own, so that a later qconfig can
        use them (only MSE, MIX and PERCENTILE search each batch; every other rule, HISTOGRAM
        methods included, can be chosen after calibration anyway).
        """
        from quantlab.progress import progress

        n = 0
        rules = batch_rules(self.spec, self.platform, observers)
        for batch in progress(batches, "calibrate"):
            batch = batch if isinstance(batch, (tuple, list)) else (batch,)
            if not self._discovered:  # find ops and fusions before observing anything
                self._forward(tuple(batch), _RunState(Mode.FLOAT, {}))
            self._obs.start_batch(rules)
            st = _RunState(Mode.FLOAT, {}, calibrating=True)
            self._forward(tuple(batch), st)
            n += 1
        if n == 0:
            raise ValueError("calibrate() needs at least one batch")
        self._calibrated = True
        self._scale_cache.clear()

    def run(
        self,
        *inputs: Any,
        mode: Mode | str = Mode.FIXED,
        op_modes: Mapping[str, OpMode] | None = None,
        replay: Trace | None = None,
    ) -> Any:
        """What ``model(*inputs)`` returns, computed in ``mode`` (with per-op overrides).

        With ``replay``, every op executed before the first op named in ``op_modes`` returns its
        recorded output instead of being recomputed.
        """
        st = self._new_state(mode, op_modes, replay)
        return self._forward(inputs, st)

    def trace(
        self,
        *inputs: Any,
        mode: Mode | str = Mode.FIXED,
        op_modes: Mapping[str, OpMode] | None = None,
        replay: Trace | None = None,
        _isolate: Trace | None = None,
    ):
        """Run once in ``mode`` (per-op overrides and replay as in ``run``) and record every
        captured op's output."""
        st = self._new_state(mode, op_modes, replay)
        st.trace = Trace(Mode.parse(mode))
        st.isolate = _isolate
        st.trace.result = self._forward(inputs, st)
        return st.trace

    def compare(
        self, *inputs: Any, a: Mode | str, b: Mode | str, view: View = View.ACCUMULATED
    ) -> pd.DataFrame:
        """Per-op comparison of modes ``a`` (reference) and ``b``; see analysis.compare."""
        from quantlab.analysis.compare import compare_modes

        return compare_modes(self, inputs, Mode.parse(a), Mode.parse(b), view)

    def set_qconfig(self, spec: QConfigSpec) -> None:
        """Replace the qconfig rules and re-resolve every op (calibration statistics are kept)."""
        self.spec = spec
        self._resolved.clear()
        # activation scales stay: their cache key holds every qconfig field a scale depends on
        self._fold_cache.clear()
        self._fast.clear()
        if self._discovered:
            self._validate()

    @property
    def ops(self) -> pd.DataFrame:
        """One row per captured op call of the latest run, in execution order."""
        rows = []
        for name in self._order:
            inf = self._info[name]
            rq = self.qconfig_of(name) if inf.category is not None else None
            rows.append(
                {
                    "name": name,
                    "op_type": inf.op_type,
                    "module": inf.module,
                    "call_index": inf.call_index,
                    "input_shapes": inf.input_shapes,
                    "output_shape": inf.output_shape,
                    "supported": self.supported(inf.op_type, inf.category),
                    "category": inf.category.name if inf.category else "NONE",
                    "fixed_kernel": (
                        f"fused into {self._fused_into[name]}"
                        if name in self._fused_into
                        else fixed_ops.kernel_name(inf.op_type, inf.category, self)
                    ),
                    "input_dtype": calls.dt_names(inf.input_dtypes),
                    "weight_dtype": rq.weight_dtype.name if rq and inf.has_weight else "",
                    "output_dtype": self._out_dtype(name).name if rq else "FLOAT32",
                    "has_weight": inf.has_weight,
                    "fused_into": self._fused_into.get(name, ""),  # the GEMM computing this op
                    "flops": inf.flops,
                }
            )
        return pd.DataFrame(rows)

    def supported(self, op_type: str, category: OpCategory | None) -> bool:
        """Whether ``op_type`` runs quantized on this platform (else it falls back to float)."""
        if category is None:
            return False
        sup = self.platform.supported_ops
        return not sup or op_type in sup

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
    def _new_state(self, mode, op_modes, replay) -> _RunState:
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
        return _RunState(mode, op_modes, replay=replay, replay_active=replay is not None)

    def _forward(self, inputs: tuple, st: _RunState) -> Any:
        if not self._discovered and (st.mode is not Mode.FLOAT or st.op_modes):
            self._forward(inputs, _RunState(Mode.FLOAT, {}))
        prev, self._state = self._state, st
        try:
            with (
                torch.no_grad(),
                self._tracker,
                CaptureMode(self._tracker, self._handle, st.qt.drop),
            ):
                out = self.model(*inputs)
        finally:
            self._state = prev
        for name in st.order:
            self._info[name] = st.infos[name]
        self._order = list(st.order)
        if any(n not in self._ctx for n in st.order):
            self._discover(out, st)
        return out

    def _discover(self, out: Any, st: _RunState) -> None:
        self._find_fusions(st)
        feeds = set()
        for leaf in tree_flatten(out)[0]:
            p = st.producers.get(leaf)
            while p is not None:
                inf = st.infos[p]
                if inf.category is not OpCategory.PASS_THROUGH:
                    feeds.add(self._fused_into.get(p, p))
                    break
                p = inf.producers[0] if inf.producers else None
        chain = set()
        for name in st.order:
            inf = st.infos[name]
            if inf.category is OpCategory.GRID_SAMPLE and len(inf.producers) > 1:
                todo, depth = [inf.producers[1]], 0
                while todo and depth < 64:
                    p = todo.pop()
                    depth += 1
                    if p is None or p in chain:
                        continue
                    chain.add(p)
                    pinf = st.infos[p]
                    if pinf.op_type not in GEMM_TYPES:
                        todo.extend(pinf.producers)
        for name in st.order:
            if name not in self._ctx:
                inf = st.infos[name]
                self._ctx[name] = OpContext(
                    name, inf.op_type, inf.module, name in feeds, name in chain
                )
                self._resolved.pop(name, None)
        self._discovered = True
        self._validate()

    def _find_fusions(self, st: _RunState) -> None:
        find_fusions(st.order, st.infos, self._chain, self._fused_into)

    def _validate(self) -> None:
        from quantlab.capture import KNOWN_OP_TYPES

        validate_names(self.spec, self._order, set(KNOWN_OP_TYPES))
        out_dt: dict[str, DType] = {}
        for name in self._order:
            inf = self._info[name]
            if inf.category is None or not self.supported(inf.op_type, inf.category):
                out_dt[name] = DType.FLOAT32
                continue
            rq = self.qconfig_of(name)
            ins = [
                rq.input_dtype or (out_dt.get(p) if p else None) or rq.output_dtype
                for p in inf.producers
            ]
            inf.input_dtypes = ins
            if inf.category is OpCategory.PASS_THROUGH and ins:
                out_dt[name] = ins[0]
            else:
                out_dt[name] = self._out_dtype(name)
            if inf.category is OpCategory.GEMM:
                ops = ins + ([rq.weight_dtype] if inf.has_weight else [])
                self._check_gemm(name, inf.op_type, ops)
            if rq.weight_split:
                check_split_target(name, inf.op_type, inf.has_weight, rq.weight_split)
                if rq.weight_dtype is not DType.INT8:
                    raise ValueError(
                        f"op {name}: weight_split={rq.weight_split} splits an INT8 weight, but "
                        f"weight_dtype={rq.weight_dtype.name}; allowed: INT8"
                    )
            if inf.category is OpCategory.GRID_SAMPLE and inf.input_shapes:
                self._check_grid(name, inf.input_shapes[0])

    def _out_dtype(self, name: str) -> DType:
        rq = self.qconfig_of(name)
        inf = self._info.get(name)
        if inf is not None and inf.category is OpCategory.GEMM and rq.high_precision_output:
            return self.platform.high_precision_output
        return rq.output_dtype

    def _check_gemm(self, name: str, op_type: str, dtypes: list) -> None:
        n16 = sum(1 for d in dtypes if d is DType.INT16)
        if n16 >= 2 and self.platform.max_int16_gemm_operands < 2:
            raise ValueError(
                f"op {name} ({op_type}): int16 x int16 GEMM is not available on "
                f"{self.platform.name} (platform.max_int16_gemm_operands="
                f"{self.platform.max_int16_gemm_operands}); make the input or the weight INT8"
            )

    def _check_grid(self, name: str, shape) -> None:
        if len(shape) != 4:
            return
        h, w = int(shape[2]), int(shape[3])
        side, area = self.platform.grid_max_side, self.platform.grid_max_area
        if side and (h > side or w > side) or area and h * w > area:
            raise ValueError(
                f"op {name} (grid_sample): input H={h}, W={w} exceeds the {self.platform.name} "
                f"limits H, W <= {side} (platform.grid_max_side) and H*W <= {area} "
                "(platform.grid_max_area)"
            )

    # ------------------------------------------------------------------ one op
    def _handle(self, call: OpCall) -> Any:
        st = self._state
        assert st is not None
        om = st.op_modes.get(call.name)
        plan = A.plan(call) if call.category is not None else A.ArgPlan(calls.float_slots(call))
        inf = self._record(call, plan, st)
        if st.replay_active:
            if om is not None:
                st.replay_active = False
            elif call.name in st.replay.outputs:
                out = calls.substitute(call, st.replay.outputs[call.name])
                self._set_out_info(out, st.replay.qinfo.get(call.name), st, call.name)
                if st.mode is Mode.FLOAT:
                    st.float_ops.add(call.name)
                return out
        mode = om.mode if om is not None else st.mode
        target = calls.inplace_target(call)
        if target is not None:
            self._guard_inplace(st, target)
        head = self._fused_into.get(call.name)
        if head is not None and head in st.fused_done:  # computed by its GEMM already
            out = A.get(call.args, call.kwargs, plan.acts[0])
            info = st.qt.get(out)
            if head in st.float_ops:  # the chain's output stayed float (quantize_output=False)
                st.float_ops.add(call.name)
        elif call.result is not None:  # not modelled: ran in float already
            out, info = call.result, None
        elif mode is Mode.FLOAT or not self.supported(call.op_type, call.category):
            out, info = call.run(), None
            if mode is Mode.FLOAT:
                st.float_ops.add(call.name)
            if st.calibrating:
                self._observe(call, plan, out)
        else:
            out, info = self._run_quantized(call, plan, mode, om, st)
            if om is not None and not om.quantize_output and mode is Mode.FAKE:
                st.float_ops.add(call.name)  # its float output is not re-quantized downstream
        inf.output_shape = calls.shape_of(out)
        inf.flops = calls.flops(call, plan, out)
        if st.trace is not None:
            st.trace.order.append(call.name)
            # an in-place op's output may change again later: record a copy
            st.trace.outputs[call.name] = (
                out.clone() if isinstance(out, Tensor) and calls.is_inplace(call) else out
            )
            st.trace.qinfo[call.name] = info
        if st.isolate is not None and call.name in st.isolate.outputs:
            out = calls.substitute(call, st.isolate.outputs[call.name])
            info = st.isolate.qinfo.get(call.name)
        self._set_out_info(out, info, st, call.name)
        return out

    def _record(self, call: OpCall, plan: A.ArgPlan, st: _RunState) -> _OpInfo:
        shapes, producers = [], []
        for slot in plan.acts:
            v = A.get(call.args, call.kwargs, slot)
            if isinstance(v, Tensor):
                shapes.append(tuple(v.shape))
                producers.append(st.producers.get(v))
            else:
                shapes.append(())
                producers.append(None)
        w = A.get(call.args, call.kwargs, plan.weight) if plan.weight else None
        inf = _OpInfo(
            call.name,
            call.op_type,
            call.category,
            call.module,
            call.call_index,
            shapes,
            None,
            w is not None,
            0,
            producers,
        )
        old = self._info.get(call.name)
        if old is not None:
            inf.input_dtypes = old.input_dtypes
        inf.post = calls.post_params(call)
        st.infos[call.name] = inf
        st.order.append(call.name)
        return inf

    def _set_out_info(self, out: Any, info: Any, st: _RunState, name: str) -> None:
        leaves = tree_flatten(out)[0]
        infos = info if isinstance(info, list) else [info] * len(leaves)
        for leaf, li in zip(leaves, infos):
            if isinstance(leaf, Tensor):
                st.producers.set(leaf, name)
                if li is not None:
                    st.qt.set(leaf, li)
                else:
                    st.qt.drop(leaf)

    def _observe(self, call: OpCall, plan: A.ArgPlan, out: Any) -> None:
        for i, slot in enumerate(plan.acts):
            v = A.get(call.args, call.kwargs, slot)
            if A.is_float_tensor(v):
                self._obs.observe(f"{call.name}/in{i}", v)
        o = tree_flatten(out)[0]
        if not o or not A.is_float_tensor(o[0]) or call.category is OpCategory.PASS_THROUGH:
            return
        key = call.name
        if call.name in self._chain and self._chain[call.name]:
            return  # observed after the last fused op
        head = self._fused_into.get(call.name)
        if head is not None:
            if self._chain[head][-1] != call.name:
                return
            key = head
        self._obs.observe(f"{key}/out", o[0])

    # ------------------------------------------------------------------ quantization
    def act_scale(self, name: str, key: str, dtype: DType, rq: ResolvedQConfig) -> Tensor:
        """Calibrated float32 scale of activation point ``name/key`` at integer ``dtype``."""
        ck = (name, key, dtype, observer_key(rq))
        s = self._scale_cache.get(ck)
        if s is not None:
            return s
        if rq.observer is ObserverKind.FIXED:
            s = torch.tensor(rq.fixed_scale, dtype=torch.float32)
        else:
            obs = self._obs.get(f"{name}/{key}")
            if obs is None:
                raise ValueError(
                    f"op {name}: no calibration statistics for its {key}; calibrate with inputs "
                    "that reach this op"
                )
            amax = obs.amax(rq, dtype, self.platform.scale_rule, self.platform.fake_round)
            s = compute_scale(amax, dtype, self.platform.scale_rule)
        self._scale_cache[ck] = s
        return s

    def fast_cache(self, name: str) -> dict:
        """A per-op scratch dict for fixed-mode kernels (encoded multipliers, cast weights)."""
        return self._fast.setdefault(name, {})

    def histogram(self, op_name: str, input_index: int | None = 0) -> tuple[Tensor, Tensor]:
        """(bin_edges, counts) of every calibration value at input ``input_index`` of op
        ``op_name`` (None: its output); float64, equal bins over [-M, M] with M a power of two
        >= max |x|, exact zeros in the bin [0, width) (ObserverKind.HISTOGRAM's histogram)."""
        key = "out" if input_index is None else f"in{input_index}"
        obs = self._obs.get(f"{op_name}/{key}")
        if obs is None:
            known = [k for k, _ in self._obs.items() if k.startswith(f"{op_name}/")]
            raise ValueError(
                f"no calibration statistics for {op_name}/{key}; calibrate first (points of "
                f"this op: {', '.join(known) or 'none'})"
            )
        return obs.histogram()

    def observed_range(self, name: str, key: str) -> tuple[float, float] | None:
        """Running (min, max) seen at activation point ``name/key`` during calibration."""
        obs = self._obs.get(f"{name}/{key}")
        if obs is None or not obs.run_max > obs.run_min:
            return None
        return obs.run_min, obs.run_max

    def weight_q(self, name: str, w: Tensor, dtype: DType, per_channel: bool):
        """(codes in ``dtype``'s torch dtype, float32 scale per channel) of a weight; cached
        until the weight changes (its ``_version``)."""
        entry = self._weight_entry(name, w, dtype, per_channel)
        return entry[2], entry[3]

    def _weight_entry(self, name: str, w: Tensor, dtype: DType, per_channel: bool) -> list:
        ck = (name, dtype, per_channel)
        hit = self._wcache.get(ck)
        if hit is not None and hit[0] is w and hit[1] == w._version:
            return hit
        amax = weight_amax(w, per_channel)
        s = compute_scale(
            amax, dtype, self.platform.scale_rule, narrow_range=self.platform.weight_narrow_range
        )
        lo = -dtype.qmax if self.platform.weight_narrow_range else None
        axis = 0 if per_channel else None
        codes = quantize(w.detach(), s, dtype, self.platform.fake_round, axis=axis, qmin=lo)
        hit = [w, w._version, codes, s, {}]
        self._wcache[ck] = hit
        return hit

    def weight_value(
        self, name: str, w: Tensor, dtype: DType, mode: Mode, split: int = 0
    ) -> Tensor:
        """The float weight an op computes with: QAT fake quant (FAKE) or codes * scale
        (FIXED), per output channel; with ``split`` = k the high/low weight
        s * (w_hi + w_lo / 2**k) (numerics.split); cached with the codes."""
        entry = self._weight_entry(name, w, dtype, True)
        values = entry[4]
        key = (mode, split)
        if key not in values:
            codes, s = entry[2], entry[3]
            if split:
                values[key] = split_fake_weight(w.detach(), s, split, 0, self.platform.fake_round)
            elif mode is Mode.FIXED:
                values[key] = dequantize(codes, s, axis=0)
            else:
                lo = -dtype.qmax if self.platform.weight_narrow_range else None
                values[key] = qat_fake_quant(w, s, dtype, self.platform.fake_round, 0, lo)
        return values[key]

    def quantize_act(
        self, name: str, key: str, x: Tensor, dtype: DType, rq, mode: Mode, bounds=None
    ):
        """(value, QInfo) of ``x`` quantized at activation point ``name/key`` (FAKE mode:
        ``bounds`` = a fused clamp applied in the same pass)."""
        if dtype.is_float:
            y = fake_cast(x, dtype, self.platform.float16_saturate)
            return y, QInfo(dtype)
        s = self.act_scale(name, key, dtype, rq)
        if mode is not Mode.FIXED:
            y = qat_fake_quant(x, s, dtype, self.platform.fake_round, bounds=bounds)
            return y, QInfo(dtype, s)
        codes = quantize(x, s, dtype, self.platform.fake_round)
        return dequantize(codes, s), QInfo(dtype, s, codes)

    def _guard_inplace(self, st: _RunState, target: Tensor) -> None:
        """Before an in-place op changes ``target``: this run's trace keeps a copy of it."""
        if st.trace is not None:
            p = st.producers.get(target)
            if p is not None and st.trace.outputs.get(p) is target:
                st.trace.outputs[p] = target.clone()

    def _run_quantized(self, call, plan, mode, om, st):
        """Quantized result of one op; an in-place op writes it into its target tensor (so
        aliases see it, as in the model) and the target's side-table entry is replaced."""
        out, info = self._run_quantized_value(call, plan, mode, om, st)
        target = calls.inplace_target(call)
        if target is not None and isinstance(out, Tensor) and out.shape == target.shape:
            target.copy_(out)
            return target, info
        return out, info

    def _run_quantized_value(self, call, plan, mode, om, st):
        rq = self.qconfig_of(call.name)
        args, kwargs = list(call.args), dict(call.kwargs)
        if kwargs.get("inplace"):
            kwargs["inplace"] = False  # computed out of place, then written by _run_quantized
        in_infos: list = []
        for i, slot in enumerate(plan.acts):
            v = A.get(args, kwargs, slot)
            if not A.is_float_tensor(v):
                in_infos.append(None)
                continue
            info = st.qt.get(v)
            if info is None and mode is Mode.FAKE and st.producers.get(v) in st.float_ops:
                in_infos.append(None)  # a float op's output stays float (sensitivity runs)
                continue
            want = rq.input_dtype or (info.dtype if info is not None else rq.output_dtype)
            if info is None or info.dtype is not want:
                if info is not None and info.dtype.is_float and want.is_float:
                    v, info = fake_cast(v, want, self.platform.float16_saturate), QInfo(want)
                else:
                    v, info = self.quantize_act(call.name, f"in{i}", v, want, rq, mode)
                A.put(args, kwargs, slot, v)
            in_infos.append(info)
        wq = None
        chain = self._chain.get(call.name) if call.category is OpCategory.GEMM else None
        if chain:
            st.fused_done.add(call.name)
            self._fold(call.name, chain, plan, args, kwargs)
        if plan.weight is not None and (om is None or om.quantize_weight):
            w = A.get(args, kwargs, plan.weight)
            if rq.weight_dtype.is_int:
                wq = (*self.weight_q(call.name, w, rq.weight_dtype, True), w)
                wv = self.weight_value(call.name, w, rq.weight_dtype, mode, rq.weight_split)
                A.put(args, kwargs, plan.weight, wv)
            else:
                A.put(args, kwargs, plan.weight, fake_cast(w, rq.weight_dtype))
        if call.category is OpCategory.GEMM:
            dts = [i.dtype for i in in_infos if i is not None]
            self._check_gemm(call.name, call.op_type, dts + ([rq.weight_dtype] if wq else []))
        if call.category is OpCategory.GRID_SAMPLE:
            self._check_grid(call.name, A.get(args, kwargs, plan.acts[0]).shape)
        quant_out = om is None or om.quantize_output
        grid_info = in_infos[1] if len(in_infos) > 1 else None
        if (
            call.category is OpCategory.GRID_SAMPLE
            and mode is Mode.FAKE
            and (grid_info is None or grid_info.dtype.is_int)
        ):  # an integer grid chain: the grid is int16 at its fixed scale (a float16 one is not)
            fake_grid(self.platform, args, kwargs, plan)
        clamp = self._fused_clamp(call.name) if chain else None
        if mode is Mode.FIXED:
            res = fixed_ops.run_fixed(
                self, call, plan, args, kwargs, in_infos, wq, rq, quant_out, clamp
            )
            if res is not None:
                return res
        out = calls.out_of_place(call)(*args, **kwargs)
        fuse = (  # fake-quantize the fused clamp in the same pass (qat_fake_quant ``bounds``)
            clamp is not None
            and mode is Mode.FAKE
            and quant_out
            and rq.output_dtype.is_int
            and not rq.high_precision_output
        )
        if clamp and not fuse:
            out = torch.clamp(out, clamp[0], clamp[1])
        return self._quant_output(call, out, in_infos, rq, quant_out, mode, clamp if fuse else None)

    def _fused_clamp(self, name: str) -> tuple | None:
        for c in self._chain.get(name, []):
            inf = self._info[c]
            if inf.op_type != "batch_norm":
                return inf.post
        return None

    def _fold(self, name: str, chain: list, plan: A.ArgPlan, args: list, kwargs: dict) -> None:
        """Put the batch_norm-folded weight and bias of GEMM ``name`` into its arguments."""
        bn = [self._info[c] for c in chain if self._info[c].op_type == "batch_norm"]
        if not bn or plan.weight is None:
            return
        w = A.get(args, kwargs, plan.weight)
        b = A.get(args, kwargs, plan.bias) if plan.bias is not None else None
        wf, bf = fold_batch_norm(self._fold_cache, name, w, b, bn[0].post)
        A.put(args, kwargs, plan.weight, wf)
        if plan.bias is None:
            plan.bias = ("k", "bias")
        A.put(args, kwargs, plan.bias, bf)

    def _quant_output(self, call, out, in_infos, rq, quant_out, mode, bounds=None):
        if call.category is OpCategory.PASS_THROUGH:
            src = in_infos[0] if in_infos else None
            if src is None or src.dtype.is_float:
                return out, src
            leaves = tree_flatten(out)[0]
            return out, [QInfo(src.dtype, src.scale) for _ in leaves]
        if not quant_out or not A.is_float_tensor(out):
            return out, None
        src = in_infos[0] if in_infos else None
        if call.category is OpCategory.GRID_SAMPLE and src is not None and src.dtype.is_int:
            codes = quantize(out, src.scale, src.dtype, self.platform.fake_round)
            return dequantize(codes, src.scale), QInfo(src.dtype, src.scale)
        if call.category is OpCategory.GEMM and rq.high_precision_output:
            return out, None
        return self.quantize_act(call.name, "out", out, rq.output_dtype, rq, mode, bounds)
