"""``gemm.pair_saturation`` (uint8 x int8 sums with adjacent products saturated in pairs, as
onnxruntime's MLAS computes them on x86 without VNNI) equals its slow reference bit for bit."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics import reference as ref
from quantlab.numerics.gemm import pair_saturation
from quantlab.numerics.gemm.pair_saturation import pair_saturated_conv, pair_saturated_matmul
from quantlab.numerics.reference import pair_saturation as ref_pairs


def _u8(g, shape, high: bool) -> torch.Tensor:
    lo = 200 if high else 0
    return torch.randint(lo, 256, shape, generator=g).to(torch.uint8)


def _s8(g, shape, extreme: bool) -> torch.Tensor:
    if extreme:  # one sign per tensor half: pairs of 255 * 127-ish saturate
        mag = torch.randint(100, 129, shape, generator=g)
        sign = torch.where(torch.rand(shape, generator=g) < 0.8, 1, -1)
        return (mag * sign).clamp(-128, 127).to(torch.int8)
    return torch.randint(-128, 128, shape, generator=g).to(torch.int8)


@pytest.mark.parametrize("k", [1, 2, 7, 16, 33])
@pytest.mark.parametrize("adversarial", [False, True])
def test_matmul_equals_the_reference(k, adversarial):
    g = torch.Generator().manual_seed(k + 100 * adversarial)
    x, w = _u8(g, (5, k), adversarial), _s8(g, (k, 6), adversarial)
    zx = int(torch.randint(0, 256, (1,), generator=g))
    got = pair_saturated_matmul(x, w, zx)
    assert got.dtype == torch.int64
    assert_bits_equal(got.numpy(), ref_pairs.pair_saturated_matmul(x.numpy(), w.numpy(), zx))
    # batched rows fold; int16 / int32 holders of the same codes give the same sums
    assert_bits_equal(pair_saturated_matmul(x.reshape(1, 5, k).to(torch.int16), w, zx)[0], got)


def test_saturation_happens_and_small_weights_are_exact():
    x = torch.full((1, 4), 255, dtype=torch.uint8)
    w = torch.full((4, 1), 127, dtype=torch.int8)
    assert int(pair_saturated_matmul(x, w, 0)) == 2 * 32767  # exact: 4 * 255 * 127 = 129540
    g = torch.Generator().manual_seed(3)
    x = _u8(g, (7, 40), True)
    w = torch.randint(-64, 64, (40, 3), generator=g).to(torch.int8)  # |pair| <= 2*255*64 < 2**15
    exact = ref.int_matmul((x.to(torch.int16) - 9).numpy(), w.numpy())
    assert_bits_equal(pair_saturated_matmul(x, w, 9).numpy(), exact)


CONVS = [
    # (N, C, H, W), (O, C/g, KH, KW), stride, padding, dilation, groups
    ((1, 3, 5, 6), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 5, 6, 5), (3, 5, 2, 3), (2, 1), (0, 2), (1, 2), 1),
    ((1, 4, 7, 7), (6, 2, 3, 2), (1, 2), (2, 1), (2, 1), 2),
    ((1, 6, 5, 5), (6, 1, 3, 3), (2, 2), (1, 1), (1, 1), 6),  # depthwise: exact
    ((1, 3, 4, 6), (6, 1, 2, 2), (1, 1), (1, 0), (1, 1), 3),  # channel multiplier 2: pairs
    ((2, 1, 6, 6), (2, 1, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((1, 8, 3, 3), (5, 8, 1, 1), (1, 1), (0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("case", range(len(CONVS)))
@pytest.mark.parametrize("adversarial", [False, True])
def test_conv_equals_the_reference(case, adversarial):
    xs, ws, stride, padding, dilation, groups = CONVS[case]
    g = torch.Generator().manual_seed(case + 10 * adversarial)
    x, w = _u8(g, xs, adversarial), _s8(g, ws, adversarial)
    _equals_the_reference_conv(g, x, w, stride, padding, dilation, groups)


def _equals_the_reference_conv(g, x, w, stride, padding, dilation, groups) -> None:
    """pair_saturated_conv at a random zero point gives the slow reference's sums."""
    zx = int(torch.randint(0, 256, (1,), generator=g))
    got = pair_saturated_conv(x, w, zx, stride, padding, dilation, groups)
    want = ref_pairs.pair_saturated_conv2d(
        x.numpy(), w.numpy(), zx, stride, padding, dilation, groups
    )
    assert_bits_equal(got.numpy(), want)


