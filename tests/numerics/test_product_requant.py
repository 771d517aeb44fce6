"""The float forms of a product's requantization (numerics.product_requant) give the codes of
``requantize`` on the int64 product, and of the scalar reference, and exist only when proven."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import FLOAT32_EXACT, DType
from quantlab.numerics.product_requant import product_form, requantize_product
from quantlab.numerics.requant import Requant, make_requant, requantize
from quantlab.numerics.rounding import Round

I8, U8, I16 = DType.INT8, DType.UINT8, DType.INT16

# (scheme, rounding): the contracts a product is requantized under
CONTRACTS = [
    (Requant.FLOAT_RESCALE, Round.HALF_EVEN),  # ONNX Runtime QLinearMul
    (Requant.FLOAT_RESCALE, Round.HALF_AWAY),
    (Requant.FLOAT64_RESCALE, Round.HALF_AWAY),
    (Requant.MUL_SHIFT, Round.HALF_UP),  # J6
]
# multipliers that put products on exact ties (0.5, 0.25, 1.5), others, and saturating ones
MULTIPLIERS = [0.5, 0.25, 1.5, 2.0**-7, 1 / 3, 0.0123456, 3.7e-5, 0.999999, 7.25, 300.0]


def _codes(dt: DType, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(dt.qmin, dt.qmax + 1, shape, generator=g, dtype=torch.int64)
    c.view(-1)[:4] = torch.tensor([dt.qmin, dt.qmax, 0, dt.qmin + 1])
    return c.to(dt.torch_dtype)


def _expected(x, zx, y, zy, params, rounding, out, zo):
    acc = (x.to(torch.int64) - zx) * (torch.as_tensor(y).to(torch.int64) - zy)
    return requantize(acc, params, out, rounding, zero_point=zo)


def _bound(dx: DType, zx: int, dy: DType, zy: int) -> int:
    return max(abs(dx.qmin - zx), abs(dx.qmax - zx)) * max(abs(dy.qmin - zy), abs(dy.qmax - zy))


@pytest.mark.parametrize("scheme,rounding", CONTRACTS)
@pytest.mark.parametrize("m", MULTIPLIERS)
@pytest.mark.parametrize(
    "dx,zx,dy,zy,out,zo",
    [
        (U8, 131, U8, 7, U8, 128),
        (U8, 0, U8, 255, U8, 0),
        (I8, 0, I8, 0, I8, 0),
        (I8, -3, I8, 5, I8, 9),
        (I8, 0, I8, 0, I16, 0),
    ],
)
def test_the_float_form_equals_requantize_of_the_int64_product(
    scheme, rounding, m, dx, zx, dy, zy, out, zo
):
    params = make_requant(m, scheme)
    form = product_form(params, rounding, _bound(dx, zx, dy, zy))
    assert form is not None  # 8-bit codes: every bound is met
    x = _codes(dx, (6, 1, 50), 1)
    for y in (_codes(dy, (6, 7, 50), 2), _codes(dy, (50,), 3)):  # broadcast either way
        got = requantize_product(x, zx, y, zy, form, out, zo)
        assert got.dtype == out.torch_dtype
        assert_bits_equal(got, _expected(x, zx, y, zy, params, rounding, out, zo))
        got = requantize_product(y, zy, x, zx, form, out, zo)  # the larger operand second
        assert_bits_equal(got, _expected(y, zy, x, zx, params, rounding, out, zo))


@pytest.mark.parametrize("scheme,rounding", CONTRACTS)
def test_a_constants_code_and_the_scalar_reference(scheme, rounding):
    x = _codes(U8, (4000,), 4)
    for code in (32767, -32767):  # constant_codes: +-CONSTANT_DTYPE.qmax
        for m in (2.0**-15, 1.0000001e-4, 3.0517578125e-05 * 0.75):
            params = make_requant(m, scheme)
            form = product_form(params, rounding, 255 * 32767)
            if form is None:  # only where 255 * 32767 * q + 2**(n-1) passes 2**53
                q, n = int(params.multiplier), params.mult_bits - int(params.shift)
                assert scheme is Requant.MUL_SHIFT and 255 * 32767 * q + (1 << (n - 1)) > 2**53
                continue
            for y in (code, torch.tensor(code)):
                got = requantize_product(x, 100, y, 0, form, U8, 100)
                assert_bits_equal(got, _expected(x, 100, y, 0, params, rounding, U8, 100))
            acc = (x.to(torch.int64) - 100) * code
            want = ref.requantize(acc[:500], m, scheme, U8, rounding, zero_point=100)
            assert_bits_equal(got[:500], torch.from_numpy(want).to(torch.uint8))


def test_ties_round_by_the_contract():
    # acc * 0.5 for odd acc is an exact tie: HALF_EVEN, HALF_AWAY and HALF_UP disagree there
    x = torch.tensor([1, 3, 5, -1, -3, -5, 0], dtype=torch.int8)
    y = torch.ones(7, dtype=torch.int8)
    want = {
        (Requant.FLOAT_RESCALE, Round.HALF_EVEN): [0, 2, 2, 0, -2, -2, 0],
        (Requant.FLOAT_RESCALE, Round.HALF_AWAY): [1, 2, 3, -1, -2, -3, 0],
        (Requant.MUL_SHIFT, Round.HALF_UP): [1, 2, 3, 0, -1, -2, 0],
    }
    for (scheme, rounding), codes in want.items():
        form = product_form(make_requant(0.5, scheme), rounding, 128 * 128)
        got = requantize_product(x, 0, y, 0, form, I8)
        assert got.tolist() == codes


def test_no_form_without_a_proof():
    fr = make_requant(0.001, Requant.FLOAT_RESCALE)
    assert product_form(fr, Round.HALF_EVEN, FLOAT32_EXACT) is not None
    assert product_form(fr, Round.HALF_EVEN, FLOAT32_EXACT + 1) is None  # fl32(acc) may round
    assert product_form(fr, Round.HALF_EVEN, 2**31) is None  # the int32 accumulator may act
    ms = make_requant(0.001, Requant.MUL_SHIFT)
    q, n = int(ms.multiplier), ms.mult_bits - int(ms.shift)
    limit = (2**53 - (1 << (n - 1))) // q
    assert product_form(ms, Round.HALF_UP, limit) is not None
    assert product_form(ms, Round.HALF_UP, limit + 1) is None  # acc * q may leave 2**53
    assert product_form(ms, Round.HALF_EVEN, 100) is None  # only the floor form is proven
    assert product_form(make_requant(0.001, Requant.MUL_SHIFT_DOUBLE), Round.HALF_AWAY, 9) is None
    per_channel = make_requant(torch.tensor([0.1, 0.2]), Requant.FLOAT_RESCALE)
    assert product_form(per_channel, Round.HALF_EVEN, 100) is None


def test_the_mul_shift_form_at_its_bound():
    # int16 x int16 products at the largest bound the float64 form accepts for this multiplier
    ms = make_requant(0.37, Requant.MUL_SHIFT)
    q, n = int(ms.multiplier), ms.mult_bits - int(ms.shift)
    bound = min((2**53 - (1 << (n - 1))) // q, 2**31 - 1)
    side = int(bound**0.5)
    x = torch.tensor([side, -side, side - 1, 12345, -1], dtype=torch.int64).to(torch.int32)
    y = torch.tensor([side, side, -side, -7, 1], dtype=torch.int64).to(torch.int32)
    form = product_form(ms, Round.HALF_UP, side * side)
    assert form is not None
    got = requantize_product(x, 0, y, 0, form, I16)
    assert_bits_equal(got, _expected(x, 0, y, 0, ms, Round.HALF_UP, I16, 0))


def test_the_float32_product_is_rounded_once_as_float32():
    # fl32(acc * fl32(0.1)) then rounded differs from rounding the exact product for thousands
    # of int16 accs: the form must round where requantize (and ONNX Runtime) does
    x = torch.arange(-32768, 32768, dtype=torch.int64).to(torch.int16)
    params = make_requant(0.1, Requant.FLOAT_RESCALE)
    m = float(params.real.to(torch.float32))
    exact = torch.round(x.to(torch.float64) * m)
    single = torch.round(x.to(torch.float32) * torch.tensor(m, dtype=torch.float32))
    assert int((exact != single.to(torch.float64)).sum()) > 1000
    form = product_form(params, Round.HALF_EVEN, 32768 * 128)
    for y in (1, torch.ones(1, dtype=torch.int8)):
        got = requantize_product(x, 0, y, 0, form, I16)
        assert_bits_equal(got, _expected(x, 0, y, 0, params, Round.HALF_EVEN, I16, 0))
        assert_bits_equal(got, single.to(torch.int16))
