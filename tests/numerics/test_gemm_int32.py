"""The INT32 path of the exact GEMM: int8 x int8 matmuls and convolutions with one group (1x1
directly, others by im2col) by torch's int8 matrix product with int32 sums give the numpy int64
reference's bits (random, extreme and adversarial codes, every layout, stride, padding and
dilation it takes, im2col in blocks); so do int16 operands as their int8 halves (INT32_SPLIT).
AUTO takes each exactly where its bound and shape rules hold, and the start-up self-test
catches a kernel that saturates."""

from __future__ import annotations

import math

import pytest
import torch
from bits import assert_bits_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from quantlab.numerics import reference as ref
from quantlab.numerics import selftest
from quantlab.numerics.gemm import (
    GemmPath,
    int_conv1d,
    int_conv2d,
    int_linear,
    int_matmul,
    plan_conv,
    plan_gemm,
    plan_matmul,
    prepare_conv,
)
from quantlab.numerics.gemm.kernels import int8_halves
from quantlab.numerics.gemm.plan import INT8_HALVES_MAX, INT32_MAX_TERMS

# AUTO's int8 paths are what these tests check (conftest pins the probe to "slow")
pytestmark = pytest.mark.usefixtures("int8_product_fast")


def _codes(g, shape) -> torch.Tensor:
    return torch.randint(-128, 128, shape, generator=g).to(torch.int8)


def _extremes(g, shape) -> torch.Tensor:
    """-128 or 127 at random: the largest products of both signs."""
    return torch.where(torch.randint(0, 2, shape, generator=g) == 1, 127, -128).to(torch.int8)


def _adversarial(g, shape) -> torch.Tensor:
    """127, 125 or 123: one sign, so int8 pair sums pass int16 and sums pass 2**24."""
    return (127 - 2 * torch.randint(0, 3, shape, generator=g)).to(torch.int8)


I8 = (torch.int8, torch.int8)  # the operand dtypes of an int8 x int8 product
MAKERS = {"random": _codes, "extremes": _extremes, "adversarial": _adversarial}


def _codes16(g, shape) -> torch.Tensor:
    return torch.randint(-INT8_HALVES_MAX, INT8_HALVES_MAX + 1, shape, generator=g).to(torch.int16)


def _extremes16(g, shape) -> torch.Tensor:
    """+-INT8_HALVES_MAX at random: halves at +-127."""
    pick = torch.randint(0, 2, shape, generator=g) == 1
    return torch.where(pick, INT8_HALVES_MAX, -INT8_HALVES_MAX).to(torch.int16)


def _adversarial16(g, shape) -> torch.Tensor:
    return (INT8_HALVES_MAX - 2 * torch.randint(0, 3, shape, generator=g)).to(torch.int16)


MAKERS16 = {"random": _codes16, "extremes": _extremes16, "adversarial": _adversarial16}
DTYPE_PAIRS = [(torch.int16, torch.int8), (torch.int8, torch.int16), (torch.int16, torch.int16)]


def _make(kind: str, dtype: torch.dtype):
    return (MAKERS if dtype == torch.int8 else MAKERS16)[kind]


