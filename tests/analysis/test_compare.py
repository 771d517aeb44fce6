"""Per-op comparison: isolated vs accumulated views, first divergence, LSB and saturation."""

from __future__ import annotations

import math

import torch
from torch import nn

from quantlab.analysis.compare import compare_traces, first_divergence
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator, View


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 16)

    def forward(self, x):
        h = torch.sigmoid(self.fc1(x))
        return self.fc2(torch.tanh(h * 3.0))


def _sim():
    torch.manual_seed(0)
    # int16 sigmoid: a segment table with interpolation (an int8 -> int8 table is exact)
    wide = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)
    sim = Simulator(Chain().eval(), "j6m", QConfigSpec(by_type={"sigmoid": wide}))
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(8, 16, generator=g),) for _ in range(2)])
    return sim, torch.randn(8, 16, generator=g)


def test_views_and_columns():
    sim, x = _sim()
    acc = sim.compare(x, a=Mode.FAKE, b=Mode.FIXED, view=View.ACCUMULATED)
    iso = sim.compare(x, a="fake", b="fixed", view=View.ISOLATED)
    assert list(acc["name"]) == list(iso["name"]) == list(sim.ops["name"])
    for col in (
        "name",
        "op_type",
        "l1",
        "cosine",
        "mse",
        "kl",
        "sqnr_db",
        "max_abs",
        "err_lsb",
        "saturated",
        "view",
    ):
        assert col in acc.columns
    # the first op sees identical inputs in both views
    assert acc.iloc[0].max_abs == iso.iloc[0].max_abs
    # errors carried from earlier ops make the accumulated gap at least as large at the end
    a, i = acc.set_index("name"), iso.set_index("name")
    assert a.loc[":tanh#0"].mse >= i.loc[":tanh#0"].mse
    # the segment LUT differs from the exact function by whole output LSBs
    lut = i.loc[":sigmoid#0"]
    assert lut.out_dtype == "INT16"
    assert abs(lut.err_lsb - round(lut.err_lsb)) < 1e-2 and lut.err_lsb >= 0.99


def test_identical_runs_and_first_divergence():
    sim, x = _sim()
    ta = sim.trace(x, mode=Mode.FIXED)
    tb = sim.trace(x, mode=Mode.FIXED)
    same = compare_traces(ta, tb)
    assert (same.max_abs == 0).all() and (same.sqnr_db == math.inf).all()
    assert first_divergence(same, "sqnr_db", 60.0) is None
    tf = sim.trace(x, mode=Mode.FLOAT)
    diff = compare_traces(tf, tb)
    first = first_divergence(diff, "sqnr_db", 1e9)
    assert first is not None and first["name"] == diff.iloc[0]["name"]
    worst = first_divergence(diff, "max_abs", diff.max_abs.max() * 0.999)
    assert worst["max_abs"] == diff.max_abs.max()
