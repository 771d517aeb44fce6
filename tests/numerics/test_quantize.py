import math

import numpy as np
import pytest
import torch
from bits import assert_bits_equal, tie_values
from hypothesis import given, settings
from hypothesis import strategies as st

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import (
    Divide,
    QuantizeCast,
    QuantStats,
    ScaleRule,
    compute_scale,
    dequantize,
    fake_cast,
    fake_quant,
    quantize,
)
from quantlab.numerics.quantize_tail import QuantizeTail, quantize_scalar_tail, tail_positions
from quantlab.numerics.rounding import Round

INTS = [DType.INT8, DType.INT16]


def test_nonfinite_inputs_saturate_and_are_counted():
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.0, 1e9, -1e9, 0.0])
    for dt in INTS:
        stats = QuantStats()
        q = quantize(x, 0.1, dt, stats=stats)
        assert q.tolist() == [dt.qmax, dt.qmin, 0, 10, dt.qmax, dt.qmin, 0]
        assert (stats.total, stats.nan, stats.inf, stats.saturated) == (7, 1, 2, 2)
        assert_bits_equal(q.to(torch.int64), torch.from_numpy(ref.quantize(x, 0.1, dt)))


def test_nonfinite_counts_accumulate():
    total = QuantStats()
    for _ in range(3):
        s = QuantStats()
        quantize(torch.tensor([float("nan"), 2.0]), 1.0, DType.INT8, stats=s)
        total.add(s)
    assert (total.total, total.nan) == (6, 3)


def test_fake_quant_nonfinite():
    y = fake_quant(torch.tensor([float("inf"), float("nan")]), 0.5, DType.INT8)
    assert y.tolist() == [127 * 0.5, 0.0]


EXPECTED_TIES = {
    Round.HALF_EVEN: lambda k: k if k % 2 == 0 else k + 1,
    Round.HALF_UP: lambda k: k + 1,
    Round.HALF_AWAY: lambda k: k + 1 if k >= 0 else k,
    Round.FLOOR: lambda k: k,
    Round.TRUNC: lambda k: k if k >= 0 else k + 1,
}


@pytest.mark.parametrize("mode", list(Round))
def test_quantize_ties_every_round(mode):
    x = tie_values().to(torch.float32)  # k + 0.5 with scale 1: exact ties
    q = quantize(x, 1.0, DType.INT8, rounding=mode)
    assert q.tolist() == [EXPECTED_TIES[mode](k) for k in range(-8, 9)]


@pytest.mark.parametrize("mode", list(Round))
@pytest.mark.parametrize("dt", INTS)
def test_quantize_matches_reference(mode, dt):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(500, generator=g) * 50
    s = 0.37 if dt is DType.INT8 else 0.0013
    q = quantize(x, s, dt, rounding=mode)
    assert_bits_equal(q.to(torch.int64), torch.from_numpy(ref.quantize(x, s, dt, mode)))


def test_per_channel_quantize_dequantize():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(4, 3, 2, 2, generator=g)
    amax = w.abs().amax(dim=(1, 2, 3))
    s = compute_scale(amax, DType.INT8)
    q = quantize(w, s, DType.INT8, axis=0)
    assert_bits_equal(q.to(torch.int64), torch.from_numpy(ref.quantize(w, s, DType.INT8, axis=0)))
    d = dequantize(q, s, axis=0)
    # oracle: the exact product code * s (exact in float64: 8 + 24 significant bits), rounded
    # once to float32
    exact = q.numpy().astype(np.float64) * s.numpy().astype(np.float64).reshape(-1, 1, 1, 1)
    assert_bits_equal(d, torch.from_numpy(exact.astype(np.float32)))
    assert float((d - w).abs().max()) <= float(s.max()) / 2 + 1e-7


@settings(max_examples=50, deadline=None)
@given(
    xs=st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=30),
    scale=st.floats(0.0001220703125, 8.0, width=32),
    mode=st.sampled_from(list(Round)),
)
def test_quantize_property(xs, scale, mode):
    x = torch.tensor(xs, dtype=torch.float32)
    q = quantize(x, scale, DType.INT16, rounding=mode)
    assert_bits_equal(
        q.to(torch.int64), torch.from_numpy(ref.quantize(x, scale, DType.INT16, mode))
    )


