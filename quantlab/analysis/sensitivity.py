"""Per-op sensitivity ranking (the vendor algorithm, j6-numerics s.9), fast and cached.

Three passes, each quantizing exactly one op at a time and comparing the model output with the
pass's baseline run:

- ACTIVATION: baseline all-float; the op runs FAKE with only its output quantized
  (``OpMode(Mode.FAKE, quantize_weight=False)``);
- WEIGHT: baseline all-float; the op runs FAKE with only its weight quantized
  (``OpMode(Mode.FAKE, quantize_output=False)``), ops with a weight only;
- INPUT: baseline all-float; a GEMM (Conv/Linear/MatMul) runs FAKE with only its activation
  inputs quantized, at its resolved ``input_dtype`` (``OpMode(Mode.FAKE, quantize_output=False,
  quantize_weight=False, quantize_float_inputs=True)``), GEMMs whose qconfig sets an input dtype
  only: on J6H/P the int8 Conv/MatMul inputs of a float16 model, which the ACTIVATION pass (a
  float16 GEMM output) never sees;
- FIXED: baseline all-FAKE; the op runs FIXED (which op hurts most after export: LUTs, period
  reduction, grids, requantization).

Ops studied: every op the platform runs quantized, except pass-through ops (reshape, relu,
max pooling, ...), which keep their input's scale, and ops fused into a preceding GEMM
(batch_norm, relu6 after a conv), whose GEMM stands for the fused chain.

Speed: the baseline of each batch is recorded once (``Simulator.trace``) and every per-op run
replays it, so the ops upstream of the studied op are not recomputed; in the all-float passes
the convolutions downstream of it keep their outputs in oneDNN's blocked layout where that gives
the dense run's bits (``quantlab.simulate.blocked_layout``). Discontinuous index ops
(topk, sort, argsort, argmax, argmin, max/min along a dim) reuse the baseline's indices
(``FrozenIndices``), so a tiny perturbation that flips an index does not dominate the ranking;
grid_sample and interpolate downstream of the studied op already run in float (baseline mode).

Metrics compare the model output of the run (y) with the baseline (x), all float tensors of the
output flattened and concatenated over batches, in float64 (``quantlab.analysis.metrics``, the
one definition of each metric): L1 = mean |x - y|; COSINE = signed cosine similarity (no abs:
anti-correlated outputs score -1); MSE; KL = mean over positions of KL(softmax(x) || softmax(y))
along dim 1 (dim 0 for 1-d outputs), in nats; SQNR = 20 log10(|x| / |x - y|) in dB (+inf when
equal, -inf when the baseline is zero and the run is not); MAX_ABS = max |x - y| (the vendor's
Atol); RTOL = max |(x - y) / x| (the vendor's Rtol; x = 0 with y != 0 counts the largest finite
float); TASK = the model's task metric (``ModelBundle.task``) of the run against the baseline.
Rank 1 is the most sensitive op: COSINE, SQNR and a higher-is-better TASK sort ascending, the
others (MAX_ABS and RTOL among them) descending; ties keep execution order.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import Tensor
from tqdm import tqdm

from quantlab.analysis.confidence import estimate_metrics
from quantlab.analysis.frozen_indices import FrozenIndices
from quantlab.analysis.metrics import Metric, _parse_enum, lower_is_worse, output_metrics
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, OpMode, Simulator

COLUMNS = [
    "op_name",
    "sensitive_type",
    "op_type",
    "metric",
    "value",
    "quant_dtype",
    "flops_share",
    "items",
    "ci_low",
    "ci_high",
    "rank",
]
"""``items``: evaluation items the value is measured on; ``ci_low``/``ci_high``: its 95% bootstrap
interval (quantlab.analysis.confidence) for the TASK metric, NaN for the output metrics."""


class SensitiveType(enum.Enum):
    """Which quantization of one op is switched on (see the module docstring)."""

    ACTIVATION = "activation"
    WEIGHT = "weight"
    INPUT = "input"
    FIXED = "fixed"

    @classmethod
    def parse(cls, value: SensitiveType | str) -> SensitiveType:
        return _parse_enum(cls, value, "sensitive_type")


# ------------------------------------------------------------------------------ the passes
@dataclass
class SensitivityRun:
    """A sensitivity table plus how it was made (runs executed, seconds, cache use)."""

    table: pd.DataFrame
    runs: int = 0
    seconds: float = 0.0
    cached: bool = False
    studied: dict[str, list[str]] = field(default_factory=dict)
    sim: Simulator | None = None  # the calibrated simulator (None when read from the cache)


def fused_members(sim: Simulator) -> set[str]:
    """Ops folded into a preceding GEMM (batch_norm, relu6/clamp after a conv): they have no
    quantizer of their own; studying their GEMM studies the fused chain's output."""
    ops = sim.ops
    return set(ops.loc[ops["fused_into"] != "", "name"])


