"""Per-op choice of the calibration rule: for each op, the observer whose scales minimise an error.

Greedy, in execution order, on calibration inputs: every op before the current one keeps the rule
already chosen for it (its outputs are replayed from the last trace), every later op runs in
float except pass-through ops (which keep their input's quantization), and each candidate rule
of the current op (``ObserverChoice``: all its activation points, inputs and output) is scored by
the squared error against the float run

- ``OP_OUTPUT``: at the op's own output (for a Conv/Linear with a fused batch_norm / clamp: the
  output of the last fused op, where its scale applies), or
- ``MODEL_OUTPUT``: at the model's output.

The lowest error wins (ties: the first candidate listed); candidates giving the op the same
scales are scored once; an op whose candidates all leave the same error (its own scales unused,
e.g. an input that arrives quantized) gets no rule. The result is a ``QConfigSpec``: the
simulator's rules plus one ``by_name`` rule per op that sets its observer, so it is saved,
loaded and applied like any other qconfig. Candidates that search each batch (MSE, MIX,
PERCENTILE, KL) need the simulator to have been calibrated with them:
``sim.calibrate(batches, observers=candidates)``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm import tqdm

from quantlab.analysis.metrics import flat
from quantlab.calibration.choice import PEER_CHOICES, VENDOR_CHOICES, ObserverChoice
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate.modes import Mode, OpMode

DEFAULT_CANDIDATES = VENDOR_CHOICES + PEER_CHOICES
ACTIVATION_DTYPES = (DType.INT8.name, DType.INT16.name)  # calibrated (int32 outputs are not)


class ChoiceTarget(enum.Enum):
    """Where the per-op choice measures the error (see the module docstring)."""

    OP_OUTPUT = "op_output"
    MODEL_OUTPUT = "model_output"


@dataclass
class PerOpChoice:
    """The chosen rules (``spec``) and every score (``table``: op, candidate, sq_error, chosen,
    effective = the candidates' errors differ at that op, so a rule was written for it)."""

    spec: QConfigSpec
    table: pd.DataFrame

    def chosen(self) -> dict[str, str]:
        """op name -> label of the rule written for it (ops where the candidates differ)."""
        t = self.table[self.table["chosen"] & self.table["effective"]]
        return dict(zip(t["op"], t["candidate"]))


def choose_per_op(
    sim,
    batches: Sequence[tuple],
    candidates: Sequence[ObserverChoice] = DEFAULT_CANDIDATES,
    target: ChoiceTarget = ChoiceTarget.OP_OUTPUT,
    mode: Mode = Mode.FAKE,
    progress: bool = True,
) -> PerOpChoice:
    """Pick each op's observer among ``candidates`` on ``batches`` (see the module docstring).

    ``sim`` must be calibrated; its qconfig is left as it was (apply ``result.spec`` with
    ``sim.set_qconfig``). A progress bar on stderr unless ``progress`` is False.
    """
    if not candidates:
        raise ValueError("choose_per_op needs at least one candidate observer")
    base = sim.spec
    refs = [sim.trace(*b, mode=Mode.FLOAT) for b in batches]
    ops = sim.ops  # dtypes and fusions do not depend on the observers
    rows_by_name = ops.set_index("name")
    decided = _decided_ops(ops)
    computing = [r.name for r in ops.itertuples() if r.category != "PASS_THROUGH"]
    by_name = dict(base.by_name)
    prefix = [None] * len(batches)
    rows = []
    try:
        desc = f"choose observers ({target.name.lower()})"
        for op in tqdm(decided, desc=desc) if progress else decided:
            later = {n: OpMode(Mode.FLOAT) for n in computing[computing.index(op) + 1 :]}
            modes = {op: OpMode(mode), **later}
            # at the op's output, a candidate's run ends there; the chosen one then runs whole
            # (the next op replays its trace), with the bits a whole run of it gave
            at = _measured_at(op, ops)
            stop = at if target is ChoiceTarget.OP_OUTPUT else None
            seen: dict[tuple, tuple] = {}
            scored = []
            for cand in candidates:
                rule = _merge(by_name.get(op), cand)
                sim.set_qconfig(dataclasses.replace(base, by_name={**by_name, op: rule}))
                key = _scales(sim, op, rows_by_name.loc[op])
                if key not in seen:
                    traces = [
                        sim.trace(*b, mode=mode, op_modes=modes, replay=p, stop_after=stop)
                        for b, p in zip(batches, prefix)
                    ]
                    seen[key] = (_error(traces, refs, at, target), traces)
                scored.append((cand, rule, *seen[key]))
            best = min(range(len(scored)), key=lambda i: scored[i][2])
            effective = len({err for _, _, err, _ in scored}) > 1
            if effective:  # else the op's scales change nothing measured: no rule written
                by_name[op] = scored[best][1]
            if stop is None:
                prefix = scored[best][3]
            else:  # the chosen candidate's run whole
                chosen = {**by_name, op: scored[best][1]}
                sim.set_qconfig(dataclasses.replace(base, by_name=chosen))
                prefix = [
                    sim.trace(*b, mode=mode, op_modes=modes, replay=p)
                    for b, p in zip(batches, prefix)
                ]
            for i, (cand, _, err, _) in enumerate(scored):
                rows.append(
                    {
                        "op": op,
                        "candidate": cand.label,
                        "sq_error": err,
                        "chosen": i == best,
                        "effective": effective,
                        "distinct_scales": len(seen),
                    }
                )
    finally:
        sim.set_qconfig(base)
    return PerOpChoice(dataclasses.replace(base, by_name=by_name), pd.DataFrame(rows))


def _decided_ops(ops: pd.DataFrame) -> list[str]:
    """Ops that own activation scales: modelled, supported, not pass-through, not fused into a
    GEMM, and with an integer input or output."""
    out = []
    for r in ops.itertuples():
        if r.category in ("NONE", "PASS_THROUGH") or not r.supported or r.fused_into:
            continue
        dts = [d for d in str(r.input_dtype).split(",") if d] + [str(r.output_dtype)]
        if any(d in ACTIVATION_DTYPES for d in dts):
            out.append(r.name)
    return out


def _merge(existing: OpQConfig | None, cand: ObserverChoice) -> OpQConfig:
    if existing is None:
        return cand.rule()
    return dataclasses.replace(
        existing,
        observer=cand.kind,
        histogram_method=cand.method,
        percentile=cand.percentile if cand.percentile is not None else existing.percentile,
    )


def _scales(sim, op: str, row) -> tuple:
    """The scales the current qconfig gives the op's activation points (a dedup key); ``row``:
    the op's row of ``sim.ops``."""
    rq = sim.qconfig_of(op)
    ins = [d for d in str(row.input_dtype).split(",") if d]
    points = [(f"in{i}", d) for i, d in enumerate(ins)] + [("out", str(row.output_dtype))]
    key = []
    for point, dt in points:
        if dt not in ACTIVATION_DTYPES:
            continue
        try:
            key.append(float(sim.act_scale(op, point, DType[dt], rq)))
        except ValueError as e:
            if "no calibration statistics" not in str(e):
                raise
    return tuple(key)


def _measured_at(op: str, ops: pd.DataFrame) -> str:
    """The op whose output ``OP_OUTPUT`` measures: ``op``, or the last op fused into it."""
    fused = ops[ops["fused_into"] == op]["name"]
    return fused.iloc[-1] if len(fused) else op


def _error(traces, refs, at: str, target: ChoiceTarget) -> float:
    """The squared error of ``traces`` against the float ``refs``: at the model's output, or
    at op ``at``'s (``_measured_at``)."""
    if target is ChoiceTarget.MODEL_OUTPUT:
        pairs = [(r.result, t.result) for r, t in zip(refs, traces)]
    else:
        pairs = [(r.outputs[at], t.outputs[at]) for r, t in zip(refs, traces)]
    total = 0.0
    for a, b in pairs:
        fa, fb = flat(a), flat(b)
        total += float(((fa - fb) ** 2).sum()) if fa.numel() else 0.0
    return total if torch.isfinite(torch.tensor(total)) else float("inf")
