import zlib

import numpy as np
import pytest
import torch
from bits import assert_bits_equal, edge_values
from hypothesis import given, settings
from hypothesis import strategies as st

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import QuantStats
from quantlab.numerics.requant import (
    Requant,
    make_requant,
    quantize_multiplier,
    requant_scale,
    requantize,
    srdhm,
)
from quantlab.numerics.rounding import Round
from quantlab.numerics.scaled_add import add_float_rescale, add_inter_scale, inter_scale

INT_SCHEMES = [Requant.MUL_SHIFT, Requant.MUL_SHIFT_DOUBLE, Requant.MUL_SHIFT_INT64]


def _accs(seed: int, n: int = 300) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rand = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64)
    small = torch.randint(-(2**20), 2**20, (n,), generator=g, dtype=torch.int64)
    return torch.cat([edge_values(DType.INT32), rand, small])


MULTIPLIERS = [1.0, 0.5, 0.25, 2.0**-20, 0.0123, 0.3333333, 1e-6, 0.9999999, 3.7, 2.0**-31, 0.0]


@pytest.mark.parametrize("m", MULTIPLIERS + [1 - 2.0**-40, 2.0**-33, 12345.678])
@pytest.mark.parametrize("bits", [31, 15])
def test_quantize_multiplier_matches_reference(m, bits):
    q, e = quantize_multiplier(torch.tensor(m, dtype=torch.float64), bits)
    assert (int(q), int(e)) == ref.quantize_multiplier(m, bits)
    if q != 0:
        assert (1 << (bits - 1)) <= int(q) < (1 << bits)


def test_quantize_multiplier_rounds_up_to_next_power():
    q, e = quantize_multiplier(torch.tensor(1 - 2.0**-40, dtype=torch.float64))
    assert (int(q), int(e)) == (1 << 30, 1)  # 2**31 becomes 2**30 with shift + 1


@pytest.mark.parametrize("scheme", list(Requant))
@pytest.mark.parametrize("mode", list(Round))
@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
def test_requantize_matches_reference(scheme, mode, out):
    acc = _accs(zlib.crc32(f"{scheme.name}{mode.name}{out.name}".encode()) % 1000, n=60)
    for m in MULTIPLIERS[:8]:
        params = make_requant(m, scheme)
        got = requantize(acc, params, out, mode)
        exp = ref.requantize(
            acc, m if scheme is not Requant.FLOAT_RESCALE else np.float32(m), scheme, out, mode
        )
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(exp), inputs={"acc": acc})
        assert got.dtype == out.torch_dtype


@pytest.mark.parametrize("scheme", list(Requant))
def test_requantize_per_channel_matches_reference(scheme):
    g = torch.Generator().manual_seed(7)
    acc = torch.randint(-(2**24), 2**24, (5, 4, 3), generator=g)
    real = torch.rand(4, generator=g, dtype=torch.float64) * 1e-3 + 1e-5
    if scheme is Requant.FLOAT_RESCALE:
        real = real.float()
    got = requantize(acc, make_requant(real, scheme), DType.INT16, Round.HALF_UP, axis=1)
    exp = ref.requantize(acc, real, scheme, DType.INT16, Round.HALF_UP, axis=1)
    assert_bits_equal(got.to(torch.int64), torch.from_numpy(exp))


@settings(max_examples=60, deadline=None)
@given(
    acc=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=20),
    m=st.floats(1e-9, 4.0),
    scheme=st.sampled_from(list(Requant)),
    mode=st.sampled_from(list(Round)),
)
def test_requantize_property(acc, m, scheme, mode):
    a = torch.tensor(acc, dtype=torch.int64)
    real = np.float32(m) if scheme is Requant.FLOAT_RESCALE else m
    got = requantize(a, make_requant(float(real), scheme), DType.INT16, mode)
    exp = ref.requantize(a, real, scheme, DType.INT16, mode)
    assert_bits_equal(got.to(torch.int64), torch.from_numpy(exp))