def studied_ops(sim: Simulator, kind: SensitiveType) -> list[str]:
    """Names of the ops a pass studies (module docstring), in execution order."""
    ops = sim.ops
    keep = ops["supported"] & (ops["category"] != "PASS_THROUGH")
    keep &= ~ops["name"].isin(fused_members(sim))
    if kind is SensitiveType.WEIGHT:
        keep &= ops["has_weight"]
    names = ops.loc[keep, "name"].tolist()
    if kind is SensitiveType.INPUT:
        cat = ops.set_index("name")["category"]
        names = [n for n in names if cat[n] == "GEMM" and _requantized_input(sim, n)]
    return names


def _requantized_input(sim: Simulator, name: str) -> bool:
    """Whether GEMM ``name`` converts its activation inputs to an integer dtype of its own
    (``input_dtype`` resolved, e.g. int8 Conv/MatMul inputs in a float16 model)."""
    dt = sim.qconfig_of(name).input_dtype
    return dt is not None and dt.is_int


def float_inputs_spec(spec: QConfigSpec, op_types: set[str]) -> QConfigSpec:
    """``spec`` with every rule's ``input_dtype`` set to FLOAT32 (op types in ``op_types``).

    An op in FAKE mode quantizes activation inputs that arrive in float; in the ACTIVATION and
    WEIGHT passes only the studied op's output (or weight) may be quantized, as in the vendor
    tool, so its inputs are declared float32 for those passes.
    """

    def lift(rule: OpQConfig | None) -> OpQConfig:
        return dataclasses.replace(rule or OpQConfig(), input_dtype=DType.FLOAT32)

    return QConfigSpec(
        global_=lift(spec.global_),
        by_type={t: lift(spec.by_type.get(t)) for t in sorted(op_types | set(spec.by_type))},
        by_module={k: lift(v) for k, v in spec.by_module.items()},
        by_name={k: lift(v) for k, v in spec.by_name.items()},
        use_platform_template=spec.use_platform_template,
    )


def pass_modes(kind: SensitiveType, name: str) -> tuple[Mode, dict]:
    """(run mode, op_modes) that switch on ``kind`` for op ``name`` alone (module docstring)."""
    if kind is SensitiveType.ACTIVATION:
        return Mode.FLOAT, {name: OpMode(Mode.FAKE, quantize_weight=False)}
    if kind is SensitiveType.WEIGHT:
        return Mode.FLOAT, {name: OpMode(Mode.FAKE, quantize_output=False)}
    if kind is SensitiveType.INPUT:
        alone = OpMode(
            Mode.FAKE, quantize_output=False, quantize_weight=False, quantize_float_inputs=True
        )
        return Mode.FLOAT, {name: alone}
    return Mode.FAKE, {name: OpMode(Mode.FIXED)}


def check_batches(batches: Sequence[tuple]) -> list[tuple]:
    """Batches as a list of tuples; ValueError for no batch or a batch holding an empty tensor."""
    out = [tuple(b) if isinstance(b, tuple | list) else (b,) for b in batches]
    if not out:
        raise ValueError("sensitivity needs at least one input batch; got none")
    for i, b in enumerate(out):
        for t in b:
            if isinstance(t, Tensor) and t.numel() == 0:
                raise ValueError(
                    f"input batch {i} holds an empty tensor of shape {tuple(t.shape)}; "
                    "sensitivity needs at least one sample per batch"
                )
    return out


