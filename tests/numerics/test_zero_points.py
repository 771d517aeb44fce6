"""Activation zero points, per-family GEMM rules, the TFLite / XNNPACK adds and the fused
bound rules, against the slow integer references (``quantlab.numerics.reference``).

Random cases with int8 and uint8 activations and nonzero zero points, through every
requantization scheme (including FLOAT64_RESCALE and the int64 accumulator of 16x8), with
power-of-two scales mixed in so that exact rounding ties occur.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics import (
    BoundRule,
    Divide,
    DType,
    GemmContract,
    GemmFamily,
    GemmRule,
    Overflow,
    Requant,
    Round,
    add_inter_scale,
    add_left_shift,
    add_shared_shift,
    bound_codes,
    centre_codes,
    check_zero_point,
    compute_zero_point_scale,
    dequantize,
    fake_quant,
    qconv2d,
    qlinear,
    qmatmul,
    quantize,
    requant_scale,
)
from quantlab.numerics import reference as R
from quantlab.numerics.add_rules import _wrap32
from quantlab.platforms import PlatformConfig

N_CASES = 24
ACTS = {"int8": (DType.INT8, torch.int8), "uint8": (DType.UINT8, torch.uint8)}
CONTRACTS = {
    "float32": GemmContract(
        accumulator_overflow=Overflow.WRAP,
        requant=Requant.FLOAT_RESCALE,
        requant_round=Round.HALF_EVEN,
    ),
    "float64": GemmContract(
        accumulator_overflow=Overflow.WRAP,
        requant=Requant.FLOAT64_RESCALE,
        requant_round=Round.HALF_AWAY,
    ),
    "double": GemmContract(
        accumulator_overflow=Overflow.WRAP,
        requant=Requant.MUL_SHIFT_DOUBLE,
        requant_round=Round.HALF_AWAY,
    ),
    "single": GemmContract(),
}


def _seed(act: str, contract: str) -> int:
    return 10 * list(ACTS).index(act) + list(CONTRACTS).index(contract)


def _codes(g, shape, dt: DType, tdt) -> torch.Tensor:
    return torch.randint(dt.qmin, dt.qmax + 1, shape, generator=g).to(tdt)


def _scales(g, n: int, ties: bool) -> tuple[float, torch.Tensor]:
    if ties:
        sx = 2.0 ** -int(torch.randint(4, 9, (1,), generator=g))
        return sx, 2.0 ** -torch.randint(5, 9, (n,), generator=g).to(torch.float32)
    sx = float(torch.empty(()).uniform_(2e-3, 5e-2, generator=g))
    return sx, torch.empty(n).uniform_(1e-3, 2e-2, generator=g)


def _out_scale(acc: np.ndarray, sx, sw: torch.Tensor, dt: DType, ties: bool) -> float:
    real = float(np.abs(acc).max() or 1) * sx * float(sw.max())
    so = real / ((dt.qmax - dt.qmin) / 2) / 0.8
    return 2.0 ** round(np.log2(so)) if ties else so


def _reference_out(acc, sx, sw, so, dt, contract, axis, zy):
    a, _ = R.accumulate(
        acc, contract.accumulator, contract.accumulator_overflow is Overflow.SATURATE
    )
    real = requant_scale(sx, sw, so, contract.requant)
    return R.requantize(
        a, real, contract.requant, dt, contract.requant_round, axis, zero_point=zy
    ).astype(np.int64)


@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.parametrize("act", ACTS)
def test_qconv2d_with_zero_points_matches_reference(act, contract):
    dt, tdt = ACTS[act]
    c = CONTRACTS[contract]
    g = torch.Generator().manual_seed(_seed(act, contract))
    zps = set()
    for i in range(N_CASES):
        ties = i % 4 == 1
        groups = int(torch.randint(1, 3, (1,), generator=g))
        cin, cout = groups * int(torch.randint(1, 4, (1,), generator=g)), groups * 2
        x = _codes(g, (2, cin, 6, 5), dt, tdt)
        w = torch.randint(-127, 128, (cout, cin // groups, 3, 2), generator=g).to(torch.int8)
        zx = int(torch.randint(dt.qmin, dt.qmax + 1, (1,), generator=g))
        zy = int(torch.randint(dt.qmin, dt.qmax + 1, (1,), generator=g))
        zps.add((zx, zy))
        sx, sw = _scales(g, cout, ties)
        bias = torch.randint(-3000, 3001, (cout,), generator=g)
        kw = dict(stride=(1, 2), padding=(1, 1), dilation=(1, 1), groups=groups)
        acc = R.int_conv2d(x, w, zero_point=zx, **kw) + bias.numpy().reshape(1, -1, 1, 1)
        so = _out_scale(acc, sx, sw, dt, ties)
        y, _ = qconv2d(x, sx, w, sw, bias, so, dt, c, zero_points=(zx, zy), **kw)
        want = _reference_out(acc, sx, sw, so, dt, c, 1, zy)
        assert_bits_equal(y.to(torch.int64), torch.from_numpy(want))
    assert len({z for z in zps if z[0] != 0}) > N_CASES // 2


@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.parametrize("act", ACTS)
def test_qlinear_and_qmatmul_with_zero_points_match_reference(act, contract):
    dt, tdt = ACTS[act]
    c = CONTRACTS[contract]
    g = torch.Generator().manual_seed(7 + _seed(act, contract))
    for i in range(N_CASES):
        ties = i % 4 == 1
        k, n = (
            int(torch.randint(1, 70, (1,), generator=g)),
            int(torch.randint(1, 9, (1,), generator=g)),
        )
        x = _codes(g, (3, k), dt, tdt)
        w = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
        zx = int(torch.randint(dt.qmin, dt.qmax + 1, (1,), generator=g))
        zy = int(torch.randint(dt.qmin, dt.qmax + 1, (1,), generator=g))
        sx, sw = _scales(g, n, ties)
        acc = R.int_linear(x, w, zero_point=zx)
        so = _out_scale(acc, sx, sw, dt, ties)
        y, _ = qlinear(x, sx, w, sw, None, so, dt, c, zero_points=(zx, zy))
        assert_bits_equal(
            y.to(torch.int64), torch.from_numpy(_reference_out(acc, sx, sw, so, dt, c, -1, zy))
        )
        ym, _ = qmatmul(x, sx, w.t().contiguous(), sw, None, so, dt, c, zero_points=(zx, zy))
        assert_bits_equal(ym, y)


def test_int64_accumulator_and_bias_of_16x8():
    """16x8 (int16 activations) with an int64 bias: sums and bias beyond int32 survive the
    int64 accumulator (an int32 one would wrap them); FLOAT64_RESCALE and MUL_SHIFT_INT64."""
    g = torch.Generator().manual_seed(3)
    for requant, rnd in (
        (Requant.FLOAT64_RESCALE, Round.HALF_AWAY),
        (Requant.MUL_SHIFT_INT64, Round.HALF_UP),
    ):
        c = GemmContract(
            accumulator=DType.INT64,
            accumulator_overflow=Overflow.WRAP,
            requant=requant,
            requant_round=rnd,
            bias_dtype=DType.INT64,
            max_int16_gemm_operands=1,
        )
        for _ in range(20):
            x = torch.full((2, 1024), 32767, dtype=torch.int16)
            x[1] = torch.randint(-32768, 32768, (1024,), generator=g).to(torch.int16)
            w = (torch.randint(0, 2, (3, 1024), generator=g) * 254 - 127).to(torch.int8)
            bias = torch.tensor([3 << 31, -(5 << 30), 17], dtype=torch.int64)
            sx, sw = 1e-4, torch.tensor([1e-3, 2e-3, 5e-4])
            acc = R.int_linear(x, w) + bias.numpy()
            assert np.abs(acc).max() > 2**31
            so = float(np.abs(acc).max()) * 1e-7 / 30000
            y, _ = qlinear(x, sx, w, sw, bias, so, DType.INT16, c)
            want = _reference_out(acc, sx, sw, so, DType.INT16, c, -1, 0)
            assert_bits_equal(y.to(torch.int64), torch.from_numpy(want))


def test_centre_codes_and_zero_point_errors():
    x = torch.tensor([0, 255], dtype=torch.uint8)
    assert_bits_equal(centre_codes(x, 128), torch.tensor([-128, 127], dtype=torch.int16))
    x8 = torch.tensor([-128, 127], dtype=torch.int8)
    assert centre_codes(x8, 0) is x8
    with pytest.raises(ValueError, match="symmetric"):
        centre_codes(torch.zeros(2, dtype=torch.int16), 3)
    with pytest.raises(ValueError, match="outside the UINT8 range"):
        check_zero_point(-1, DType.UINT8)
    with pytest.raises(ValueError, match="integer"):
        check_zero_point(1.5, DType.INT8)


@pytest.mark.parametrize("act", ACTS)
def test_quantize_fake_quant_with_zero_points(act):
    dt, _ = ACTS[act]
    g = torch.Generator().manual_seed(11)
    for _ in range(20):
        x = torch.randn(300, generator=g) * 3
        x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
        s, zp = compute_zero_point_scale(float(x[4:].min()), float(x[4:].max()), dt)
        assert dt.qmin <= zp <= dt.qmax
        for mode in (Round.HALF_EVEN, Round.HALF_AWAY):
            codes = quantize(x, s, dt, mode, zero_point=zp)
            assert_bits_equal(
                codes.to(torch.int64), torch.from_numpy(R.quantize(x, s, dt, mode, zero_point=zp))
            )
            back = dequantize(codes, s, zero_point=zp)
            assert_bits_equal(back, (codes.to(torch.float32) - zp) * s)
            assert_bits_equal(fake_quant(x[4:], s, dt, mode, zero_point=zp), back[4:])
        fq = fake_quant(x[4:], s, dt, zero_point=zp, divide=Divide.BY_RECIPROCAL)
        r = np.float32(1) / np.float32(s)  # torch's kernel: x * fl32(1 / s), ties to even
        q = np.rint(x[4:].numpy() * r) + zp
        want = (np.clip(q, dt.qmin, dt.qmax) - zp).astype(np.float32) * np.float32(s)
        assert_bits_equal(fq, torch.from_numpy(want.astype(np.float32)))


@pytest.mark.parametrize("dt", [DType.INT8, DType.INT16])
def test_add_left_shift_matches_reference(dt):
    g = torch.Generator().manual_seed(5)
    tdt = dt.torch_dtype
    for i in range(N_CASES):
        a = torch.randint(dt.qmin, dt.qmax + 1, (40,), generator=g).to(tdt)
        b = torch.randint(dt.qmin, dt.qmax + 1, (40,), generator=g).to(tdt)
        za, zb, zo = (
            (0, 0, 0)
            if dt is DType.INT16
            else tuple(int(v) for v in torch.randint(-100, 101, (3,), generator=g))
        )
        sa, sb = (float(v) for v in torch.empty(2).uniform_(5e-3, 1e-1, generator=g))
        if i % 4 == 1:
            sa, sb = 2.0**-6, 2.0**-8
        so = max(sa, sb) * 2.5
        left = 15 if dt is DType.INT16 else 20
        got = add_left_shift(a, sa, b, sb, so, dt, left, (za, zb, zo))
        want = R.add_left_shift(a, sa, b, sb, so, dt, left, (za, zb, zo))
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


def test_add_shared_shift_matches_reference():
    g = torch.Generator().manual_seed(6)
    for i in range(N_CASES):
        a = torch.randint(-128, 128, (40,), generator=g).to(torch.int8)
        b = torch.randint(-128, 128, (40,), generator=g).to(torch.int8)
        z = tuple(int(v) for v in torch.randint(-100, 101, (3,), generator=g))
        sa, sb = (float(v) for v in torch.empty(2).uniform_(5e-3, 1e-1, generator=g))
        so = max(sa, sb) * (1.5 if i % 2 else 0.7)
        got = add_shared_shift(a, sa, b, sb, so, DType.INT8, 20, z)
        want = R.add_shared_shift(a, sa, b, sb, so, DType.INT8, 20, z)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))
    assert int(_wrap32(torch.tensor(1 << 31))) == -(1 << 31)


@pytest.mark.parametrize("act", list(ACTS))
def test_add_inter_scale_with_zero_points_matches_reference(act):
    """The J6 add rule extended to zero points (centred codes, zo after rounding), int8 and
    uint8, both schemes the J6 profiles use, power-of-two scales for exact ties."""
    dt, tdt = ACTS[act]
    g = torch.Generator().manual_seed(7)
    for i in range(N_CASES):
        a = _codes(g, (40,), dt, tdt)
        b = _codes(g, (40,), dt, tdt)
        z = tuple(int(v) for v in torch.randint(dt.qmin, dt.qmax + 1, (3,), generator=g))
        sa, sb = (float(v) for v in torch.empty(2).uniform_(5e-3, 1e-1, generator=g))
        if i % 4 == 1:
            sa, sb = 2.0**-6, 2.0**-8
        so = max(sa, sb) * (2.5 if i % 2 else 0.8)
        scheme = (Requant.MUL_SHIFT, Requant.FLOAT_RESCALE)[i % 2]
        rnd = (Round.HALF_UP, Round.HALF_EVEN)[i % 2]
        got = add_inter_scale(a, sa, b, sb, so, dt, scheme, rnd, zero_points=z)
        want = R.add_inter_scale(a, sa, b, sb, so, dt, scheme, rnd, zero_points=z)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


@pytest.mark.parametrize("rule", list(BoundRule))
def test_bound_rules_match_reference(rule):
    """Bounds at random scales and at the RELU6 tie scales (6.0f / s == k + 0.5 exactly)."""
    g = torch.Generator().manual_seed(9)
    ties = 0
    for i in range(200):
        if i % 2:
            k = int(torch.randint(20, 121, (1,), generator=g))
            s = float(np.float32(6.0 / (k + 0.5)))
            ties += float(np.float32(6.0) / np.float32(s)) == k + 0.5
        else:
            s = float(torch.empty(()).uniform_(0.01, 0.2, generator=g))
        zp = int(torch.randint(-100, 101, (1,), generator=g))
        lo, hi = bound_codes(0.0, 6.0, s, DType.INT8, zp, rule)
        want_hi = min(127, R.bound_code(6.0, s, zp, rule.name))
        assert (lo, hi) == (max(-128, R.bound_code(0.0, s, zp, rule.name)), want_hi)
    assert ties > 50


def test_rules_tell_the_bounds_apart_at_a_tie():
    s = float(np.float32(6.0 / 100.5))
    assert float(np.float32(6.0) / np.float32(s)) == 100.5
    his = {r: bound_codes(0.0, 6.0, s, DType.INT8, 0, r)[1] for r in BoundRule}
    assert his[BoundRule.FLOAT32_HALF_AWAY] == 101
    assert his[BoundRule.FLOAT32_ZERO_POINT_HALF_EVEN] == 100


def test_gemm_rules_select_per_family_and_validate():
    p = PlatformConfig(
        name="t",
        gemm_rules=[
            GemmRule(
                family=GemmFamily.LINEAR,
                activation=DType.INT8,
                requant=Requant.FLOAT64_RESCALE,
                requant_round=Round.HALF_AWAY,
            ),
            {
                "family": "CONV",
                "activation": "INT16",
                "accumulator": "INT64",
                "bias_dtype": "INT64",
                "requant": "MUL_SHIFT_INT64",
            },
        ],
    )
    assert p.gemm_contract().requant is Requant.MUL_SHIFT
    assert p.gemm_contract("linear", activation=DType.INT8).requant is Requant.FLOAT64_RESCALE
    assert p.gemm_contract("conv2d", activation=DType.INT8) == p.gemm_contract()
    wide = p.gemm_contract("conv2d", activation=DType.INT16)
    assert (wide.accumulator, wide.bias_dtype) == (DType.INT64, DType.INT64)
    with pytest.raises(ValueError, match=r"gemm_rules\[0\].*accumulator"):
        PlatformConfig(gemm_rules=[{"accumulator": "INT16"}])
    with pytest.raises(ValueError, match="GemmRule.activation"):
        GemmRule(activation=DType.INT32)
