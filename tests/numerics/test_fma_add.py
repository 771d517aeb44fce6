"""ONNX Runtime's QLinearAdd kernel (numerics.fma_add) equals its Fraction reference bit for bit,
and the fused multiply-add equals an exactly rounded a * r + c on random and midpoint cases."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from quantlab.numerics.dtypes import DType
from quantlab.numerics.fma_add import fma_float32, qlinear_add
from quantlab.numerics.reference.fma_add import qlinear_add as ref_qlinear_add
from quantlab.numerics.reference.fma_add import round_to_float32
from tests.bits import assert_bits_equal


def test_fma_float32_rounds_once():
    rng = np.random.default_rng(3)
    a = rng.integers(-300, 300, 4000).astype(np.float32)
    r = rng.uniform(0.01, 4.0, 4000).astype(np.float32)
    c = (rng.uniform(-500, 500, 4000) * 10.0 ** rng.integers(-12, 2, 4000)).astype(np.float32)
    # midpoints: c chosen so that a * r + c is a float32 midpoint plus a tiny remainder
    half = (a[:1000] * r[:1000]).astype(np.float64)
    c[:1000] = (np.float32(1024.0) + np.float32(2.0**-14)) - half.astype(np.float32)
    got = fma_float32(torch.from_numpy(a), torch.from_numpy(r), torch.from_numpy(c))
    want = [
        round_to_float32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
        for x, y, z in zip(a, r, c)
    ]
    assert_bits_equal(got, torch.tensor(want, dtype=torch.float32))


def test_fma_float32_breaks_a_float64_midpoint_by_the_remainder():
    # 3 * (1 + 2**-23) = 3 + 1.5 * 2**-22 is halfway between the float32 values 3 + 2**-22 and
    # 3 + 2**-21; adding -+2**-80 leaves float64 on the midpoint (ties to even: 3 + 2**-21),
    # while the exact sum lies below / above it
    a = torch.tensor([3.0, 3.0, 3.0], dtype=torch.float32)
    r = torch.full((3,), 1.0 + 2.0**-23, dtype=torch.float32)
    c = torch.tensor([-(2.0**-80), 2.0**-80, 0.0], dtype=torch.float32)
    got = fma_float32(a, r, c)
    assert got.tolist() == [3.0 + 2.0**-22, 3.0 + 2.0**-21, 3.0 + 2.0**-21]
    for x, y, z, g in zip(a, r, c, got):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        assert float(g) == round_to_float32(exact)


@pytest.mark.parametrize("zero_point", [0, 128])
def test_qlinear_add_equals_reference(zero_point):
    rng = np.random.default_rng(11 + zero_point)
    for case in range(40):
        x = torch.from_numpy(rng.integers(-128, 128, (3, 50)).astype(np.int8))
        y = torch.from_numpy(rng.integers(-128, 128, (3, 50)).astype(np.int8))
        sx, sy = np.float32(rng.uniform(1e-3, 0.1)), np.float32(rng.uniform(1e-3, 0.1))
        if case % 5 == 0:  # power-of-two scales: exact ties
            sx, sy = np.float32(2.0 ** -int(rng.integers(3, 8))), np.float32(2.0**-6)
        so = np.float32((sx + sy) * rng.uniform(0.3, 1.5))
        got = qlinear_add(x, float(sx), y, float(sy), float(so), DType.INT8, zero_point)
        want = ref_qlinear_add(x, sx, y, sy, so, DType.INT8, zero_point)
        assert_bits_equal(got, torch.from_numpy(want).to(torch.int8))


def test_qlinear_add_rejects_float_codes_and_bad_scales():
    x = torch.zeros(3, dtype=torch.int8)
    with pytest.raises(TypeError, match="integer codes"):
        qlinear_add(x.float(), 0.1, x, 0.1, 0.1, DType.INT8)
    with pytest.raises(ValueError, match="out_scale"):
        qlinear_add(x, 0.1, x, 0.1, 0.0, DType.INT8)


def test_qlinear_add_with_operand_zero_points_equals_reference():
    rng = np.random.default_rng(23)
    for case in range(40):
        out = DType.UINT8 if case % 2 else DType.INT8
        x = torch.from_numpy(rng.integers(out.qmin, out.qmax + 1, (2, 40)))
        y = torch.from_numpy(rng.integers(out.qmin, out.qmax + 1, (2, 40)))
        zps = tuple(int(v) for v in rng.integers(out.qmin, out.qmax + 1, 3))
        sx, sy = np.float32(rng.uniform(1e-3, 0.1)), np.float32(rng.uniform(1e-3, 0.1))
        if case % 5 == 0:  # power-of-two scales: exact ties
            sx, sy = np.float32(2.0 ** -int(rng.integers(3, 8))), np.float32(2.0**-6)
        so = np.float32((sx + sy) * rng.uniform(0.3, 1.5))
        got = qlinear_add(x, float(sx), y, float(sy), float(so), out, 0, zps)
        want = ref_qlinear_add(x, sx, y, sy, so, out, 0, zps)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


def _general_path(monkeypatch):
    import quantlab.numerics.fma_add as fma_add

    monkeypatch.setattr(fma_add, "float64_exact", lambda *args: False)


def _no_pair_table(monkeypatch):
    """8-bit codes run the formula on each pair too, not the cached table of every pair."""
    from quantlab.numerics import pair_table

    monkeypatch.setattr(pair_table, "EIGHT_BIT", ())


@pytest.mark.parametrize("zero_point", [0, 128])
def test_qlinear_add_float64_form_equals_the_fma_form(zero_point, monkeypatch):
    """The float64 fast form gives the bits of the two-fma form on many random scales, on
    power-of-two and equal scales (exact ties) and on scales whose products land on float32
    midpoints (r = 1 + 2**-23 and 3 * 2**-k patterns), int8 and int16 codes."""
    rng = np.random.default_rng(5 + zero_point)
    cases = []
    for case in range(60):
        dt = DType.INT16 if case % 3 == 2 else DType.INT8
        x = torch.from_numpy(rng.integers(dt.qmin, dt.qmax + 1, (4, 300))).to(dt.torch_dtype)
        y = torch.from_numpy(rng.integers(dt.qmin, dt.qmax + 1, (4, 300))).to(dt.torch_dtype)
        sx, sy = (
            float(np.float32(rng.uniform(1e-4, 0.2))),
            float(np.float32(rng.uniform(1e-4, 0.2))),
        )
        so = float(np.float32((sx + sy) * rng.uniform(0.3, 1.5)))
        if case % 6 == 1:
            sx, sy, so = 2.0**-5, 2.0**-7, 2.0**-6
        if case % 6 == 3:
            sx = sy = so = float(np.float32(rng.uniform(1e-3, 0.1)))
        if case % 6 == 5:
            so = 2.0**-8
            sx, sy = so * (1 + 2.0**-23), so * 3 * 2.0 ** -int(rng.integers(1, 6))
        zps = tuple(int(v) for v in rng.integers(-20, 20, 3)) if case % 2 else (0, 0, 0)
        cases.append((x, sx, y, sy, so, dt, zps))
    import quantlab.numerics.fma_add as fma_add

    _no_pair_table(monkeypatch)
    taken = []
    real = fma_add.float64_exact
    monkeypatch.setattr(fma_add, "float64_exact", lambda *a: taken.append(real(*a)) or taken[-1])
    fast = [
        qlinear_add(x, sx, y, sy, so, dt, zero_point, zps) for x, sx, y, sy, so, dt, zps in cases
    ]
    assert all(taken) and len(taken) == len(cases)  # every case ran the float64 form
    _general_path(monkeypatch)
    for got, (x, sx, y, sy, so, dt, zps) in zip(fast, cases):
        assert_bits_equal(got, qlinear_add(x, sx, y, sy, so, dt, zero_point, zps))


def test_float64_exact_decides_from_the_scalar_bits():
    from quantlab.numerics.fma_add import float64_exact

    assert float64_exact(0.7, 0.3, 0.0, 128, 128)
    assert float64_exact(0.7, 0.3, 131.5, 256, 256)
    # a ratio of 2**40 between the two terms' lowest bits leaves too few float64 bits
    assert not float64_exact(2.0**30, 2.0**-12 * 1.1, 0.0, 1 << 15, 1 << 15)
    assert not float64_exact(1.0, 1.0, 2.0**-60 * 1.3, 255, 255)


def test_qlinear_add_with_extreme_scale_ratios_takes_the_fma_form_and_equals_reference():
    rng = np.random.default_rng(41)
    x = torch.from_numpy(rng.integers(-128, 128, (2, 30)).astype(np.int8))
    y = torch.from_numpy(rng.integers(-128, 128, (2, 30)).astype(np.int8))
    sx, sy, so = np.float32(3.0e3), np.float32(1.1e-9), np.float32(0.7)
    from quantlab.numerics.fma_add import float64_exact

    assert not float64_exact(float(sx / so), float(sy / so), 0.0, 128, 128)
    got = qlinear_add(x, float(sx), y, float(sy), float(so), DType.INT8)
    assert_bits_equal(
        got, torch.from_numpy(ref_qlinear_add(x, sx, y, sy, so, DType.INT8)).to(torch.int8)
    )


def test_an_all_zero_operand_puts_no_bit_in_the_proof(monkeypatch):
    """An operand whose codes are all 0 (a padding mask's zeros at a tiny scale) leaves its
    ratio out of the lowest-bit bound once its codes are measured (the int8 dtype bound does
    not prove it): the float64 form runs, with the reference's bits."""
    import quantlab.numerics.fma_add as fma_add
    from quantlab.numerics.fma_add import float64_exact

    _no_pair_table(monkeypatch)
    general = []
    real = fma_add.fma_float32
    monkeypatch.setattr(fma_add, "fma_float32", lambda *a: general.append(1) or real(*a))

    assert float64_exact(1.0, 2.1796731175527384e-07, -3.0517578125e-05, 231, 0)
    assert not float64_exact(1.0, 2.1796731175527384e-07, -3.0517578125e-05, 231, 1)
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.integers(-128, 128, (4, 64)).astype(np.int8))
    y = torch.zeros(1, 64, dtype=torch.int8)
    sx, sy, so = np.float32(0.05), np.float32(1.1e-8), np.float32(0.05)
    for zp in (0, 128):  # held as uint8 (128), the zeros are 128: the term is not 0
        got = qlinear_add(x, float(sx), y, float(sy), float(so), DType.INT8, zp)
        want = ref_qlinear_add(x, sx, y, sy, so, DType.INT8, zp)
        assert_bits_equal(got, torch.from_numpy(want).to(torch.int8))
        assert bool(general) == bool(zp)


