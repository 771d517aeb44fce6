"""Bilinear and linear F.interpolate in fixed mode on J6 (``platform.resize``
GRID_SAMPLER): the codes of the fixed-point sampler (numerics.resize; a 1-d input as one row) on
the input's centred codes, requantized to the op's output by the platform's rule (the slow
references), for a size, scale factors mapped by torch, a recomputed factor, align_corners and
zero points; no fallback to float; the onnxruntime profiles keep computing it in float, and the
op table says which."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from test_zero_point_ops import _observe, _requant_reference
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.resize import resize_bilinear_fixed
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Simulator

CALLS = {  # op name -> (interpolate's keyword arguments, the sampler's size and scales)
    ":interpolate#0": ({"scale_factor": 2.0}, (14, 10), (2.0, 2.0)),
    ":interpolate#1": ({"size": (5, 9), "align_corners": True}, (5, 9), (None, None)),
    ":interpolate#2": ({"scale_factor": (0.6, 1.5)}, (4, 7), (0.6, 1.5)),
    ":interpolate#3": (
        {"scale_factor": 1.7, "recompute_scale_factor": True},
        (11, 8),
        (None, None),
    ),
}


LINEAR = {  # the same for a row: (keyword arguments, output length, scale)
    ":interpolate#4": ({"scale_factor": 2.5}, 12, 2.5),
    ":interpolate#5": ({"size": 3, "align_corners": True}, 3, None),
}


class _Resized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        outs = [F.interpolate(y, mode="bilinear", **kw) for kw, _, _ in CALLS.values()]
        row = y[:, :, 0, :]  # (N, C, 5)
        outs += [F.interpolate(row, mode="linear", **kw) for kw, _, _ in LINEAR.values()]
        return [o.mean(-1) for o in outs]


@pytest.mark.parametrize("symmetry", ["SYMMETRIC", "ASYMMETRIC"])
def test_bilinear_interpolate_is_the_fixed_point_sampler_then_requantized(symmetry, monkeypatch):
    torch.manual_seed(0)
    spec = QConfigSpec(global_=OpQConfig(activation_symmetry=symmetry, observer="MINMAX"))
    sim = Simulator(_Resized().eval(), "j6m", spec)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 3, 7, 5, generator=g),) for _ in range(2)], progress=False)
    seen_args = {}

    def record(oc):
        seen_args[oc.call.name] = oc.call.args

    trace, seen, fell_back = _observe(
        sim, torch.randn(2, 3, 7, 5, generator=g), monkeypatch, record
    )
    assert fell_back == [], fell_back
    p = sim.platform
    for name, (_, size, scales) in CALLS.items():
        xi = seen[name][1][0]
        xc = xi.codes_of(seen_args[name][0]).to(torch.int64) - xi.zero_point
        align = bool(CALLS[name][0].get("align_corners"))
        acc = resize_bilinear_fixed(xc, DType.INT32, size, align, scales, p.grid_weight_frac_bits,
                                    p.grid_round, p.grid_round).to(torch.int64)  # fmt: skip
        got = trace.qinfo[name]
        assert tuple(got.codes.shape[2:]) == size
        assert_bits_equal(got.codes, _requant_reference(p, acc, xi.scale, got))
    for name, (kw, length, scale) in LINEAR.items():
        xi = seen[name][1][0]
        xc = xi.codes_of(seen_args[name][0]).to(torch.int64) - xi.zero_point
        align = bool(kw.get("align_corners"))
        bits = (p.grid_weight_frac_bits, p.grid_round, p.grid_round)
        row = xc.unsqueeze(2)  # one row of height 1
        acc = resize_bilinear_fixed(row, DType.INT32, (1, length), align, (None, scale), *bits)
        got = trace.qinfo[name]
        assert tuple(got.codes.shape[2:]) == (length,)
        assert_bits_equal(got.codes, _requant_reference(p, acc.squeeze(2).long(), xi.scale, got))
    kernels = set(sim.ops.fixed_kernel[sim.ops.op_type == "interpolate"])
    want = "integer (nearest, nearest-exact, linear, bilinear); float_fallback (other modes)"
    assert kernels == {want}


@pytest.mark.parametrize("platform", ["onnxruntime", "onnxruntime_no_vnni"])
def test_runtime_profiles_keep_bilinear_resize_in_float(platform):
    """onnxruntime runs Resize in float (the LiteRT profiles' integer kernels:
    tests/runtime/test_litert_resize.py)."""
    sim = Simulator(_Resized().eval(), platform)
    sim.calibrate([(torch.randn(2, 3, 7, 5),)], progress=False)
    kernel = sim.ops.fixed_kernel[sim.ops.op_type == "interpolate"].iloc[0]
    assert "bilinear" in kernel and "float" in kernel.split(";")[1]
