"""The plan-time fake quant (``fake_quant_fn``) and fake_quant's per-tensor BY_SCALE form give
the bits of the integer reference, on random and adversarial inputs (ties, NaN, inf, -0,
saturation, zero points outside a narrow code range)."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from bits import assert_bits_equal
from native_builds import BUILDS, use_build
from toolchain import CC

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.fake_quant_plan import fake_quant_fn
from quantlab.numerics.quantize import Divide, code_range, fake_quant, fake_quant_by_scale
from quantlab.numerics.reference.rounding import round_fraction as ref_round
from quantlab.numerics.rounding import Round
from quantlab.numerics.scales import check_scale

CASES = [  # dtype, zero point, (qmin, qmax)
    (DType.INT8, 0, (None, None)),
    (DType.INT8, 7, (None, None)),
    (DType.INT8, -128, (-127, None)),  # NaN's code (the zero point) lies below the range
    (DType.UINT8, 131, (None, None)),
    (DType.INT16, 0, (None, None)),
    (DType.INT16, -300, (None, 32000)),
]
BOUNDS = [None, (0.0, 6.0), (None, 2.0), (-1.5, None)]


def _inputs(scale: float, dtype: DType) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    span = scale * (dtype.qmax - dtype.qmin)
    ties = (torch.arange(-40, 40, dtype=torch.float64) + 0.5) * scale  # exact: scale = 2**-k
    edges = torch.tensor([dtype.qmin - 1, dtype.qmin, dtype.qmax, dtype.qmax + 1.5]) * scale
    special = torch.tensor(
        [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-30, -1e-30, 1e30, -1e30]
    )
    rand = torch.randn(200, generator=g) * span / 3
    return torch.cat([ties.float(), edges.float(), special, rand, -ties.float()])


def _reference(x, bounds, s, dtype, zp, qmin, qmax, rounding) -> torch.Tensor:
    """(codes - zp) * s in float32 from the exact numpy reference quantizer."""
    if bounds is not None:
        x = torch.clamp(x, bounds[0], bounds[1])
    codes = ref.quantize(x, np.float32(s), dtype, rounding, zero_point=zp)
    lo = dtype.qmin if qmin is None else qmin
    hi = dtype.qmax if qmax is None else qmax
    codes = np.clip(codes, lo, hi) - zp
    value = codes.astype(np.float32) * np.float32(s)  # one float32 product, exact
    return torch.from_numpy(value)


@pytest.mark.parametrize("rounding", list(Round))
@pytest.mark.parametrize("dtype,zp,rng", CASES)
@pytest.mark.parametrize("exact_ties", [True, False], ids=["power-of-2-scale", "inexact-scale"])
def test_by_scale_matches_integer_reference(rounding, dtype, zp, rng, exact_ties):
    s = (2.0**-5 if dtype.bits == 8 else 2.0**-9) if exact_ties else float(np.float32(0.0371))
    x = _inputs(s, dtype)
    for bounds in BOUNDS:
        want = _reference(x, bounds, s, dtype, zp, *rng, rounding)
        kw = dict(qmin=rng[0], qmax=rng[1], bounds=bounds, zero_point=zp)
        fn = fake_quant_fn(torch.tensor(s), dtype, rounding, Divide.BY_SCALE, **kw)
        assert_bits_equal(fn(x), want, inputs={"x": x})
        got = fake_quant(x, s, dtype, rounding, divide=Divide.BY_SCALE, **kw)
        assert_bits_equal(got, want, inputs={"x": x})
        assert_bits_equal(fn(x.double()), want)  # float64 input: clamped, then float32


@pytest.mark.parametrize("rounding", list(Round))
@pytest.mark.parametrize("dtype,zp,rng", CASES)
def test_by_scale_in_place_and_with_nan_kept(rounding, dtype, zp, rng):
    """``fake_quant_by_scale``: ``inplace`` writes the result into an owned float32 input (not
    into one with gradient) and ``keep_nan`` leaves NaN as NaN, every other value as the
    reference."""
    s = float(np.float32(0.0371))
    x = _inputs(s, dtype)
    want = _reference(x, None, s, dtype, zp, *rng, rounding)
    lo, hi = code_range(dtype, *rng)
    st = check_scale(torch.tensor(s), "scale").reshape(())
    args = (st, lo - zp, hi - zp, rounding)
    owned = x.clone()
    got = fake_quant_by_scale(owned, *args, inplace=True)
    assert got.data_ptr() == owned.data_ptr()
    assert_bits_equal(got, want, inputs={"x": x})
    with_grad = x.clone().requires_grad_()
    got = fake_quant_by_scale(with_grad, *args, inplace=True)
    assert got.data_ptr() != with_grad.data_ptr()
    assert_bits_equal(got, want, inputs={"x": x})
    assert_bits_equal(with_grad.detach(), x)
    nan = torch.isnan(x)
    kept = fake_quant_by_scale(x, *args, keep_nan=True)
    assert torch.isnan(kept[nan]).all() and not torch.isnan(kept[~nan]).any()
    assert_bits_equal(kept[~nan], want[~nan], inputs={"x": x[~nan]})


def _reciprocal_reference(x, bounds, s, dtype, zp, qmin, qmax, rounding) -> torch.Tensor:
    """round(fl32(x * fl32(1 / s))) clamped to the code range around zp, times s (float32);
    NaN stays NaN (torch's fake-quant kernels), element by element with exact rounding."""
    if bounds is not None:
        x = torch.clamp(x, bounds[0], bounds[1])
    r = np.float32(1) / np.float32(s)
    lo = (dtype.qmin if qmin is None else qmin) - zp
    hi = (dtype.qmax if qmax is None else qmax) - zp
    out = []
    for v in (x.numpy().astype(np.float32) * r).astype(np.float32).tolist():
        if math.isnan(v):
            out.append(np.float32("nan"))
            continue
        code = max(lo, hi) if v == math.inf else lo if v == -math.inf else None
        if code is None:
            code = min(max(ref_round(Fraction(v), rounding), lo), hi)
        out.append(np.float32(code) * np.float32(s))
    return torch.tensor(np.array(out, dtype=np.float32))


@pytest.mark.parametrize("rounding", list(Round))
@pytest.mark.parametrize("dtype,zp,rng", CASES)
def test_by_reciprocal_matches_exact_reference(rounding, dtype, zp, rng):
    s = torch.tensor(0.0371, dtype=torch.float32)  # an inexact reciprocal
    x = _inputs(float(s), dtype)
    for bounds in BOUNDS:
        want = _reciprocal_reference(x, bounds, float(s), dtype, zp, *rng, rounding)
        kw = dict(qmin=rng[0], qmax=rng[1], bounds=bounds, zero_point=zp)
        fn = fake_quant_fn(s, dtype, rounding, Divide.BY_RECIPROCAL, **kw)
        assert_bits_equal(fn(x), want, inputs={"x": x})
        strided = torch.stack([x, x], 1)[:, 0]  # the same values; the torch passes (HALF_EVEN too)
        assert_bits_equal(fn(strided), want, inputs={"x": x})
        owned = x.clone()
        assert_bits_equal(fn(owned, inplace=True), want, inputs={"x": x})
        assert owned.data_ptr() == fn(owned, inplace=True).data_ptr()  # written in place
        got = fake_quant(x, s, dtype, rounding, divide=Divide.BY_RECIPROCAL, **kw)
        assert_bits_equal(got, want, inputs={"x": x})


@pytest.mark.skipif(CC is None, reason="the native fake quant needs a C compiler")
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype,zp,rng", CASES)
def test_by_reciprocal_in_one_c_pass_matches_exact_reference(dtype, zp, rng, build, monkeypatch):
    """Contiguous float32 tensors of any size take the one-pass C kernel (HALF_EVEN):
    the exact reference's bits, NaN, infinities, ties and saturation included, out of place
    and in place, by the build the CPU loads, by the baseline build and by the AVX2 code alone."""
    from quantlab.numerics import fake_quant_native as FQN

    use_build(build, FQN.KERNELS, monkeypatch)
    s = torch.tensor(0.0371, dtype=torch.float32)
    lo_code = (dtype.qmin if rng[0] is None else rng[0]) - zp
    hi_code = (dtype.qmax if rng[1] is None else rng[1]) - zp
    steps = torch.arange(-3, 3, 0.05, dtype=torch.float64)  # dense around both code bounds
    edges = torch.cat([(lo_code + steps) * float(s), (hi_code + steps) * float(s)]).float()
    base = torch.cat([_inputs(float(s), dtype), edges])
    k = (1 << 15) // base.numel() + 2  # on two threads where torch has two
    x = base.repeat(k)
    for bounds in BOUNDS:
        want = _reciprocal_reference(base, bounds, float(s), dtype, zp, *rng, Round.HALF_EVEN)
        want = want.repeat(k)
        kw = dict(qmin=rng[0], qmax=rng[1], bounds=bounds, zero_point=zp)
        fn = fake_quant_fn(s, dtype, Round.HALF_EVEN, Divide.BY_RECIPROCAL, **kw)
        assert_bits_equal(fn(x), want, inputs={"x": x})
        owned = x.clone()
        got = fn(owned, inplace=True)
        assert got.data_ptr() == owned.data_ptr()
        assert_bits_equal(got, want, inputs={"x": x})
        for m in (1, 15, 17, 1000):  # short tensors: one thread, a scalar tail
            assert_bits_equal(fn(x[:m]), want[:m], inputs={"x": x[:m]})
    lo, hi, rf, sf = -8, 7, float(1 / s), float(s)
    assert FQN.reciprocal(x, rf, sf, lo, hi) is not None  # the C pass ran
    assert FQN.reciprocal(x[:1], rf, sf, lo, hi) is not None  # on one value too
    assert FQN.reciprocal(x, rf, sf, lo, 1 + (1 << 16)) is None  # beyond the rounding's bound
    assert FQN.reciprocal(x[::2].clone().t() if x.dim() > 1 else x[::2], rf, sf, lo, hi) is None


@pytest.mark.parametrize("dtype,zp", [(DType.INT8, 0), (DType.UINT8, 131), (DType.INT16, -3)])
def test_by_reciprocal_is_torch_fake_quantize(dtype, zp):
    s = torch.tensor(0.0371, dtype=torch.float32)
    x = _inputs(float(s), dtype)
    x = x[~torch.isnan(x)]  # torch's kernel does not define NaN
    fn = fake_quant_fn(s, dtype, Round.HALF_EVEN, Divide.BY_RECIPROCAL, zero_point=zp)
    want = torch.fake_quantize_per_tensor_affine(x, float(s), zp, dtype.qmin, dtype.qmax)
    assert_bits_equal(fn(x), want + 0.0, inputs={"x": x})


def test_bad_arguments_raise_when_made():
    with pytest.raises(ValueError, match="scale"):
        fake_quant_fn(torch.tensor(0.0), DType.INT8)
    with pytest.raises(ValueError, match="zero_point"):
        fake_quant_fn(torch.tensor(0.1), DType.INT8, zero_point=300)
    with pytest.raises(TypeError, match="float tensor"):
        fake_quant_fn(torch.tensor(0.1), DType.INT8)(torch.ones(3, dtype=torch.int32))


@pytest.mark.skipif(CC is None, reason="the native fake quant needs a C compiler")
@pytest.mark.parametrize("n", [32768, 32769, 40007, 49152, 100003, 196608 + 5])
def test_the_c_pass_split_between_threads_writes_every_value(n):
    """Long tensors are split into one equal run per thread (a multiple of 16 values): every
    value is written, with the torch passes' bits, whatever the remainder."""
    from quantlab.numerics import fake_quant_native as FQN

    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 4
    s = 0.0371
    rf, sf = float(torch.tensor(1 / s, dtype=torch.float32)), s
    want = torch.clamp(torch.round(x * torch.tensor(rf)), -128, 127) * torch.tensor(sf) + 0.0
    threads = torch.get_num_threads()
    try:
        for t in (2, 3):
            torch.set_num_threads(t)
            out = torch.full((n,), 1e30)
            assert FQN.reciprocal(x, rf, sf, -128, 127, out) is out
            assert_bits_equal(out, want)
    finally:
        torch.set_num_threads(threads)
