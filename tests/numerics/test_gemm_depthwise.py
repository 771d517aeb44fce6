"""The INT32_DEPTHWISE path (``gemm.depthwise_native``): its C kernel against torch's int64
convolution, bit for bit, on random and extreme codes over strides, paddings, dilations, kernel
shapes and output channels per group, in the loaded, the baseline and the AVX2 build; the
plan's choice and bound; the exact conv entry points taking it; and the integer paths leaving
torch's float precision alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from native_builds import BUILDS, use_build

from quantlab.numerics import native
from quantlab.numerics.gemm import (
    GemmPath,
    auto_excluded,
    int_conv1d,
    int_conv2d,
    int_matmul,
    plan_conv,
    plan_gemm,
    prepare_conv,
)
from quantlab.numerics.gemm import depthwise_native as DW
from quantlab.numerics.gemm.plan import (
    DEPTHWISE_MAX_TAPS,
    DEPTHWISE_MIN_POSITIONS_PER_TAP,
    INT32_MAX,
    depthwise_conv,
    depthwise_pays,
)
from quantlab.numerics.selftest import run_selftest

needs_cc = pytest.mark.skipif(
    native.compiler() is None, reason="the depthwise kernel needs a C compiler"
)
RANGES = {torch.int8: (-128, 127), torch.int16: (-32768, 32767)}


@pytest.fixture(params=BUILDS)
def build(request, monkeypatch):
    """The kernels as the CPU loads them, the baseline build, or the AVX2 code alone."""
    use_build(request.param, DW.KERNELS, monkeypatch)
    return request.param


def _codes(g, shape, dtype, limit=None):
    lo, hi = RANGES[dtype]
    if limit is not None:
        lo, hi = max(lo, -limit), min(hi, limit)
    return torch.randint(lo, hi + 1, shape, generator=g).to(dtype)


def _reference(x, w, stride, padding, dilation):
    """torch's int64 convolution with one input channel per group."""
    return F.conv2d(x.long(), w.long(), None, stride, padding, dilation, x.shape[1])


def _random_case(g):
    """A depthwise conv2d with every geometry parameter drawn per axis, sums within the bound."""

    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (), generator=g))

    kh, kw = pick(1, 5), pick(1, 5)
    sy, sx, dy, dx = pick(1, 3), pick(1, 3), pick(1, 3), pick(1, 2)
    py, px = pick(0, 3), pick(0, 3)
    h = max(pick(1, 17), dy * (kh - 1) + 1 - 2 * py)
    wd = max(pick(1, 17), dx * (kw - 1) + 1 - 2 * px)
    n, c, m = pick(1, 3), pick(1, 6), pick(1, 3)
    xd = torch.int8 if pick(0, 1) else torch.int16
    wdt = torch.int8 if pick(0, 1) else torch.int16
    x = _codes(g, (n, c, h, wd), xd)
    limit = INT32_MAX // (kh * kw * max(1, int(x.to(torch.int64).abs().max())))
    w = _codes(g, (c * m, 1, kh, kw), wdt, limit)
    return x, w, (sy, sx), (py, px), (dy, dx)


@needs_cc
def test_kernel_matches_int64_on_random_geometries(build):
    g = torch.Generator().manual_seed(20)
    for _ in range(150):
        x, w, stride, padding, dilation = _random_case(g)
        got = DW.depthwise_conv_int32(x, w, stride, padding, dilation)
        assert got.dtype == torch.int32
        ref = _reference(x, w, stride, padding, dilation)
        assert torch.equal(got.long(), ref), (x.shape, w.shape, stride, padding, dilation)


