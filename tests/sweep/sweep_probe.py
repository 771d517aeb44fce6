"""A tiny experiment used only by the sweep tests (registered when this module is imported).

Its table has ``points`` rows: x = 0..points-1 and y = value * x. ``sleep_s`` makes each job take
a known time, so a test can stop a sweep between two jobs; ``fail`` makes the job raise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment


@dataclass
class SweepProbeExp:
    value: float = 1.0
    points: int = 3
    sleep_s: float = 0.0
    fail: bool = False


register_schema("exp", "sweep_probe_schema", SweepProbeExp)


@experiment(SweepProbeExp, "sweep_probe")
def sweep_probe(exp: SweepProbeExp, ctx: RunContext) -> ExperimentResult:
    if exp.fail:
        raise RuntimeError(f"sweep_probe asked to fail (value={exp.value})")
    time.sleep(exp.sleep_s)
    table = pd.DataFrame({"x": range(exp.points), "y": [exp.value * x for x in range(exp.points)]})
    return ExperimentResult(table=table, title=f"sweep probe {exp.value}")
