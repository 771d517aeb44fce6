"""Mixed precision from a sensitivity table: raise the top ops, measure accuracy and cost.

``SensitiveTemplate`` is the vendor's "sensitive op" setter (j6-numerics s.8, horizon-plugin
s.3.1): sort the sensitivity table by one metric (activation, weight and input rows together),
take the first k rows (k = ``topk``, or ``ceil(ratio x rows)``), keep the rows of the chosen
sensitive types whose quantized dtype is int8 (an output already in int16, float16 or int32 has
nothing to gain), and raise those ops through ``QConfigSpec.by_name``:

- an activation row raises the op's output to ``platform.sensitive_dtype`` (int16 on every J6
  member; on J6H/P outputs are float16 already, so their activation rows are not int8 and are
  kept in float16, as the vendor keeps vector work in float16);
- an input row (a GEMM's own int8 inputs, J6H/P) raises the GEMM's inputs to
  ``platform.sensitive_dtype``;
- a weight row raises the op's weight to int16 (J6 GEMMs are integer on every member); on a
  platform without int16 x int16 GEMM (``platform.max_int16_gemm_operands`` < 2) its input is
  pinned to int8 so the op stays legal.

``evaluate_mixed`` runs one raised configuration and reports the task metric, output metrics
and the cost model (quantlab.analysis.cost) so a sweep over the ratio gives a Pareto curve. A
GEMM that raising makes illegal (int16 x int16 on J6E/M, e.g. a matmul of two raised
activations) has its inputs pinned to int8 (``apply_legal``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from quantlab.analysis.cost import CostModel, op_costs
from quantlab.analysis.sensitivity import (
    Metric,
    SensitiveType,
    lower_is_worse,
    output_metrics,
)
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator


@dataclass(frozen=True)
class SensitiveTemplate:
    """Which rows of a sensitivity table to raise: ``topk`` rows or a ``ratio`` of the rows."""

    metric: Metric = Metric.L1
    topk: int | None = None
    ratio: float | None = None
    kinds: tuple[SensitiveType, ...] = (SensitiveType.ACTIVATION,)

    def __post_init__(self) -> None:
        if (self.topk is None) == (self.ratio is None):
            raise ValueError("SensitiveTemplate needs exactly one of topk and ratio")
        if self.topk is not None and self.topk < 0:
            raise ValueError(f"SensitiveTemplate.topk must be >= 0, got {self.topk}")
        if self.ratio is not None and not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"SensitiveTemplate.ratio must be in [0, 1], got {self.ratio}")
        bad = [k for k in self.kinds if k is SensitiveType.FIXED]
        if bad or not self.kinds:
            raise ValueError("SensitiveTemplate.kinds must be ACTIVATION, WEIGHT and/or INPUT")


def select_sensitive(
    table: pd.DataFrame, template: SensitiveTemplate, task: Any = None
) -> list[tuple[str, SensitiveType]]:
    """The (op name, sensitive type) pairs ``template`` raises, most sensitive first."""
    metric = template.metric.name
    raisable = [t.value for t in SensitiveType if t is not SensitiveType.FIXED]
    rows = table[(table["metric"] == metric) & table["sensitive_type"].isin(raisable)]
    if rows.empty:
        have = ", ".join(sorted(table["metric"].unique())) if len(table) else "none"
        raise ValueError(f"the sensitivity table has no {metric} rows; metrics in it: {have}")
    asc = lower_is_worse(template.metric, task)
    rows = rows.sort_values("value", ascending=asc, kind="stable", na_position="last")
    k = template.topk if template.topk is not None else math.ceil(template.ratio * len(rows))
    kinds = {t.value for t in template.kinds}
    picked = rows.head(k)
    picked = picked[picked["sensitive_type"].isin(kinds) & (picked["quant_dtype"] == "INT8")]
    return [(r.op_name, SensitiveType(r.sensitive_type)) for r in picked.itertuples()]


def raise_spec(
    picked: Sequence[tuple[str, SensitiveType]],
    platform: Any,
    base: QConfigSpec | None = None,
    activation_dtype: DType | None = None,
    recalibrate_raised: bool = False,
) -> QConfigSpec:
    """``base`` (default: empty) with ``by_name`` rules raising every picked op (module doc);
    ``activation_dtype`` replaces ``platform.sensitive_dtype`` for activation rows (e.g.
    ``platform.ceiling_dtype``); GEMM inputs (TAE operands) always take ``sensitive_dtype``.
    ``recalibrate_raised``: an op with a raised output or input drops the calibration rule
    ``base`` gives it by name (observer, percentile, histogram method, clip range), which was
    chosen for the lower dtype (a clip that suits int8 costs int16 its range); it takes the
    default observer."""
    base = base or QConfigSpec()
    by_name = dict(base.by_name)
    for name, kind in picked:
        rule = by_name.get(name, OpQConfig())
        if kind is SensitiveType.ACTIVATION:
            rule = _replace(rule, output_dtype=activation_dtype or platform.sensitive_dtype)
        elif kind is SensitiveType.INPUT:
            rule = _replace(rule, input_dtype=platform.sensitive_dtype)
        else:
            pin = DType.INT8 if platform.max_int16_gemm_operands < 2 else rule.input_dtype
            rule = _replace(rule, weight_dtype=DType.INT16, input_dtype=pin)
        if recalibrate_raised and kind is not SensitiveType.WEIGHT:
            rule = _replace(
                rule, observer=None, percentile=None, histogram_method=None, clip_range=None
            )
        by_name[name] = rule
    return QConfigSpec(
        global_=base.global_,
        by_type=dict(base.by_type),
        by_module=dict(base.by_module),
        by_name=by_name,
        use_platform_template=base.use_platform_template,
    )


def _replace(rule: OpQConfig, **kw) -> OpQConfig:
    import dataclasses

    return dataclasses.replace(rule, **kw)


@dataclass
class MixedResult:
    """One evaluated configuration: raised ops, metrics against float, cost."""

    raised: list[tuple[str, SensitiveType]]
    metrics: dict[str, float]
    cost: float
    ops: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    pinned: list[str] = field(default_factory=list)  # GEMMs whose inputs were pinned to int8
    spec: QConfigSpec | None = None  # the evaluated configuration (pins included)
    task: Any = None  # the task metric's Estimate (95% bootstrap interval), None without task
    sqnr: Any = None  # the output SQNR's Estimate (the same interval), None without SQNR


def ops_with_split(sim: Simulator) -> pd.DataFrame:
    """``sim.ops`` plus each op's resolved ``weight_split`` (for the cost model)."""
    ops = sim.ops.copy()
    splits = []
    for name, supported, cat in zip(ops["name"], ops["supported"], ops["category"]):
        ok = bool(supported) and cat != "NONE"
        splits.append(sim.qconfig_of(name).weight_split if ok else 0)
    ops["weight_split"] = splits
    return ops


