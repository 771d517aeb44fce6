"""log2, log10, log1p, celu and logit as segment LUTs of their functions on J6 (as log, elu
and inverse_sigmoid are; each strategy an assumption, ``lut.functions.default_spec``); the
runtime profiles run them in float."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_unary_tables import assert_near_function, assert_table_op
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import default_spec
from quantlab.op_kinds import OpCategory, classify
from quantlab.simulate import Mode, Simulator

# op type -> (its call, the table function and spec fields the call sets, the inputs' range)
CASES = {
    "log2": (torch.log2, "log2", {}, (0.05, 4.0)),
    "log10": (lambda y: y.log10(), "log10", {}, (0.05, 4.0)),
    "log1p": (torch.special.log1p, "log1p", {}, (-0.5, 4.0)),
    "celu": (nn.CELU(alpha=0.5), "celu", {"alpha": 0.5}, (-3.0, 3.0)),
    "logit": (lambda y: torch.logit(y, eps=1e-3), "inverse_sigmoid", {"eps": 1e-3}, (0.0, 1.0)),
}


class _Identity1x1(nn.Module):
    """A 1x1 convolution that passes its input (its output codes feed the op), then the op."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.eye(3).reshape(3, 3, 1, 1))
            self.conv.bias.zero_()
        self.fn = fn

    def forward(self, x):
        return self.fn(self.conv(x))


def _inputs(op: str, g: torch.Generator, count: int) -> list[torch.Tensor]:
    lo, hi = CASES[op][3]
    return [lo + (hi - lo) * torch.rand(2, 3, 5, 5, generator=g) for _ in range(count)]


def _calibrated(op: str, platform: str):
    g = torch.Generator().manual_seed(1)
    sim = Simulator(_Identity1x1(CASES[op][0]).eval(), platform)
    sim.calibrate([(x,) for x in _inputs(op, g, 2)], progress=False)
    return sim, _inputs(op, g, 2)


def test_each_spelling_is_a_table_op():
    x = torch.rand(8)
    for op, fn in (
        ("log2", torch.log2),
        ("log2", torch.Tensor.log2_),
        ("log10", torch.log10),
        ("log1p", torch.log1p),
        ("log1p", torch.special.log1p),
        ("log1p", torch.Tensor.log1p_),
        ("celu", F.celu),
        ("celu", torch.celu),
        ("logit", torch.logit),
        ("logit", torch.special.logit),
        ("logit", torch.Tensor.logit_),
    ):
        assert classify(fn, (x,), {}) == (op, OpCategory.LUT), (op, fn)


@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize(("dtype", "scale"), [(DType.INT8, 2.0**-4), (DType.INT16, 2.0**-11)])
def test_the_op_is_the_table_of_its_function(op, dtype, scale):
    """J6M: the op's output is the table of its function (at the call's alpha or eps) over the
    calibrated input range on the convolution's output codes, and that table follows the
    function on the codes it covers."""
    fn, func, fields, _ = CASES[op]
    sim, xs = _calibrated(op, "j6m")
    (name,) = sim.ops.loc[sim.ops.op_type == op, "name"]
    spec = dataclasses.replace(default_spec(func), **fields)

    def grid(lo, hi):
        x = torch.linspace(max(lo, 0.06 if op.startswith("log") else -3.0), min(hi, 3.0), 97)
        return x.clamp(0.02, 0.98) if op == "logit" else x

    assert_table_op(sim, name, func, spec, dtype, scale, xs, grid, fn)


@pytest.mark.parametrize("platform", ["j6m", "j6p"])
@pytest.mark.parametrize("op", list(CASES))
def test_fake_and_fixed_stay_near_the_function(platform, op):
    """FAKE is the float function fake-quantized at the output; FIXED its table (J6P: its
    float16 form): both within a few output steps of the function of the op's own input."""
    sim, xs = _calibrated(op, platform)
    (name,) = sim.ops.loc[sim.ops.op_type == op, "name"]
    assert_near_function(sim, name, CASES[op][0], xs, clipped_tail=True)


@pytest.mark.parametrize("platform", ["onnxruntime", "tflite"])
def test_runtime_profiles_run_them_in_float(platform):
    for op in CASES:
        sim, xs = _calibrated(op, platform)
        row = sim.ops.set_index("op_type").loc[op]
        assert row["fixed_kernel"] == "float (not supported on this platform)", op
        assert torch.isfinite(sim.run(xs[0], mode=Mode.FIXED)).all()