def test_depthwise_is_exact_and_conv1d_is_a_one_row_conv2d():
    g = torch.Generator().manual_seed(8)
    x, w = _u8(g, (1, 4, 5, 5), True), _s8(g, (4, 1, 3, 3), True)
    exact = ref.int_conv2d((x.to(torch.int16) - 7).numpy(), w.numpy(), 1, 0, 1, 4)
    assert_bits_equal(pair_saturated_conv(x, w, 7, groups=4).numpy(), exact)
    x1, w1 = _u8(g, (2, 6, 9), True), _s8(g, (3, 6, 3), True)
    one = pair_saturated_conv(x1, w1, 30, stride=2, padding=1)
    two = pair_saturated_conv(x1.unsqueeze(2), w1.unsqueeze(2), 30, (1, 2), (0, 1))
    assert_bits_equal(one, two.squeeze(2))
    # unbatched input: the batched result's one item
    assert_bits_equal(pair_saturated_conv(x1[0], w1, 30, stride=2, padding=1), one[0])


def _mixed(g, x_shape, w_shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes as a trained layer gives them: small weights with a few extreme ones (1 in 12),
    rows of high codes beside rows of low ones, so that a pair which can saturate does so in
    some rows and not in others."""
    w = torch.randint(-30, 31, w_shape, generator=g)
    big = torch.rand(w_shape, generator=g) < 1 / 12
    w = torch.where(big, torch.where(torch.rand(w_shape, generator=g) < 0.5, 127, -128), w)
    x = torch.randint(0, 256, x_shape, generator=g)
    low = torch.rand(x_shape[:-1] + (1,), generator=g) < 0.5
    return torch.where(low, x // 4, x).to(torch.uint8), w.to(torch.int8)


@pytest.mark.parametrize("fraction", [0.0, 1.0], ids=["every_pair", "pairs_that_can_saturate"])
@pytest.mark.parametrize("kind", ["random", "adversarial", "mixed"])
def test_both_summations_equal_the_reference(monkeypatch, fraction, kind):
    """Summing every pair and correcting only the pairs that can saturate give the reference's
    sums, whichever the share of such pairs (``DENSE_PAIR_FRACTION`` forced each way)."""
    monkeypatch.setattr(pair_saturation, "DENSE_PAIR_FRACTION", fraction)
    g = torch.Generator().manual_seed(["random", "adversarial", "mixed"].index(kind))
    for k in (1, 8, 33, 96):
        if kind == "mixed":
            x, w = _mixed(g, (40, k), (k, 7))
        else:
            x, w = _u8(g, (40, k), kind == "adversarial"), _s8(g, (k, 7), kind == "adversarial")
        zx = int(torch.randint(0, 256, (1,), generator=g))
        want = ref_pairs.pair_saturated_matmul(x.numpy(), w.numpy(), zx)
        assert_bits_equal(pair_saturated_matmul(x, w, zx).numpy(), want)
    for xs, ws, stride, padding, dilation, groups in CONVS:
        adversarial = kind == "adversarial"
        x, w = (
            _mixed(g, xs, ws)
            if kind == "mixed"
            else (_u8(g, xs, adversarial), _s8(g, ws, adversarial))
        )
        _equals_the_reference_conv(g, x, w, stride, padding, dilation, groups)


def test_mixed_codes_take_the_sparse_correction_and_saturate():
    """On trained-like codes few pairs can saturate: no pair sum is formed for the others (the
    dense summation is not called), and some of those that can do saturate; matmul and conv."""
    g = torch.Generator().manual_seed(5)
    x, w = _mixed(g, (64, 96), (96, 8))
    exact = ref.int_matmul(x.to(torch.int16).numpy(), w.numpy())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pair_saturation, "_dense_rows", None)  # calling it would raise
        got = pair_saturated_matmul(x, w, 0)
    assert_bits_equal(got.numpy(), ref_pairs.pair_saturated_matmul(x.numpy(), w.numpy(), 0))
    assert (got.numpy() != exact).any()
    x, w = _mixed(g, (2, 16, 9, 9), (8, 16, 3, 3))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pair_saturation, "_dense_rows", None)
        got = pair_saturated_conv(x, w, 3, padding=1)
    want = ref_pairs.pair_saturated_conv2d(x.numpy(), w.numpy(), 3, (1, 1), (1, 1), (1, 1), 1)
    assert_bits_equal(got.numpy(), want)
    exact = ref.int_conv2d((x.to(torch.int16) - 3).numpy(), w.numpy(), 1, 1, 1, 1)
    assert (got.numpy() != exact).any()


def test_bad_operands_are_refused():
    with pytest.raises(TypeError, match="int8"):
        pair_saturated_matmul(torch.zeros(2, 3, dtype=torch.uint8), torch.zeros(3, 2), 0)
    with pytest.raises(ValueError, match="numeric padding"):
        pair_saturated_conv(
            torch.zeros(1, 2, 3, 3, dtype=torch.uint8),
            torch.zeros(2, 2, 1, 1, dtype=torch.int8),
            0,
            padding="same",
        )
