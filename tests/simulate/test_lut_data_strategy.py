"""lut_strategy DATA in the Simulator: the table is chosen under the op's calibrated input
histogram (``Simulator.histogram``), and under that histogram its mean error is no larger
than OPTIMAL's, whose points ignore the data."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import InputHistogram, Strategy, build_lut, default_spec
from quantlab.numerics.lut.analysis import mean_error_lsb
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.profiles import platform_config


class _Sigmoid(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)


def _calibration():
    g = torch.Generator().manual_seed(3)
    # most inputs in a narrow band, a few far out: the range sets the scale, the band the data
    band = [torch.randn(4096, generator=g) * 0.3 + 1.0 for _ in range(3)]
    tails = torch.tensor([-7.5, 7.5])
    return [(torch.cat([b, tails]),) for b in band]


def _sim(strategy: Strategy) -> Simulator:
    rule = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16, lut_strategy=strategy.name)
    sim = Simulator(_Sigmoid(), platform_config("j6m"), QConfigSpec(by_type={"sigmoid": rule}))
    sim.calibrate(_calibration(), progress=False)
    return sim


def test_data_strategy_runs_on_the_calibrated_histogram_and_beats_optimal_on_its_data():
    data, optimal = _sim(Strategy.DATA), _sim(Strategy.OPTIMAL)
    name = ":sigmoid#0"
    edges, counts = data.histogram(name, 0)
    assert float(counts.sum()) == 3 * (4096 + 2)  # every calibration value counted
    hist = InputHistogram(float(edges[0]), float(edges[-1]), tuple(counts.tolist()))
    x = _calibration()[0][0]
    y_data = data.run(x, mode=Mode.FIXED)
    y_opt = optimal.run(x, mode=Mode.FIXED)
    assert torch.isfinite(y_data).all() and not torch.equal(y_data, y_opt)

    rq = data.qconfig_of(name)
    xs = data.act_scale(name, "in0", DType.INT16, rq)
    so = data.act_scale(name, "out", DType.INT16, rq)
    observed = data.observed_range(name, "in0")
    tables = {}
    for st in (Strategy.DATA, Strategy.OPTIMAL):
        spec = replace(default_spec("sigmoid"), strategy=st, dividing_points=None)
        tables[st] = build_lut(
            "sigmoid",
            DType.INT16,
            float(xs),
            DType.INT16,
            float(so),
            spec,
            data.platform.lut_format(),
            observed,
            hist,
        )
    # the simulator's fixed output is the DATA table evaluated on the input codes
    codes = torch.round(x / float(xs)).clamp(-32768, 32767).to(torch.int16)
    want = tables[Strategy.DATA].evaluate(codes).to(torch.float32) * float(so)
    assert torch.equal(y_data.to(torch.float32), want)
    w = hist.code_weights(DType.INT16, float(xs))
    e_data = mean_error_lsb(tables[Strategy.DATA], w)
    e_opt = mean_error_lsb(tables[Strategy.OPTIMAL], w)
    assert e_data <= e_opt and np.isfinite(e_data)


def test_data_strategy_refuses_a_period_reduced_input():
    class _Sin(nn.Module):
        def forward(self, x):
            return torch.sin(x)

    rule = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16, lut_strategy="DATA")
    sim = Simulator(_Sin(), platform_config("j6m"), QConfigSpec(by_type={"sin": rule}))
    sim.calibrate([(torch.linspace(-40.0, 40.0, 4096),)], progress=False)
    with pytest.raises(ValueError, match="period-reduced"):
        sim.run(torch.linspace(-40.0, 40.0, 4096), mode=Mode.FIXED)