@needs_cc
@pytest.mark.parametrize("x_dtype", [torch.int8, torch.int16])
@pytest.mark.parametrize("w_dtype", [torch.int8, torch.int16])
def test_kernel_at_the_extremes(build, x_dtype, w_dtype):
    """Codes at both ends of their range (products of both signs at their largest), with the
    kernel as large as the int32 bound allows."""
    g = torch.Generator().manual_seed(21)
    x_lo, x_hi = RANGES[x_dtype]
    w_lo, w_hi = RANGES[w_dtype]
    taps = max(1, INT32_MAX // (max(-x_lo, x_hi) * max(-w_lo, w_hi)))
    kw = min(taps, 7)
    kh = max(1, min(taps // kw, 7))
    for x_pick, w_pick in ((x_lo, w_lo), (x_hi, w_lo), (None, None)):
        shape = (2, 3, 12, 13)
        if x_pick is None:  # each code at one of its two ends, at random
            x = torch.where(torch.randint(0, 2, shape, generator=g) == 1, x_hi, x_lo)
            w = torch.where(torch.randint(0, 2, (6, 1, kh, kw), generator=g) == 1, w_hi, w_lo)
        else:
            x, w = torch.full(shape, x_pick), torch.full((6, 1, kh, kw), w_pick)
        x, w = x.to(x_dtype), w.to(w_dtype)
        for stride, padding in ((1, 0), (2, (kh // 2, kw // 2)), ((1, 2), (kh, 0))):
            got = DW.depthwise_conv_int32(x, w, stride, padding, 1)
            assert torch.equal(got.long(), _reference(x, w, stride, padding, 1))


@needs_cc
def test_kernel_at_the_int32_bound(build):
    """Two taps of 32767 * 32767: a sum of 2**31 - 2**16 - ... just below INT32_MAX."""
    x = torch.full((1, 2, 3, 4), 32767, dtype=torch.int16)
    w = torch.full((2, 1, 1, 2), 32767, dtype=torch.int16)
    w[1] = -32767
    got = DW.depthwise_conv_int32(x, w, 1, 0, 1)
    ref = _reference(x, w, 1, 0, 1)
    assert int(ref.abs().max()) == 2 * 32767 * 32767 <= INT32_MAX
    assert torch.equal(got.long(), ref)


@needs_cc
def test_kernel_reads_any_layout(build):
    g = torch.Generator().manual_seed(22)
    x = _codes(g, (2, 5, 9, 8), torch.int8).contiguous(memory_format=torch.channels_last)
    w = _codes(g, (5, 1, 3, 3), torch.int8)
    got = DW.depthwise_conv_int32(x, w, 1, 1, 1)
    assert torch.equal(got.long(), _reference(x, w, 1, 1, 1))
    xs = _codes(g, (2, 5, 9, 16), torch.int8)[..., ::2]  # a strided view
    assert torch.equal(DW.depthwise_conv_int32(xs, w, 2, 1, 2).long(), _reference(xs, w, 2, 1, 2))


def test_kernel_without_a_compiler_gives_the_same_bits(monkeypatch):
    """Where the C kernels cannot be built the sums come from torch's int64 convolution, and
    AUTO stops taking the path."""
    failed = native.Kernels("depthwise_none", DW.SOURCE, DW.configure, "test")
    failed.failed = "RuntimeError: no C compiler found"
    monkeypatch.setattr(DW, "KERNELS", failed)
    g = torch.Generator().manual_seed(23)
    x, w = _codes(g, (1, 4, 7, 7), torch.int8), _codes(g, (8, 1, 3, 3), torch.int8)
    got = DW.depthwise_conv_int32(x, w, 2, 1, 1)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), _reference(x, w, 2, 1, 1))
    assert GemmPath.INT32_DEPTHWISE in auto_excluded()
    assert plan_conv(x, w, groups=4, disabled=auto_excluded()).path is GemmPath.FLOAT32
    forced = int_conv2d(x, w, 2, 1, groups=4, path=GemmPath.INT32_DEPTHWISE)
    assert torch.equal(forced, _reference(x, w, 2, 1, 1))


@needs_cc
def test_auto_plan_takes_the_path_for_depthwise_convs_only():
    g = torch.Generator().manual_seed(24)
    x8, x16 = _codes(g, (1, 8, 9, 9), torch.int8), _codes(g, (1, 8, 9, 9), torch.int16)
    w = _codes(g, (8, 1, 3, 3), torch.int8)
    assert plan_conv(x8, w, groups=8, padding=1).path is GemmPath.INT32_DEPTHWISE
    assert plan_conv(x16, w, groups=8, padding=1).path is GemmPath.INT32_DEPTHWISE
    x12 = _codes(g, (1, 8, 12, 12), torch.int8)
    assert plan_conv(x12, w, groups=8, padding="valid").path is GemmPath.INT32_DEPTHWISE
    # "same" padding, two input channels per group, or AUTO told not to: another path
    assert plan_conv(x8, w, groups=8, padding="same").path is not GemmPath.INT32_DEPTHWISE
    w2 = _codes(g, (4, 2, 3, 3), torch.int8)
    assert plan_conv(x8, w2, groups=4).path is not GemmPath.INT32_DEPTHWISE
    off = {GemmPath.INT32_DEPTHWISE}
    assert plan_conv(x8, w, groups=8, disabled=off).path is GemmPath.FLOAT32


@needs_cc
def test_auto_plan_keeps_small_planes_on_torch():
    """Below DEPTHWISE_MIN_POSITIONS_PER_TAP output positions per tap AUTO takes torch's
    float32 convolution (measured faster there); a forced path still runs the kernel."""
    g = torch.Generator().manual_seed(26)
    w3, w5 = _codes(g, (8, 1, 3, 3), torch.int8), _codes(g, (8, 1, 5, 5), torch.int8)
    x5, x7 = _codes(g, (1, 8, 5, 5), torch.int8), _codes(g, (1, 8, 7, 7), torch.int8)
    x14 = _codes(g, (1, 8, 14, 14), torch.int8)
    per_tap = DEPTHWISE_MIN_POSITIONS_PER_TAP
    assert 25 < per_tap * 9 <= 49 < per_tap * 25 <= 196
    assert not depthwise_pays(tuple(x5.shape), w3, 1, 1) and depthwise_pays(
        tuple(x7.shape), w3, 1, 1
    )
    assert plan_conv(x5, w3, groups=8, padding=1).path is GemmPath.FLOAT32
    assert plan_conv(x7, w3, groups=8, padding=1).path is GemmPath.INT32_DEPTHWISE
    assert plan_conv(x7, w5, groups=8, padding=2).path is GemmPath.FLOAT32
    assert plan_conv(x14, w5, groups=8, padding=2).path is GemmPath.INT32_DEPTHWISE
    forced = plan_conv(x5, w3, groups=8, path=GemmPath.INT32_DEPTHWISE, padding=1)
    assert forced.path is GemmPath.INT32_DEPTHWISE
    got = int_conv2d(x5, w3, 1, 1, groups=8, path=GemmPath.INT32_DEPTHWISE, as_int64=False)
    assert got.dtype == torch.int32 and torch.equal(got.long(), _reference(x5, w3, 1, 1, 1))


def test_what_the_path_takes():
    """Not an empty output, nor more than DEPTHWISE_MAX_TAPS taps or stride (the C loop's
    tables), nor two input channels per group or a string padding other than "valid"."""
    w = torch.ones((4, 1, 5, 5), dtype=torch.int8)
    x = torch.ones((1, 4, 3, 3), dtype=torch.int8)
    assert not depthwise_conv(tuple(x.shape), x.dtype, w, 1, 0, 1, 4)
    assert depthwise_conv(tuple(x.shape), x.dtype, w, 1, 1, 1, 4)
    with pytest.raises(ValueError, match="is empty"):
        DW.depthwise_conv_int32(x, w, 1, 0, 1)
    big = torch.ones((4, 1, 1, DEPTHWISE_MAX_TAPS + 1), dtype=torch.int8)
    wide = (1, 4, 1, DEPTHWISE_MAX_TAPS + 1)
    assert not depthwise_conv(wide, torch.int8, big, 1, 0, 1, 4)
    assert depthwise_conv(wide, torch.int8, big[..., 1:], 1, 0, 1, 4)
    assert not depthwise_conv(wide, torch.int8, w, DEPTHWISE_MAX_TAPS + 1, 0, 1, 4)
    assert not depthwise_conv(
        (1, 4, 8, 8), torch.int8, torch.ones((2, 2, 3, 3), dtype=torch.int8), 1, 0, 1, 2
    )
    assert not depthwise_conv((1, 4, 8, 8), torch.int8, w, 1, "same", 1, 4)
    assert not depthwise_conv((1, 4, 8, 8), torch.uint8, w, 1, 0, 1, 4)


def test_plan_bound_of_the_path():
    """The path holds kh * kw * max|x| * max|w| <= INT32_MAX, and a forced path beyond it
    raises naming the bound."""
    at = plan_gemm(32767, 32767, 1, 2, depthwise=True)
    assert at.path is GemmPath.INT32_DEPTHWISE
    over = plan_gemm(32768, 32768, 1, 2, depthwise=True)  # 2**31
    assert over.path is not GemmPath.INT32_DEPTHWISE
    with pytest.raises(ValueError, match="INT32_DEPTHWISE needs"):
        plan_gemm(32768, 32768, 1, 2, GemmPath.INT32_DEPTHWISE, depthwise=True)
    with pytest.raises(ValueError, match="INT32_DEPTHWISE needs"):
        plan_gemm(128, 128, 4, 9, GemmPath.INT32_DEPTHWISE)  # not a depthwise conv


@needs_cc
def test_exact_conv_entry_points_take_the_path():
    """int_conv2d / int_conv1d (height 1) / a prepared conv on AUTO equal torch int64, with the
    path's int32 sums kept by ``as_int64=False``."""
    g = torch.Generator().manual_seed(25)
    x = _codes(g, (2, 6, 24, 40), torch.int8)
    w = _codes(g, (12, 1, 3, 5), torch.int8)
    ref = _reference(x, w, (2, 1), (1, 2), (1, 2))
    got = int_conv2d(x, w, (2, 1), (1, 2), (1, 2), groups=6, as_int64=False)
    assert got.dtype == torch.int32 and torch.equal(got.long(), ref)
    prepared = prepare_conv(tuple(x.shape[1:]), x.dtype, w, 2, (2, 1), (1, 2), (1, 2), 6)
    assert prepared.plan.path is GemmPath.INT32_DEPTHWISE
    assert torch.equal(prepared(x[0]), ref[0])
    x1 = _codes(g, (3, 4, 90), torch.int16)
    w1 = _codes(g, (4, 1, 5), torch.int8)
    ref1 = F.conv1d(x1.long(), w1.long(), None, 2, 3, 2, 4)
    got1 = int_conv1d(x1, w1, 2, 3, 2, groups=4, as_int64=False)
    assert got1.dtype == torch.int32 and torch.equal(got1.long(), ref1)
    assert torch.equal(int_conv1d(x1[0], w1, 2, 3, 2, groups=4), ref1[0])


@needs_cc
def test_selftest_covers_the_path():
    cases = [c for c in run_selftest() if c.path is GemmPath.INT32_DEPTHWISE]
    assert len(cases) == 2 and all(c.ok and c.outputs > 0 for c in cases)


def test_integer_paths_leave_torch_float_precision_alone(monkeypatch):
    """The integer paths run no float kernel, so they do not pin (and restore) torch's float
    precision; a float path still does."""
    from quantlab.numerics.gemm import exact

    entered = []

    class Counting(exact.exact_float_kernels):
        def __enter__(self):
            entered.append(True)
            return super().__enter__()

    monkeypatch.setattr(exact, "exact_float_kernels", Counting)
    g = torch.Generator().manual_seed(27)
    x, w = _codes(g, (1, 8, 9, 9), torch.int8), _codes(g, (8, 1, 3, 3), torch.int8)
    ref = _reference(x, w, 1, 1, 1)
    for path in (GemmPath.INT32_DEPTHWISE, GemmPath.INT64):
        assert torch.equal(int_conv2d(x, w, 1, 1, groups=8, path=path), ref)
    a, b = _codes(g, (4, 16), torch.int8), _codes(g, (16, 3), torch.int8)
    assert torch.equal(int_matmul(a, b, GemmPath.INT32), a.long() @ b.long())
    assert entered == []
    assert torch.equal(int_conv2d(x, w, 1, 1, groups=8, path=GemmPath.FLOAT32), ref)
    assert entered == [True]