def test_mul_shift_15bit_matches_reference():
    acc = _accs(3, 100)
    for m in MULTIPLIERS[:8]:
        got = requantize(acc, make_requant(m, Requant.MUL_SHIFT, 15), DType.INT8, Round.HALF_EVEN)
        exp = ref.requantize(acc, m, Requant.MUL_SHIFT, DType.INT8, Round.HALF_EVEN, mult_bits=15)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(exp))


# x / 4 for x = -8..8 by each rule (bit-exact-emulation s.1.4 table)
X = list(range(-8, 9))
QUARTER = {
    Round.HALF_UP: [-2, -2, -1, -1, -1, -1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2],
    Round.HALF_AWAY: [-2, -2, -2, -1, -1, -1, -1, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2],
    Round.HALF_EVEN: [-2, -2, -2, -1, -1, -1, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2],
    Round.TRUNC: [-2, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2],
    Round.FLOOR: [-2, -2, -2, -2, -1, -1, -1, -1, 0, 0, 0, 0, 1, 1, 1, 1, 2],
}
TFLITE_DOUBLE = [-2, -2, -2, -1, -1, -1, -1, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]


@pytest.mark.parametrize("mode", list(Round))
@pytest.mark.parametrize("scheme", [Requant.MUL_SHIFT, Requant.FLOAT_RESCALE])
def test_ties_for_every_round(mode, scheme):
    got = requantize(torch.tensor(X), make_requant(0.25, scheme), DType.INT8, mode)
    assert got.tolist() == QUARTER[mode]


def test_tflite_double_rounding_table():
    # q = 2**30 (x 0.5) and shift -1: x / 4 rounded twice (half up, then half away)
    p = make_requant(0.25, Requant.MUL_SHIFT_DOUBLE)
    assert (int(p.multiplier), int(p.shift)) == (1 << 30, -1)
    got = requantize(torch.tensor(X), p, DType.INT8, Round.HALF_AWAY)
    assert got.tolist() == TFLITE_DOUBLE


def test_double_rounding_differs_from_single():
    # 5 / 4 = 1.25. Double: SRDHM 5 * 0.5 = 2.5 -> 3, then 3 / 2 = 1.5 -> 2. Single: 1.
    x = torch.tensor([5])
    assert (
        int(
            requantize(x, make_requant(0.25, Requant.MUL_SHIFT_DOUBLE), DType.INT8, Round.HALF_AWAY)
        )
        == 2
    )
    assert int(requantize(x, make_requant(0.25, Requant.MUL_SHIFT), DType.INT8, Round.HALF_UP)) == 1


def test_srdhm_edges():
    a = torch.tensor([7, -7, -(2**31), -(2**31), 2**31 - 1])
    b = torch.tensor([2**30, 2**30, -(2**31), 2**31 - 1, 2**31 - 1])
    exp = [ref.srdhm(int(x), int(y)) for x, y in zip(a, b)]
    assert srdhm(a, b).tolist() == exp
    assert exp[:3] == [4, -3, 2**31 - 1]


def test_int64_scheme_tflite_reduced_multiplier():
    p = make_requant(0.999999, Requant.MUL_SHIFT_INT64)  # q >= 0x7FFF0000 -> 0x7FFF
    assert int(p.multiplier) >= 0x7FFF0000
    acc = torch.tensor([2**40, -(2**40) + 3, 12345, -1])
    got = requantize(acc, p, DType.INT16, Round.HALF_UP)
    exp = ref.requantize(acc, 0.999999, Requant.MUL_SHIFT_INT64, DType.INT16, Round.HALF_UP)
    assert_bits_equal(got.to(torch.int64), torch.from_numpy(exp))


def test_requantize_counts_saturation():
    stats = QuantStats()
    requantize(
        torch.tensor([0, 1000, -1000, 5]),
        make_requant(1.0, Requant.MUL_SHIFT),
        DType.INT8,
        Round.HALF_UP,
        stats=stats,
    )
    assert (stats.total, stats.saturated) == (4, 2)


