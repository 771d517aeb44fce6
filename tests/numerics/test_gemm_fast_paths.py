"""Fast paths of the exact GEMM and its requantization give the reference's bits: convolutions
checked and planned once (``prepare_conv``), the float32 paths of int8 products (with the int8
matrix product turned off, as after a failed self-test; its own tests are in
``test_gemm_int32``), FLOAT_RESCALE requantization in float32 passes
(up to and past the bounds it relies on), and the J6 add without its int32 clamp where the
operand dtypes prove it idle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bits import assert_bits_equal, edge_values

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import (
    GemmContract,
    GemmPath,
    GemmStats,
    finish_gemm,
    int_linear,
    int_matmul,
    prepare_conv,
)
from quantlab.numerics.gemm import finish as finish_mod
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round
from quantlab.numerics.scaled_add import add_inter_scale

ORT = GemmContract(requant=Requant.FLOAT_RESCALE, requant_round=Round.HALF_EVEN)


@pytest.fixture
def without_int32(monkeypatch):
    """AUTO as on a machine whose int8 matrix product failed the self-test: int8 matmuls and
    1x1 convolutions take the float paths these tests are about."""
    from quantlab.numerics.gemm import exact

    monkeypatch.setattr(exact, "ensure_selftest", lambda: frozenset({GemmPath.INT32}))


def _codes(g, shape, dtype: torch.dtype, adversarial: bool = False) -> torch.Tensor:
    info = torch.iinfo(dtype)
    if adversarial:  # all odd, near the maximum, one sign: float32 partial sums pass 2**24
        return (info.max - 2 * torch.randint(0, 3, shape, generator=g)).to(dtype)
    return torch.randint(info.min, info.max + 1, shape, generator=g).to(dtype)


@pytest.mark.parametrize(
    "x_dtype, x_shape, w_shape, kw",
    [
        (torch.int8, (2, 8, 7, 6), (5, 8, 3, 3), dict(padding=1)),
        (torch.int8, (6, 9, 9), (6, 1, 3, 3), dict(stride=2, padding=1, groups=6)),  # unbatched
        (torch.int8, (1, 300, 3, 3), (4, 300, 3, 3), dict(padding=1)),  # float32 chunks
        (torch.int16, (1, 16, 5, 5), (3, 16, 3, 3), dict(padding=1)),
        (torch.int16, (2, 4, 6, 6), (4, 2, 1, 1), dict(groups=2, dilation=2)),
        (torch.int16, (1, 64, 5, 5), (64, 1, 3, 3), dict(padding=1, groups=64)),  # split
    ],
)
@pytest.mark.parametrize("adversarial", [False, True])
def test_prepared_conv_equals_the_reference(x_dtype, x_shape, w_shape, kw, adversarial):
    g = torch.Generator().manual_seed(len(x_shape) * 7 + w_shape[1])
    w = _codes(g, w_shape, torch.int8, adversarial)
    conv = prepare_conv(x_shape, x_dtype, w, 2, **kw, w_float32=w.to(torch.float32))
    for _ in range(2):  # one preparation, several inputs of its shape
        x = _codes(g, x_shape, x_dtype, adversarial)
        xb = x if len(x_shape) == 4 else x.unsqueeze(0)
        want = torch.from_numpy(ref.int_conv2d(xb, w, **kw))
        want = want if len(x_shape) == 4 else want.squeeze(0)
        assert_bits_equal(conv(x), want)
        got32 = conv(x, as_int64=False)  # int32 or float32 hold the exact integers, or int64
        assert_bits_equal(got32.to(torch.int64), want)


def test_many_groups_split_an_int16_input():
    # a depthwise conv of int16 codes: float32 on the exact high/low halves, not float64
    w = torch.ones(64, 1, 3, 3, dtype=torch.int8)
    assert prepare_conv((1, 64, 5, 5), torch.int16, w, 2, groups=64).split_a
    small = prepare_conv((1, 63, 5, 5), torch.int16, w[:63], 2, groups=63)
    assert not small.split_a


def test_prepared_conv1d_equals_the_reference():
    g = torch.Generator().manual_seed(3)
    w = _codes(g, (4, 6, 3), torch.int8)
    conv = prepare_conv((2, 6, 11), torch.int8, w, 1, padding=1)
    x = _codes(g, (2, 6, 11), torch.int8)
    want = ref.int_conv2d(x.unsqueeze(2), w.unsqueeze(2), padding=(0, 1)).squeeze(2)
    assert_bits_equal(conv(x), torch.from_numpy(want))


@pytest.mark.parametrize("k", [100, 1024, 3000])  # one float32 chunk, its limit, several
def test_float32_matmul_sums_equal_the_reference(k, without_int32):
    g = torch.Generator().manual_seed(k)
    a = _codes(g, (2, 3, k), torch.int8, adversarial=k == 1024)
    b = _codes(g, (k, 5), torch.int8, adversarial=k == 1024)
    want = torch.from_numpy(ref.int_matmul(a, b))
    got = int_matmul(a, b, as_int64=False)  # float32 when one chunk holds K, else int64
    assert got.dtype == (torch.float32 if k <= 1024 else torch.int64)
    assert_bits_equal(got.to(torch.int64), want)
    assert_bits_equal(int_linear(a, b.t().contiguous(), as_int64=False).to(torch.int64), want)
    w = b.t().contiguous()  # a weight's codes with their float32 cast made once by the caller
    got = int_linear(a, w, as_int64=False, w_float32=w.to(torch.float32))
    assert_bits_equal(got.to(torch.int64), want)
    assert_bits_equal(int_matmul(a, b, b_float32=b.to(torch.float32)), want)


def test_float32_copies_of_the_codes_are_checked():
    w = torch.ones(4, 3, dtype=torch.int8)
    x = torch.ones(2, 3, dtype=torch.int8)
    with pytest.raises(ValueError, match="w_float32 must be the codes as float32 with shape"):
        int_linear(x, w, w_float32=torch.ones(3, 4))
    with pytest.raises(ValueError, match="b_float32 must be the codes as float32"):
        int_matmul(x, w.t(), b_float32=w.t().to(torch.float64))


def test_prepared_conv_rejects_other_inputs():
    w = torch.ones(2, 3, 1, 1, dtype=torch.int8)
    conv = prepare_conv((1, 3, 4, 4), torch.int8, w, 2)
    with pytest.raises(ValueError, match="shape"):
        conv(torch.ones(1, 3, 5, 4, dtype=torch.int8))
    with pytest.raises(ValueError, match="int16"):
        conv(torch.ones(1, 3, 4, 4, dtype=torch.int16))
    with pytest.raises(ValueError, match="input channels"):
        prepare_conv((1, 4, 4, 4), torch.int8, w, 2)
    with pytest.raises(TypeError, match="int8 or int16"):
        prepare_conv((1, 3, 4, 4), torch.int32, w, 2)


def _spy_rescale32(monkeypatch) -> list:
    """Record whether the float32 FLOAT_RESCALE form produced the codes (not None)."""
    used = []
    real = finish_mod._finish_rescale32

    def spy(*a, **kw):
        out = real(*a, **kw)
        used.append(out is not None)
        return out

    monkeypatch.setattr(finish_mod, "_finish_rescale32", spy)
    return used


def _ort_reference(acc, xs, ws, bias_codes, so, out, zp, axis, clamp=None) -> torch.Tensor:
    """numpy reference: int64 sum + bias codes, int32 saturation, FLOAT_RESCALE requantize
    (fl32(fl32(acc) * fl32(M)), half to even, + zero point, saturate), then the fused clamp."""
    a = np.asarray(acc, dtype=np.int64)
    if bias_codes is not None:
        shape = [1] * a.ndim
        shape[axis] = -1
        a = a + np.asarray(bias_codes, dtype=np.int64).reshape(shape)
    a = np.clip(a, -(1 << 31), (1 << 31) - 1)
    real = np.float32(xs) * np.asarray(ws, dtype=np.float32) / np.float32(so)
    codes = ref.requantize(a, real, Requant.FLOAT_RESCALE, out, Round.HALF_EVEN, axis, 31, zp)
    codes = torch.from_numpy(codes)
    return codes if clamp is None else codes.clamp_min(clamp[0]).clamp_max(clamp[1])


@pytest.mark.parametrize("out, zp", [(DType.INT8, 0), (DType.UINT8, 128), (DType.INT16, 0)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_float32_rescale_form_equals_the_reference(out, zp, per_channel, monkeypatch):
    used = _spy_rescale32(monkeypatch)
    g = torch.Generator().manual_seed(21 + zp)
    xs = torch.tensor(0.0123)
    ws = torch.rand(3, generator=g) * 0.01 + 1e-4 if per_channel else torch.tensor(0.0031)
    so = torch.tensor(0.05 if out is not DType.INT16 else 3e-4)
    bias = torch.randn(3, generator=g) * 0.5
    bias_codes = ref.quantize_bias(bias, xs, ws if per_channel else ws.expand(3))
    lim = 1 << 24
    near = torch.tensor([lim, -lim, lim - 1, 1 - lim, 0, 1, -1, 4097, -4097])
    rnd = torch.randint(-lim, lim + 1, (600,), generator=g)
    acc = torch.cat([near, rnd, edge_values(DType.INT16)]).reshape(-1, 1).expand(-1, 3)
    acc = acc.contiguous()
    for clamp in (None, (zp - 3, zp + 90)):
        want = _ort_reference(acc, xs, ws, bias_codes, so, out, zp, 1, clamp)
        general = finish_gemm(
            acc, xs, ws, bias, so, out, ORT, 1, GemmStats(), clamp, out_zero_point=zp
        )
        assert_bits_equal(general.to(torch.int64), want)
        for a in (acc, acc.to(torch.float32), acc.to(torch.float64)):  # int64, float32, float64
            used.clear()
            got = finish_gemm(
                a.clone(), xs, ws, bias, so, out, ORT, 1, None, clamp, sum_bound=lim,
                reuse_acc=True, out_zero_point=zp,
            )  # fmt: skip
            assert used == [True]
            assert_bits_equal(got, general, inputs={"acc": acc})


def test_float32_rescale_form_steps_aside_past_its_bounds(monkeypatch):
    used = _spy_rescale32(monkeypatch)
    xs, ws, so = torch.tensor(0.5), torch.tensor(0.25), torch.tensor(3.0)
    g = torch.Generator().manual_seed(5)
    # int64 sums beyond 2**24: float32 would round them before the bias joins (twice)
    big = torch.tensor([(1 << 24) + 1, (1 << 24) + 3, -(1 << 24) - 1, (1 << 30) + 7])
    big = torch.cat([big, torch.randint(-(1 << 30), 1 << 30, (200,), generator=g)])
    bias = torch.tensor([0.375])  # code 3: odd, so fl32(acc) + 3 would differ from fl32(acc + 3)
    for acc, fast in ((big.reshape(-1, 1), False), (big.reshape(-1, 1).float(), True)):
        used.clear()
        got = finish_gemm(acc.clone(), xs, ws, bias, so, DType.INT16, ORT, 1, sum_bound=1 << 30)
        assert used == [fast]
        want = _ort_reference(acc.to(torch.int64), xs, ws, np.array([3]), so, DType.INT16, 0, 1)
        assert_bits_equal(got.to(torch.int64), want, inputs={"acc": acc})
    # the int32 accumulator saturates: max|acc| + max|b| reaches 2**31
    acc = torch.tensor([[(1 << 31) - 3], [-(1 << 31) + 2], [5]])
    used.clear()
    got = finish_gemm(acc.float(), xs, ws, bias, so, DType.INT16, ORT, 1)
    assert used == [False]
    want = _ort_reference(acc.float().to(torch.int64), xs, ws, [3], so, DType.INT16, 0, 1)
    assert_bits_equal(got.to(torch.int64), want)
    # a bias code that is no float32 (2**24 + 1; integer bias codes) turns the form off
    odd = torch.tensor([(1 << 24) + 1])
    acc = torch.tensor([[1.0], [-3.0], [1 << 20]])
    used.clear()
    got = finish_gemm(acc.clone(), xs, ws, odd, so, DType.INT16, ORT, 1, sum_bound=1 << 20)
    assert used == []
    want = _ort_reference(acc.to(torch.int64), xs, ws, odd.numpy(), so, DType.INT16, 0, 1)
    assert_bits_equal(got.to(torch.int64), want)


@pytest.mark.parametrize("inter_shift", [14, 15])
@pytest.mark.parametrize("zero_points", [(0, 0, 0), (-5, 7, 3)])
def test_j6_add_at_the_int32_bound_equals_the_reference(inter_shift, zero_points):
    # int16 extremes: |x * mx| + |y * my| reaches 2**31 at inter_shift 15 (the clamp stays),
    # 2**30 at 14 (the clamp is provably idle and skipped)
    g = torch.Generator().manual_seed(inter_shift)
    ext = torch.tensor([-32768, 32767, -32767, 0, 1, -1], dtype=torch.int16)
    x = torch.cat([ext, ext, torch.randint(-32768, 32768, (300,), generator=g).to(torch.int16)])
    y = torch.cat([ext, ext.flip(0), torch.randint(-32768, 32768, (300,), generator=g)])
    y = y.to(torch.int16)
    zx, zy, zo = zero_points
    for scales in ((0.01, 0.01, 0.02), (0.013, 0.0041, 3e-4)):
        got = add_inter_scale(
            x, scales[0], y, scales[1], scales[2], DType.INT16, Requant.MUL_SHIFT,
            Round.HALF_UP, inter_shift, zero_points=zero_points,
        )  # fmt: skip
        want = ref.add_inter_scale(
            x, scales[0], y, scales[1], scales[2], DType.INT16, Requant.MUL_SHIFT,
            Round.HALF_UP, inter_shift, zero_points=(zx, zy, zo),
        )  # fmt: skip
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


def _chunked_calls(monkeypatch) -> list:
    import quantlab.numerics.gemm.kernels as kernels

    seen = []
    real = kernels._sum_chunks_f64
    monkeypatch.setattr(kernels, "_sum_chunks_f64", lambda parts: seen.append(1) or real(parts))
    return seen


def _matmul_ref(a, b) -> torch.Tensor:
    return torch.matmul(a.to(torch.int64), b.to(torch.int64))


@pytest.mark.parametrize("k", [1100, 1536, 4000])
def test_measured_rows_run_one_float32_matmul_and_equal_int64(k, monkeypatch, without_int32):
    """K past the static 2**24 bound of int8 x int8 (1024 terms): rows of small codes (as after
    a GELU) run as one float32 product; rows just below the bound (1023 * 128 * 128) too; rows
    at it (2**24) take the chunks. Every result equals the int64 product."""
    seen = _chunked_calls(monkeypatch)
    g = torch.Generator().manual_seed(k)
    b = _codes(g, (k, 48), torch.int8)
    small = torch.randint(-6, 7, (2, 16, k), generator=g).to(torch.int8)
    assert_bits_equal(int_matmul(small, b), _matmul_ref(small, b))
    assert_bits_equal(int_linear(small, b.t().contiguous()), _matmul_ref(small, b))
    assert not seen
    full = torch.full((k,), -128, dtype=torch.int8)
    at = torch.zeros(3, k, dtype=torch.int8)
    at[:, :1023] = -128  # a sum of 1023 products 2**14: 2**24 - 2**14
    wide = torch.full((k, 48), -128, dtype=torch.int8)
    assert_bits_equal(int_matmul(at, wide), _matmul_ref(at, wide))
    assert not seen
    at[1, 1023] = -128  # 2**24: the check is strict
    assert_bits_equal(int_matmul(at, wide), _matmul_ref(at, wide))
    assert len(seen) == 1
    adversarial = _codes(g, (4, k), torch.int8, adversarial=True)
    assert_bits_equal(int_matmul(adversarial, b), _matmul_ref(adversarial, b))
    assert_bits_equal(int_matmul(adversarial, full), _matmul_ref(adversarial, full))


def test_measured_channels_run_one_pointwise_float32_conv_and_equal_int64(
    monkeypatch, without_int32
):
    """A 1x1 convolution over 1152 int8 channels: small activations run as one float32 conv,
    large ones (and any kxk convolution) take the chunks; each equals the int64 conv."""
    import torch.nn.functional as F

    seen = _chunked_calls(monkeypatch)
    g = torch.Generator().manual_seed(8)
    w = _codes(g, (40, 1152, 1, 1), torch.int8)
    small = torch.randint(-9, 10, (1, 1152, 7, 7), generator=g).to(torch.int8)
    big = _codes(g, (1, 1152, 7, 7), torch.int8, adversarial=True)

    def ref_conv(x, w, **kw):
        return F.conv2d(x.to(torch.int64), w.to(torch.int64), **kw)

    for kw in ({}, {"stride": 2, "padding": 1}):
        conv = prepare_conv(tuple(small.shape), torch.int8, w, 2, **kw)
        assert_bits_equal(conv(small), ref_conv(small, w, **kw))
        assert not seen
        assert_bits_equal(conv(big), ref_conv(big, w, **kw))
        assert seen
        seen.clear()
    w3 = _codes(g, (8, 1152, 3, 3), torch.int8)
    conv = prepare_conv(tuple(small.shape), torch.int8, w3, 2, padding=1)
    assert_bits_equal(conv(small), ref_conv(small, w3, padding=1))
    assert seen  # 9 taps a unit: not the pointwise rule


@pytest.mark.parametrize("dt", [DType.INT8, DType.INT16])
def test_j6_add_float64_form_equals_int64_form_and_reference(dt, monkeypatch):
    """The J6 add in float64 passes (when its bound proves every step exact) gives the int64
    form's and the reference's codes: extreme codes, ties of the half-up rounding (equal and
    power-of-two scales), broadcasting either way, scales far apart, int8 and int16 outputs."""
    import quantlab.numerics.scaled_add as scaled_add

    g = torch.Generator().manual_seed(dt.bits)
    info = torch.iinfo(dt.torch_dtype)
    ext = torch.tensor([info.min, info.max, info.min + 1, 0, 1, -1])
    x = torch.cat([ext, ext, torch.randint(info.min, info.max + 1, (500,), generator=g)])
    y = torch.cat([ext, ext.flip(0), torch.randint(info.min, info.max + 1, (500,), generator=g)])
    x, y = x.to(dt.torch_dtype), y.to(dt.torch_dtype)
    scale_sets = [(0.01, 0.01, 0.02), (2.0**-6, 2.0**-7, 2.0**-6), (0.013, 0.0041, 3e-4)]
    scale_sets += [(0.5, 1e-4, 0.25), (0.03, 0.07, 0.05)]
    operands = [(x, y), (x.reshape(2, -1), y.reshape(2, -1)[:1]), (x[:4].reshape(4, 1), y)]
    forms = []
    real = scaled_add._float64_form
    monkeypatch.setattr(scaled_add, "_float64_form", lambda *a: forms.append(real(*a)) or forms[-1])
    for out in (DType.INT8, DType.INT16):
        for sx, sy, so in scale_sets:
            for a, b in operands:
                args = (a, sx, b, sy, so, out, Requant.MUL_SHIFT, Round.HALF_UP)
                got = add_inter_scale(*args)
                want = ref.add_inter_scale(*args)
                assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))
                with monkeypatch.context() as m:
                    m.setattr(scaled_add, "_float64_form", lambda *a: None)
                    assert_bits_equal(got, add_inter_scale(*args))
    taken = sum(f is not None for f in forms)
    if dt is DType.INT8:
        assert taken >= len(forms) // 2  # the float64 form ran for most cases
    else:  # int16 codes times 2**14 times a 31-bit multiplier pass 2**53: the int64 form
        assert taken == 0


def test_row_check_is_a_proof_when_float32_row_sums_round():
    """int16 rows whose float32 sums round: 512 * 32768 + 1 sums to 2**24 in float32 (ties to
    even), and the strict check still refuses it; exact sums below 2**24 pass."""
    from quantlab.numerics.gemm.kernels import rows_fit_float32

    row = torch.full((1, 513), 32768.0)
    row[0, -1] = 1.0
    assert float(row.abs().sum(-1)) == 2.0**24  # the rounded sum
    assert not rows_fit_float32(row, 1)
    row[0, 0] = 32766.0  # 2**24 - 1 exactly
    assert rows_fit_float32(row, 1) and not rows_fit_float32(row, 2)
    assert rows_fit_float32(torch.zeros(0, 5), 128)
