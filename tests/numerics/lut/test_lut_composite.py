"""Softmax and inverse_sigmoid built from several LUTs, against an integer reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import (
    build_lut,
    default_spec,
    inverse_sigmoid_composite,
    lut_softmax,
)
from quantlab.numerics.lut.composite import (
    SOFTMAX_EXP_SCALE,
    _product_half_up_codes,
    requant_half_up,
    softmax_exp_spec,
)

I8, I16 = DType.INT8, DType.INT16


def _requant_ref(v: np.ndarray, ratio: float, dt: DType) -> np.ndarray:
    """floor(v * ratio + 1/2) in float64 (HALF_UP), saturated."""
    return np.clip(np.floor(v.astype(np.float64) * ratio + 0.5), dt.qmin, dt.qmax).astype(np.int64)


def _softmax_reference(codes: torch.Tensor, s_in: float, out_scale: float) -> torch.Tensor:
    """The same five steps, one row at a time, with each table's numpy reference."""
    n = codes.shape[-1]
    sum_scale = n * SOFTMAX_EXP_SCALE
    exp_lut = build_lut("exp", I16, s_in, I16, SOFTMAX_EXP_SCALE, softmax_exp_spec(s_in))
    recip = build_lut("reciprocal", I16, sum_scale, I16, 1 / 32767)
    rows = []
    for row in codes.reshape(-1, n):
        x = row.numpy().astype(np.int64)
        d = np.maximum(x - x.max(), -32768)
        e = exp_lut.evaluate_reference(torch.from_numpy(d).to(torch.int16)).numpy().astype(np.int64)
        s = _requant_ref(np.array([e.sum()]), SOFTMAX_EXP_SCALE / sum_scale, I16)
        r = int(recip.evaluate_reference(torch.from_numpy(s).to(torch.int16))[0])
        rows.append(_requant_ref(e * r, SOFTMAX_EXP_SCALE * (1 / 32767) / out_scale, I16))
    return torch.from_numpy(np.stack(rows).reshape(codes.shape)).to(torch.int16)


def test_lut_softmax_matches_reference_and_float():
    g = torch.Generator().manual_seed(7)
    s_in = 16 / 32767.5
    x = torch.randn(6, 33, generator=g) * 4
    x[0] = 0.0  # all equal: uniform
    x[1, 5] = 15.0  # one dominant
    codes = torch.round(x / s_in).clamp(-32768, 32767).to(torch.int16)
    out_scale = 1 / 32767
    y = lut_softmax(codes, s_in, I16, -1, out_scale, I16)
    assert y.dtype == torch.int16 and y.shape == codes.shape
    assert_bits_equal(y, _softmax_reference(codes, s_in, out_scale))
    ref = torch.softmax(codes.double() * s_in, dim=-1)
    err = (y.double() * out_scale - ref).abs().max().item()
    assert err < 2e-3, err
    assert (y.double() * out_scale).sum(-1).sub(1).abs().max().item() < 0.05


@pytest.mark.parametrize("s_in", [13.0, 10000 / 127.5, 1e4, 2.0**128 / 32768])
def test_a_code_wider_than_the_exp_range_gives_one_at_the_maximum_and_zero_elsewhere(s_in):
    """Scores calibrated over an additive mask of -1e4 or of float32's lowest value: one code
    spans more than exp's [-12, 0], so each row's maximum takes all the weight (ties share
    it). The exp table covers the one code [-s_in, 0]: its cap at the output's top (ln of
    32767 exp-scale codes, just below 0) would leave less than that, so it steps aside."""
    codes = torch.tensor([[0, 0, -32768, -1], [-5, -32768, -32768, -32768], [3, 3, 3, 3]])
    codes = codes.to(torch.int16)
    y = lut_softmax(codes, s_in, I16, -1, 1 / 32767, I16)
    assert_bits_equal(y, _softmax_reference(codes, s_in, 1 / 32767))
    want = torch.tensor([[0.5, 0.5, 0, 0], [1, 0, 0, 0], [0.25] * 4], dtype=torch.float64)
    assert (y.double() / 32767 - want).abs().max().item() < 2e-3


def test_a_softmax_over_one_value_is_one():
    """An axis of length 1 (attention over a single key): the sum's reciprocal saturates at
    every code of its table, whose inverse-function rule then steps aside; each output is 1."""
    codes = torch.tensor([[-300], [0], [12000]], dtype=torch.int16)
    y = lut_softmax(codes, 8 / 32767.5, I16, -1, 1 / 32767, I16)
    assert_bits_equal(y, _softmax_reference(codes, 8 / 32767.5, 1 / 32767))
    assert (y.double() / 32767 - 1).abs().max().item() < 2e-3


def test_lut_softmax_other_dim_and_int8():
    g = torch.Generator().manual_seed(8)
    s_in = 8 / 127.5
    codes = torch.randint(-128, 128, (4, 9, 3), generator=g, dtype=torch.int32).to(torch.int8)
    y = lut_softmax(codes, s_in, I8, 1, 1 / 127, I8)
    assert y.dtype == torch.int8
    ref = torch.softmax(codes.double() * s_in, dim=1)
    assert (y.double() / 127 - ref).abs().max().item() < 0.02


