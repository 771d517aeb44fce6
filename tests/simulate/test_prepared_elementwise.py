"""Fixed-mode mul, div by a scalar, add and sub keep per-op constants between runs: every
output code, on the first run and on later runs with other inputs, is what the integer
references of quantlab.numerics.reference compute from the op's input codes and scales."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics import DType
from quantlab.numerics import reference as R
from quantlab.numerics.code_bounds import constant_codes
from quantlab.numerics.requant import requant_scale
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator


class _Elementwise(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        y, z = self.a(x), self.b(x)
        return torch.cat([y * z, y * 0.37, y / 3.0, y + z, y - z], -1)


def _product_reference(p, acc, xs, ys, out_info):
    real = float(requant_scale(xs, ys, out_info.scale, p.requant))
    c = p.gemm_contract()
    out = R.requantize(acc, real, c.requant, out_info.dtype, c.requant_round,
                       mult_bits=c.requant_mult_bits)  # fmt: skip
    return torch.from_numpy(out)


@pytest.mark.parametrize("dtype", ["INT8", "INT16"])
def test_mul_div_add_sub_codes_match_references_across_runs(dtype):
    torch.manual_seed(5)
    spec = QConfigSpec(global_=OpQConfig(output_dtype=DType[dtype]))
    sim = Simulator(_Elementwise().eval(), "j6m", spec)
    sim.calibrate([(torch.randn(4, 16),) for _ in range(3)], progress=False)
    p = sim.platform
    for run in range(3):
        seen = {}

        def on_call(oc, seen=seen):
            seen[oc.call.name] = (oc.call.op_type, oc.call.args, oc.incoming)

        x = torch.randn(4, 16) * (1 + run)  # later runs saturate more
        trace = sim.trace(x, mode=Mode.FIXED, on_call=on_call)
        checked = set()
        for name, (op, args, infos) in seen.items():
            if op not in ("mul", "div", "add", "sub"):
                continue
            out = trace.qinfo[name]
            xi = infos[0]
            xc = xi.codes_of(args[0])
            if isinstance(args[1], torch.Tensor):
                yi = infos[1]
                yc, ys = yi.codes_of(args[1]), yi.scale
            else:
                yc, ys = constant_codes(args[1] if op == "mul" else 1.0 / args[1])
            if op in ("mul", "div"):
                want = _product_reference(p, xc * yc, xi.scale, ys, out)
            else:
                sign = 1 if op == "add" else -1
                want = torch.from_numpy(R.add_inter_scale(
                    xc, float(xi.scale), sign * yc, float(ys), float(out.scale), out.dtype,
                    p.requant, p.requant_round, p.add_inter_shift))  # fmt: skip
            assert_bits_equal(out.codes.to(torch.int64), want.to(torch.int64))
            checked.add((op, isinstance(args[1], torch.Tensor)))
        assert checked == {
            ("mul", True),
            ("mul", False),
            ("div", False),
            ("add", True),
            ("sub", True),
        }, checked
