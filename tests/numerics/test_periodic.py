import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from bits import assert_bits_equal, edge_values

from quantlab.numerics.dtypes import DType
from quantlab.numerics.periodic import (
    TWO_PI,
    needs_period_reduction,
    period_reduce,
    period_reduce_steps,
    wrap_to_pi,
)
from quantlab.numerics.rounding import Round


def _round(v: float, mode: Round) -> int:
    """Round a float exactly (via Fraction) with ``mode``."""
    q = Fraction(v)
    f = q.numerator // q.denominator
    r = q - f
    if mode is Round.FLOOR:
        return f
    if r != Fraction(1, 2):
        return f + 1 if r > Fraction(1, 2) else f
    if mode is Round.HALF_UP:
        return f + 1
    return f + (f & 1)


def reference(code: int, s_in: float, dt: DType, mode: Round) -> list[int]:
    """Scalar, step-by-step twin of period_reduce_steps (j6-numerics s.5)."""
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    sat = lambda c: min(max(c, dt.qmin), dt.qmax)  # noqa: E731
    qmax = dt.qmax
    s_in = f32(s_in)
    s_t = f32(s_in / TWO_PI)
    t = sat(_round(code * s_in / TWO_PI / s_t, mode))
    s_n = f32(math.ceil(s_in * qmax / TWO_PI) / qmax)
    n = sat(_round(math.floor(t * s_t) / s_n, mode))
    s_f = f32(1.0 / qmax)
    f = sat(_round((t * s_t - n * s_n) / s_f, mode))
    s_o = f32(TWO_PI / qmax)
    o = sat(_round(f * s_f * TWO_PI / s_o, mode))
    return [t, n, f, o]


@pytest.mark.parametrize("dt", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("periods", [1, 3.7, 16, 256, 1024])
@pytest.mark.parametrize("mode", [Round.HALF_EVEN, Round.HALF_UP])
def test_steps_match_scalar_reference(dt, periods, mode):
    s_in = periods * TWO_PI / dt.qmax
    if dt is DType.INT8:
        codes = torch.arange(dt.qmin, dt.qmax + 1)
    else:
        gen = torch.Generator().manual_seed(int(periods * 10))
        codes = torch.cat(
            [edge_values(dt), torch.randint(dt.qmin, dt.qmax + 1, (1500,), generator=gen)]
        )
    r = period_reduce_steps(codes.to(dt.torch_dtype), s_in, dt, mode)
    got = torch.stack([r.t_codes, r.floor_codes, r.frac_codes, r.codes], 1).to(torch.int64)
    ref = torch.tensor([reference(int(c), s_in, dt, mode) for c in codes], dtype=torch.int64)
    assert_bits_equal(got, ref)


@pytest.mark.parametrize("dt", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("periods", [2, 16, 256, 1024])
def test_reduced_angle_is_the_input_angle_mod_two_pi(dt, periods):
    s_in = periods * TWO_PI / dt.qmax
    codes = torch.arange(dt.qmin, dt.qmax + 1, 7 if dt is DType.INT16 else 1)
    out, scale = period_reduce(codes.to(dt.torch_dtype), s_in, dt)
    assert scale == pytest.approx(TWO_PI / dt.qmax)
    x = codes.double() * float(np.float32(s_in))
    diff = torch.remainder(out.double() * scale - x + math.pi, TWO_PI) - math.pi
    s_n = math.ceil(s_in * dt.qmax / TWO_PI) / dt.qmax
    # floor re-quantized with scale s_n (off by <= s_n/2 periods) + frac and output rounding
    bound = TWO_PI * (s_n / 2 + 1 / dt.qmax) + 1e-9
    assert float(diff.abs().max()) <= bound
    assert out.dtype == dt.torch_dtype


def test_needs_period_reduction():
    assert not needs_period_reduction(math.pi / 32767, DType.INT16)
    assert not needs_period_reduction(TWO_PI / 32767 * 0.999, DType.INT16)
    assert needs_period_reduction(TWO_PI / 32767 * 1.001, DType.INT16)
    assert needs_period_reduction(0.1, DType.INT8)
    with pytest.raises(ValueError, match="integer inputs"):
        needs_period_reduction(0.1, DType.FLOAT16)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="x_scale"):
        period_reduce(torch.zeros(3, dtype=torch.int16), 0.0, DType.INT16)
    with pytest.raises(ValueError, match="INT8 or INT16"):
        period_reduce(torch.zeros(3, dtype=torch.int32), 1.0, DType.INT32)


def test_wrap_to_pi_range_and_values():
    x = torch.linspace(-1024 * TWO_PI, 1024 * TWO_PI, 100001, dtype=torch.float64)
    x = torch.cat([x, torch.tensor([math.pi, -math.pi, 3 * math.pi, 0.0])])
    r = wrap_to_pi(x)
    assert float(r.min()) >= -math.pi and float(r.max()) < math.pi
    assert float((torch.sin(r) - torch.sin(x)).abs().max()) < 1e-9
    assert float((torch.cos(r) - torch.cos(x)).abs().max()) < 1e-9
    r32 = wrap_to_pi(x.float())
    assert r32.dtype == torch.float32
    assert float(r32.abs().max()) <= float(np.float32(math.pi))