def test_plan_takes_int32_where_its_rules_hold():
    a8, b8 = torch.zeros(4, 5, dtype=torch.int8), torch.zeros(5, 3, dtype=torch.int8)
    assert plan_matmul(a8, b8).path is GemmPath.INT32
    assert plan_matmul(a8.reshape(2, 2, 5), b8).path is GemmPath.INT32  # rows fold
    assert plan_matmul(a8, b8[:, 0]).path is GemmPath.INT32  # a 1-d right operand
    batched = torch.zeros(2, 5, 3, dtype=torch.int8)
    assert plan_matmul(a8, batched).path is GemmPath.FLOAT32  # per-batch products: float32
    assert plan_matmul(a8.to(torch.int16), b8).path is not GemmPath.INT32
    assert plan_matmul(torch.zeros(0, 5, dtype=torch.int8), b8).path is not GemmPath.INT32
    # K up to INT32_MAX_TERMS terms; past it, the float32 chunks
    assert plan_gemm(128, 128, INT32_MAX_TERMS, int_product=I8).path is GemmPath.INT32
    assert plan_gemm(128, 128, INT32_MAX_TERMS + 1, int_product=I8).path is GemmPath.FLOAT32
    assert plan_gemm(128, 128, 100, int_product=None).path is GemmPath.FLOAT32
    off = {GemmPath.INT32}
    assert plan_gemm(128, 128, 100, int_product=I8, disabled=off).path is GemmPath.FLOAT32
    x = torch.zeros(1, 8, 5, 5, dtype=torch.int8)
    w1, w3 = torch.zeros(4, 8, 1, 1, dtype=torch.int8), torch.zeros(4, 8, 3, 3, dtype=torch.int8)
    assert plan_conv(x, w1).path is GemmPath.INT32
    assert plan_conv(x, w1, padding="same").path is GemmPath.INT32
    assert plan_conv(x, w1, padding=(0, 0), stride=(1, 1)).path is GemmPath.INT32
    assert plan_conv(x, w3, padding=1).path is GemmPath.INT32  # im2col
    assert plan_conv(x, w3, padding=(1, 2), dilation=2).path is GemmPath.INT32
    assert plan_conv(x, w3, padding="same").path is GemmPath.FLOAT32  # string: 1x1 only
    assert plan_conv(x, w3, padding=0, dilation=3).path is GemmPath.FLOAT32  # empty output
    # strided: from IM2COL_MIN_CHANNELS input channels on
    assert plan_conv(x, w1, stride=2).path is GemmPath.FLOAT32
    x16 = torch.zeros(1, 16, 5, 5, dtype=torch.int8)
    assert plan_conv(x16, torch.zeros(4, 16, 3, 3, dtype=torch.int8), stride=2).path is (
        GemmPath.INT32
    )
    assert plan_conv(x, w1[:, :4], groups=2).path is GemmPath.FLOAT32
    assert plan_conv(x.to(torch.int16), w1).path is not GemmPath.INT32
    assert plan_conv(x, torch.zeros(4, 8, 100, 1, dtype=torch.int8)).path is not GemmPath.INT32


def test_forced_int32_refuses_what_it_cannot_compute():
    a8 = torch.ones(3, 4, dtype=torch.int8)
    with pytest.raises(ValueError, match="path INT32 needs int8 x int8"):
        int_matmul(a8.to(torch.int16), torch.ones(4, 2, dtype=torch.int8), GemmPath.INT32)
    with pytest.raises(ValueError, match="path INT32"):
        int_matmul(a8, torch.ones(2, 4, 2, dtype=torch.int8), GemmPath.INT32)
    x = torch.ones(1, 4, 5, 5, dtype=torch.int8)
    with pytest.raises(ValueError, match="convolution with one group"):
        int_conv2d(x, torch.ones(2, 2, 3, 3, dtype=torch.int8), groups=2, path=GemmPath.INT32)
    with pytest.raises(ValueError, match="numeric padding"):
        int_conv2d(x, torch.ones(2, 4, 3, 3, dtype=torch.int8), padding="same", path=GemmPath.INT32)
    with pytest.raises(ValueError, match="path INT32"):
        plan_gemm(128, 128, INT32_MAX_TERMS + 1, path=GemmPath.INT32, int_product=I8)


MATMUL_SHAPES = [
    ((7, 13), (13, 5)),
    ((13,), (13, 4)),
    ((3, 13), (13,)),
    ((13,), (13,)),
    ((2, 3, 6, 9), (9, 4)),
    ((1, 128, 384), (384, 96)),
    ((4, 2100), (2100, 3)),  # K past one float32 chunk
]


@pytest.mark.parametrize("kind", list(MAKERS))
@pytest.mark.parametrize("shapes", MATMUL_SHAPES)
def test_int8_matmul_in_int32_equals_the_reference(kind, shapes):
    g = torch.Generator().manual_seed(len(shapes[0]) * 31 + shapes[0][-1])
    a, b = MAKERS[kind](g, shapes[0]), MAKERS[kind](g, shapes[1])
    want = torch.as_tensor(ref.int_matmul(a, b))  # a dot product is one numpy scalar
    assert plan_matmul(a, b).path is GemmPath.INT32
    for path in (GemmPath.AUTO, GemmPath.INT32):
        assert_bits_equal(int_matmul(a, b, path), want)
        got = int_matmul(a, b, path, as_int64=False)
        assert got.dtype == torch.int32
        assert_bits_equal(got.to(torch.int64), want)


