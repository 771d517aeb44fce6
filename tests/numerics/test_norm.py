"""Fixed-point LayerNorm / GroupNorm / InstanceNorm: identical bits to the integer reference on
random and adversarial inputs, and clear errors for bad arguments."""

import dataclasses

import pytest
import torch

from quantlab.numerics import reference
from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import (
    J6_NORM,
    EpsMode,
    NormContract,
    NormLayout,
    NormScales,
)
from quantlab.numerics.norm_calibrate import norm_steps, output_scale, scales_from_steps
from quantlab.numerics.norm_integer import norm_constants, norm_fixed
from quantlab.numerics.quantize import compute_scale, quantize
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round
from tests.bits import assert_bits_equal

I8, I16 = DType.INT8, DType.INT16


def calibrated(x, layout, w, b, in_dtype, out_dtype, eps=1e-5, contract=J6_NORM):
    """Input codes and MinMax-calibrated scales of every step, from the data itself."""
    s_in = float(compute_scale(x.abs().max(), in_dtype))
    codes = quantize(x, s_in, in_dtype)
    xd = codes.to(torch.float64) * s_in
    steps = norm_steps(xd, layout, w, b, eps)
    return codes, s_in, scales_from_steps(steps, contract), output_scale(steps, out_dtype)


def check(codes, s_in, layout, w, b, eps, scales, s_out, out_dtype, contract=J6_NORM):
    got = norm_fixed(codes, s_in, layout, w, b, eps, scales, s_out, out_dtype, contract)
    want = reference.norm_fixed(codes, s_in, layout, w, b, eps, scales, s_out, out_dtype, contract)
    assert got.dtype == out_dtype.torch_dtype
    assert_bits_equal(got.to(torch.int64), torch.from_numpy(want), {"codes": codes})
    return got


def rows_data(seed, shape, spread=1.0):
    """Gaussian rows with per-row offsets and log-uniform per-row spreads."""
    g = torch.Generator().manual_seed(seed)
    ones = (1,) * (len(shape) - 1)
    std = torch.exp(torch.rand(shape[0], *ones, generator=g) * spread)
    return torch.randn(*shape, generator=g) * std + torch.randn(shape[0], *ones, generator=g)


def params(c, seed, affine=(True, True)):
    g = torch.Generator().manual_seed(seed + 100)
    w = torch.rand(c, generator=g) + 0.5 if affine[0] else None
    b = torch.randn(c, generator=g) * 0.3 if affine[1] else None
    return w, b


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("in_dtype,out_dtype", [(I8, I8), (I16, I16), (I8, I16), (I16, I8)])
def test_layer_norm_random(seed, in_dtype, out_dtype):
    layout = NormLayout.layer(24)
    x = rows_data(seed, (2, 5, 24))
    w, b = params(24, seed)
    c, s_in, sc, so = calibrated(x, layout, w, b, in_dtype, out_dtype)
    check(c, s_in, layout, w, b, 1e-5, sc, so, out_dtype)


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
def test_layer_norm_partial_affine(affine):
    layout = NormLayout.layer((3, 8))
    x = rows_data(3, (4, 3, 8))
    w, b = params(8, 3, affine)
    w = None if w is None else w.repeat(3, 1)
    b = None if b is None else b.repeat(3, 1)
    c, s_in, sc, so = calibrated(x, layout, w, b, I16, I8)
    check(c, s_in, layout, w, b, 1e-5, sc, so, I8)


@pytest.mark.parametrize("dtype", [I8, I16])
def test_group_and_instance_norm_random(dtype):
    x = rows_data(4, (2, 8, 3, 4))
    w, b = params(8, 4)
    for layout in (NormLayout.group(2), NormLayout.group(8), NormLayout.instance()):
        c, s_in, sc, so = calibrated(x, layout, w, b, dtype, dtype)
        check(c, s_in, layout, w, b, 1e-5, sc, so, dtype)


