import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics import float16 as f16
from quantlab.numerics import reference as ref

OPS = ["add", "sub", "mul", "div"]


def _random_halves(seed: int, n: int) -> torch.Tensor:
    """Random finite float16 bit patterns (normals, subnormals, zeros of both signs)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 16, n * 2, dtype=np.uint32).astype(np.uint16)
    vals = bits.view(np.float16)
    vals = vals[np.isfinite(vals)][:n]
    return torch.from_numpy(vals.copy())


def _edge_halves() -> torch.Tensor:
    v = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        -65504.0,
        2.0**-24,
        -(2.0**-24),
        2.0**-14,
        1 + 2.0**-10,
        3.0,
        1 / 3,
        2.0**-15,
        60000.0,
        0.1,
        2048.0,
        2049.0,
    ]
    return torch.tensor(v, dtype=torch.float16)


@pytest.mark.parametrize("op", OPS)
def test_elementwise_correctly_rounded(op):
    a = torch.cat([_random_halves(1, 1500), _edge_halves().repeat_interleave(17)])
    b = torch.cat([_random_halves(2, 1500), _edge_halves().repeat(17)])
    if op == "div":
        b = torch.where(b == 0, torch.ones_like(b), b)
    got = getattr(f16, op)(a, b)
    exp = torch.from_numpy(ref.f16_binary(a, b, op))
    assert_bits_equal(got, exp, inputs={"a": a, "b": b})


def test_elementwise_saturation_and_specials():
    a = torch.tensor([65504.0, -65504.0, 1.0, float("inf")], dtype=torch.float16)
    b = torch.tensor([65504.0, -65504.0, 0.0, 1.0], dtype=torch.float16)
    assert f16.add(a, b).tolist()[:2] == [float("inf"), float("-inf")]
    sat = f16.add(a, b, saturate=True).tolist()
    assert sat[:2] == [65504.0, -65504.0] and sat[3] == float("inf")  # inf operands stay inf
    assert f16.div(a, b, saturate=True)[2] == float("inf")  # 1 / 0 is not an overflow
    with pytest.raises(TypeError, match="float16"):
        f16.add(a.float(), b)


def test_round_to_float16_float64_single_rounding():
    x = torch.tensor([1 + 2.0**-11 + 2.0**-40, 2.0**-25 + 2.0**-60, 65519.99], dtype=torch.float64)
    assert f16.round_to_float16(x).tolist() == [1 + 2.0**-10, 2.0**-24, 65504.0]


def _halves_normal(seed, shape, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(torch.float16)


@pytest.mark.parametrize("seed", range(4))
def test_matmul_exact_sum_one_rounding(seed):
    a = _halves_normal(seed, (2, 5, 40), 10.0)
    b = _halves_normal(seed + 10, (40, 6), 0.1)
    assert_bits_equal(f16.matmul(a, b), torch.from_numpy(ref.f16_matmul(a, b)))


def test_matmul_cancellation_and_exact_ties():
    # 2048 + 1 - 2048 + ... : float32 sequential sums and the exact sum disagree
    a = torch.tensor(
        [[2048.0, 1.0, -2048.0, 2.0**-13], [1.0, 2.0**-11, 0.0, 0.0]], dtype=torch.float16
    )
    b = torch.ones(4, 1, dtype=torch.float16)
    got = f16.matmul(a, b)
    assert_bits_equal(got, torch.from_numpy(ref.f16_matmul(a, b)))
    assert got[1, 0] == 1.0  # 1 + 2**-11 is a tie between 1 and 1 + 2**-10: even wins
    assert got[0, 0] == 1.0  # exact 1 + 2**-13 rounds to 1


def test_matmul_near_tie_fallback():
    # sums within float64 error of a float16 midpoint are recomputed exactly
    rng = np.random.default_rng(5)
    a = torch.from_numpy(
        rng.choice([1.0, 2.0**-11, -(2.0**-11), 2.0**-24], (30, 64)).astype(np.float16)
    )
    b = torch.from_numpy(rng.choice([1.0, -1.0, 0.5], (64, 8)).astype(np.float16))
    assert_bits_equal(f16.matmul(a, b), torch.from_numpy(ref.f16_matmul(a, b)))


def test_matmul_vectors_and_saturation():
    a = _halves_normal(1, (9,))
    b = _halves_normal(2, (9, 3))
    assert f16.matmul(a, b).shape == (3,)
    assert_bits_equal(
        f16.matmul(a, b[:, 0]).reshape(1),
        torch.from_numpy(ref.f16_matmul(a.reshape(1, 9), b[:, :1])).reshape(1),
    )
    big = torch.full((1, 4), 60000.0, dtype=torch.float16)
    one = torch.ones(4, 1, dtype=torch.float16)
    assert float(f16.matmul(big, one)) == float("inf")
    assert float(f16.matmul(big, one, saturate=True)) == 65504.0
    with pytest.raises(ValueError, match="do not match"):
        f16.matmul(big, torch.ones(3, 1, dtype=torch.float16))


def test_linear_with_bias():
    x = _halves_normal(3, (4, 12), 3.0)
    w = _halves_normal(4, (5, 12), 0.3)
    bias = _halves_normal(5, (5,), 2.0)
    exp = ref.f16_matmul(x, w.t(), bias)
    assert_bits_equal(f16.linear(x, w, bias), torch.from_numpy(exp))


@pytest.mark.parametrize(
    "stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1), (2, 1, 2, 4)]
)
def test_conv2d_matches_reference(stride, padding, dilation, groups):
    x = _halves_normal(6, (2, 4, 7, 6), 2.0)
    w = _halves_normal(7, (8, 4 // groups, 3, 3), 0.5)
    bias = _halves_normal(8, (8,))
    got = f16.conv2d(x, w, bias, stride, padding, dilation, groups)
    exp = ref.f16_conv2d(x, w, bias, stride, padding, dilation, groups)
    assert_bits_equal(got, torch.from_numpy(exp))


def test_conv1d_matches_reference():
    x = _halves_normal(9, (2, 3, 11), 2.0)
    w = _halves_normal(10, (4, 3, 3), 0.5)
    got = f16.conv1d(x, w, None, 2, 1)
    exp = ref.f16_conv2d(x.unsqueeze(2), w.unsqueeze(2), None, (1, 2), (0, 1))[:, :, 0]
    assert_bits_equal(got, torch.from_numpy(exp))


def test_exactly_zero_sums_are_positive_zero_and_underflow_keeps_its_sign():
    # IEEE round to nearest gives +0.0 for x + (-x); an exact-sum model has no other zero
    h = torch.float16
    a = torch.tensor([[1.0, -1.0, 0.0], [0.5, 0.25, -0.75], [2.0**-24, 0.0, 0.0]], dtype=h)
    b = torch.tensor([[1.0, 2.0], [1.0, 4.0], [1.0, 2.0]], dtype=h)
    b[0, 1] = -(2.0**-2)  # row 2: 2**-24 * -(1/4) underflows to -0.0
    got = f16.matmul(a, b)
    assert_bits_equal(got, torch.from_numpy(ref.f16_matmul(a, b)))
    assert not bool(torch.signbit(got[0, 0])) and not bool(torch.signbit(got[1, 0]))
    assert bool(torch.signbit(got[2, 1]))
    x = torch.tensor([[1.0, 2.0]], dtype=h)
    w = torch.tensor([[1.0, -0.5], [-2.0, 1.0]], dtype=h)
    bias = torch.tensor([0.0, 0.0], dtype=h)
    assert_bits_equal(f16.linear(x, w, bias), torch.from_numpy(ref.f16_matmul(x, w.t(), bias)))
    xc = torch.ones(1, 2, 3, 3, dtype=h)
    wc = torch.tensor([1.0, -1.0], dtype=h).reshape(1, 2, 1, 1)
    got = f16.conv2d(xc, wc, padding=1)
    assert_bits_equal(got, torch.from_numpy(ref.f16_conv2d(xc, wc, padding=1)))


def test_saturation_is_decided_per_element():
    h = torch.float16
    inf = float("inf")
    a = torch.tensor([[60000.0, 60000.0], [inf, 1.0], [-60000.0, -60000.0]], dtype=h)
    one = torch.ones(2, 1, dtype=h)
    assert f16.matmul(a, one, saturate=True).flatten().tolist() == [65504.0, inf, -65504.0]
    w = torch.ones(1, 2, dtype=h)
    assert f16.linear(a, w, saturate=True).flatten().tolist() == [65504.0, inf, -65504.0]
    x = torch.full((2, 2, 1, 1), 60000.0, dtype=h)
    x[1, 0] = inf
    got = f16.conv2d(x, torch.ones(1, 2, 1, 1, dtype=h), saturate=True)
    assert got.flatten().tolist() == [65504.0, inf]


@pytest.mark.parametrize("k", [3, 2, 4])
def test_conv_padding_same_and_valid(k):
    import torch.nn.functional as F

    x = _halves_normal(11, (1, 2, 6, 5), 2.0)
    w = _halves_normal(12, (3, 2, k, k), 0.5)
    total = k - 1  # PyTorch 'same': the odd padding unit goes to the right / bottom
    xp = F.pad(x, (total // 2, total - total // 2, total // 2, total - total // 2))
    got = f16.conv2d(x, w, padding="same")
    assert_bits_equal(got, torch.from_numpy(ref.f16_conv2d(xp, w)))
    assert_bits_equal(f16.conv2d(x, w, padding="valid"), torch.from_numpy(ref.f16_conv2d(x, w)))
    x1, w1 = x[:, :, 0], w[:, :, 0]
    got1 = f16.conv1d(x1, w1, padding="same")
    xp1 = xp[:, :, total // 2]
    exp1 = ref.f16_conv2d(xp1.unsqueeze(2), w1.unsqueeze(2))[:, :, 0]
    assert_bits_equal(got1, torch.from_numpy(exp1))
    with pytest.raises(ValueError, match="stride"):
        f16.conv2d(x, w, stride=2, padding="same")