def test_8bit_codes_take_the_table_of_every_pair_with_the_formulas_bits(monkeypatch):
    """For int8 / uint8 codes the result is read from a table of all 65,536 code pairs built by
    the formula once; it equals the formula run on the pairs themselves (scales with exact
    ties, midpoint-producing and extreme ratios, zero points, broadcasting either way,
    non-contiguous input) and the scalar reference."""
    import quantlab.numerics.fma_add as fma_add

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    rng = np.random.default_rng(31)
    cases = [
        (0.05, 0.02, 0.06, 0, (0, 0, 0), torch.int8, torch.int8, DType.INT8),
        (2.0**-5, 2.0**-7, 2.0**-6, 128, (0, 0, 0), torch.int8, torch.int8, DType.INT8),
        (
            2.0**-8 * (1 + 2.0**-23),
            3 * 2.0**-11,
            2.0**-8,
            0,
            (3, -5, 1),
            torch.int8,
            torch.int8,
            DType.INT8,
        ),
        (0.05, 1.1e-8, 0.05, 128, (0, 0, 0), torch.int8, torch.int8, DType.INT8),
        (0.031, 0.017, 0.04, 0, (128, 120, 131), torch.uint8, torch.uint8, DType.UINT8),
        (0.031, 0.017, 0.04, 0, (-3, 120, 7), torch.int8, torch.uint8, DType.UINT8),
    ]
    for sx, sy, so, zp, zps, xd, yd, out in cases:
        x = codes.view(xd).repeat_interleave(256).reshape(256, 256)
        y = codes.view(yd).repeat(256).reshape(256, 256)
        got = qlinear_add(x, sx, y, sy, so, out, zp, zps)
        pieces = (x.t(), y.t()), (x[:, :1], y), (x, y[:1]), (x[:, ::3], y[:, ::3])
        with monkeypatch.context() as m:
            _no_pair_table(m)
            want = qlinear_add(x, sx, y, sy, so, out, zp, zps)
            per_pair = [qlinear_add(a, sx, b, sy, so, out, zp, zps) for a, b in pieces]
        assert_bits_equal(got, want)
        for (a, b), w in zip(pieces, per_pair):
            assert_bits_equal(qlinear_add(a, sx, b, sy, so, out, zp, zps), w)
        pick = rng.integers(0, 256, (2, 300))
        ref = ref_qlinear_add(
            x[pick[0], pick[1]],
            np.float32(sx),
            y[pick[0], pick[1]],
            np.float32(sy),
            np.float32(so),
            out,
            zp,
            zps,
        )
        assert_bits_equal(got[pick[0], pick[1]].to(torch.int64), torch.from_numpy(ref))
    built = []
    real = fma_add._add_codes
    monkeypatch.setattr(fma_add, "_add_codes", lambda *a: built.append(1) or real(*a))
    assert_bits_equal(qlinear_add(x[:3], sx, y[:3], sy, so, out, zp, zps), got[:3])
    assert not built  # the table of these scalars was built once, by the first call