def test_requant_scale_float_chain_and_double():
    sx, sw, so = 0.1, torch.tensor([0.3, 0.7]), 0.7
    f = requant_scale(sx, sw, so, Requant.FLOAT_RESCALE)
    assert f.dtype == torch.float32
    exp = (np.float32(sx) * sw.numpy()) / np.float32(so)
    assert np.array_equal(f.numpy(), exp.astype(np.float32))
    d = requant_scale(sx, sw, so, Requant.MUL_SHIFT)
    assert d.dtype == torch.float64


def test_requant_errors():
    with pytest.raises(ValueError, match="mult_bits"):
        make_requant(0.5, Requant.MUL_SHIFT, mult_bits=16)
    with pytest.raises(ValueError, match="31-bit"):
        make_requant(0.5, Requant.MUL_SHIFT_DOUBLE, mult_bits=15)
    with pytest.raises(ValueError, match=">= 0"):
        make_requant(-0.5, Requant.MUL_SHIFT)
    p = make_requant(torch.tensor([0.1, 0.2]), Requant.MUL_SHIFT)
    with pytest.raises(ValueError, match="axis"):
        requantize(torch.zeros(3, 2, dtype=torch.int64), p, DType.INT8, Round.HALF_UP)
    with pytest.raises(ValueError, match="channels"):
        requantize(torch.zeros(3, 3, dtype=torch.int64), p, DType.INT8, Round.HALF_UP, axis=1)
    with pytest.raises(TypeError, match="integer accumulator"):
        requantize(torch.zeros(3), p, DType.INT8, Round.HALF_UP)
    with pytest.raises(ValueError, match="INT8 or INT16"):
        requantize(
            torch.zeros(3, dtype=torch.int64),
            make_requant(0.1, Requant.MUL_SHIFT),
            DType.INT32,
            Round.HALF_UP,
        )
    with pytest.raises(ValueError, match="accumulate"):
        requantize(
            torch.tensor([2**33]), make_requant(0.1, Requant.MUL_SHIFT), DType.INT8, Round.HALF_UP
        )


def test_inter_scale_rule():
    s = inter_scale(0.02, 0.005, 14)
    assert s.mx == 2**14 and s.my == 4096
    assert float(s.inter) == float(np.float32(0.02) / np.float32(2**14))


@pytest.mark.parametrize("scheme", list(Requant))
@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
def test_add_inter_scale_matches_reference(scheme, out):
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-32768, 32768, (40,), generator=g).to(torch.int16)
    y = torch.randint(-128, 128, (40,), generator=g).to(torch.int8)
    args = (0.0123, 0.00377, 0.02)
    got = add_inter_scale(x, args[0], y, args[1], args[2], out, scheme, Round.HALF_UP)
    exp = ref.add_inter_scale(x, args[0], y, args[1], args[2], out, scheme, Round.HALF_UP)
    assert_bits_equal(got.to(torch.int64), torch.from_numpy(exp))


def test_add_float_rescale_matches_reference():
    g = torch.Generator().manual_seed(12)
    x = torch.randint(-128, 128, (200,), generator=g).to(torch.int8)
    y = torch.randint(-128, 128, (200,), generator=g).to(torch.int8)
    got = add_float_rescale(x, 0.031, y, 0.017, 0.05, DType.INT8)
    exp = ref.add_float_rescale(x, 0.031, y, 0.017, 0.05, DType.INT8)
    assert_bits_equal(got.to(torch.int64), torch.from_numpy(exp))


def test_add_rejects_float_inputs():
    with pytest.raises(TypeError, match="integer codes"):
        add_float_rescale(
            torch.zeros(2), 0.1, torch.zeros(2, dtype=torch.int8), 0.1, 0.1, DType.INT8
        )


def test_quantize_multiplier_clamps_shifts_above_30_like_tflite():
    m = torch.tensor([2.0**30, 5e9, 1e12, 1e9], dtype=torch.float64)
    q, e = quantize_multiplier(m)
    assert e.tolist() == [30, 30, 30, 30]
    assert q.tolist()[:3] == [(1 << 31) - 1] * 3
    assert [ref.quantize_multiplier(float(v)) for v in m] == list(zip(q.tolist(), e.tolist()))