def evaluate_mixed(
    sim: Simulator,
    batches: Sequence[tuple],
    refs: list,
    picked: Sequence[tuple[str, SensitiveType]],
    metrics: Sequence[Metric],
    task: Any = None,
    mode: Mode = Mode.FIXED,
    base: QConfigSpec | None = None,
    cost_model: CostModel | None = None,
) -> MixedResult:
    """Raise ``picked`` on a calibrated ``sim``, run ``batches`` in ``mode``, compare with
    ``refs`` (the float outputs) and price the configuration; the task metric and the output
    SQNR come with their 95% bootstrap intervals over the items (``MixedResult.task``,
    ``MixedResult.sqnr``)."""
    from quantlab.analysis.confidence import estimate_metrics, sqnr_estimate

    spec = raise_spec(picked, sim.platform, base)
    pinned = apply_legal(sim, spec)
    outs = [sim.run(*b, mode=mode) for b in batches]
    values = output_metrics(refs, outs, [m for m in metrics if m is not Metric.TASK], task)
    est = None
    if Metric.TASK in metrics:
        est = estimate_metrics([task], refs, outs)[task.name]
        values[Metric.TASK] = est.value
    sqnr = sqnr_estimate(refs, outs) if Metric.SQNR in metrics else None
    ops = ops_with_split(sim)
    cost = float(op_costs(ops, sim.platform.lut_direct_int8, cost_model or CostModel()).sum())
    return MixedResult(
        list(picked), {m.name: v for m, v in values.items()}, cost, ops, pinned, spec, est, sqnr
    )


def apply_legal(sim: Simulator, spec: QConfigSpec) -> list[str]:
    """Configure ``sim`` with ``spec``; a GEMM the platform rejects (int16 x int16 where
    ``platform.max_int16_gemm_operands`` < 2, e.g. a matmul whose two raised producers are both
    int16) gets its inputs pinned to int8 (``spec.by_name`` is updated). Returns those ops."""
    gemms = sim.ops.loc[sim.ops["category"] == "GEMM", "name"].tolist()
    pinned: list[str] = []
    while True:
        try:
            sim.set_qconfig(spec)
            return pinned
        except ValueError as err:
            text = str(err)
            hit = next((n for n in gemms if f"op {n} (" in text), None)
            if "int16 x int16" not in text or hit is None or hit in pinned:
                raise
            rule = spec.by_name.get(hit, OpQConfig())
            spec.by_name[hit] = _replace(rule, input_dtype=DType.INT8)
            pinned.append(hit)


def pareto_front(costs: Sequence[float], scores: Sequence[float], higher_is_better: bool) -> list:
    """For each point, whether no other point is at most as costly and strictly better, or
    strictly cheaper and at least as good (True = on the Pareto front)."""
    sign = 1.0 if higher_is_better else -1.0
    pts = [(float(c), sign * float(s)) for c, s in zip(costs, scores)]
    front = []
    for i, (c, s) in enumerate(pts):
        dominated = any(
            (c2 <= c and s2 > s) or (c2 < c and s2 >= s) for j, (c2, s2) in enumerate(pts) if j != i
        )
        front.append(not dominated)
    return front