CONTRACTS = [
    J6_NORM,
    NormContract(eps_mode=EpsMode.ADD_CODES),
    NormContract(requant_round=Round.HALF_EVEN, add_inter_shift=12),
    NormContract(inter_dtype=I8),
]


@pytest.mark.parametrize("seed", range(16))
def test_random_sweep(seed):
    """Random layout, shape, dtypes, affine parameters, spread, eps and contract per seed."""
    g = torch.Generator().manual_seed(1000 + seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    b_, c_ = pick([1, 2, 3]), pick([2, 4, 6])
    kind = pick(["layer", "group", "instance"])
    if kind == "layer":
        shape, layout, n_aff = (b_, c_, 10), NormLayout.layer(10), 10
    else:
        shape, n_aff = (b_, c_, 3, pick([1, 2, 5])), c_
        layout = NormLayout.group(pick([1, 2])) if kind == "group" else NormLayout.instance()
    x = rows_data(seed, shape, spread=pick([0.0, 1.0, 3.0])) * pick([0.01, 1.0, 50.0])
    w, b = params(n_aff, seed, (pick([True, False]), pick([True, False])))
    in_dt, out_dt, eps = pick([I8, I16]), pick([I8, I16]), pick([1e-5, 1e-2, 0.0])
    contract = pick(CONTRACTS)
    c, s_in, sc, so = calibrated(x, layout, w, b, in_dt, out_dt, eps, contract)
    check(c, s_in, layout, w, b, eps, sc, so, out_dt, contract)


def test_constant_rows_variance_zero():
    """Rows whose variance is 0 (and rows at the code extremes): the mean's rounding leaves a
    residual x - mean that the rsqrt of eps amplifies; bits still match the reference."""
    layout = NormLayout.layer(16)
    x = torch.stack(
        [torch.full((16,), v) for v in (0.0, 0.3, -1.7, 5.0, -5.0, 2.2)] + [torch.randn(16)]
    )
    w, b = params(16, 7)
    for dtype in (I8, I16):
        c, s_in, sc, so = calibrated(x, layout, w, b, dtype, dtype)
        check(c, s_in, layout, w, b, 1e-5, sc, so, dtype)
        check(c, s_in, layout, w, b, 0.0, sc, so, dtype)  # eps 0: rsqrt(0) saturates


def test_every_int8_value_and_full_int16_range():
    g = torch.Generator().manual_seed(8)
    all8 = torch.stack([torch.randperm(256, generator=g) - 128 for _ in range(3)]).to(torch.int8)
    layout = NormLayout.layer(256)
    w, b = params(256, 8)
    sc = NormScales(
        mean=0.5 / 32767, diff=1.0 / 256, square=1.0 / 16, var=0.01, rsqrt=1 / 8192,
        normed=2 / 32767, scaled=3 / 32767, gamma=2 / 32767, beta=1 / 32767,
    )  # fmt: skip
    check(all8, 1 / 64, layout, w, b, 1e-5, sc, 4 / 127, I8)
    extremes = torch.tensor([[32767, -32768] * 8, [-32768] * 15 + [32767]], dtype=torch.int16)
    c16 = torch.cat([extremes, torch.randint(-32768, 32768, (2, 16), generator=g).to(torch.int16)])
    w, b = params(16, 9)
    x = c16.to(torch.float64) * 1e-3
    steps = norm_steps(x, NormLayout.layer(16), w, b, 1e-5)
    check(c16, 1e-3, NormLayout.layer(16), w, b, 1e-5, scales_from_steps(steps), 1e-4, I16)


def test_saturating_scales():
    """Scales far too small for the data: every step saturates somewhere; bits still match."""
    layout = NormLayout.layer(12)
    x = rows_data(10, (6, 12), spread=2.0) * 20
    w, b = params(12, 10)
    c, s_in, sc, so = calibrated(x, layout, w, b, I16, I16)
    tight = dataclasses.replace(
        sc, mean=sc.mean / 50, diff=sc.diff / 9, square=sc.square / 30, var=sc.var / 7,
        rsqrt=sc.rsqrt / 3, normed=sc.normed / 5, scaled=sc.scaled / 4, gamma=sc.gamma / 2,
        beta=sc.beta / 2,
    )  # fmt: skip
    y = check(c, s_in, layout, w, b, 1e-5, tight, so / 20, I16)
    assert int((y == 32767).sum() + (y == -32768).sum()) > 0


def test_tiny_groups_and_single_element_rows():
    x = rows_data(11, (3, 6, 1))
    w, b = params(6, 11)
    for layout in (NormLayout.group(6), NormLayout.instance()):
        c, s_in, sc, so = calibrated(x, layout, w, b, I8, I8)
        check(c, s_in, layout, w, b, 1e-5, sc, so, I8)
    c, s_in, sc, so = calibrated(x, NormLayout.layer(1), None, None, I16, I16)
    check(c, s_in, NormLayout.layer(1), None, None, 1e-5, sc, so, I16)


@pytest.mark.parametrize(
    "contract",
    [
        NormContract(eps_mode=EpsMode.ADD_CODES),
        NormContract(requant=Requant.FLOAT_RESCALE, requant_round=Round.HALF_EVEN),
        NormContract(requant_mult_bits=15, requant_round=Round.FLOOR, add_inter_shift=10),
        NormContract(requant=Requant.MUL_SHIFT_DOUBLE, requant_round=Round.HALF_AWAY),
        NormContract(inter_dtype=I8, affine_dtype=I8, affine_round=Round.HALF_UP),
    ],
    ids=["add_codes", "float_rescale", "mult15_floor", "double_rounding", "int8_inner"],
)
def test_contract_variants(contract):
    layout = NormLayout.layer(20)
    x = torch.cat([rows_data(12, (5, 20)), torch.full((1, 20), 0.75)])
    w, b = params(20, 12)
    c, s_in, sc, so = calibrated(x, layout, w, b, I16, I8, eps=1e-3, contract=contract)
    check(c, s_in, layout, w, b, 1e-3, sc, so, I8, contract)


def test_bad_arguments_fail_clearly():
    layout = NormLayout.layer(8)
    codes = torch.zeros(2, 8, dtype=torch.int8)
    sc = NormScales(mean=1, diff=1, square=1, var=1, rsqrt=1)
    with pytest.raises(ValueError, match="needs normed, gamma"):
        norm_fixed(codes, 1.0, layout, torch.ones(8), None, 1e-5, sc, 1.0, I8)
    with pytest.raises(ValueError, match="does not end in normalized_shape"):
        norm_fixed(torch.zeros(2, 7, dtype=torch.int8), 1.0, layout, None, None, 1e-5, sc, 1.0, I8)
    with pytest.raises(TypeError, match="int8 or int16 codes"):
        norm_fixed(codes.float(), 1.0, layout, None, None, 1e-5, sc, 1.0, I8)
    with pytest.raises(ValueError, match="max_reduce_elements"):
        norm_fixed(
            codes, 1.0, layout, None, None, 1e-5, sc, 1.0, I8, NormContract(max_reduce_elements=4)
        )
    with pytest.raises(ValueError, match="must divide the channel count"):
        NormLayout.group(3).rows(torch.zeros(1, 8, 2))
    with pytest.raises(ValueError, match="weight must have shape"):
        sc2 = dataclasses.replace(sc, normed=1.0, gamma=1.0)
        norm_fixed(codes, 1.0, layout, torch.ones(7), None, 1e-5, sc2, 1.0, I8)
    with pytest.raises(ValueError, match="NormContract.inter_dtype must be INT8 or INT16"):
        NormContract(inter_dtype=DType.INT32)
    with pytest.raises(ValueError, match="NormScales.var must be finite and > 0"):
        NormScales(mean=1, diff=1, square=1, var=0.0, rsqrt=1)
    with pytest.raises(ValueError, match="eps must be finite"):
        norm_fixed(codes, 1.0, layout, None, None, -1.0, sc, 1.0, I8)


def _general(k):
    """The same constants without the folded StepShift form: norm_fixed's general steps."""
    return dataclasses.replace(k, shifts=None)


@pytest.mark.parametrize("in_dtype,out_dtype", [(I8, I8), (I16, I16), (I16, I8)])
def test_shifted_form_equals_general_form(in_dtype, out_dtype):
    """J6's contract runs the folded int64 form (NormShifts); on random, full-range, constant
    and saturating codes, with every affine combination and layout, it gives the general
    form's bits (which the tests above tie to the reference)."""
    g = torch.Generator().manual_seed(21)
    lo, hi = in_dtype.qmin, in_dtype.qmax
    shape = (3, 8, 2, 5)
    codes = [
        torch.randint(lo, hi + 1, shape, generator=g),
        torch.full(shape, lo),
        torch.full(shape, hi),
        torch.tensor([lo, hi]).repeat(3 * 8 * 5).reshape(shape),
    ]
    x = rows_data(21, shape, spread=2.0)
    w8, b8 = params(8, 21)
    w10, b10 = (p.reshape(2, 5) for p in params(10, 21))
    cases = [
        (NormLayout.layer((2, 5)), w10, b10),
        (NormLayout.layer((2, 5)), w10, None),
        (NormLayout.layer((2, 5)), None, None),
        (NormLayout.group(4), w8, b8),
        (NormLayout.group(4), None, b8),
        (NormLayout.instance(), w8, b8),
    ]
    for layout, w, b in cases:
        _, s_in, sc, so = calibrated(x, layout, w, b, in_dtype, out_dtype)
        tight = dataclasses.replace(sc, diff=sc.diff / 8, square=sc.square / 20, rsqrt=sc.rsqrt / 3)
        for scales, s_out in ((sc, so), (tight, so / 10), (sc, so * 1e3)):
            n = layout.rows(codes[0]).shape[1]
            k = norm_constants(s_in, n, w, b, 1e-5, scales, s_out, out_dtype)
            assert k.shifts is not None
            for c in codes:
                c = c.to(in_dtype.torch_dtype)
                args = (c, s_in, layout, w, b, 1e-5, scales, s_out, out_dtype)
                got = norm_fixed(*args, constants=k)
                want = norm_fixed(*args, constants=_general(k))
                assert_bits_equal(got, want, {"codes": c})


@pytest.mark.parametrize(
    "contract",
    [
        NormContract(add_inter_shift=15),  # with s_mean = s_in an add could pass 2**31
        NormContract(requant_round=Round.HALF_EVEN),
        NormContract(requant=Requant.FLOAT_RESCALE),
    ],
    ids=["inter_shift_15", "half_even", "float_rescale"],
)
def test_contracts_outside_the_shifted_form_take_the_general_one(contract):
    layout = NormLayout.layer(20)
    x = torch.cat([rows_data(13, (5, 20)), torch.full((1, 20), 0.75)])
    w, b = params(20, 13)
    c, s_in, sc, so = calibrated(x, layout, w, b, I16, I16, eps=1e-3, contract=contract)
    sc = dataclasses.replace(sc, mean=s_in)  # the add rule's mx = my = 2**add_inter_shift
    assert norm_constants(s_in, 20, w, b, 1e-3, sc, so, I16, contract).shifts is None
    check(c, s_in, layout, w, b, 1e-3, sc, so, I16, contract)
    extremes = torch.tensor([[32767, -32768] * 10, [-32768] * 19 + [32767]], dtype=torch.int16)
    check(extremes, s_in, layout, w, b, 1e-3, sc, so, I16, contract)