@pytest.mark.parametrize("scheme", list(Requant))
@pytest.mark.parametrize("m", [1e9, 2e9, 5e9, 1e12])
def test_large_multipliers_saturate_and_never_wrap(scheme, m):
    acc = torch.tensor([3, 1, -3, 0, -1, 40000, -(1 << 31), (1 << 31) - 1])
    mode = Round.HALF_AWAY if scheme is Requant.MUL_SHIFT_DOUBLE else Round.HALF_UP
    got = requantize(acc, make_requant(m, scheme), DType.INT16, mode)
    want = [32767, 32767, -32768, 0, -32768, 32767, -32768, 32767]
    assert got.tolist() == want
    assert ref.requantize(acc, m, scheme, DType.INT16, mode).tolist() == want


def test_8bit_j6_adds_take_the_table_of_every_pair_with_the_formulas_bits(monkeypatch):
    """int8 / uint8 codes read a table of all 65,536 code pairs built once by the J6 add's
    formula; it equals the formula run on the pairs (FLOAT_RESCALE and MUL_SHIFT, power-of-two
    and equal scales, zero points, broadcasting either way, strided input) and the scalar
    reference on a sample."""
    import quantlab.numerics.scaled_add as scaled_add
    from quantlab.numerics import pair_table
    from quantlab.numerics.pair_table import every_pair

    rng = np.random.default_rng(41)
    cases = [
        (0.031, 0.017, 0.05, Requant.MUL_SHIFT, Round.HALF_UP, (0, 0, 0), torch.int8, DType.INT8),
        (
            2.0**-5,
            2.0**-7,
            2.0**-6,
            Requant.MUL_SHIFT,
            Round.HALF_UP,
            (0, 0, 0),
            torch.int8,
            DType.INT8,
        ),
        (
            0.02,
            0.02,
            0.02,
            Requant.FLOAT_RESCALE,
            Round.HALF_EVEN,
            (0, 0, 0),
            torch.int8,
            DType.INT8,
        ),
        (
            0.031,
            0.0041,
            0.013,
            Requant.MUL_SHIFT,
            Round.HALF_UP,
            (0, 0, 0),
            torch.int8,
            DType.INT16,
        ),
        (
            0.031,
            0.017,
            0.05,
            Requant.FLOAT_RESCALE,
            Round.HALF_EVEN,
            (131, 120, 128),
            torch.uint8,
            DType.UINT8,
        ),
    ]
    for sx, sy, so, scheme, rnd, zps, dt, out in cases:
        a, b = every_pair(dt, dt)
        x, y = a.reshape(256, 256), b.reshape(256, 256)
        got = scaled_add.add_inter_scale(x, sx, y, sy, so, out, scheme, rnd, zero_points=zps)
        pieces = (x.t(), y.t()), (x[:, :1], y), (x, y[:1]), (x[:, ::3], y[:, ::3])
        with monkeypatch.context() as m:
            m.setattr(pair_table, "EIGHT_BIT", ())
            want = scaled_add.add_inter_scale(x, sx, y, sy, so, out, scheme, rnd, zero_points=zps)
            per_pair = [
                scaled_add.add_inter_scale(p, sx, q, sy, so, out, scheme, rnd, zero_points=zps)
                for p, q in pieces
            ]
        assert_bits_equal(got, want)
        for (p, q), w in zip(pieces, per_pair):
            got_piece = scaled_add.add_inter_scale(
                p, sx, q, sy, so, out, scheme, rnd, zero_points=zps
            )
            assert_bits_equal(got_piece, w)
        i, j = rng.integers(0, 256, (2, 300))
        exp = ref.add_inter_scale(x[i, j], sx, y[i, j], sy, so, out, scheme, rnd, zero_points=zps)
        assert_bits_equal(got[i, j].to(torch.int64), torch.from_numpy(exp))
    built = []
    real = scaled_add._add_inter_scale_codes
    monkeypatch.setattr(
        scaled_add, "_add_inter_scale_codes", lambda *a: built.append(1) or real(*a)
    )
    again = scaled_add.add_inter_scale(x[:2], sx, y[:2], sy, so, out, scheme, rnd, zero_points=zps)
    assert_bits_equal(again, got[:2])
    assert not built  # built once, by the first call
