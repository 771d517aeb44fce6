"""The in-place MUL_SHIFT / HALF_UP requantization equals numerics.requant.requantize bit for
bit, and the fast GEMM finish equals gemm.finish_gemm."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal, edge_values

from quantlab.numerics import gemm
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import Requant, make_requant, requantize
from quantlab.numerics.rounding import Round
from quantlab.platforms import PlatformConfig
from quantlab.simulate.fastpath import (
    conv_exact_float32,
    finish_gemm_fast,
    requant_mul_shift_half_up_,
)


def _accs(seed: int, n: int = 4000) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rnd = torch.randint(-(1 << 31), 1 << 31, (n,), generator=g, dtype=torch.int64)
    small = torch.randint(-5000, 5000, (n,), generator=g, dtype=torch.int64)
    return torch.cat([edge_values(DType.INT32), rnd, small])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("mult_bits", [31, 15])
def test_requant_fast_equals_requantize(seed, out, mult_bits):
    g = torch.Generator().manual_seed(100 + seed)
    acc = _accs(seed)
    reals = torch.cat(
        [
            torch.rand(6, generator=g, dtype=torch.float64) * 10.0 ** -torch.arange(6),
            torch.tensor([0.5, 0.25, 2.0**-20, 0.999999, 1e-9, 0.0], dtype=torch.float64),
        ]
    )
    for real in reals:
        p = make_requant(real, Requant.MUL_SHIFT, mult_bits)
        want = requantize(acc, p, out, Round.HALF_UP)
        got = requant_mul_shift_half_up_(acc.clone(), p, out)
        assert_bits_equal(got, want, inputs={"acc": acc})
    # per channel along axis 1
    acc2 = acc[: 12 * 300].reshape(300, 12).t().contiguous()
    p = make_requant(reals, Requant.MUL_SHIFT, mult_bits)
    want = requantize(acc2.t(), p, out, Round.HALF_UP, axis=1)
    assert_bits_equal(requant_mul_shift_half_up_(acc2.t().clone(), p, out, axis=1), want)


def test_left_shift_multipliers_are_left_to_requantize():
    p = make_requant(torch.tensor(2.0**35, dtype=torch.float64), Requant.MUL_SHIFT, 31)
    assert requant_mul_shift_half_up_(torch.arange(5), p, DType.INT8) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finish_gemm_fast_equals_finish_gemm(seed):
    g = torch.Generator().manual_seed(seed)
    platform = PlatformConfig()
    x = torch.randint(-128, 128, (2, 40, 9, 9), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (16, 40, 3, 3), generator=g, dtype=torch.int8)
    if seed == 2:  # adversarial: all operands at the extremes
        x = torch.full_like(x, -128)
        w = torch.full_like(w, -128)
    xs = torch.tensor(0.02)
    ws = torch.rand(16, generator=g) * 0.01 + 1e-4
    bias = torch.randn(16, generator=g)
    so = torch.tensor(0.7 if seed == 2 else 0.05)
    acc = gemm.int_conv2d(x, w, 1, 1)
    want, _ = gemm.finish_gemm(acc.clone(), xs, ws, bias, so, DType.INT8, platform, 1)
    bound = 360 * 128 * 128
    cache: dict = {}
    for b in (bound, 1 << 31):  # bias folded into the rounding offset / accumulator contract
        got = finish_gemm_fast(
            acc.clone(), xs, ws, bias, so, DType.INT8, platform, 1, b, None, cache
        )
        assert_bits_equal(got, want)
    clamped = finish_gemm_fast(
        acc.clone(), xs, ws, bias, so, DType.INT8, platform, 1, bound, (0, 50)
    )
    assert_bits_equal(clamped, want.clamp(0, 50))
    w32 = w.to(torch.float32)
    conv = torch.nn.functional.conv2d
    assert conv_exact_float32(x, w32, conv, 1 << 25, padding=1) is None  # bound too large
    assert_bits_equal(conv_exact_float32(x, w32, conv, bound, padding=1).to(torch.int64), acc)