def sensitivity(
    sim: Simulator,
    batches: Sequence[tuple],
    kinds: Sequence[SensitiveType | str] = (SensitiveType.ACTIVATION, SensitiveType.WEIGHT),
    metrics: Sequence[Metric | str] = (Metric.L1,),
    task: Any = None,
    replay: bool = True,
    freeze_indices: bool = True,
    progress: bool = True,
) -> SensitivityRun:
    """Rank the ops of a calibrated ``sim`` by sensitivity; one table row per op, kind, metric.

    ``replay=False`` is the naive method (one full forward per op), kept for benchmarks.
    ``progress``: a progress bar per pass on stderr.
    Columns: COLUMNS. Raises ValueError for no batch, an empty batch, an unknown kind or
    metric, TASK without ``task``, or a model with no quantizable op.
    """
    kinds = [SensitiveType.parse(k) for k in kinds]
    metrics = [Metric.parse(m) for m in metrics]
    if Metric.TASK in metrics and task is None:
        raise ValueError("metric TASK needs a model with a task metric (ModelBundle.task)")
    batches = check_batches(batches)
    start = time.perf_counter()
    sim.trace(*batches[0], mode=Mode.FLOAT)  # discover the ops at these inputs
    ops = sim.ops
    if not studied_ops(sim, SensitiveType.ACTIVATION):
        listing = ", ".join(f"{n} ({t})" for n, t in zip(ops["name"], ops["op_type"]))
        raise ValueError(
            "the model has no quantizable op on this platform, nothing to rank; "
            f"captured ops: {listing or 'none'}"
        )
    total_flops = float(ops["flops"].sum()) or 1.0
    items = sum(int(b[0].shape[0]) if isinstance(b[0], Tensor) else 1 for b in batches)
    info = ops.set_index("name")
    rows, runs, studied, baselines = [], 0, {}, {}
    user_spec = sim.spec
    quantized_types = set(ops.loc[ops["supported"], "op_type"])
    for kind in kinds:
        want = (
            user_spec
            if kind in (SensitiveType.FIXED, SensitiveType.INPUT)
            else float_inputs_spec(user_spec, quantized_types)
        )
        if sim.spec is not want:
            sim.set_qconfig(want)
        names = studied_ops(sim, kind)  # INPUT reads the input dtypes of the user's spec
        studied[kind.value] = names
        if not names:
            continue
        base_mode = pass_modes(kind, names[0])[0]
        if base_mode not in baselines:  # ACTIVATION and WEIGHT share the all-float baseline
            freezes = [FrozenIndices() for _ in batches]
            traces = []
            for b, fr in zip(batches, freezes):
                with fr.record() if freeze_indices else _nullcontext():
                    traces.append(sim.trace(*b, mode=base_mode))
            baselines[base_mode] = (traces, freezes)
        traces, freezes = baselines[base_mode]
        refs = [tr.result for tr in traces]
        # a model without index ops runs the per-op passes without the extra mode (no overhead)
        freeze = freeze_indices and any(fr.recorded for fr in freezes)
        for name in tqdm(names, desc=f"sensitivity {kind.value}") if progress else names:
            mode, op_modes = pass_modes(kind, name)
            outs = []
            for b, tr, fr in zip(batches, traces, freezes):
                with fr.replay() if freeze else _nullcontext():
                    outs.append(
                        sim.run(*b, mode=mode, op_modes=op_modes, replay=tr if replay else None)
                    )
                runs += 1
            values = output_metrics(refs, outs, metrics, task)
            ci = estimate_metrics([task], refs, outs)[task.name] if Metric.TASK in values else None
            rq = sim.qconfig_of(name)
            qdt = {SensitiveType.WEIGHT: rq.weight_dtype, SensitiveType.INPUT: rq.input_dtype}.get(
                kind, info.at[name, "output_dtype"]
            )
            for m, v in values.items():
                rows.append(
                    {
                        "op_name": name,
                        "sensitive_type": kind.value,
                        "op_type": info.at[name, "op_type"],
                        "metric": m.name,
                        "value": v,
                        "quant_dtype": getattr(qdt, "name", qdt),
                        "flops_share": float(info.at[name, "flops"]) / total_flops,
                        "items": items,
                        "ci_low": ci.low if ci is not None and m is Metric.TASK else math.nan,
                        "ci_high": ci.high if ci is not None and m is Metric.TASK else math.nan,
                    }
                )
    if sim.spec is not user_spec:
        sim.set_qconfig(user_spec)
    table = rank_table(pd.DataFrame(rows, columns=COLUMNS[:-1]), task)
    return SensitivityRun(table, runs, time.perf_counter() - start, False, studied)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def rank_table(table: pd.DataFrame, task: Any = None) -> pd.DataFrame:
    """Add ``rank`` (1 = most sensitive) per (sensitive_type, metric) and sort by it."""
    parts = []
    for (_kind, metric), g in table.groupby(["sensitive_type", "metric"], sort=False):
        asc = lower_is_worse(Metric[metric], task)
        g = g.sort_values("value", ascending=asc, kind="stable", na_position="last")
        parts.append(g.assign(rank=range(1, len(g) + 1)))
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(parts, ignore_index=True)[COLUMNS]