def test_inverse_sigmoid_composite_reference_and_bounds():
    s_in = 1 / 32767.5
    out_scale = 11.6 / 32767.5
    codes = torch.arange(0, 32768, 7, dtype=torch.int64).to(torch.int16)
    y = inverse_sigmoid_composite(codes, s_in, out_scale, I16, I16)
    # reference: the same steps with numpy and each table's reference
    q = codes.numpy().astype(np.int64)
    one, lower = round(1 / s_in), 32
    r_scale = (1 / (lower * s_in)) / 32767
    recip = build_lut("reciprocal", I16, s_in, I16, r_scale)
    r = recip.evaluate_reference(torch.from_numpy(np.clip(one - q, lower, 32767)).to(torch.int16))
    p = _requant_ref(np.maximum(q, 0) * r.numpy().astype(np.int64), s_in, I16)
    log = build_lut("log", I16, r_scale, I16, out_scale, default_spec("log"))
    assert_bits_equal(y, log.evaluate_reference(torch.from_numpy(p).to(torch.int16)))
    v = y.double() * out_scale
    assert v.min().item() >= -10.0 - out_scale  # the log floor, not -11.51
    assert v.max().item() <= math.log(1 / (lower * s_in)) + 0.01  # the reciprocal clip
    mid = (codes.double() * s_in > 0.2) & (codes.double() * s_in < 0.8)
    x = codes.double()[mid] * s_in
    # mid-range error is set by the int16 product's step r_max / 32767 = 0.031 on p = x/(1-x)
    # (0.25 <= p <= 4): at most about 0.031 / 0.25 / 2 + table error, i.e. < 0.1
    assert (v[mid] - torch.log(x / (1 - x))).abs().max().item() < 0.1


def test_the_softmax_tail_equals_requant_half_up_of_the_int64_product():
    # e * r times ratio, HALF_UP, against requant_half_up on the int64 product: ratios where
    # p + 1/2 is exact, and ratios that put p past 2**52 (both forms saturate there)
    g = torch.Generator().manual_seed(12)
    e = torch.randint(-32768, 32768, (5, 64), generator=g, dtype=torch.int32).to(torch.int16)
    e[0, :6] = torch.tensor([-32768, 32767, 0, 1, -1, 3], dtype=torch.int16)
    r = torch.randint(-32768, 32768, (5, 1), generator=g, dtype=torch.int32).to(torch.int16)
    r[0, 0] = -32768  # |e * r| = 2**30 at the corner
    e[1, :3], r[1, 0] = torch.tensor([1, -1, 2], dtype=torch.int16), 1  # e * r = 1, -1, 2
    v = e.to(torch.int64) * r.to(torch.int64)
    below_half = 0.5 - 2.0**-54  # e * r = 1: p one ulp below 1/2, floor(p + 1/2) would give 1
    for ratio in (0.5, 0.25, 2.0**-15, 1 / 3, 1e-9, 2.0**21, 2.0**22 * 1.5, 3e9, below_half):
        for dt in (I16, I8):
            got = _product_half_up_codes(e, r, ratio, dt)
            want = requant_half_up(v, ratio, dt).to(dt.torch_dtype)
            assert_bits_equal(got, want)
    one = torch.tensor([[1, -1, 2]], dtype=torch.int16)
    got = _product_half_up_codes(one, torch.ones(1, 1, dtype=torch.int16), below_half, I16)
    assert got.tolist() == [[0, 0, 1]]
    # ties: odd products times 1/2 land on .5 exactly; HALF_UP takes the larger neighbour
    odd = torch.tensor([[1, 3, -1, -3, 5]], dtype=torch.int16)
    got = _product_half_up_codes(odd, torch.ones(1, 1, dtype=torch.int16), 0.5, I16)
    assert got.tolist() == [[1, 2, 0, -1, 3]]


def test_the_softmax_tail_for_nonnegative_codes_skips_the_floor_with_the_same_codes():
    # e, r >= 0 (softmax's exp and reciprocal tables): truncation after the clamp at qmax is
    # the floor; on random codes, zeros, the corner 32767 * 32767, ties and saturating ratios
    g = torch.Generator().manual_seed(13)
    e = torch.randint(0, 32768, (6, 64), generator=g, dtype=torch.int32).to(torch.int16)
    e[0, :5] = torch.tensor([0, 1, 2, 3, 32767], dtype=torch.int16)
    r = torch.randint(0, 32768, (6, 1), generator=g, dtype=torch.int32).to(torch.int16)
    r[0, 0], r[1, 0] = 32767, 0
    for ratio in (0.5, 0.25, 2.0**-15, 1 / 3, 1e-9, 2.0**21, 3e9, 2.0**-30 / 3, 0.5 - 2.0**-54):
        for dt in (I16, I8):
            got = _product_half_up_codes(e, r, ratio, dt, nonnegative=True)
            assert_bits_equal(got, _product_half_up_codes(e, r, ratio, dt))
    odd = torch.tensor([[1, 3, 5, 7, 0]], dtype=torch.int16)  # odd * 1/2: ties, taken upward
    got = _product_half_up_codes(odd, torch.ones(1, 1, dtype=torch.int16), 0.5, I16, True)
    assert got.tolist() == [[1, 2, 3, 4, 0]]


def test_softmax_tables_have_nonnegative_outputs_and_a_signed_map():
    exp_lut = build_lut("exp", I16, 16 / 32767.5, I16, SOFTMAX_EXP_SCALE, softmax_exp_spec())
    recip = build_lut("reciprocal", I16, 128 * SOFTMAX_EXP_SCALE, I16, 1 / 32767)
    assert exp_lut.min_output() >= 0 and recip.min_output(0) >= 0
    assert recip.min_output() < 0 and recip.min_output(-5) < 0  # symmetric: negative inputs
    assert recip.min_output(0) == int(recip.evaluate(torch.arange(0, 32768).to(torch.int16)).min())
    codes = torch.arange(-32768, 32768, dtype=torch.int32)
    signed = exp_lut.signed_code_map().index_select(0, codes + 32768)
    assert_bits_equal(signed, exp_lut.evaluate(codes.to(torch.int16)))
