"""Quantization state: what calibration leaves behind and what it is turned into.

Activation observers (fed in float calibration runs) and the scales made from them, weight codes
and scales, the float weights each mode computes with, and the per-op scratch of the fixed-mode
kernels; all cached per op and invalidated by what they depend on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten

from quantlab.capture import OpCall
from quantlab.numerics.dtypes import DType
from quantlab.numerics.fake_quant_plan import fake_quant_fn
from quantlab.numerics.gemm import acc_scale, quantize_bias
from quantlab.numerics.quantize import (
    compute_scale,
    compute_zero_point_scale,
    dequantize,
    fake_cast,
    quantize,
)
from quantlab.numerics.split import split_fake_weight
from quantlab.op_kinds import OpCategory
from quantlab.qconfig import ActivationSymmetry, ObserverKind, ResolvedQConfig
from quantlab.simulate import args as A
from quantlab.simulate import (
    fixed_div,
    fixed_embedding,
    fixed_log_softmax,
    fixed_lut,
    fixed_norm,
    fixed_softmax,
    same_grid,
)
from quantlab.simulate.modes import Mode
from quantlab.simulate.observers import observer_key, weight_amax
from quantlab.simulate.qat import qat_divide, qat_fake_quant
from quantlab.simulate.qtensor import QInfo
from quantlab.simulate.straight_through import learned_scale, range_mask, through


class QuantizationState:
    """The Simulator's observers, activation scales, weight codes and kernel caches."""

    def _observe_inputs(self, call: OpCall, plan: A.ArgPlan) -> None:
        """Feed the observers of ``call``'s activation inputs (and a norm's or embedding's own
        statistics), before the call runs: an in-place op writes its input."""
        if call.category is OpCategory.NORM:
            fixed_norm.observe(self, call)
        elif call.category is OpCategory.EMBEDDING:
            fixed_embedding.observe(self, call)
        elif call.category is OpCategory.DIV:
            fixed_div.observe_reciprocal(self, call, plan)
        elif call.category is OpCategory.LOG_SOFTMAX:
            fixed_log_softmax.observe_log_softmax(self, call, plan)
            fixed_softmax.observe_softmax_sum(self, call, plan)
        elif call.category is OpCategory.SOFTMAX:
            fixed_softmax.observe_softmax_sum(self, call, plan)
        for i, slot in enumerate(plan.acts):
            v = A.get(call.args, call.kwargs, slot)
            if A.is_float_tensor(v):
                self._obs.observe(f"{call.name}/in{i}", v)

    def _observe_output(self, call: OpCall, out: Any) -> None:
        """Feed the observer of ``call``'s output ``out`` (a fused chain's, at its last op)."""
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
        in_dtype = None
        if call.op_type in fixed_lut.OBSERVED_DOMAIN_CLIPS and call.category is OpCategory.LUT:
            # the clip's dtype: the op's input dtype, else (an input that keeps its producer's
            # dtype, not known while calibrating) its output dtype
            rq = self.qconfig_of(call.name)
            in_dtype = rq.input_dtype or rq.output_dtype
        observed = fixed_lut.qat_observed(self.platform, call, o[0], in_dtype)
        self._obs.observe(f"{key}/out", observed)

    def act_scale(self, name: str, key: str, dtype: DType, rq: ResolvedQConfig) -> Tensor:
        """Calibrated float32 scale of activation point ``name/key`` at integer ``dtype`` (its
        trained value once ``learn_scales`` made it a parameter)."""
        ck = self.act_scale_key(name, key, dtype, rq)
        s = self._scale_cache.get(ck)
        if s is None:
            s = self._calibrated_scale(name, key, dtype, rq)
            self._scale_cache[ck] = s
        learned = self._learned_scales.get(ck) if self._learned_scales else None
        return s if learned is None else learned.detach().clamp_min(_MIN_SCALE)

    @staticmethod
    def act_scale_key(name: str, key: str, dtype: DType, rq: ResolvedQConfig) -> tuple:
        """The scale-cache key of ``act_scale(name, key, dtype, rq)`` (its entry: the
        calibrated scale)."""
        return (name, key, dtype, observer_key(rq))

    @staticmethod
    def act_zero_point_key(name: str, key: str, dtype: DType, rq: ResolvedQConfig) -> tuple:
        """The scale-cache key of an asymmetric activation point's (scale, zero point) entry
        (``act_zero_point``; present once an ASYMMETRIC point's scale or zero point was
        asked for)."""
        return ("asymmetric", name, key, dtype, observer_key(rq))

    def _calibrated_scale(self, name: str, key: str, dtype: DType, rq: ResolvedQConfig):
        if rq.activation_symmetry is ActivationSymmetry.ASYMMETRIC and dtype.bits <= 16:
            s = self._asymmetric(name, key, dtype, rq)[0]
        elif rq.observer is ObserverKind.FIXED:
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
        return s

    def _learned_scale(self, ck: tuple, s: Tensor, rq: ResolvedQConfig):
        """The trained scale parameter of activation point ``ck`` under ScaleTraining.LEARNED
        (made from the calibrated ``s`` in the first gradient run that reaches it), else None."""
        if self._learned_scales is None or rq.observer is ObserverKind.FIXED:
            return None
        p = self._learned_scales.get(ck)
        if p is None and self._state is not None and self._state.grad:
            p = torch.nn.Parameter(s.detach().clone())
            self._learned_scales[ck] = p
        return p

    def _recording_grad(self) -> bool:
        return self._state is not None and self._state.grad

    def act_zero_point(self, name: str, key: str, dtype: DType, rq: ResolvedQConfig) -> int:
        """Zero point of activation point ``name/key`` at integer ``dtype``: 0 unless the op is
        ASYMMETRIC (``rq.activation_symmetry``)."""
        if rq.activation_symmetry is not ActivationSymmetry.ASYMMETRIC or dtype.bits > 16:
            return 0
        return self._asymmetric(name, key, dtype, rq)[1]

    def _asymmetric(self, name: str, key: str, dtype: DType, rq: ResolvedQConfig):
        """(scale, zero point) of an asymmetric activation point from its observed min / max
        (``numerics.quantize.compute_zero_point_scale``, zero point rounded by fake_round)."""
        ck = self.act_zero_point_key(name, key, dtype, rq)
        hit = self._scale_cache.get(ck)
        if hit is None:
            obs = self._obs.get(f"{name}/{key}")
            if obs is None:
                raise ValueError(
                    f"op {name}: no calibration statistics for its {key}; calibrate with inputs "
                    "that reach this op"
                )
            try:
                lo, hi = obs.min_max(rq)
            except ValueError as e:
                raise ValueError(f"op {name}: {e}") from None
            hit = compute_zero_point_scale(lo, hi, dtype, self.platform.fake_round)
            self._scale_cache[ck] = hit
        return hit

    def op_memo(self, name: str, what: str, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()`` computed once per op ``name`` and ``what`` while ``key`` stays the same:
        tensors in ``key`` compared by identity (the entry holds them, so no other tensor can
        take their id; scales and weight codes are cached objects, new when they change),
        other values by equality. For plan-time constants of the fixed-mode kernels."""
        cache = self._fast.setdefault(name, {})
        hit = cache.get(what)
        if hit is not None and _same_key(hit[0], key):
            return hit[1]
        value = make()
        cache[what] = (key, value)
        return value

    def observed_range(self, name: str, key: str) -> tuple[float, float] | None:
        """Running (min, max) seen at activation point ``name/key`` during calibration."""
        obs = self._obs.get(f"{name}/{key}")
        if obs is None or not obs.run_max > obs.run_min:
            return None
        return obs.run_min, obs.run_max

    def weight_q(self, name: str, w: Tensor, dtype: DType, per_channel: bool, axis: int | None = 0):
        """(codes in ``dtype``'s torch dtype, float32 scale per output channel (along ``axis``)
        or one 0-d scale when not ``per_channel`` or ``axis`` is None) of a weight; cached until
        the weight changes (its ``_version``)."""
        entry = self._weight_entry(name, w, dtype, per_channel, axis)
        return entry[2], entry[3]

    def _weight_entry(
        self, name: str, w: Tensor, dtype: DType, per_channel: bool, axis: int | None = 0
    ) -> list:
        per_channel = per_channel and axis is not None
        ck = (name, dtype, per_channel, axis if per_channel else None)
        hit = self._wcache.get(ck)
        if hit is not None and hit[0] is w and hit[1] == w._version:
            return hit
        amax = weight_amax(w, per_channel, axis if per_channel else 0)
        s = compute_scale(
            amax, dtype, self.platform.scale_rule, narrow_range=self.platform.weight_narrow_range
        )
        lo = -dtype.qmax if self.platform.weight_narrow_range else None
        q_axis = axis if per_channel else None
        codes = quantize(w.detach(), s, dtype, self.platform.fake_round, axis=q_axis, qmin=lo)
        hit = [w, w._version, codes, s, {}, q_axis]
        self._wcache[ck] = hit
        return hit

    def weight_coded(
        self, name: str, w: Tensor, dtype: DType, mode: Mode, split: int = 0, axis: int | None = 0
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(``weight_value``, codes, scale) of a weight (``weight_q`` at
        ``platform.weight_per_channel``, output channels along ``axis``; None: one scale per
        tensor), from one cache entry."""
        entry = self._weight_entry(name, w, dtype, self.platform.weight_per_channel, axis)
        value = entry[4].get((mode, split))
        if value is None or self._recording_grad():
            value = self.weight_value(name, w, dtype, mode, split, axis)
        return value, entry[2], entry[3]

    def weight_value(
        self, name: str, w: Tensor, dtype: DType, mode: Mode, split: int = 0, axis: int | None = 0
    ) -> Tensor:
        """The float weight an op computes with: QAT fake quant (FAKE) or codes * scale
        (FIXED), per output channel (along ``axis``) or per tensor
        (``platform.weight_per_channel`` false, or ``axis`` None); with ``split`` = k the
        high/low weight s * (w_hi + w_lo / 2**k) (numerics.split); cached with the codes."""
        entry = self._weight_entry(name, w, dtype, self.platform.weight_per_channel, axis)
        values = entry[4]
        key = (mode, split)
        if key not in values:
            codes, s = entry[2], entry[3]
            axis = entry[5]
            if split:
                values[key] = split_fake_weight(
                    w.detach(), s, split, axis, self.platform.fake_round
                )
            elif mode is Mode.FIXED:
                values[key] = dequantize(codes, s, axis=axis)
            else:
                lo = -dtype.qmax if self.platform.weight_narrow_range else None
                w0 = w.detach() if self._recording_grad() else w
                values[key] = qat_fake_quant(w0, s, dtype, self.platform.fake_round, axis, lo)
        if self._recording_grad():  # straight through to the float weight (FAKE and FIXED)
            return through(w, values[key])
        return values[key]

    def bias_value(
        self, bias: Tensor, x_scale: Tensor, w_scale: Tensor, name: str | None = None
    ) -> Tensor:
        """The float32 bias a FAKE run of a GEMM adds: ``bias`` itself when
        ``platform.bias_float`` (the compiler receives it as float32), else the value of the
        int32 codes the model holds, round_half_even(fl32(bias / fl32(x_scale * w_scale)))
        saturated to int32 (``numerics.gemm.quantize_bias``, the codes FIXED mode adds), times
        fl32(x_scale * w_scale) in float32 (a QDQ graph's DequantizeLinear). With op ``name``
        the value is kept until the bias (its ``_version``) or a scale object changes."""
        if self.platform.bias_float:
            return bias
        if self._recording_grad():
            return through(bias, self.bias_value(bias.detach(), x_scale.detach(), w_scale))
        if name is not None:
            key = (bias, bias._version, x_scale, w_scale)
            return self.op_memo(
                name, "bias_value", key, lambda: self.bias_value(bias, x_scale, w_scale)
            )
        codes = quantize_bias(bias, x_scale, w_scale)
        unit = acc_scale(x_scale, w_scale)
        return dequantize(codes, unit, axis=0 if unit.dim() == 1 else None)

    def cast_float(self, name: str, x: Tensor, dtype: DType) -> Tensor:
        """``x`` rounded to float ``dtype`` (numerics.quantize.fake_cast, saturating at +-65504
        when ``platform.float16_saturate``); for FLOAT16 the finite values beyond +-65504 (before
        saturation) are counted against op ``name`` in the current run (``float16_overflow``)."""
        if dtype is DType.FLOAT16 and self._state is not None and x.numel():
            over = x.detach().abs() > DType.FLOAT16.max_finite
            n = int(torch.count_nonzero(over & torch.isfinite(x)))
            if n:
                counts = self._state.float16_overflow
                counts[name] = counts.get(name, 0) + n
        return fake_cast(x, dtype, self.platform.float16_saturate)

    def quantize_act(
        self,
        name: str,
        key: str,
        x: Tensor,
        dtype: DType,
        rq,
        mode: Mode,
        bounds=None,
        owned: bool = False,
    ):
        """(value, QInfo) of ``x`` quantized at activation point ``name/key`` (FAKE mode:
        ``bounds`` = a fused clamp applied in the same pass; ``owned``: ``x`` is a fresh tensor
        nothing else holds, which a no-gradient FAKE run may overwrite with the value)."""
        if dtype.is_float:
            return self.cast_float(name, x, dtype), QInfo(dtype)
        grid = self._state.grid if self._state is not None else None
        point = None if mode is Mode.FIXED else self.plain_fake_point(name, key, dtype, rq, bounds)
        if point is not None:
            fq, info = point
            if bounds is None and grid is not None and self._on_grid(grid, x, info):
                return x, info  # already on this grid: fq(x) would be x, bit for bit
            return fq(x, inplace=owned), info
        s = self.act_scale(name, key, dtype, rq)
        zp = self.act_zero_point(name, key, dtype, rq)
        if mode is Mode.FIXED and grid is not None:
            hit = same_grid.codes_on_grid(grid, x, dtype, s, zp, self.platform.fake_round)
            if hit is not None and hit.codes is not None:
                return x, hit  # the codes quantize would find; x is their dequantized value
        if mode is not Mode.FIXED and self._recording_grad():
            y = qat_fake_quant(
                x.detach(), s, dtype, self.platform.fake_round, bounds=bounds, zero_point=zp
            )
            ck = self.act_scale_key(name, key, dtype, rq)
            p = self._learned_scale(ck, s, rq)
            lo, hi = dtype.qmin - zp, dtype.qmax - zp  # the code range around the zero point
            if p is not None:
                return learned_scale(x, p, y, lo, hi), QInfo(dtype, s, zero_point=zp)
            mask = range_mask(x, s, lo, hi, bounds)
            return through(x, y, mask), QInfo(dtype, s, zero_point=zp)
        if mode is not Mode.FIXED:
            y = qat_fake_quant(x, s, dtype, self.platform.fake_round, bounds=bounds, zero_point=zp)
            return y, QInfo(dtype, s, zero_point=zp)
        codes = self.platform.quantize_codes(x, s, dtype, zp)
        return dequantize(codes, s, zero_point=zp), QInfo(dtype, s, codes, zp)

    def _on_grid(self, grid, x: Tensor, info: QInfo) -> bool:
        fr = self.platform.fake_round
        return (
            same_grid.codes_on_grid(grid, x, info.dtype, info.scale, info.zero_point, fr)
            is not None
        )

    def plain_fake_point(self, name: str, key: str, dtype: DType, rq, bounds=None):
        """(fake-quant function, QInfo) that a FAKE or HYBRID ``quantize_act`` of integer
        ``dtype`` at point ``name/key`` applies as it stands (no learned scales, no gradient
        recorded: ``_fake_point``), else None (it takes another path)."""
        if self._learned_scales is not None or self._recording_grad():
            return None
        return self._fake_point(name, key, dtype, rq, bounds)

    def _fake_point(self, name: str, key: str, dtype: DType, rq, bounds):
        """(fake-quant function, QInfo) of activation point ``name/key`` at integer ``dtype``
        with the fused clamp ``bounds``, made once per calibrated configuration (kept beside
        the scales, checked against the op's resolved qconfig and the platform's rounding):
        ``qat_fake_quant`` with the point's scale and zero point, bit for bit."""
        ck = ("fake_point", name, key, dtype, bounds)
        fr = self.platform.fake_round
        hit = self._scale_cache.get(ck)
        if hit is not None and hit[0] is rq and hit[1] is fr:
            return hit[2], hit[3]
        s = self.act_scale(name, key, dtype, rq)
        zp = self.act_zero_point(name, key, dtype, rq)
        fq = fake_quant_fn(s, dtype, fr, qat_divide(fr), bounds=bounds, zero_point=zp)
        info = QInfo(dtype, s, zero_point=zp)
        self._scale_cache[ck] = (rq, fr, fq, info)
        return fq, info


_MIN_SCALE = 1e-30  # a learned scale is kept positive


def _same_key(a: tuple, b: tuple) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is y:
            continue
        if isinstance(x, Tensor) or isinstance(y, Tensor) or x != y:
            return False
    return True