def test_compute_scale_rules():
    amax = torch.tensor(12.75)
    assert float(compute_scale(amax, DType.INT8)) == pytest.approx(12.75 / 127.5)
    assert float(compute_scale(amax, DType.INT8, ScaleRule.QMAX)) == pytest.approx(12.75 / 127)
    assert float(compute_scale(amax, DType.INT16)) == pytest.approx(12.75 / 32767.5)
    pot = float(compute_scale(amax, DType.INT8, ScaleRule.POT))
    assert pot == 0.125 and math.log2(pot).is_integer()
    assert float(compute_scale(0.0, DType.INT8)) == float(torch.finfo(torch.float32).eps)


def test_fake_cast_float16():
    x = torch.tensor([1.0 + 2**-11, 1e5, -1e5, float("inf"), 65519.0, 65520.0])
    y = fake_cast(x, DType.FLOAT16)
    assert y[0] == 1.0  # tie to even
    assert y[1] == 65504 and y[2] == -65504 and y[3] == float("inf")
    unsat = fake_cast(x, DType.FLOAT16, saturate=False)
    assert unsat[1] == float("inf") and unsat[4] == 65504 and unsat[5] == float("inf")


def test_quantize_errors():
    with pytest.raises(ValueError, match="integer dtype"):
        quantize(torch.zeros(2), 1.0, DType.FLOAT16)
    with pytest.raises(TypeError, match="float tensor"):
        quantize(torch.zeros(2, dtype=torch.int32), 1.0, DType.INT8)
    with pytest.raises(ValueError, match="one scale"):
        quantize(torch.zeros(2, 3), torch.ones(3), DType.INT8)
    with pytest.raises(ValueError, match="per-channel scale must have shape"):
        quantize(torch.zeros(2, 3), torch.ones(2), DType.INT8, axis=1)
    with pytest.raises(ValueError, match="needs a scale"):
        fake_quant(torch.zeros(2), None, DType.INT8)
    with pytest.raises(ValueError, match="finite"):
        compute_scale(float("inf"), DType.INT8)
    with pytest.raises(ValueError, match="allowed"):
        DType.parse("int4")


def test_dequantize_is_exact_product():
    q = torch.arange(-128, 128, dtype=torch.int8)
    s = np.float32(0.0173)
    assert_bits_equal(
        dequantize(q, float(s)), torch.from_numpy(np.arange(-128, 128).astype(np.float32) * s)
    )


