"""The vendor's precision recipe (seed 004, lines 55-93): reach an accuracy target at least cost.

The flow depends on where the platform starts (its ``global_dtype``), not on its name:

- integer start (J6E/M/B, seed 004 l.59-63): the start configuration (all int8); if it misses
  the target, the *ceiling* (every candidate raised, activations at ``platform.ceiling_dtype``)
  shows the precision ceiling; then ``BACKOFF`` lowers the raised ops again, least sensitive
  first, as long as the target still holds.
- float16 start (J6H/P, seed 004 l.75-81): the start configuration (global float16, int8
  Conv/MatMul); ops whose values leave the float16 range (``Simulator.float16_overflow``) are
  switched to int16 (l.81); then ``RAISE`` raises the sensitive ops by the ranking (the int8
  GEMM inputs and weights to int16, l.77; vector ops stay float16, l.79) until the target
  holds.

Both directions can run on any platform (``directions``). The candidates are the rows of a
sensitivity table (``quantlab.analysis.sensitivity``) the vendor template can raise
(``mixed_precision.select_sensitive`` with ratio 1), most sensitive first. RAISE tries the
``k`` most sensitive for ``steps`` evenly spaced k, then bisects between the last k that missed
and the first that met (``refine`` times). BACKOFF removes groups of the least sensitive raised
ops from the ceiling; a group that breaks the target is halved and retried, a single op that
breaks it stays raised (at most ``max_evaluations`` evaluations in all). An op with a raised
output or input drops the calibration rule the start gives it by name (a per-op observer choice
made for int8) and is calibrated by the default observer.

Every evaluated configuration is one ``RecipeStep``: the task metric with its 95% bootstrap
interval (quantlab.analysis.confidence), output SQNR against float with its interval, cost
(quantlab.analysis.cost, int8-MAC equivalents), the number of raised ops and whether it meets
the target. The chosen configuration is the cheapest step that meets the target (the better
metric breaks a tie); when none does, ``RecipeResult.chosen`` is None and the best-scoring
step is ``RecipeResult.best``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from quantlab.analysis.confidence import Estimate, sqnr_estimate
from quantlab.analysis.cost import CostModel, op_costs
from quantlab.analysis.metrics import Metric
from quantlab.analysis.mixed_precision import (
    SensitiveTemplate,
    apply_legal,
    ops_with_split,
    raise_spec,
    select_sensitive,
)
from quantlab.analysis.sensitivity import SensitiveType
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

Raise = tuple[str, SensitiveType]


class Direction(enum.Enum):
    """RAISE: from the start, raise the most sensitive ops until the target holds.
    BACKOFF: from the ceiling, lower the least sensitive raised ops while the target holds."""

    RAISE = "raise"
    BACKOFF = "backoff"


def platform_directions(platform: Any) -> list[Direction]:
    """The vendor's direction for ``platform``: RAISE from a float16 start (J6H/P), BACKOFF from
    the ceiling for an integer start (J6E/M/B) (seed 004 l.59-63, l.75-81)."""
    return [Direction.RAISE] if platform.global_dtype.is_float else [Direction.BACKOFF]


@dataclass(frozen=True)
class RecipeTarget:
    """Exactly one of: ``target_metric`` (the task metric must reach it: >= when higher is
    better, <= otherwise), ``max_drop`` (the task metric may lose at most this much against the
    float model's own value), ``min_sqnr_db`` (output SQNR against float in dB)."""

    target_metric: float | None = None
    max_drop: float | None = None
    min_sqnr_db: float | None = None

    def __post_init__(self) -> None:
        given = [v for v in (self.target_metric, self.max_drop, self.min_sqnr_db) if v is not None]
        if len(given) != 1:
            raise ValueError(
                "the recipe needs exactly one target: exp.target_metric, exp.max_drop or "
                f"exp.min_sqnr_db (got {len(given)})"
            )
        if any(not math.isfinite(float(v)) for v in given):
            raise ValueError(f"the recipe target must be a finite number, got {given[0]}")
        if self.max_drop is not None and self.max_drop < 0:
            raise ValueError(f"exp.max_drop must be >= 0, got {self.max_drop}")

    @property
    def on_task(self) -> bool:
        """Whether the target is on the task metric (else on output SQNR)."""
        return self.min_sqnr_db is None

    def threshold(self, task: Any = None, float_value: float = math.nan) -> float:
        """The value a configuration's task metric (or SQNR) must reach."""
        if self.min_sqnr_db is not None:
            return float(self.min_sqnr_db)
        if self.target_metric is not None:
            return float(self.target_metric)
        sign = 1.0 if task.higher_is_better else -1.0
        return float_value - sign * float(self.max_drop)

    def met(self, value: float, threshold: float, higher_is_better: bool) -> bool:
        """Whether ``value`` reaches ``threshold`` (NaN never does)."""
        if math.isnan(value):
            return False
        return value >= threshold if higher_is_better else value <= threshold

    def words(self, task: Any = None, float_value: float = math.nan) -> str:
        """The target in a sentence fragment."""
        if self.min_sqnr_db is not None:
            return f"output SQNR >= {self.min_sqnr_db:g} dB"
        cmp = ">=" if task.higher_is_better else "<="
        if self.target_metric is not None:
            return f"{task.name} {cmp} {self.target_metric:g}"
        return (
            f"{task.name} drop <= {self.max_drop:g} from the float model's {float_value:.4g} "
            f"({task.name} {cmp} {self.threshold(task, float_value):.4g})"
        )


@dataclass
class RecipeStep:
    """One evaluated configuration of the recipe's path."""

    step: int
    direction: str  # "start", "float16 range", "ceiling", "raise" or "backoff"
    raised: list[Raise]
    spec: QConfigSpec
    task: Estimate | None
    sqnr: Estimate  # output SQNR against float (dB) with its 95% interval over the items
    cost: float
    score: float = math.nan  # the value the target judges: the task metric or output SQNR
    meets: bool = False
    pinned: list[str] = field(default_factory=list)
    float16_overflow: dict[str, int] = field(default_factory=dict)

    @property
    def sqnr_db(self) -> float:
        return self.sqnr.value


@dataclass
class RecipeResult:
    """The path (every step), the chosen step (None: no step meets the target) and the step
    with the best score (what to look at when the target is out of reach)."""

    steps: list[RecipeStep]
    chosen: RecipeStep | None
    best: RecipeStep
    threshold: float
    float_value: float  # the float model's own task metric (NaN for an SQNR target)
    candidates: list[Raise]
    overflow_ops: list[str]

    def table(self) -> pd.DataFrame:
        """One row per step (the tidy path table, ``recipe.csv``)."""
        start_cost = self.steps[0].cost or math.nan
        rows = []
        for s in self.steps:
            row = {
                "step": s.step,
                "direction": s.direction,
                "raised_ops": len({n for n, _ in s.raised}),
                "raised_rows": len(s.raised),
                "task": s.task.value if s.task is not None else math.nan,
                "task_ci_low": s.task.low if s.task is not None else math.nan,
                "task_ci_high": s.task.high if s.task is not None else math.nan,
                "task_n": s.task.n if s.task is not None else 0,
                **s.sqnr.as_columns("sqnr_db"),
                "cost": s.cost,
                "cost_rel": s.cost / start_cost,
                "meets_target": s.meets,
                "chosen": self.chosen is s,
                "float16_overflow": sum(s.float16_overflow.values()),
                "pinned_int8": " ".join(s.pinned),
                "raised": " ".join(f"{n}[{k.value}]" for n, k in s.raised),
            }
            rows.append(row)
        return pd.DataFrame(rows)


class _Evaluator:
    """Evaluates configurations on a calibrated simulator against the float outputs."""

    def __init__(self, sim, batches, refs, task, target, mode, cost_model, estimate) -> None:
        self.sim, self.batches, self.refs, self.task = sim, batches, refs, task
        self.target, self.mode, self.cost_model, self.estimate = target, mode, cost_model, estimate
        self.steps: list[RecipeStep] = []
        self.seen: dict[tuple, RecipeStep] = {}  # a configuration is evaluated once
        self.threshold = math.nan
        self.higher = True if task is None or not target.on_task else task.higher_is_better

    def __call__(
        self,
        direction: str,
        picked: Sequence[Raise],
        base: QConfigSpec,
        activation_dtype: DType | None = None,
    ) -> RecipeStep:
        key = (direction in ("start", "float16 range"), tuple(picked), activation_dtype)
        if key in self.seen:
            return self.seen[key]
        spec = raise_spec(
            picked, self.sim.platform, base, activation_dtype, recalibrate_raised=True
        )
        pinned = apply_legal(self.sim, spec)
        outs, overflow = [], {}
        for b in self.batches:
            outs.append(self.sim.run(*b, mode=self.mode))
            for name, n in self.sim.float16_overflow.items():
                overflow[name] = overflow.get(name, 0) + n
        sqnr = sqnr_estimate(self.refs, outs)
        est = self.estimate(self.task, self.refs, outs) if self.task is not None else None
        ops = ops_with_split(self.sim)
        cost = float(op_costs(ops, self.sim.platform.lut_direct_int8, self.cost_model).sum())
        score = est.value if self.target.on_task else sqnr.value
        step = RecipeStep(len(self.steps), direction, list(picked), spec, est, sqnr, cost, score)
        step.pinned, step.float16_overflow = pinned, overflow
        step.meets = self.target.met(score, self.threshold, self.higher)
        self.steps.append(step)
        self.seen[key] = step
        return step


def default_estimate(task: Any, refs: list, outs: list) -> Estimate:
    """The task metric of ``outs`` against ``refs`` with its 95% percentile-bootstrap interval
    over the items (``confidence.estimate_metrics``; one item: a NaN interval)."""
    from quantlab.analysis.confidence import estimate_metrics

    return estimate_metrics([task], refs, outs)[task.name]


def no_drop_from(task: Any, float_value: float = math.inf) -> ValueError:
    """The error for an ``exp.max_drop`` target on a task metric whose float value is not
    finite (output SQNR against the float model: infinite for the float model itself)."""
    return ValueError(
        f"exp.max_drop: the task metric {task.name} of the float model is {float_value:g} (it "
        "compares outputs with the float model's own), so no drop from it can be met; use "
        "exp.min_sqnr_db (an output SQNR floor in dB) or exp.target_metric"
    )


def run_recipe(
    sim: Simulator,
    batches: Sequence[tuple],
    ranking: pd.DataFrame,
    target: RecipeTarget,
    task: Any = None,
    base: QConfigSpec | None = None,
    directions: Sequence[Direction] | None = None,
    rank_metric: Metric = Metric.L1,
    kinds: Sequence[SensitiveType] = (SensitiveType.ACTIVATION, SensitiveType.INPUT),
    steps: int = 6,
    refine: int = 3,
    max_evaluations: int = 40,
    mode: Mode = Mode.FIXED,
    cost_model: CostModel | None = None,
    estimate: Callable[[Any, list, list], Estimate] = default_estimate,
    progress: Callable[[str], None] | None = None,
) -> RecipeResult:
    """Run the platform's precision recipe on a calibrated ``sim`` (module docstring).

    ``ranking``: a sensitivity table of ``sim``'s model (rows of ``kinds`` with ``rank_metric``);
    ``base``: the starting qconfig (default: the platform template); ``directions``: default
    ``platform_directions``. ``estimate(task, refs, outs)`` gives the task metric with its
    interval. ``progress`` gets one line per evaluated step. Raises ValueError for a task target
    without a task metric or bad step counts.
    """
    if target.on_task and task is None:
        raise ValueError(
            "exp.target_metric and exp.max_drop judge the model's task metric, and this model "
            "has none; use exp.min_sqnr_db (an output SQNR floor in dB)"
        )
    if steps < 1 or refine < 0 or max_evaluations < 1:
        raise ValueError(
            "exp.steps and exp.max_evaluations must be >= 1 and exp.refine >= 0; got "
            f"steps={steps}, refine={refine}, max_evaluations={max_evaluations}"
        )
    base = base or QConfigSpec()
    directions = list(directions) if directions else platform_directions(sim.platform)
    batches = list(batches)
    refs = [sim.run(*b, mode=Mode.FLOAT) for b in batches]
    ev = _Evaluator(sim, batches, refs, task, target, mode, cost_model or CostModel(), estimate)
    float_value = math.nan
    if target.on_task:
        float_value = float(task(refs, refs))
    if target.max_drop is not None and not math.isfinite(float_value):
        raise no_drop_from(task, float_value)
    ev.threshold = target.threshold(task, float_value)
    say = progress or (lambda line: None)

    def log(step: RecipeStep) -> RecipeStep:
        say(
            f"recipe step {step.step} ({step.direction}): {len(step.raised)} raised, "
            f"score {step.score:.4g}, cost {step.cost:.4g}, meets {step.meets}"
        )
        return step

    start = log(ev("start", [], base))
    overflow_ops = sorted(start.float16_overflow)
    if overflow_ops:  # seed 004 l.81: back to int16 where float16 cannot hold the range
        base = _with_int16_outputs(base, overflow_ops)
        log(ev("float16 range", [], base))
    candidates = select_sensitive(
        ranking, SensitiveTemplate(rank_metric, ratio=1.0, kinds=tuple(kinds)), task
    )
    candidates = [c for c in candidates if c[0] not in overflow_ops or c[1] is not _ACT]
    if not ev.steps[-1].meets and candidates:
        ceiling = log(ev("ceiling", candidates, base, sim.platform.ceiling_dtype))
        for direction in directions:
            if len(ev.steps) >= max_evaluations:
                break
            if direction is Direction.RAISE:
                _raise(ev, candidates, base, steps, refine, max_evaluations, log)
            elif ceiling.meets:
                _back_off(ev, candidates, base, steps, max_evaluations, log)
    meeting = [s for s in ev.steps if s.meets]
    sign = 1.0 if ev.higher else -1.0
    chosen = min(meeting, key=lambda s: (s.cost, -sign * s.score)) if meeting else None
    valid = [s for s in ev.steps if not math.isnan(s.score)] or ev.steps
    best = max(valid, key=lambda s: (sign * s.score, -s.cost))
    sim.set_qconfig((chosen or best).spec)
    return RecipeResult(ev.steps, chosen, best, ev.threshold, float_value, candidates, overflow_ops)


_ACT = SensitiveType.ACTIVATION


def _with_int16_outputs(base: QConfigSpec, names: Sequence[str]) -> QConfigSpec:
    by_name = dict(base.by_name)
    for n in names:
        rule = by_name.get(n, OpQConfig())
        by_name[n] = OpQConfig(**{**rule.__dict__, "output_dtype": DType.INT16})
    return QConfigSpec(
        global_=base.global_,
        by_type=dict(base.by_type),
        by_module=dict(base.by_module),
        by_name=by_name,
        use_platform_template=base.use_platform_template,
    )


def _raise(ev: _Evaluator, candidates, base, steps, refine, max_evaluations, log) -> None:
    n = len(candidates)
    ks = sorted({max(1, math.ceil(i * n / steps)) for i in range(1, steps + 1)} - {n})
    low, high = 0, n  # k = low misses (the start), k = high meets or is the ceiling
    for k in ks:
        if len(ev.steps) >= max_evaluations:
            return
        if log(ev(Direction.RAISE.value, candidates[:k], base)).meets:
            high = k
            break
        low = k
    if not ev.steps[-1].meets and not _ceiling_meets(ev):
        return
    for _ in range(refine):
        if high - low <= 1 or len(ev.steps) >= max_evaluations:
            return
        mid = (low + high) // 2
        if log(ev(Direction.RAISE.value, candidates[:mid], base)).meets:
            high = mid
        else:
            low = mid


def _ceiling_meets(ev: _Evaluator) -> bool:
    return any(s.direction == "ceiling" and s.meets for s in ev.steps)


def _back_off(ev: _Evaluator, candidates, base, steps, max_evaluations, log) -> None:
    kept = list(candidates)  # most sensitive first
    order = list(reversed(candidates))  # lowered first: the least sensitive
    size = max(1, math.ceil(len(order) / steps))
    chunk, i = size, 0
    ceiling_dtype = ev.sim.platform.ceiling_dtype
    while i < len(order) and len(ev.steps) < max_evaluations:
        group = order[i : i + chunk]
        trial = [c for c in kept if c not in group]
        if log(ev(Direction.BACKOFF.value, trial, base, ceiling_dtype)).meets:
            kept, i = trial, i + len(group)
            chunk = size
        elif len(group) > 1:
            chunk = max(1, len(group) // 2)
        else:
            i, chunk = i + 1, size  # this op stays raised
