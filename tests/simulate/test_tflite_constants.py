"""A scalar constant added under the TFLite reference ADD (``AddRule.LEFT_SHIFT``) or
XNNPACK's add (``AddRule.SHARED_SHIFT``) is the int8 constant a LiteRT model holds (+-127 at
|c| / 127): shifted left by 20, or times XNNPACK's 20-bit multiplier, it fits int32, where the
int16 constant quantlab holds elsewhere (32767 << 20) wrapped and lost the constant."""

from __future__ import annotations

import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics.add_rules import add_left_shift, add_shared_shift
from quantlab.numerics.code_bounds import constant_codes
from quantlab.numerics.dtypes import DType
from quantlab.simulate import Mode, Simulator


class _PlusConstant(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) + 0.5, torch.tanh(x) - 0.25, 0.75 + torch.tanh(x)


def test_an_int8_add_of_a_constant_under_tflites_rule_holds_the_constant():
    """The TFLite reference ADD shifts codes left by 20: an int8 constant (+-127 at |c| / 127)
    fits; the int16 constant (32767 << 20) wrapped int32 and lost the constant (errors of
    about the constant itself)."""
    sim = Simulator(_PlusConstant(), "tflite")
    g = torch.Generator().manual_seed(0)
    sim.calibrate([(torch.randn(256, generator=g) * 3,)], progress=False)
    x = torch.randn(256, generator=g) * 3
    trace = sim.trace(x, mode=Mode.FIXED)
    s, out = trace.qinfo[":sigmoid#0"], trace.qinfo[":add#0"]
    code, scale = constant_codes(0.5, DType.INT8)
    want = add_left_shift(s.codes, s.scale, code, scale, out.scale, DType.INT8, 20,
                          (s.zero_point, 0, out.zero_point))  # fmt: skip
    assert_bits_equal(out.codes.to(torch.int64), want.to(torch.int64))
    for got, ref in zip(sim.run(x, mode=Mode.FIXED), _PlusConstant()(x), strict=True):
        assert float((got - ref).abs().max()) < 0.05  # 0.51 with the int16 constant


class _ZeroPlusConstant(nn.Module):
    """x * 0 + 1: the add's tensor operand at a scale far below the constant's."""

    def forward(self, x):
        return x * 0 + 1.0, torch.sigmoid(x) + 0.5


def test_an_int8_add_of_a_constant_under_xnnpacks_rule_holds_the_constant():
    """XNNPACK's add (litert_xnnpack) multiplies each code by a multiplier of up to 2**20:
    the int16 constant (32767) wrapped int32 where the constant's scale outweighs the tensor's
    (x * 0 + 1 gave -1 code instead of 1.0); the int8 constant fits."""
    sim = Simulator(_ZeroPlusConstant(), "litert_xnnpack")
    g = torch.Generator().manual_seed(0)
    sim.calibrate([(torch.randn(256, generator=g) * 3,)], progress=False)
    x = torch.randn(256, generator=g) * 3
    trace = sim.trace(x, mode=Mode.FIXED)
    s, out = trace.qinfo[":sigmoid#0"], trace.qinfo[":add#1"]
    code, scale = constant_codes(0.5, DType.INT8)
    want = add_shared_shift(s.codes, s.scale, code, scale, out.scale, DType.INT8, 20,
                            (s.zero_point, 0, out.zero_point))  # fmt: skip
    assert_bits_equal(out.codes.to(torch.int64), want.to(torch.int64))
    for got, ref in zip(sim.run(x, mode=Mode.FIXED), _ZeroPlusConstant()(x), strict=True):
        assert float((got - ref).abs().max()) < 0.05
