import numpy as np
import pytest
import torch
from bits import assert_bits_equal
from hypothesis import given, settings
from hypothesis import strategies as st

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import (
    GemmContract,
    GemmPath,
    Overflow,
    accumulate,
    clamp_int16_operand,
    coarsen_int16_matmul_scale,
    finish_gemm,
    int16_matmul_scale_factor,
    int_conv1d,
    int_conv2d,
    int_linear,
    int_matmul,
    plan_gemm,
    qconv1d,
    qconv2d,
    qlinear,
    qmatmul,
    quantize_bias,
)
from quantlab.numerics.quantize import QuantStats
from quantlab.numerics.requant import Requant, requant_scale
from quantlab.platforms import PlatformConfig

PATHS = [GemmPath.AUTO, GemmPath.FLOAT32, GemmPath.FLOAT64, GemmPath.INT64]
DT = {DType.INT8: torch.int8, DType.INT16: torch.int16}


def _codes(g, shape, dtype: torch.dtype) -> torch.Tensor:
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max + 1, shape, generator=g).to(dtype)


def _adversarial(g, shape, dtype: torch.dtype) -> torch.Tensor:
    """All odd, near the maximum, one sign: partial sums exceed 2**24 and stay odd."""
    hi = torch.iinfo(dtype).max
    mag = hi - 2 * torch.randint(0, 3, shape, generator=g)
    sign = int(torch.randint(0, 2, (), generator=g)) * 2 - 1
    return (mag * sign).to(dtype)


def _paths_for(a: torch.Tensor, b: torch.Tensor, conv: bool = False):
    """Forced paths whose bound holds for these operands (FLOAT32 needs one unit <= 2**24;
    FLOAT32_SPLIT is for convolutions with an int8 right operand)."""
    both8 = a.dtype == torch.int8 and b.dtype == torch.int8
    paths = PATHS if both8 else [GemmPath.AUTO, GemmPath.FLOAT64, GemmPath.INT64]
    if conv and b.dtype == torch.int8:
        paths = paths + [GemmPath.FLOAT32_SPLIT]
    return paths


MATMUL_SHAPES = [
    ((7, 13), (13, 5)),
    ((13,), (13, 4)),
    ((3, 13), (13,)),
    ((2, 1, 6, 9), (3, 9, 4)),
    ((4, 5, 2100), (2100, 3)),  # K above one float32 chunk
]


@pytest.mark.parametrize("ta", [torch.int8, torch.int16])
@pytest.mark.parametrize("tb", [torch.int8, torch.int16])
@pytest.mark.parametrize("shapes", MATMUL_SHAPES)
def test_int_matmul_matches_reference(ta, tb, shapes):
    g = torch.Generator().manual_seed(1)
    a, b = _codes(g, shapes[0], ta), _codes(g, shapes[1], tb)
    exp = torch.from_numpy(ref.int_matmul(a, b))
    for path in _paths_for(a, b):
        assert_bits_equal(int_matmul(a, b, path), exp)


@pytest.mark.parametrize("ta", [torch.int8, torch.int16])
def test_int_matmul_adversarial_large_k(ta):
    g = torch.Generator().manual_seed(2)
    a, b = _adversarial(g, (6, 3000), ta), _adversarial(g, (3000, 7), torch.int8)
    exp = torch.from_numpy(ref.int_matmul(a, b))
    if ta == torch.int8:  # the data really defeats plain float32
        plain = (a.float() @ b.float()).to(torch.int64)
        assert not torch.equal(plain, exp)
    for path in _paths_for(a, b):
        assert_bits_equal(int_matmul(a, b, path), exp)


def test_int_matmul_int16_adversarial_extremes():
    a = torch.full((3, 4000), -32768, dtype=torch.int16)
    b = torch.full((4000, 2), -32768, dtype=torch.int16)
    exp = torch.from_numpy(ref.int_matmul(a, b))
    assert int(exp[0, 0]) == 4000 * 2**30
    assert_bits_equal(int_matmul(a, b), exp)


def test_int_linear_matches_reference():
    g = torch.Generator().manual_seed(3)
    x, w = _codes(g, (2, 3, 40), torch.int8), _codes(g, (9, 40), torch.int16)
    assert_bits_equal(int_linear(x, w), torch.from_numpy(ref.int_linear(x, w)))


