import pytest
import torch
from bits import assert_bits_equal, edge_values, tie_values

from quantlab.numerics.dtypes import DType
from quantlab.numerics.rounding import Round, round_float, rshift_round

EXPECTED_TIES = {
    Round.HALF_EVEN: lambda k: k if k % 2 == 0 else k + 1,  # for k + 0.5
    Round.HALF_UP: lambda k: k + 1,
    Round.HALF_AWAY: lambda k: k + 1 if k >= 0 else k,
    Round.FLOOR: lambda k: k,
    Round.TRUNC: lambda k: k if k >= 0 else k + 1,
}


@pytest.mark.parametrize("mode", list(Round))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_float_ties(mode, dtype):
    x = tie_values().to(dtype)
    ks = torch.arange(-8, 9)
    expected = torch.tensor([EXPECTED_TIES[mode](int(k)) for k in ks], dtype=dtype)
    assert_bits_equal(round_float(x, mode).abs(), expected.abs())
    assert torch.equal(round_float(x, mode), expected)


def test_round_half_up_no_float_trap():
    # floor(x + 0.5) in float gives 1.0 for the largest float below 0.5
    x = torch.tensor([0.49999997], dtype=torch.float32)
    assert float(x + 0.5) == 1.0
    assert float(round_float(x, Round.HALF_UP)) == 0.0
    x64 = torch.tensor([0.49999999999999994], dtype=torch.float64)
    assert float(round_float(x64, Round.HALF_UP)) == 0.0


@pytest.mark.parametrize("mode", list(Round))
def test_rshift_round_matches_exact_rational(mode):
    from fractions import Fraction

    def ref(v: int, n: int) -> int:
        q = Fraction(v, 1 << n)
        f = q.numerator // q.denominator
        r = q - f
        if mode is Round.FLOOR:
            return f
        if mode is Round.TRUNC:
            return f if (v >= 0 or r == 0) else f + 1
        if r > Fraction(1, 2):
            return f + 1
        if r < Fraction(1, 2):
            return f
        return {
            Round.HALF_UP: f + 1,
            Round.HALF_AWAY: f + 1 if v > 0 else f,
            Round.HALF_EVEN: f + (f % 2),
        }[mode]

    xs = torch.cat([edge_values(DType.INT32), torch.arange(-70, 71)])
    for n in range(0, 33):
        got = rshift_round(xs, n, mode)
        want = torch.tensor([ref(int(v), n) for v in xs], dtype=torch.int64)
        assert_bits_equal(got, want, inputs={"x": xs})


def test_rshift_round_tensor_shift():
    x = torch.tensor([[5, -5], [6, -6]])
    n = torch.tensor([[1], [2]])
    assert torch.equal(rshift_round(x, n, Round.HALF_AWAY), torch.tensor([[3, -3], [2, -2]]))


def test_rshift_round_rejects_bad_input():
    with pytest.raises(ValueError, match="shift must be >= 0"):
        rshift_round(torch.tensor([1]), -1, Round.FLOOR)
    with pytest.raises(TypeError):
        rshift_round(torch.tensor([1.0]), 1, Round.FLOOR)


def _exact_rshift(v: int, n: int, mode: Round) -> int:
    """v / 2**n rounded by ``mode``, with Fractions (the definition of each rule)."""
    from fractions import Fraction

    from quantlab.numerics.reference import round_fraction

    return round_fraction(Fraction(v, 1 << n), mode)


@pytest.mark.parametrize("mode", list(Round))
def test_rshift_round_shifts_of_62_and_more(mode):
    big = [(1 << 62) - 1, 1 << 61, (1 << 61) + 1, 3 << 60, (1 << 61) - 1]
    xs = torch.cat([edge_values(DType.INT32), torch.tensor(big + [-v for v in big])])
    for n in (40, 61, 62, 63, 64, 65, 100, 1000):
        want = torch.tensor([_exact_rshift(int(v), n, mode) for v in xs], dtype=torch.int64)
        assert_bits_equal(rshift_round(xs, n, mode), want, inputs={"x": xs})
        shifts = torch.full_like(xs, n)
        assert_bits_equal(rshift_round(xs, shifts, mode), want, inputs={"x": xs})
