"""The int15 MatMul split A (B_hi + B_lo): operand halves and the two-pass product against exact
references (Fractions, numpy int64 sums)."""

import numpy as np
import pytest
import torch
from bits import assert_bits_equal
from test_split import combine_reference, split_weight_reference

from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.rounding import Round
from quantlab.numerics.split import SplitCombine
from quantlab.numerics.split_matmul import (
    split_hi_scale,
    split_int15_matmul,
    split_operand,
    split_operand_fake,
)

EDGES = [-32768, -32767, -32640, -129, -128, -1, 0, 1, 127, 128, 255, 256, 32639, 32766, 32767]


def _hi_scale_reference(s_b: float) -> float:
    return float(np.float32(np.float64(np.float32(s_b)) * 65535.0 / 255.0))


def _codes(seed: int, shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(-32768, 32768, shape, generator=g)
    flat = c.reshape(-1)
    flat[: len(EDGES)] = torch.tensor(EDGES)
    return c.to(torch.int16)


@pytest.mark.parametrize("k", [6, 7, 8])
@pytest.mark.parametrize("mode", [Round.HALF_EVEN, Round.HALF_UP])
@pytest.mark.parametrize("s_b", [3.1e-5, 0.0173, 1.0])
def test_split_operand_matches_exact_reference(k, mode, s_b):
    c = _codes(k, (300,))
    hi, lo, s = split_operand(c, s_b, k, mode)
    assert float(s) == _hi_scale_reference(s_b)
    value = c.to(torch.float32) * torch.tensor(s_b, dtype=torch.float32)  # one f32 product
    rhi, rlo = split_weight_reference(value, float(s), k, mode)
    assert_bits_equal(hi, rhi, inputs={"codes": c})
    assert_bits_equal(lo, rlo, inputs={"codes": c})


def test_split_operand_error_bound_over_the_whole_int16_range():
    c = torch.arange(-32768, 32768).to(torch.int16)
    s_b = 0.0123
    for k in (1, 4, 7):
        hi, lo, s = split_operand(c, s_b, k)
        value = c.double() * float(np.float32(s_b))
        held = float(s) * (hi.double() + lo.double() / 2**k)
        assert float((value - held).abs().max()) <= float(s) / 2 ** (k + 1) * (1 + 1e-6)
        assert int(lo.abs().max()) <= 2 ** (k - 1)  # no clipping for k <= 7
    fake = split_operand_fake(c.to(torch.float32) * np.float32(s_b), s_b, 7)
    assert_bits_equal(fake, held.to(torch.float32))  # QAT value = what the halves hold


@pytest.mark.parametrize("combine", list(SplitCombine))
@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
def test_split_int15_matmul_equals_two_int8_reference_matmuls(combine, out):
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-128, 128, (2, 5, 48), generator=g).to(torch.int8)
    a[0, 0] = -128  # the largest partial sums
    b = _codes(4, (2, 48, 6))
    b[0, :, 0] = -32768
    sa, sb, k = 0.021, 7.3e-4, 7
    so = 0.05 if out is DType.INT8 else 4e-4
    y = split_int15_matmul(a, b, sa, sb, k, so, out, combine)
    hi, lo, s = split_operand(b, sb, k)
    real = sa * float(s) / so
    ref = torch.empty(2, 5, 6, dtype=out.torch_dtype)
    for i in range(2):
        acc_hi = torch.from_numpy(reference.int_matmul(a[i].numpy(), hi[i].numpy()))
        acc_lo = torch.from_numpy(reference.int_matmul(a[i].numpy(), lo[i].numpy()))
        parts = [(acc_hi, 0), (acc_lo, -k)]
        ref[i] = combine_reference(parts, real, out, combine, Round.HALF_UP)
    assert_bits_equal(y, ref)


def test_split_int15_matmul_is_closer_to_the_int16_product_than_int8():
    g = torch.Generator().manual_seed(5)
    a = torch.randint(-128, 128, (16, 64), generator=g).to(torch.int8)
    b = (torch.randn(64, 16, generator=g) * 9000).clamp(-32768, 32767).round().to(torch.int16)
    sa, sb = 0.01, 1e-3
    exact = a.double() @ b.double() * sa * sb
    so = float(exact.abs().max()) / 32767.5
    y = split_int15_matmul(a, b, sa, sb, 7, so, DType.INT16, SplitCombine.WIDE_ACCUMULATOR)
    b8 = torch.round(b.double() * sb / float(split_hi_scale(sb))).clamp(-128, 127)
    y8 = a.double() @ b8 * sa * float(split_hi_scale(sb))
    err15 = float((y.double() * so - exact).norm())
    err8 = float((y8 - exact).norm())
    assert err15 < err8 / 50  # seven more bits of B: about 2**7 less error


def test_bad_operands_name_the_problem():
    with pytest.raises(TypeError, match="integer codes"):
        split_operand(torch.ones(3), 0.1, 7)
    with pytest.raises(ValueError, match="weight_split k=9"):
        split_operand(torch.ones(3, dtype=torch.int16), 0.1, 9)
    with pytest.raises(ValueError, match="INT8 or INT16"):
        split_hi_scale(0.1, DType.INT32)