def test_int8_matmul_in_int32_takes_strided_operands():
    g = torch.Generator().manual_seed(2)
    a = _extremes(g, (9, 40)).t()  # (40, 9) transposed view
    b = _codes(g, (5, 9)).t()  # (9, 5) transposed view, as a linear's weight
    assert not a.is_contiguous() and not b.is_contiguous()
    assert_bits_equal(int_matmul(a, b), torch.from_numpy(ref.int_matmul(a, b)))
    w = _codes(g, (6, 40))
    x = _adversarial(g, (3, 2, 40))[:, 1]  # strided rows
    assert_bits_equal(int_linear(x, w), torch.from_numpy(ref.int_linear(x, w)))


def test_int8_matmul_in_int32_takes_expanded_and_overlapping_operands():
    """torch's int8 product reads its operands' strides as given; expanded (stride 0) and
    overlapping views are copied first, so their sums are right too."""
    g = torch.Generator().manual_seed(3)
    row, col = _extremes(g, (1, 16)), _adversarial(g, (16, 1))
    b = _codes(g, (16, 8))
    for a, bb in (
        (row.expand(8, 16), b),
        (_codes(g, (8, 16)), col.expand(16, 8)),
        (_codes(g, (40,)).as_strided((5, 16), (2, 1)), b),  # rows overlap
        (_codes(g, (4, 3)), _codes(g, (40,)).as_strided((3, 6), (1, 1))),
        (_codes(g, (8, 32))[:, ::2], b[::2].repeat(2, 1)),  # a stepped slice
        (_codes(g, (1, 1)), _codes(g, (2, 1)).t()),  # one row, strides (1, 1): a linear, K = 1
        (_codes(g, (3, 1)), _codes(g, (4, 1)).t()),
        (_codes(g, (2, 1)).t(), _codes(g, (2, 3))),
    ):
        want = torch.matmul(a.to(torch.int64), bb.to(torch.int64))
        assert_bits_equal(int_matmul(a, bb, GemmPath.INT32), want)


def test_int32_sums_at_the_term_limit():
    """INT32_MAX_TERMS products of (-128)(-128) sum to 2**30; mixed extremes near it; the
    sums are what int64 gives."""
    k = INT32_MAX_TERMS
    a = torch.full((2, k), -128, dtype=torch.int8)
    b = torch.full((k, 3), -128, dtype=torch.int8)
    got = int_matmul(a, b, GemmPath.INT32)
    assert int(got[0, 0]) == 1 << 30
    assert_bits_equal(got, torch.matmul(a.to(torch.int64), b.to(torch.int64)))
    g = torch.Generator().manual_seed(5)
    a2, b2 = _extremes(g, (2, k)), _adversarial(g, (k, 3))
    assert_bits_equal(int_matmul(a2, b2), torch.matmul(a2.to(torch.int64), b2.to(torch.int64)))


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 9),
    k=st.integers(1, 70),
    n=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(list(MAKERS)),
)
def test_int8_matmul_in_int32_property(m, k, n, seed, kind):
    g = torch.Generator().manual_seed(seed)
    a, b = MAKERS[kind](g, (m, k)), MAKERS[kind](g, (k, n))
    assert_bits_equal(int_matmul(a, b, GemmPath.INT32), torch.from_numpy(ref.int_matmul(a, b)))


CONV_CASES = [
    ((1, 16, 7, 6), (24, 16, 1, 1), {}),
    ((3, 40, 5, 5), (8, 40, 1, 1), {}),  # a batch: one product per item
    ((40, 5, 5), (8, 40, 1, 1), {}),  # unbatched
    ((2, 24, 4, 4), (6, 24, 1, 1), {"padding": "same", "dilation": 2}),
    ((1, 600, 3, 3), (5, 600, 1, 1), {"padding": "valid"}),
    ((1, 1152, 7, 7), (40, 1152, 1, 1), {}),  # K past one float32 chunk
    ((2, 16, 9, 9), (8, 16, 1, 1), {"stride": 2}),  # strided 1x1: im2col
    ((2, 5, 8, 7), (6, 5, 3, 3), {"padding": 1}),
    ((1, 300, 5, 5), (4, 300, 3, 3), {"padding": 1}),  # K = 2700
    ((2, 16, 11, 9), (7, 16, 3, 3), {"stride": 2, "padding": 1}),
    ((1, 16, 12, 10), (5, 16, 3, 2), {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2)}),
    ((1, 3, 9, 9), (4, 3, 5, 5), {"padding": 2}),  # fewer channels than taps
    ((6, 7, 7), (3, 6, 3, 3), {}),  # unbatched, no padding
    ((2, 1, 6, 5), (4, 1, 3, 1), {"padding": (1, 0)}),  # one channel: overlapping windows
    ((1, 1, 9, 9), (2, 1, 3, 3), {"dilation": 2}),
]


