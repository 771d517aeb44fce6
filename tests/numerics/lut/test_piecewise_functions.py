"""hardsigmoid, hardswish and leaky_relu as segment LUTs: the default tables' edges sit on their
kinks (-3 and 3: HARD_POINTS; 0: KINK_AT_ZERO), which keeps an int16 table within about two
output LSB of the function over every input range; the curvature rule's edges miss the kinks.
A simulated leaky_relu takes its call's slope."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from quantlab.numerics import DType
from quantlab.numerics.lut import LutSpec, Strategy, build_lut, default_spec
from quantlab.numerics.lut.functions import get_function
from quantlab.simulate import Mode, Simulator

CODES = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)


def _max_error_lsb(func: str, in_range: float, spec: LutSpec | None = None) -> float:
    """Largest |table - f| over every int16 code, in output LSB; output scale for the range."""
    spec = spec or default_spec(func)
    si = in_range / 32767
    so = (1.0 if func == "hardsigmoid" else max(in_range, 1.0)) / 32767  # no saturation
    table = build_lut(func, DType.INT16, si, DType.INT16, so, spec)
    want = get_function(func).target(CODES.double() * si, spec)
    return float(((table.evaluate(CODES).double() * so - want).abs() / so).max())


@pytest.mark.parametrize("func", ["hardsigmoid", "hardswish"])
@pytest.mark.parametrize("in_range", [1.0, 2.0, 4.0, 8.0, 16.0, 64.0])
def test_int16_tables_stay_within_two_and_a_half_lsb(func, in_range):
    assert _max_error_lsb(func, in_range) <= 2.5


@pytest.mark.parametrize("slope", [0.01, 0.1, 0.2, 1.0])
@pytest.mark.parametrize("in_range", [1.0, 8.0, 100.0])
def test_int16_leaky_relu_is_two_lines_meeting_at_zero(slope, in_range):
    spec = dataclasses.replace(default_spec("leaky_relu"), negative_slope=slope)
    si = in_range / 32767
    assert build_lut("leaky_relu", DType.INT16, si, DType.INT16, si, spec).points == (
        -32768,
        0,
        32767,
    )
    assert _max_error_lsb("leaky_relu", in_range, spec) <= 2.01  # index rounding, not the line


def test_hard_table_edges_sit_on_the_kinks():
    si = 8 / 32767
    for func in ("hardsigmoid", "hardswish"):
        points = build_lut(func, DType.INT16, si, DType.INT16, 8 / 32767).points
        assert {round(-3 / si), round(3 / si)} <= {int(p) for p in points}
    curvature = LutSpec(Strategy.CURVATURE)
    assert _max_error_lsb("hardswish", 8.0, curvature) > 10 * _max_error_lsb("hardswish", 8.0)


@pytest.mark.parametrize("func", ["hardsigmoid", "hardswish"])
def test_int8_direct_table_is_the_rounded_function(func):
    si, so = 0.05, 0.0317  # no output tie: float64 orders of the same function agree
    table = build_lut(func, DType.INT8, si, DType.INT8, so)
    codes = torch.arange(-128, 128).to(torch.int8)
    fn = torch.nn.functional.hardsigmoid if func == "hardsigmoid" else torch.nn.functional.hardswish
    want = torch.round(fn(codes.double() * si) / so).clamp(-128, 127).to(torch.int8)
    assert torch.equal(table.evaluate(codes), want)


class _Leaky(nn.Module):
    def forward(self, x):
        return nn.functional.leaky_relu(x, 0.25)


def test_a_simulated_leaky_relu_takes_its_calls_slope():
    torch.manual_seed(0)
    sim = Simulator(_Leaky(), "j6m")
    sim.calibrate([(torch.randn(64) * 4,)], progress=False)
    x = torch.linspace(-6, 6, 97)
    fixed = sim.run(x, mode=Mode.FIXED)
    assert (fixed - torch.nn.functional.leaky_relu(x, 0.25)).abs().max() < 0.1  # 2 LSB of 6/127
    negative = x < -0.5
    ratio = fixed[negative] / torch.nn.functional.leaky_relu(x[negative], 0.01)
    assert ratio.min() > 10  # a table of the default 0.01 would give about 1