@pytest.mark.parametrize("dt", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_dequantize_every_code_dtype_per_tensor_and_channel(dt):
    # the integer -> float32 cast happens inside the product: the same bits as casting first,
    # also for codes beyond 2**24 (the cast rounds them once, to nearest even)
    info = torch.iinfo(dt)
    big = [info.min, info.max, (1 << 24) + 1, (1 << 24) + 3] if info.bits > 16 else []
    vals = [v for v in [0, 1, -1, 127, -128, 255, 32767, -32768, *big] if info.min <= v <= info.max]
    q = torch.tensor(vals, dtype=dt).repeat(3, 1)
    s1 = np.float32(0.0173)
    want = q.numpy().astype(np.float32) * s1
    assert_bits_equal(dequantize(q, float(s1)), torch.from_numpy(want))
    sc = np.array([0.5, 3e-5, 7.0], dtype=np.float32)
    want = q.numpy().astype(np.float32) * sc.reshape(3, 1)
    assert_bits_equal(dequantize(q, torch.from_numpy(sc), axis=0), torch.from_numpy(want))


def test_fake_cast_float64_rounds_once():
    # 1 + 2**-11 + 2**-40: through float32 it would become the tie 1 + 2**-11 and round to 1
    x = torch.tensor([1 + 2.0**-11 + 2.0**-40, 70000.0], dtype=torch.float64)
    assert fake_cast(x, DType.FLOAT16).tolist() == [1 + 2.0**-10, 65504.0]


def test_int32_quantize_saturates_exactly():
    # 2147483647.0 is 2**31 in float32: it saturates to INT32_MAX, it does not wrap
    x = torch.tensor(
        [3e9, 2147483647.0, 2147483520.0, -3e9, -2147483648.0, 1e30, float("inf"), -float("inf")]
    )
    stats = QuantStats()
    q = quantize(x, 1.0, DType.INT32, stats=stats)
    assert q.dtype == torch.int32
    assert_bits_equal(q.to(torch.int64), torch.from_numpy(ref.quantize(x, 1.0, DType.INT32)))
    assert stats.saturated == 4 and stats.inf == 2  # 3e9, 2**31, -3e9, 1e30


def test_quantize_range_outside_the_dtype_or_empty_is_rejected():
    x = torch.tensor([1.0, 400.0, -400.0])
    with pytest.raises(ValueError, match=r"qmax=300.*\[-128, 127\]"):
        quantize(x, 1.0, DType.INT8, qmax=300)
    with pytest.raises(ValueError, match=r"qmin=-200.*\[-128, 127\]"):
        quantize(x, 1.0, DType.INT8, qmin=-200)
    with pytest.raises(ValueError, match=r"qmin=5.*qmax=3"):
        quantize(x, 1.0, DType.INT16, qmin=5, qmax=3)
    q = quantize(x, 1.0, DType.INT8, qmin=-127, qmax=100)  # a narrower range inside is fine
    assert q.tolist() == [1, 100, -127]


@pytest.mark.parametrize("mode", list(Round))
@pytest.mark.parametrize("dt", [DType.INT8, DType.UINT8, DType.INT16])
def test_quantize_in_place_form_equals_the_counted_form_and_reference(mode, dt):
    """The in-place per-tensor form (no stats) gives the bits of the counted form and of the
    reference on ties, saturation, +-inf, NaN and -0, with and without a zero point, under
    both divides and with a narrowed code range (with 0 outside it the general form runs)."""
    from quantlab.numerics.quantize import Divide

    g = torch.Generator().manual_seed(int(dt.bits) + len(mode.name))
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e30, -1e30])
    x = torch.cat([torch.randn(3000, generator=g) * 80, tie_values().float() * 0.25, special])
    zps = [0, dt.qmin + 3, dt.qmax - 5] if dt is not DType.INT16 else [0, -700]
    for zp in zps:
        for divide in Divide:
            for qmin, qmax in [(None, None), (dt.qmin + 2, dt.qmax - 9)]:
                kw = dict(rounding=mode, divide=divide, zero_point=zp, qmin=qmin, qmax=qmax)
                fast = quantize(x, 0.25, dt, **kw)
                counted = quantize(x, 0.25, dt, stats=QuantStats(), **kw)
                assert_bits_equal(fast, counted)
                if divide is Divide.BY_SCALE and qmin is None:
                    want = ref.quantize(x, 0.25, dt, mode, zero_point=zp)
                    assert_bits_equal(fast.to(torch.int64), torch.from_numpy(want))


@pytest.mark.parametrize("cast", list(QuantizeCast))
@pytest.mark.parametrize("dt", [DType.INT8, DType.UINT8, DType.INT16, DType.INT32])
def test_quantize_casts_in_place_counted_and_reference_agree(cast, dt):
    """Every ``QuantizeCast``: the in-place form, the counted form and the reference give the
    same codes on NaN, infinities, the int32 limits and beyond, ties and random values, with
    zero points, in both roundings the runtimes use."""
    g = torch.Generator().manual_seed(int(dt.bits) + len(cast.name))
    limits = [2.0**31, -(2.0**31), 2147483520.0, -2147483520.0, -2147483904.0, 3.4e38]
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, *limits])
    x = torch.cat([torch.randn(500, generator=g) * 300, tie_values().float(), special])
    zps = {DType.INT8: [0, -5, 120], DType.UINT8: [128, 3, 255], DType.INT16: [0, -700]}
    for zp in zps.get(dt, [0]):
        for mode in (Round.HALF_EVEN, Round.HALF_AWAY):
            fast = quantize(x, 1.0, dt, mode, zero_point=zp, cast=cast)
            counted = quantize(x, 1.0, dt, mode, zero_point=zp, cast=cast, stats=QuantStats())
            assert_bits_equal(fast, counted)
            want = ref.quantize(x, 1.0, dt, mode, zero_point=zp, cast=cast)
            assert_bits_equal(fast.to(torch.int64), torch.from_numpy(want))