def _conv_geometry(rng, nsp):
    while True:
        groups = int(rng.choice([1, 2, 3]))
        cin, cout = groups * int(rng.integers(1, 5)), groups * int(rng.integers(1, 4))
        k = tuple(int(v) for v in rng.integers(1, 4, nsp))
        size = tuple(int(v) for v in rng.integers(3, 9, nsp))
        stride = tuple(int(v) for v in rng.integers(1, 3, nsp))
        dil = tuple(int(v) for v in rng.integers(1, 3, nsp))
        pad = tuple(int(v) for v in rng.integers(0, 3, nsp))
        if all(size[i] + 2 * pad[i] - dil[i] * (k[i] - 1) - 1 >= 0 for i in range(nsp)):
            return groups, cin, cout, k, size, stride, dil, pad


@pytest.mark.parametrize("seed", range(24))
def test_int_conv2d_matches_reference(seed):
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    groups, cin, cout, k, size, stride, dil, pad = _conv_geometry(rng, 2)
    tx, tw = [
        (torch.int8, torch.int8),
        (torch.int16, torch.int8),
        (torch.int8, torch.int16),
        (torch.int16, torch.int16),
    ][seed % 4]
    x = _codes(g, (2, cin, *size), tx)
    w = _codes(g, (cout, cin // groups, *k), tw)
    exp = torch.from_numpy(ref.int_conv2d(x, w, stride, pad, dil, groups))
    for path in _paths_for(x, w, conv=True):
        assert_bits_equal(int_conv2d(x, w, stride, pad, dil, groups, path), exp)


@pytest.mark.parametrize("seed", range(12))
def test_int_conv1d_matches_reference(seed):
    rng = np.random.default_rng(100 + seed)
    g = torch.Generator().manual_seed(seed)
    groups, cin, cout, k, size, stride, dil, pad = _conv_geometry(rng, 1)
    tx = torch.int16 if seed % 3 == 0 else torch.int8
    x = _codes(g, (2, cin, *size), tx)
    w = _codes(g, (cout, cin // groups, *k), torch.int8)
    exp = torch.from_numpy(ref.int_conv1d(x, w, stride, pad, dil, groups))
    for path in _paths_for(x, w, conv=True):
        assert_bits_equal(int_conv1d(x, w, stride, pad, dil, groups, path), exp)


@pytest.mark.parametrize("groups", [1, 2])
def test_int_conv2d_adversarial_chunked(groups):
    g = torch.Generator().manual_seed(4)
    cin = 256 * groups  # K = 256 * 9 = 2304 per group: three float32 chunks
    x = _adversarial(g, (1, cin, 5, 5), torch.int8)
    w = _adversarial(g, (4 * groups, 256, 3, 3), torch.int8)
    exp = torch.from_numpy(ref.int_conv2d(x, w, 1, 1, 1, groups))
    plain = torch.nn.functional.conv2d(x.float(), w.float(), padding=1, groups=groups)
    assert not torch.equal(plain.to(torch.int64), exp)
    plan = plan_gemm(127, 127, 256, 9)
    assert plan.path is GemmPath.FLOAT32 and plan.chunk < 256
    for path in PATHS:
        assert_bits_equal(int_conv2d(x, w, padding=1, groups=groups, path=path), exp)


@pytest.mark.parametrize("sign", [1, -1])
def test_int16_conv_split_adversarial(sign):
    g = torch.Generator().manual_seed(11)
    x = (_adversarial(g, (2, 400, 5, 5), torch.int16).to(torch.int32).abs() * sign).to(torch.int16)
    x[0, 0, 0, :3] = torch.tensor([-32768, 32767, 128], dtype=torch.int16)  # split edges
    w = torch.full((4, 200, 3, 3), -128, dtype=torch.int8)
    exp = torch.from_numpy(ref.int_conv2d(x, w, 1, 1, 1, 2))
    plan = plan_gemm(32768, 128, 200, 9, split_a=True)
    assert plan.path is GemmPath.FLOAT32_SPLIT and plan.chunk < 200
    for path in (GemmPath.AUTO, GemmPath.FLOAT32_SPLIT):
        assert_bits_equal(int_conv2d(x, w, padding=1, groups=2, path=path), exp)
    with pytest.raises(ValueError, match="FLOAT32_SPLIT"):
        int_matmul(x[0, :3, 0], w[:, :5, 0, 0].t().contiguous(), GemmPath.FLOAT32_SPLIT)


def test_unbatched_conv():
    g = torch.Generator().manual_seed(5)
    x, w = _codes(g, (3, 6, 6), torch.int8), _codes(g, (2, 3, 3, 3), torch.int8)
    assert_bits_equal(int_conv2d(x, w), torch.from_numpy(ref.int_conv2d(x, w)))


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 6),
    k=st.integers(1, 40),
    n=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    ta=st.sampled_from([torch.int8, torch.int16]),
    extreme=st.booleans(),
)
def test_int_matmul_property(m, k, n, seed, ta, extreme):
    g = torch.Generator().manual_seed(seed)
    make = _adversarial if extreme else _codes
    a, b = make(g, (m, k), ta), make(g, (k, n), torch.int8)
    assert_bits_equal(int_matmul(a, b), torch.from_numpy(ref.int_matmul(a, b)))


def test_plan_choices():
    assert plan_gemm(128, 128, 1000).path is GemmPath.FLOAT32  # one chunk
    p = plan_gemm(128, 128, 5000)
    assert p.path is GemmPath.FLOAT32 and p.chunk == 1000  # 5 balanced chunks <= 1024
    assert plan_gemm(32768, 128, 5000).path is GemmPath.FLOAT64  # int16 x int8
    assert plan_gemm(32768, 32768, 100).path is GemmPath.FLOAT64
    assert plan_gemm(32768, 32768, 2**24).path is GemmPath.INT64
    with pytest.raises(ValueError, match="FLOAT32 cannot be exact"):
        plan_gemm(32768, 32768, 10, path=GemmPath.FLOAT32)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        plan_gemm(32768, 32768, 2**24, path=GemmPath.FLOAT64)


def test_gemm_errors():
    a8 = torch.zeros(3, 4, dtype=torch.int8)
    with pytest.raises(TypeError, match="int8 or int16"):
        int_matmul(torch.zeros(3, 4), torch.zeros(4, 2, dtype=torch.int8))
    with pytest.raises(TypeError, match="int8 or int16"):
        int_matmul(a8, torch.zeros(4, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="do not match"):
        int_matmul(a8, torch.zeros(5, 2, dtype=torch.int8))
    with pytest.raises(ValueError, match="does not match"):
        int_linear(a8, torch.zeros(2, 5, dtype=torch.int8))
    x = torch.zeros(1, 4, 5, 5, dtype=torch.int8)
    with pytest.raises(ValueError, match="groups"):
        int_conv2d(x, torch.zeros(3, 2, 3, 3, dtype=torch.int8), groups=2)
    with pytest.raises(ValueError, match="input channels"):
        int_conv2d(x, torch.zeros(2, 3, 3, 3, dtype=torch.int8))
    with pytest.raises(ValueError, match="4-d"):
        int_conv2d(x, torch.zeros(2, 4, 3, dtype=torch.int8))


@pytest.mark.parametrize("overflow", list(Overflow))
def test_accumulate_matches_reference(overflow):
    acc = torch.tensor([0, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 5 * 2**32 + 7, -(2**40)])
    got, n = accumulate(acc, DType.INT32, overflow)
    exp, n_exp = ref.accumulate(acc, DType.INT32, saturate=overflow is Overflow.SATURATE)
    assert_bits_equal(got, torch.from_numpy(exp))
    assert n == n_exp == 4
    with pytest.raises(TypeError):
        accumulate(acc.float())


def _contract(**kw) -> GemmContract:
    """The GEMM contract of a test platform profile (PlatformConfig fields in ``kw``)."""
    base = dict(name="test", requant=Requant.MUL_SHIFT)
    base.update(kw)
    return PlatformConfig(**base).gemm_contract()


@pytest.mark.parametrize("scheme", list(Requant))
def test_qconv2d_matches_reference_pipeline(scheme):
    from quantlab.numerics.rounding import Round

    plat = _contract(requant=scheme, requant_round=Round.HALF_UP)
    g = torch.Generator().manual_seed(6)
    x, w = _codes(g, (2, 4, 7, 7), torch.int8), _codes(g, (6, 2, 3, 3), torch.int8)
    sw = torch.rand(6, generator=g) * 0.01 + 1e-3
    bias = torch.randn(6, generator=g)
    codes, stats = qconv2d(x, 0.05, w, sw, bias, 0.2, DType.INT8, plat, padding=1, groups=2)
    acc = ref.int_conv2d(x, w, 1, 1, 1, 2) + ref.quantize_bias(bias, 0.05, sw)[None, :, None, None]
    acc, _ = ref.accumulate(acc)
    real = requant_scale(0.05, sw, 0.2, scheme)
    exp = ref.requantize(acc, real, scheme, DType.INT8, Round.HALF_UP, axis=1)
    assert_bits_equal(codes.to(torch.int64), torch.from_numpy(exp))
    assert stats.outputs == codes.numel()


def test_high_precision_outputs():
    plat = _contract()
    g = torch.Generator().manual_seed(8)
    x, w = _codes(g, (3, 20), torch.int8), _codes(g, (5, 20), torch.int8)
    sw = torch.rand(5, generator=g) * 0.01 + 1e-3
    bias = torch.randn(5, generator=g)
    acc32, _ = qlinear(x, 0.1, w, sw, bias, None, DType.INT32, plat)
    assert acc32.dtype == torch.int32
    exp = ref.int_linear(x, w) + ref.quantize_bias(bias, 0.1, sw)[None, :]
    assert_bits_equal(acc32.to(torch.int64), torch.from_numpy(exp))
    f, _ = qlinear(x, 0.1, w, sw, bias, None, DType.FLOAT32, plat)
    s = (np.float32(0.1) * sw.numpy()).astype(np.float32)
    assert_bits_equal(f, torch.from_numpy(exp.astype(np.float32) * s))


def test_accumulator_overflow_counted_and_wrapped():
    plat = _contract(accumulator_overflow=Overflow.WRAP, max_int16_gemm_operands=2)
    a = torch.full((1, 4), 32767, dtype=torch.int16)
    b = torch.full((4, 1), 32767, dtype=torch.int16)  # 4 * (2**15 - 1)**2 > 2**31
    acc32, stats = qmatmul(a, 1.0, b, 1.0, None, None, DType.INT32, plat)
    exact = 4 * 32767**2
    assert stats.acc_overflow == 1
    assert int(acc32) == ((exact + 2**31) % 2**32) - 2**31
    sat, stats = qmatmul(
        a, 1.0, b, 1.0, None, None, DType.INT32, _contract(max_int16_gemm_operands=2)
    )
    assert int(sat) == 2**31 - 1 and stats.acc_overflow == 1


def test_int16_x_int16_rejected_where_platform_forbids():
    a = torch.zeros(2, 3, dtype=torch.int16)
    with pytest.raises(ValueError, match="max_int16_gemm_operands=1"):
        qmatmul(a, 1.0, a.t().contiguous(), 1.0, None, 1.0, DType.INT8, _contract())


def test_qconv1d_and_qmatmul_per_column():
    from quantlab.numerics.rounding import Round

    plat = _contract()
    g = torch.Generator().manual_seed(9)
    x, w = _codes(g, (1, 3, 9), torch.int8), _codes(g, (4, 3, 2), torch.int8)
    codes, _ = qconv1d(x, 0.1, w, 0.01, None, 0.05, DType.INT16, plat, stride=2)
    exp = ref.requantize(
        ref.int_conv1d(x, w, 2),
        requant_scale(0.1, 0.01, 0.05, plat.requant),
        plat.requant,
        DType.INT16,
        Round.HALF_UP,
    )
    assert_bits_equal(codes.to(torch.int64), torch.from_numpy(exp))
    a, b = _codes(g, (2, 3, 8), torch.int8), _codes(g, (8, 5), torch.int8)
    sw = torch.rand(5, generator=g) * 0.01 + 1e-3
    codes, _ = qmatmul(a, 0.1, b, sw, None, 0.3, DType.INT8, plat)
    exp = ref.requantize(
        ref.int_matmul(a, b),
        requant_scale(0.1, sw, 0.3, plat.requant),
        plat.requant,
        DType.INT8,
        Round.HALF_UP,
        axis=-1,
    )
    assert_bits_equal(codes.to(torch.int64), torch.from_numpy(exp))


def test_quantize_bias_matches_reference_and_saturates():
    b = torch.tensor([0.5, -1.25, 3e9, -3e9, 0.0])
    stats_holder = __import__("quantlab.numerics.gemm", fromlist=["GemmStats"]).GemmStats()
    got = quantize_bias(b, 0.5, torch.full((5,), 0.25), stats_holder)
    assert_bits_equal(got, torch.from_numpy(ref.quantize_bias(b, 0.5, np.full(5, 0.25))))
    assert stats_holder.bias_saturated == 2
    # integer bias: codes already (a QDQ graph's int32 bias), checked against the bias dtype
    codes = torch.tensor([1, -(1 << 31), (1 << 31) - 1])
    assert_bits_equal(quantize_bias(codes, 0.5, 0.5), codes)
    with pytest.raises(ValueError, match="INT32 range"):
        quantize_bias(torch.tensor([1 << 31]), 0.5, 0.5)
    assert int(quantize_bias(torch.tensor([1 << 40]), 0.5, 0.5, dtype=DType.INT64)) == 1 << 40


def test_finish_gemm_errors():
    plat = _contract()
    acc = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="out_scale"):
        finish_gemm(acc, 0.1, 0.1, None, None, DType.INT8, plat, -1)
    with pytest.raises(ValueError, match="bias must have shape"):
        finish_gemm(acc, 0.1, 0.1, torch.zeros(2), 0.1, DType.INT8, plat, -1)
    with pytest.raises(ValueError, match="out_dtype"):
        finish_gemm(acc, 0.1, 0.1, None, 0.1, DType.FLOAT16, plat, -1)


def test_int16_operand_rule():
    top = PlatformConfig().int16_operand_max
    assert top == 32639
    assert int16_matmul_scale_factor(2, top) == pytest.approx(32767 / 32639)
    assert int16_matmul_scale_factor(512, top) == 16.0
    s = coarsen_int16_matmul_scale(torch.tensor(0.5), 512, top)
    assert s.dtype == torch.float32 and float(s) == 8.0
    stats = QuantStats()
    c = clamp_int16_operand(
        torch.tensor([-32768, 0, 32639, 32640, 32767], dtype=torch.int16), top, stats
    )
    assert c.tolist() == [-32768, 0, 32639, 32639, 32639] and stats.saturated == 2
    with pytest.raises(TypeError):
        clamp_int16_operand(torch.zeros(2, dtype=torch.int8), top)
    with pytest.raises(ValueError, match="operand_max"):
        int16_matmul_scale_factor(4, 40000)


def test_qmatmul_double_rounding_equals_the_gemmlowp_reference():
    # oracle: numpy int64 sums, then TFLite's double rounding line by line on Python ints,
    # with the multiplier formed from the float32 scales in float64 here
    from quantlab.numerics.rounding import Round

    plat = _contract(requant=Requant.MUL_SHIFT_DOUBLE, requant_round=Round.HALF_AWAY)
    g = torch.Generator().manual_seed(10)
    x, w = _codes(g, (4, 30), torch.int8), _codes(g, (30, 6), torch.int8)
    codes, _ = qmatmul(x, 0.02, w, 0.03, None, 0.5, DType.INT8, plat)
    real = float(np.float64(np.float32(0.02)) * np.float64(np.float32(0.03)))
    real /= float(np.float64(np.float32(0.5)))
    acc = ref.int_matmul(x, w)
    exp = ref.requantize(acc, real, Requant.MUL_SHIFT_DOUBLE, DType.INT8, Round.HALF_AWAY)
    assert_bits_equal(codes.to(torch.int64), torch.from_numpy(exp))
    assert len(set(exp.ravel().tolist())) > 5  # not a degenerate all-saturated case


def test_selftest_passes_and_its_data_breaks_plain_float32():
    """The self-test's adversarial data defeats a float32 sum taken term by term (one float32
    accumulator, as a kernel without blocking computes it). torch's own float32 product may
    split K into blocks whose partial sums stay exact, and then it depends on the CPU's BLAS
    whether the data breaks it, so the sum is taken here in a fixed order."""
    from quantlab.numerics.selftest import _adversarial, run_selftest

    cases = run_selftest()
    assert cases and all(c.ok for c in cases)
    a, b = _adversarial((4, 2100), torch.int8, 1), _adversarial((2100, 3), torch.int8, 2)
    af, bf = a.float(), b.float()
    acc = torch.zeros(4, 3)
    for k in range(a.shape[1]):
        acc += af[:, k : k + 1] * bf[k : k + 1, :]  # each sum rounded to float32
    exact = int_matmul(a, b, GemmPath.INT64)
    assert int(exact.abs().max()) > 2**24  # beyond float32's exact integers
    assert not torch.equal(acc.to(torch.int64), exact)


def test_auto_avoids_a_path_that_failed_selftest():
    assert plan_gemm(128, 128, 100).path is GemmPath.FLOAT32
    assert plan_gemm(128, 128, 100, disabled={GemmPath.FLOAT32}).path is GemmPath.FLOAT64
    off = {GemmPath.FLOAT32, GemmPath.FLOAT64}
    assert plan_gemm(128, 128, 100, disabled=off).path is GemmPath.INT64