@pytest.mark.parametrize("kind", list(MAKERS))
@pytest.mark.parametrize("x_shape, w_shape, kw", CONV_CASES)
def test_int8_conv_in_int32_equals_the_reference(kind, x_shape, w_shape, kw):
    g = torch.Generator().manual_seed(x_shape[-3] + w_shape[0])
    x, w = MAKERS[kind](g, x_shape), MAKERS[kind](g, w_shape)
    xb = x if x.dim() == 4 else x.unsqueeze(0)
    pad = 0 if isinstance(kw.get("padding"), str) else kw.get("padding", 0)
    stride, dilation = kw.get("stride", 1), kw.get("dilation", 1)
    want = torch.from_numpy(ref.int_conv2d(xb, w, stride, pad, dilation))
    want = want if x.dim() == 4 else want.squeeze(0)
    assert plan_conv(xb, w, **kw).path is GemmPath.INT32
    for path in (GemmPath.AUTO, GemmPath.INT32):
        assert_bits_equal(int_conv2d(x, w, path=path, **kw), want)
    conv = prepare_conv(tuple(x.shape), x.dtype, w, 2, **kw)
    assert conv.plan.path is GemmPath.INT32
    got = conv(x, as_int64=False)
    assert got.dtype == torch.int32
    assert_bits_equal(got.to(torch.int64), want)


def test_im2col_in_blocks_of_output_rows(monkeypatch):
    """Columns copied a few output rows at a time (the memory bound) give the same sums."""
    import quantlab.numerics.gemm.kernels as kernels

    g = torch.Generator().manual_seed(6)
    x, w = _extremes(g, (2, 16, 13, 11)), _adversarial(g, (5, 16, 3, 3))
    want = torch.from_numpy(ref.int_conv2d(x, w, 1, 1))
    monkeypatch.setattr(kernels, "IM2COL_BLOCK_BYTES", 16 * 9 * 11 * 4)  # 4 rows a block
    assert_bits_equal(int_conv2d(x, w, padding=1), want)
    monkeypatch.setattr(kernels, "IM2COL_BLOCK_BYTES", 1)  # one row a block
    assert_bits_equal(int_conv2d(x, w, padding=1), want)
    x1, w1 = _codes(g, (2, 16, 40)), _codes(g, (3, 16, 5))
    want1 = torch.from_numpy(ref.int_conv1d(x1, w1, 2, 2))
    assert_bits_equal(int_conv1d(x1, w1, stride=2, padding=2), want1)


def test_int8_conv_in_int32_takes_channels_last_expanded_inputs_and_conv1d():
    g = torch.Generator().manual_seed(9)
    channels_last = _extremes(g, (2, 32, 6, 5)).to(memory_format=torch.channels_last)
    expanded = _extremes(g, (1, 32, 1, 5)).expand(2, 32, 6, 5)
    for x in (channels_last, expanded):
        for w_shape, kw in (((12, 32, 1, 1), {}), ((4, 32, 3, 3), {"padding": 1})):
            w = _extremes(g, w_shape)
            want = torch.from_numpy(ref.int_conv2d(x.contiguous(), w, 1, kw.get("padding", 0)))
            assert_bits_equal(int_conv2d(x, w, path=GemmPath.INT32, **kw), want)
    for x_shape, w_shape, kw in (
        ((3, 48, 11), (7, 48, 1), {}),
        ((3, 48, 11), (5, 48, 3), {"padding": 1, "dilation": 2}),
        ((2, 1, 6), (4, 1, 3), {"padding": 1}),  # one channel: the windows overlap in memory
    ):
        x1, w1 = _adversarial(g, x_shape), _codes(g, w_shape)
        want1 = torch.from_numpy(
            ref.int_conv1d(x1, w1, 1, kw.get("padding", 0), kw.get("dilation", 1))
        )
        assert_bits_equal(int_conv1d(x1, w1, **kw), want1)
        assert_bits_equal(int_conv1d(x1, w1, path=GemmPath.INT32, **kw), want1)