def test_quantize_cast_codes_of_nan_and_overflow():
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), 2.0**31, 2147483520.0, 5.0])
    codes = {
        c: quantize(x, 1.0, DType.UINT8, zero_point=128, cast=c).tolist() for c in QuantizeCast
    }
    assert codes[QuantizeCast.NAN_TO_ZERO_POINT] == [128, 255, 0, 255, 255, 133]
    assert codes[QuantizeCast.NAN_TO_LOWEST] == [0, 255, 0, 255, 255, 133]
    assert codes[QuantizeCast.NAN_TO_HIGHEST] == [255, 255, 0, 255, 255, 133]
    # int32(r) is -2**31 for NaN, +inf and 2**31; 2147483520 + 128 wraps in int32
    assert codes[QuantizeCast.INT32_CAST] == [0, 0, 0, 0, 0, 133]
    # 16-bit codes: NAN_TO_HIGHEST is XNNPACK's 8-bit rule; LiteRT converts them by int32
    wide = quantize(x, 1.0, DType.INT16, cast=QuantizeCast.NAN_TO_HIGHEST)
    assert wide.tolist() == [-32768, -32768, -32768, -32768, 32767, 5]


@pytest.mark.parametrize(
    "shape", [(), (3,), (13,), (2, 7), (2, 3, 5), (1, 3, 5, 6), (2, 3, 2, 5), (1, 2, 3, 2, 5)]
)
def test_quantize_scalar_tail_agrees_with_reference(shape):
    """``QuantizeTail.SCALAR_FLOAT64_HALF_AWAY``: the fast form (the product rule, then the last
    n mod 8 elements recomputed in float64) gives the reference's codes for every rank (4-d:
    the tail in NHWC order), with ties, NaN, infinities and zero points; 8-bit codes keep one
    rule."""
    g = torch.Generator().manual_seed(len(shape) + math.prod(shape))
    n = math.prod(shape)
    pool = torch.cat(
        [tie_values().float() * 0.75, torch.tensor([float("nan"), float("inf"), -3e9])]
    )
    for zp in (0, -700):
        x = pool[torch.randint(0, pool.numel(), (n,), generator=g)].reshape(shape)
        for scale in (0.75, 0.0371):
            body = quantize(
                x, scale, DType.INT16, zero_point=zp, cast=QuantizeCast.INT32_CAST,
                divide=Divide.BY_RECIPROCAL,
            )  # fmt: skip
            fast = quantize_scalar_tail(body.clone(), x, scale, DType.INT16, zp)
            want = ref.quantize(
                x, scale, DType.INT16, zero_point=zp, cast=QuantizeCast.INT32_CAST,
                divide=Divide.BY_RECIPROCAL, tail=QuantizeTail.SCALAR_FLOAT64_HALF_AWAY,
            )  # fmt: skip
            assert_bits_equal(fast.to(torch.int64), torch.from_numpy(want))
            changed = (fast != body).flatten().nonzero().flatten().tolist()
            nhwc = len(shape) == 4
            tail = set(map(tuple, tail_positions(shape, channels_last=nhwc)))
            assert all(tuple(np.unravel_index(i, shape)) in tail for i in changed)
    codes8 = quantize(x.clamp(-100, 100), 1.0, DType.INT8)
    assert_bits_equal(quantize_scalar_tail(codes8.clone(), x, 1.0, DType.INT8), codes8)


def test_tail_positions_in_memory_order():
    assert tail_positions((11,), channels_last=False) == [(8,), (9,), (10,)]
    assert tail_positions((2, 5), channels_last=False) == [(1, 3), (1, 4)]
    # N, C, H, W = 1, 3, 2, 3 held as NHWC: the last two are (h=1, w=2, c=1) and (c=2)
    assert tail_positions((1, 3, 2, 3), channels_last=True) == [(0, 1, 1, 2), (0, 2, 1, 2)]
    assert tail_positions((1, 3, 2, 3), channels_last=False) == [(0, 2, 1, 1), (0, 2, 1, 2)]
    assert tail_positions((16,), channels_last=False) == []