def top_ops(table: pd.DataFrame, metric: Metric | str, k: int) -> pd.DataFrame:
    """The ``k`` most sensitive rows per sensitive type for one metric."""
    m = Metric.parse(metric).name
    sub = table[table["metric"] == m]
    if sub.empty:
        have = ", ".join(sorted(table["metric"].unique()))
        raise ValueError(f"metric {m} is not in the sensitivity table; it has: {have}")
    return sub[sub["rank"] <= k].reset_index(drop=True)


def merge_batches(batches: Sequence[tuple], per_run: int | None = None) -> list[tuple]:
    """``batches`` concatenated along dim 0 when every position holds tensors of matching
    trailing shapes (fewer, larger runs): into one batch, or into runs of ``per_run`` batches
    (a model that takes one batch size only, such as an ONNX graph that fixes its batch: whole
    runs only, a remainder left out); otherwise the batches unchanged."""
    batches = check_batches(batches)
    per_run = len(batches) if per_run is None else max(1, per_run)
    if len(batches) == 1 or per_run == 1:
        return batches
    arity = len(batches[0])
    ok = all(len(b) == arity for b in batches) and all(
        isinstance(t, Tensor) and t.ndim >= 1 and t.shape[1:] == batches[0][i].shape[1:]
        for b in batches
        for i, t in enumerate(b)
    )
    if not ok:
        return batches
    whole = max(1, len(batches) // per_run) * per_run
    return [
        tuple(torch.cat([b[i] for b in batches[s : s + per_run]], 0) for i in range(arity))
        for s in range(0, whole, per_run)
    ]


def analyze(
    model: torch.nn.Module,
    platform: Any,
    calib: Sequence[tuple],
    batches: Sequence[tuple],
    kinds: Sequence[SensitiveType | str] = (SensitiveType.ACTIVATION, SensitiveType.WEIGHT),
    metrics: Sequence[Metric | str] = (Metric.L1,),
    task: Any = None,
    qconfig: QConfigSpec | None = None,
    cache_dir: str | None = None,
    replay: bool = True,
    freeze_indices: bool = True,
    progress: bool = True,
) -> SensitivityRun:
    """Calibrate a Simulator on ``calib`` and rank its ops on ``batches``, cached.

    The cache key hashes quantlab's source, the model (structure and weights), both input sets,
    the platform, the qconfig and every option, so a rerun with the same inputs returns the
    stored table without building a simulator (``cached=True``, ``runs=0``).
    """
    from quantlab.analysis.cache import ResultCache, code_fingerprint, fingerprint

    kinds = [SensitiveType.parse(k) for k in kinds]
    metrics = [Metric.parse(m) for m in metrics]
    batches = check_batches(batches)
    calib = check_batches(calib)
    cache = ResultCache(cache_dir, "sensitivity")
    key = fingerprint(
        code_fingerprint(),
        model,
        calib,
        batches,
        platform,
        qconfig,
        kinds,
        metrics,
        getattr(task, "name", None),
        replay,
        freeze_indices,
    )
    start = time.perf_counter()
    hit = cache.get(key)
    if hit is not None:
        return SensitivityRun(
            hit, 0, time.perf_counter() - start, True, hit.attrs.get("studied", {})
        )
    sim = Simulator(model, platform, qconfig)
    sim.calibrate(calib, progress)
    run = sensitivity(sim, batches, kinds, metrics, task, replay, freeze_indices, progress)
    run.seconds = time.perf_counter() - start
    run.sim = sim
    run.table.attrs["studied"] = run.studied
    cache.put(key, run.table)
    return run