def _saturating_int_mm(a, b, out=None):
    """An int8 matrix product as a kernel without VNNI may compute it: a offset to unsigned
    (a + 128), products summed in pairs clamped to int16, then the offset taken back."""
    au = a.to(torch.int32) + 128
    bi = b.to(torch.int32)
    if au.shape[1] % 2:
        au = torch.cat([au, torch.zeros(au.shape[0], 1, dtype=torch.int32)], 1)
        bi = torch.cat([bi, torch.zeros(1, bi.shape[1], dtype=torch.int32)], 0)
    prod = au[:, :, None] * bi[None, :, :]
    pairs = (prod[:, 0::2] + prod[:, 1::2]).clamp(-32768, 32767)
    res = (pairs.sum(1) - 128 * bi.sum(0)).to(torch.int32)
    if out is not None:
        out.copy_(res)
        return out
    return res


def test_selftest_catches_a_saturating_int8_kernel(monkeypatch):
    int_paths = (GemmPath.INT32, GemmPath.INT32_SPLIT)
    cases = selftest.run_selftest()
    assert {c.path for c in cases} >= set(int_paths)
    assert all(c.ok for c in cases)
    monkeypatch.setattr(torch, "_int_mm", _saturating_int_mm)
    cases = selftest.run_selftest()
    on_int8_kernel = [c for c in cases if c.path in int_paths]
    assert {c.path for c in on_int8_kernel} == set(int_paths)
    assert all(not c.ok for c in on_int8_kernel)
    assert all(c.ok for c in cases if c.path not in int_paths)


def test_auto_keeps_the_bits_without_int32(monkeypatch):
    """A machine whose int8 product failed the self-test: AUTO takes the float paths, with the
    same sums."""
    from quantlab.numerics.gemm import exact

    g = torch.Generator().manual_seed(4)
    a, b = _adversarial(g, (3, 1500)), _extremes(g, (1500, 4))
    x, w = _codes(g, (2, 64, 5, 5)), _extremes(g, (9, 64, 1, 1))
    with_int32 = (int_matmul(a, b), int_conv2d(x, w))
    monkeypatch.setattr(exact, "ensure_selftest", lambda: frozenset({GemmPath.INT32}))
    assert prepare_conv(tuple(x.shape), x.dtype, w, 2).plan.path is GemmPath.FLOAT32
    assert_bits_equal(int_matmul(a, b), with_int32[0])
    assert_bits_equal(int_conv2d(x, w), with_int32[1])


def test_int8_halves_are_exact_over_their_range():
    a = torch.arange(-32768, INT8_HALVES_MAX + 1, dtype=torch.int32).to(torch.int16)
    hi, lo = int8_halves(a)
    assert hi.dtype == lo.dtype == torch.int8
    assert_bits_equal(hi.to(torch.int32) * 256 + lo.to(torch.int32), a.to(torch.int32))
    assert int(hi.max()) == 127 and int(lo.min()) == -128 and int(lo.max()) == 127


def test_plan_takes_int32_split_within_the_halves_bound():
    b8 = torch.zeros(6, 3, dtype=torch.int8)
    a16 = torch.full((4, 6), INT8_HALVES_MAX, dtype=torch.int16)
    assert plan_matmul(a16, b8).path is GemmPath.INT32_SPLIT
    assert plan_matmul(b8.t(), a16.t()).path is GemmPath.INT32_SPLIT
    assert plan_matmul(a16, a16.t()).path is GemmPath.INT32_SPLIT
    a16[1, 2] = -INT8_HALVES_MAX - 1  # past the symmetric bound: the float paths
    assert plan_matmul(a16, b8).path is GemmPath.FLOAT64
    with pytest.raises(ValueError, match="path INT32_SPLIT needs"):
        int_matmul(a16, b8, GemmPath.INT32_SPLIT)
    with pytest.raises(ValueError, match="path INT32 needs"):
        int_matmul(a16.clamp(-5, 5), b8, GemmPath.INT32)  # int16 codes: not INT32
    off = {GemmPath.INT32_SPLIT}
    assert plan_gemm(5000, 128, 50, int_product=(torch.int16, torch.int8)).path is (
        GemmPath.INT32_SPLIT
    )
    assert plan_gemm(5000, 128, 50, int_product=(torch.int16, torch.int8), disabled=off).path is (
        GemmPath.FLOAT64
    )
    x16 = torch.full((1, 64, 5, 5), 20000, dtype=torch.int16)
    assert plan_conv(x16, torch.zeros(4, 64, 3, 3, dtype=torch.int8), padding=1).path is (
        GemmPath.INT32_SPLIT
    )
    dw = torch.ones(64, 1, 3, 3, dtype=torch.int8)  # depthwise: no matrix product
    assert plan_conv(x16, dw, groups=64, padding=1).path is GemmPath.FLOAT32_SPLIT


