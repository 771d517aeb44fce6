"""A scalar constant added under the TFLite reference ADD (``AddRule.LEFT_SHIFT``) or
XNNPACK's add (``AddRule.SHARED_SHIFT``) is the int8 constant a LiteRT model holds (+-127 at
|c| / 127): shifted left by 20, or times XNNPACK's 20-bit multiplier, it fits int32, where the
int16 constant quantlab holds elsewhere (32767 << 20) wrapped and lost the constant."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics.add_rules import add_left_shift, add_shared_shift
from quantlab.numerics.code_bounds import constant_codes
from quantlab.numerics.dtypes import DType
from quantlab.simulate import Mode, Simulator


class _PlusConstant(nn.Module):
    """Constants added to LUT outputs, and x * 0 + 1: an add whose tensor operand sits at a
    scale far below the constant's."""

    def forward(self, x):
        return (
            torch.sigmoid(x) + 0.5,
            torch.tanh(x) - 0.25,
            0.75 + torch.tanh(x),
            x * 0 + 1.0,
        )


@pytest.mark.parametrize(
    "platform, add",
    [
        ("tflite", lambda *a: add_left_shift(*a[:6], 20, a[6])),
        ("litert_xnnpack", lambda *a: add_shared_shift(*a[:6], 20, a[6])),
    ],
)
def test_an_int8_add_of_a_constant_holds_the_constant(platform, add):
    """The TFLite reference ADD shifts codes left by 20 and XNNPACK's add multiplies them by
    up to 2**20: an int8 constant (+-127 at |c| / 127) fits; the int16 constant (32767) wrapped
    int32 and lost the constant (errors of about the constant itself: 0.51 on sigmoid(x) + 0.5
    under TFLite's rule; x * 0 + 1 gave code -1 under XNNPACK's)."""
    sim = Simulator(_PlusConstant(), platform)
    g = torch.Generator().manual_seed(0)
    sim.calibrate([(torch.randn(256, generator=g) * 3,)], progress=False)
    x = torch.randn(256, generator=g) * 3
    trace = sim.trace(x, mode=Mode.FIXED)
    s, out = trace.qinfo[":sigmoid#0"], trace.qinfo[":add#0"]
    code, scale = constant_codes(0.5, DType.INT8)
    want = add(
        s.codes, s.scale, code, scale, out.scale, DType.INT8, (s.zero_point, 0, out.zero_point)
    )
    assert_bits_equal(out.codes.to(torch.int64), want.to(torch.int64))
    for got, ref in zip(sim.run(x, mode=Mode.FIXED), _PlusConstant()(x), strict=True):
        assert float((got - ref).abs().max()) < 0.05
