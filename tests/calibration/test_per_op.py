"""Per-op choice against errors recomputed in numpy for a two-op model (sigmoid then tanh)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from quantlab.calibration.choice import ObserverChoice
from quantlab.calibration.per_op import ChoiceTarget, choose_per_op
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

CANDIDATES = [
    ObserverChoice("GLOBAL_MINMAX"),
    ObserverChoice("HISTOGRAM", "MSE"),
    ObserverChoice("HISTOGRAM", "PERCENTILE", 90.0),
    ObserverChoice("MSE"),
]


class _TwoOps(nn.Module):
    def forward(self, x):
        return torch.tanh(3.0 * torch.sigmoid(x) - 1.5)


def _fq(x: np.ndarray, s: float) -> np.ndarray:
    return np.clip(np.round(x / s), -128, 127) * s


def _scale(sim, op: str, point: str, cand: ObserverChoice) -> float:
    base = sim.qconfig_of(op)
    rule = OpQConfig(
        observer=cand.kind,
        histogram_method=cand.method or base.histogram_method,
        percentile=cand.percentile or base.percentile,
    )
    sim.set_qconfig(QConfigSpec(by_name={op: rule}))
    s = float(sim.act_scale(op, point, DType.INT8, sim.qconfig_of(op)))
    sim.set_qconfig(QConfigSpec())
    return s


@pytest.mark.parametrize("target", list(ChoiceTarget))
def test_each_op_gets_the_candidate_with_the_lowest_recomputed_error(target):
    g = torch.Generator().manual_seed(0)
    calib = [(torch.randn(64, 32, generator=g) * 3,) for _ in range(3)]
    sim = Simulator(_TwoOps(), "j6m")
    sim.calibrate(calib, observers=CANDIDATES)
    names = list(sim.ops["name"])
    sig = next(n for n in names if "sigmoid" in n)
    mul = next(n for n in names if "mul" in n)
    tanh = next(n for n in names if "tanh" in n)
    res = choose_per_op(sim, calib, CANDIDATES, target)
    assert sim.spec == QConfigSpec()  # the simulator's own qconfig is left as it was
    x = np.concatenate([b[0].double().numpy() for b in calib])
    assert set(res.table["op"]) >= {sig, mul, tanh}  # every op that owns a scale is decided
    errs = {}
    for cand in CANDIDATES:
        s_in, s_out = _scale(sim, sig, "in0", cand), _scale(sim, sig, "out", cand)
        y = _fq(1.0 / (1.0 + np.exp(-_fq(x, s_in))), s_out)
        ref = 1.0 / (1.0 + np.exp(-x))
        if target is ChoiceTarget.OP_OUTPUT:
            errs[cand.label] = ((y - ref) ** 2).sum()
        else:  # later ops in float
            errs[cand.label] = ((np.tanh(3.0 * y - 1.5) - np.tanh(3.0 * ref - 1.5)) ** 2).sum()
    t = res.table[res.table["op"] == sig].set_index("candidate")
    for label, e in errs.items():
        assert t.loc[label, "sq_error"] == pytest.approx(e, rel=1e-3)
    assert res.chosen()[sig] == min(errs, key=errs.get)
    rule = res.spec.by_name[sig]
    assert rule.observer is ObserverChoice.parse(res.chosen()[sig]).kind
    sim.set_qconfig(res.spec)
    y = sim.run(*calib[0], mode=Mode.FAKE)
    assert torch.isfinite(y).all() and mul in names