@pytest.mark.parametrize("dtypes", DTYPE_PAIRS)
@pytest.mark.parametrize("kind", list(MAKERS))
@pytest.mark.parametrize("shapes", [MATMUL_SHAPES[i] for i in (0, 1, 2, 4, 6)])
def test_int16_matmul_by_int8_halves_equals_the_reference(dtypes, kind, shapes):
    g = torch.Generator().manual_seed(shapes[0][-1] * 3 + len(shapes[1]))
    a, b = _make(kind, dtypes[0])(g, shapes[0]), _make(kind, dtypes[1])(g, shapes[1])
    want = torch.as_tensor(ref.int_matmul(a, b))
    assert plan_matmul(a, b).path is GemmPath.INT32_SPLIT
    for path in (GemmPath.AUTO, GemmPath.INT32_SPLIT):
        assert_bits_equal(int_matmul(a, b, path), want)
    if b.dim() == 2:
        assert_bits_equal(int_linear(a, b.t()), want)


@pytest.mark.parametrize("dtypes", DTYPE_PAIRS)
@pytest.mark.parametrize("kind", list(MAKERS))
@pytest.mark.parametrize("x_shape, w_shape, kw", [CONV_CASES[i] for i in (1, 2, 7, 10, 13)])
def test_int16_conv_by_int8_halves_equals_the_reference(dtypes, kind, x_shape, w_shape, kw):
    g = torch.Generator().manual_seed(x_shape[-2] * 5 + w_shape[0])
    x, w = _make(kind, dtypes[0])(g, x_shape), _make(kind, dtypes[1])(g, w_shape)
    xb = x if x.dim() == 4 else x.unsqueeze(0)
    stride, pad, dilation = (
        kw.get(k, d) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1))
    )
    want = torch.from_numpy(ref.int_conv2d(xb, w, stride, pad, dilation))
    want = want if x.dim() == 4 else want.squeeze(0)
    assert plan_conv(xb, w, **kw).path is GemmPath.INT32_SPLIT
    for path in (GemmPath.AUTO, GemmPath.INT32_SPLIT):
        assert_bits_equal(int_conv2d(x, w, path=path, **kw), want)
    conv = prepare_conv(tuple(x.shape), x.dtype, w, 2, **kw)
    assert_bits_equal(conv(x), want)  # int16 inputs: planned per call from their max|x|


def test_the_speed_probe_times_both_products():
    from quantlab.numerics.gemm.int8_speed import measure_int8_product

    ratio = measure_int8_product((16, 64, 32), repeats=3)
    assert math.isfinite(ratio) and ratio > 0


def test_auto_skips_a_slow_int8_product_with_the_same_bits(monkeypatch):
    """A CPU whose int8 product is slower than float32 (no VNNI: torch runs a scalar loop):
    AUTO takes the float paths for int8 and int16 operands; a forced INT32 still runs."""
    from quantlab.numerics.gemm import exact, int8_speed

    g = torch.Generator().manual_seed(5)
    a, b = _adversarial(g, (3, 700)), _extremes(g, (700, 4))
    a16 = torch.randint(-INT8_HALVES_MAX, INT8_HALVES_MAX + 1, (3, 700), generator=g).to(
        torch.int16
    )
    x, w = _codes(g, (2, 32, 5, 5)), _extremes(g, (9, 32, 3, 3))
    fast = (int_matmul(a, b), int_matmul(a16, b), int_conv2d(x, w, padding=1))
    assert prepare_conv(tuple(x.shape), x.dtype, w, 2, padding=1).plan.path is GemmPath.INT32
    monkeypatch.setitem(int8_speed._STATE, "ratio", 40.0)
    assert exact.auto_excluded() >= {GemmPath.INT32, GemmPath.INT32_SPLIT}
    assert plan_matmul(a, b, disabled=exact.auto_excluded()).path is GemmPath.FLOAT32
    assert prepare_conv(tuple(x.shape), x.dtype, w, 2, padding=1).plan.path is GemmPath.FLOAT32
    assert_bits_equal(int_matmul(a, b), fast[0])
    assert_bits_equal(int_matmul(a16, b), fast[1])
    assert_bits_equal(int_conv2d(x, w, padding=1), fast[2])
    assert_bits_equal(int_matmul(a, b, GemmPath.INT32), fast[0])
