"""The product requantization in one C pass (quantlab.numerics.product_requant_native): the
codes of the torch passes and of ``requantize`` on the int64 product, for every code dtype
pair, output dtype and form, with zero points, extreme codes, exact ties and saturation, on
same-shape operands, operands that repeat along the output's leading dims (either side) and an
integer constant; in the build the CPU loads, the baseline and the AVX2 code; and the torch
passes wherever it declines, also when no kernel can be built."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from bits import assert_bits_equal
from native_builds import BUILDS, use_build, without_compiler

from quantlab.numerics import native, product_requant_native
from quantlab.numerics.dtypes import DType
from quantlab.numerics.product_requant import (
    product_form,
    requantize_product,
    requantize_product_torch,
)
from quantlab.numerics.product_requant_native import requantize_product_native
from quantlab.numerics.requant import Requant, make_requant, requantize
from quantlab.numerics.rounding import Round

needs_cc = pytest.mark.skipif(
    native.compiler() is None, reason="no C compiler to build the kernels"
)

I8, I16 = DType.INT8, DType.INT16
# (scheme, rounding) of each form the kernel takes: float32 and float64 half to even (ONNX
# Runtime's QLinearMul, the float64 rescale), J6's multiply and shift (float64 floor(. + 1/2))
FORMS = [
    (Requant.FLOAT_RESCALE, Round.HALF_EVEN),
    (Requant.FLOAT64_RESCALE, Round.HALF_EVEN),
    (Requant.MUL_SHIFT, Round.HALF_UP),
]
# exact ties (0.5, 0.25), others, and saturating ones
MULTIPLIERS = [0.5, 0.25, 1 / 3, 0.0123456, 3.7e-5, 7.25]
SHAPES = [
    ((1, 128, 384), (1, 128, 384)),  # same shape
    ((1, 12, 128, 128), (1, 1, 1, 128)),  # a row repeated over every head's scores
    ((1, 1, 1, 128), (1, 12, 128, 128)),  # the same, the other way round
    ((128, 384), (1, 1, 128, 384)),  # extra leading 1s on one side
    ((4, 33, 77), (77,)),  # odd sizes: the thread shares do not fall on a row
    ((4096,), (4096,)),
    ((1,), (1,)),  # one value
    ((3, 17), (17,)),  # a few values, repeated
    ((15,), (15,)),  # fewer than one vector
]


@pytest.fixture(params=BUILDS)
def build(request, monkeypatch):
    """The kernels as the CPU loads them, the baseline build, or the AVX2 code alone."""
    use_build(request.param, product_requant_native.KERNELS, monkeypatch)
    return request.param


def _codes(g, dt: DType, shape) -> torch.Tensor:
    c = torch.randint(dt.qmin, dt.qmax + 1, shape, generator=g, dtype=torch.int64)
    c.view(-1)[:4] = torch.tensor([dt.qmin, dt.qmax, 0, dt.qmin + 1])[: c.numel()]
    return c.to(dt.torch_dtype)


def _bound(dx: DType, zx: int, dy: DType, zy: int) -> int:
    return max(abs(dx.qmin - zx), abs(dx.qmax - zx)) * max(abs(dy.qmin - zy), abs(dy.qmax - zy))


def _check(x, zx, y, zy, params, rounding, form, out, zo):
    got = requantize_product_native(x, zx, y, zy, form, out, zo)
    assert got is not None and got.dtype == out.torch_dtype
    assert_bits_equal(got, requantize_product_torch(x, zx, y, zy, form, out, zo))
    acc = (x.to(torch.int64) - zx) * (torch.as_tensor(y).to(torch.int64) - zy)
    assert_bits_equal(got, requantize(acc, params, out, rounding, zero_point=zo))


@needs_cc
@pytest.mark.parametrize("scheme,rounding", FORMS)
@pytest.mark.parametrize(("dx", "dy", "out"), list(itertools.product((I8, I16), repeat=3)))
def test_the_c_pass_gives_the_codes_of_the_torch_passes(build, scheme, rounding, dx, dy, out):
    g = torch.Generator().manual_seed(7)
    for m, (sx, sy) in zip(MULTIPLIERS, SHAPES):
        for zx, zy, zo in ((0, 0, 0), (-3, 5, 9)):
            params = make_requant(m, scheme)
            x, y = _codes(g, dx, sx), _codes(g, dy, sy)
            form = product_form(params, rounding, _bound(dx, zx, dy, zy))
            if form is None:  # int16 products too large for an exact form: codes within +-1000
                assert I16 in (dx, dy)
                x, y = x.clamp(-1000, 1000), y.clamp(-1000, 1000)
                form = product_form(params, rounding, 1003 * 1005)
            _check(x, zx, y, zy, params, rounding, form, out, zo)


@needs_cc
@pytest.mark.parametrize("scheme,rounding", FORMS)
def test_every_shape_and_an_integer_constant(build, scheme, rounding):
    g = torch.Generator().manual_seed(8)
    for m in MULTIPLIERS:
        params = make_requant(m, scheme)
        form = product_form(params, rounding, _bound(I8, 2, I8, -1))
        for sx, sy in SHAPES:
            _check(_codes(g, I8, sx), 2, _codes(g, I8, sy), -1, params, rounding, form, I8, 0)
        x = _codes(g, I8, (3, 5000))
        for y in (-127, 127, 0, torch.tensor(-127, dtype=torch.int16)):
            _check(x, 2, y, -1, params, rounding, form, I8, 4)


@needs_cc
def test_ties_round_by_the_form():
    # acc * 0.5 on odd products: half to even and floor(. + 1/2) disagree on every one
    x = torch.arange(-128, 128, dtype=torch.int8).repeat(64)
    y = torch.ones_like(x)
    for scheme, rounding in FORMS:
        form = product_form(make_requant(0.5, scheme), rounding, 128 * 128)
        got = requantize_product_native(x, 0, y, 0, form, I8)
        exact = x.to(torch.float64) * 0.5
        want = torch.floor(exact + 0.5) if form.half_up else torch.round(exact)
        assert_bits_equal(got, want.to(torch.int8))


def test_where_the_c_pass_declines_the_torch_passes_give_the_codes():
    g = torch.Generator().manual_seed(9)
    params = make_requant(0.01, Requant.FLOAT_RESCALE)
    form = product_form(params, Round.HALF_EVEN, 255 * 255)
    x, y = _codes(g, I8, (64, 130)), _codes(g, I8, (64, 130))
    declined = [
        (x[:, ::2], y[:, ::2]),  # strided codes
        (x[:, :1], y),  # a middle broadcast, not a repeat
        (x[:0], y[:0]),  # no outputs
        (x.to(torch.uint8), y.to(torch.uint8)),  # another code dtype
        (x.to(torch.int32), y),
    ]
    for a, b in declined:
        assert requantize_product_native(a, 0, b, 0, form, I8) is None
        want = requantize(a.to(torch.int64) * b.to(torch.int64), params, I8, Round.HALF_EVEN)
        assert_bits_equal(requantize_product(a, 0, b, 0, form, I8), want)
    away = product_form(params, Round.HALF_AWAY, 255 * 255)  # a rounding it has no loop for
    assert requantize_product_native(x, 0, y, 0, away, I8) is None
    assert requantize_product_native(x, 0, y, 0, form, DType.UINT8) is None  # another output


def test_without_a_compiler_the_torch_passes_serve_with_one_warning(monkeypatch):
    without_compiler(product_requant_native, monkeypatch)
    g = torch.Generator().manual_seed(10)
    params = make_requant(0.37, Requant.MUL_SHIFT)
    form = product_form(params, Round.HALF_UP, 128 * 128)
    x, y = _codes(g, I8, (64, 128)), _codes(g, I8, (128,))
    want = requantize(x.to(torch.int64) * y.to(torch.int64), params, I8, Round.HALF_UP)
    with pytest.warns(RuntimeWarning, match="no C compiler found"):
        assert_bits_equal(requantize_product(x, 0, y, 0, form, I8), want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert_bits_equal(requantize_product(y, 0, x, 0, form, I8), want)
