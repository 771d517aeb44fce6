"""Per-op choice against errors recomputed in numpy for a small model: sigmoid, a pass-through
reshape, tanh (each LUT op owns its scales; the reshape keeps the sigmoid's quantization)."""

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


class _LutChain(nn.Module):
    def forward(self, x):
        y = torch.sigmoid(x).reshape(x.shape[0], -1, 4)
        return torch.tanh(y)


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
    sim = Simulator(_LutChain(), "j6m")
    sim.calibrate(calib, observers=CANDIDATES)
    names = list(sim.ops["name"])
    sig, tanh = (next(n for n in names if f":{f}#" in n) for f in ("sigmoid", "tanh"))
    res = choose_per_op(sim, calib, CANDIDATES, target)
    assert sim.spec == QConfigSpec()  # the simulator's own qconfig is left as it was
    assert list(dict.fromkeys(res.table["op"])) == [sig, tanh]  # the reshape owns no scale
    x = np.concatenate([b[0].double().numpy() for b in calib])
    ref_sig = 1.0 / (1.0 + np.exp(-x))
    sig_errs, sig_out = {}, {}
    for cand in CANDIDATES:
        y = _fq(
            1.0 / (1.0 + np.exp(-_fq(x, _scale(sim, sig, "in0", cand)))),
            _scale(sim, sig, "out", cand),
        )
        sig_out[cand.label] = y
        later = y if target is ChoiceTarget.OP_OUTPUT else np.tanh(y)  # the tanh in float
        ref = ref_sig if target is ChoiceTarget.OP_OUTPUT else np.tanh(ref_sig)
        sig_errs[cand.label] = ((later - ref) ** 2).sum()
    chosen = res.chosen()
    assert chosen[sig] == min(sig_errs, key=sig_errs.get)
    # tanh: its input arrives quantized at the chosen sigmoid scale, through the reshape
    tanh_errs = {
        c.label: (
            (_fq(np.tanh(sig_out[chosen[sig]]), _scale(sim, tanh, "out", c)) - np.tanh(ref_sig))
            ** 2
        ).sum()
        for c in CANDIDATES
    }
    assert chosen[tanh] == min(tanh_errs, key=tanh_errs.get)
    t = res.table.set_index(["op", "candidate"])["sq_error"]
    for label in sig_errs:
        assert t[(sig, label)] == pytest.approx(sig_errs[label], rel=1e-3)
        assert t[(tanh, label)] == pytest.approx(tanh_errs[label], rel=1e-3)
    assert res.spec.by_name[sig].observer is ObserverChoice.parse(chosen[sig]).kind
    sim.set_qconfig(res.spec)
    assert torch.isfinite(sim.run(*calib[0], mode=Mode.FAKE)).all()


def test_fused_conv_chains_are_decided_at_their_heads():
    torch.manual_seed(0)
    blocks = [nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU6(), nn.Conv2d(8, 8, 3)]
    model = nn.Sequential(*blocks, nn.BatchNorm2d(8), nn.ReLU6(), nn.Flatten(), nn.Linear(128, 4))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)]
    sim = Simulator(model.eval(), "j6m")
    sim.calibrate(calib, observers=CANDIDATES)
    ops = sim.ops
    heads = set(ops[ops["fused_into"] != ""]["fused_into"])
    assert len(heads) == 2
    for target in ChoiceTarget:
        res = choose_per_op(sim, calib, CANDIDATES, target)
        assert heads <= set(res.table["op"])
        assert not set(ops[ops["fused_into"] != ""]["name"]) & set(res.table["op"])


def test_a_candidates_run_ends_at_the_measured_op_with_the_whole_runs_choice():
    """At OP_OUTPUT each candidate's run ends once its op (or its fused chain's last op) has
    run, and the chosen one runs whole for the next op's replay: the same table, errors bit for
    bit, and the same rules as whole runs of every candidate give."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU6(), nn.Conv2d(8, 8, 3), nn.Sigmoid(),
        nn.Flatten(), nn.Linear(128, 4), nn.Tanh(),
    )  # fmt: skip
    g = torch.Generator().manual_seed(2)
    calib = [(torch.randn(2, 3, 8, 8, generator=g),) for _ in range(2)]
    sim = Simulator(model.eval(), "j6m")
    sim.calibrate(calib, observers=CANDIDATES)
    order = list(sim.ops["name"])
    ends = []
    trace = sim.trace

    def whole(*args, stop_after=None, **kwargs):  # every candidate's run whole, as before
        ends.append(stop_after)
        return trace(*args, **kwargs)

    sim.trace = whole
    reference = choose_per_op(sim, calib, CANDIDATES, ChoiceTarget.OP_OUTPUT, progress=False)
    del sim.trace
    stops = {e for e in ends if e is not None}
    assert order[-1] in stops and order[0] not in stops  # the conv is measured after its relu6
    assert any(":relu6#" in e for e in stops)
    got = choose_per_op(sim, calib, CANDIDATES, ChoiceTarget.OP_OUTPUT, progress=False)
    assert got.table.equals(reference.table) and got.spec == reference.spec
    assert list(sim.ops["name"]) == order  # a run that ended early changed nothing learnt
    part = sim.trace(*calib[0], mode=Mode.FAKE, stop_after=order[1])
    assert part.result is None and set(part.outputs) == set(order[:2])
    full = sim.trace(*calib[0], mode=Mode.FAKE)
    assert torch.equal(full.outputs[order[1]], part.outputs[order[1]])
    assert full.result is not None and set(full.outputs) == set(order)
