"""High/low split: exact references (Fractions, numpy int64 loops) against the fast paths."""

from fractions import Fraction

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import Overflow
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round
from quantlab.numerics.split import (
    SplitCombine,
    check_split_k,
    check_split_target,
    combine_partials,
    combine_split,
    exact_conv2d,
    multiplier_shift,
    requant_partial,
    split_conv2d,
    split_error_bound,
    split_fake_weight,
    split_int16_codes,
    split_linear,
    split_matmul,
    split_weight,
)


def _round_frac(q: Fraction, mode: Round) -> int:
    fl = q.numerator // q.denominator
    rem = q - fl
    if mode is Round.HALF_EVEN:
        if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2 == 1):
            return fl + 1
        return fl
    if mode is Round.HALF_UP:
        return fl + 1 if rem >= Fraction(1, 2) else fl
    raise AssertionError(mode)


def split_weight_reference(w, s, k, mode=Round.HALF_EVEN):
    """Exact rational split of a 1-D float32 weight row with one float32 scale."""
    hi, lo = [], []
    sf = Fraction(float(s))
    for v in w.tolist():
        q32 = float(torch.tensor(v, dtype=torch.float32) / torch.tensor(float(s)))  # IEEE f32 div
        h = max(-128, min(127, _round_frac(Fraction(q32), mode)))
        r = Fraction(v) - sf * h
        lo_v = max(-128, min(127, _round_frac(r * 2**k / sf, mode)))
        hi.append(h)
        lo.append(lo_v)
    return torch.tensor(hi, dtype=torch.int8), torch.tensor(lo, dtype=torch.int8)


def _weights(seed, n=2000):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=g) * 0.05
    s = float(w.abs().max()) / 127.5
    st = torch.tensor(s, dtype=torch.float32)
    adversarial = (
        torch.tensor(
            [0.0, -0.0, 1e-30, -1e-30, 127.5, -127.5, 127.49, -128.0, 0.5, -0.5, 1.5, 2.5, 63.5]
        )
        * st
    )
    ties_lo = (torch.arange(-70, 70).float() + 0.5) * st / 128  # residual ties for k = 7
    return torch.cat([w, adversarial, ties_lo]).to(torch.float32), st


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [7, 8])
@pytest.mark.parametrize("mode", [Round.HALF_EVEN, Round.HALF_UP])
def test_split_weight_matches_exact_reference(seed, k, mode):
    w, s = _weights(seed, 400)
    hi, lo = split_weight(w, s, k, axis=None, rounding=mode)
    rhi, rlo = split_weight_reference(w, s, k, mode)
    assert_bits_equal(hi, rhi, inputs={"w": w})
    assert_bits_equal(lo, rlo, inputs={"w": w})


def test_split_weight_max_error_is_s_over_2_pow_k_plus_1():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 3, 3, 3, generator=g) * torch.rand(64, 1, 1, 1, generator=g)
    s = (w.abs().amax(dim=(1, 2, 3)) / 127.5).to(torch.float32)
    k = 7
    wq = split_fake_weight(w, s, k, axis=0)
    hi, lo = split_weight(w, s, k, axis=0)
    exact = s.double().reshape(-1, 1, 1, 1) * (hi.double() + lo.double() / 2**k)
    err = (w.double() - exact).abs()
    bound = split_error_bound(s, k).reshape(-1, 1, 1, 1)
    assert bool((err <= bound).all())
    assert float((err / bound).max()) > 0.95  # the bound is reached, not loose
    assert int(lo.abs().max()) <= 64  # k = 7 never clips
    # the float32 weights differ from the exact split value by one float32 rounding only
    assert bool(((wq.double() - exact).abs() <= exact.abs() * 2**-24).all())
    # versus one int8 pass: s / 2
    one_pass = (w - torch.round(w / s.reshape(-1, 1, 1, 1)) * s.reshape(-1, 1, 1, 1)).abs()
    assert float(one_pass.max()) > 60 * float(err.max())


def test_split_k8_clips_only_plus_128():
    s = torch.tensor(1.0)
    w = torch.tensor([127.5, -127.5, 0.5, -0.5])  # residual +-s/2 -> lo = +-128
    hi, lo = split_weight(w, s, 8, axis=None)
    assert lo.tolist() == [127, 127, 127, -128]
    assert hi.tolist() == [127, -128, 0, 0]


@pytest.mark.parametrize("bad", [0, 9, 16, -1, 7.0, True])
def test_bad_k_names_field_and_allowed_values(bad):
    with pytest.raises(ValueError, match=r"weight_split k=.*allowed.*\[1, 2, 3, 4, 5, 6, 7, 8\]"):
        check_split_k(bad)
    with pytest.raises(ValueError, match="weight_split"):
        split_weight(torch.ones(3), 1.0, bad, axis=None)


def test_split_needs_a_weight():
    with pytest.raises(TypeError, match="float weights"):
        split_weight(torch.ones(3, dtype=torch.int8), 1.0, 7, axis=None)


def test_int16_byte_split_exhaustive():
    c = torch.arange(-32768, 32640, dtype=torch.int64)
    hi, lo = split_int16_codes(c.to(torch.int16))
    assert hi.dtype == torch.int8 and lo.dtype == torch.int8
    assert_bits_equal(hi.long() * 256 + lo.long(), c)
    with pytest.raises(ValueError, match=r"\[-32768, 32639\].*int16_operand_max"):
        split_int16_codes(torch.tensor([32640], dtype=torch.int16))


def requant_reference(acc: int, real: float, mode: Round, mult_bits: int) -> int:
    """Python-int multiplier/shift: real ~ M / 2**n, one rounding of acc * M / 2**n."""
    m, e = np.frexp(real)
    big = int(Fraction(m) * 2**mult_bits + Fraction(1, 2))  # ties away (m > 0)
    n = mult_bits - int(e)
    if big == 2**mult_bits:
        big //= 2
        n -= 1
    return _round_frac(Fraction(acc * big, 2**n), mode)


def combine_reference(parts, real, out, combine, mode, mult_bits=31, wide_mult_bits=15):
    e_min = min(e for _, e in parts)
    flat = [a.reshape(-1).tolist() for a, _ in parts]
    res = []
    for vals in zip(*flat):
        if combine is SplitCombine.WIDE_ACCUMULATOR:
            wide = sum(v * 2 ** (e - e_min) for v, (_, e) in zip(vals, parts))
            wide = max(-(2**47), min(2**47 - 1, wide))
            y = requant_reference(wide, real * 2.0**e_min, mode, wide_mult_bits)
        else:
            y = sum(
                requant_reference(v, real * 2.0**e, mode, mult_bits)
                for v, (_, e) in zip(vals, parts)
            )
        res.append(max(out.qmin, min(out.qmax, y)))
    return torch.tensor(res, dtype=out.torch_dtype).reshape(parts[0][0].shape)


@pytest.mark.parametrize("combine", list(SplitCombine))
@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("k", [7, 8])
def test_combine_split_matches_reference(combine, out, k):
    g = torch.Generator().manual_seed(k)
    acc_hi = torch.randint(-(2**20), 2**20, (300,), generator=g)
    acc_lo = torch.randint(-(2**20), 2**20, (300,), generator=g)
    edges = torch.tensor([0, 1, -1, 2**31 - 1, -(2**31), 64, -64, 2**k, -(2**k)])
    acc_hi = torch.cat([acc_hi, edges, edges.flip(0)])
    acc_lo = torch.cat([acc_lo, edges.flip(0), edges])
    real = 3.1e-4 if out is DType.INT8 else 1.7e-2
    y = combine_split(acc_hi, acc_lo, k, real, out, combine)
    ref = combine_reference([(acc_hi, 0), (acc_lo, -k)], real, out, combine, Round.HALF_UP)
    assert_bits_equal(y, ref, inputs={"hi": acc_hi, "lo": acc_lo})


def test_combine_modes_differ_by_at_most_one_lsb_and_do_differ():
    g = torch.Generator().manual_seed(5)
    acc_hi = torch.randint(-4000, 4000, (20000,), generator=g)
    acc_lo = torch.randint(-(2**13), 2**13, (20000,), generator=g)
    real = 0.0123
    wide = combine_split(acc_hi, acc_lo, 7, real, DType.INT16, SplitCombine.WIDE_ACCUMULATOR)
    sep = combine_split(acc_hi, acc_lo, 7, real, DType.INT16, SplitCombine.SEPARATE_REQUANT)
    d = (wide.long() - sep.long()).abs()
    assert int(d.max()) == 1 and int((d > 0).sum()) > 100


def test_multiplier_shift_is_exact_for_powers_of_two_and_bounded():
    big, n = multiplier_shift(torch.tensor([0.5, 2.0**-20, 0.3], dtype=torch.float64), 31)
    assert big.tolist()[:2] == [2**30, 2**30]
    assert n.tolist()[:2] == [31, 50]
    assert abs(big[2].item() / 2 ** n[2].item() - 0.3) < 2**-32


def conv2d_reference(x: np.ndarray, w: np.ndarray, stride=1, padding=0, groups=1):
    """Plain int64 loops over output positions (NCHW / OIHW)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - kh) // stride + 1
    ow = (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), dtype=np.int64)
    opg = o // groups
    for oc in range(o):
        gi = oc // opg
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, gi * cg : (gi + 1) * cg, i * stride : i * stride + kh]
                patch = patch[:, :, :, j * stride : j * stride + kw]
                out[:, oc, i, j] = (patch * w[oc].astype(np.int64)).sum(axis=(1, 2, 3))
    return out


@pytest.mark.parametrize("combine", list(SplitCombine))
@pytest.mark.parametrize("groups", [1, 4])
def test_split_conv_fixed_equals_sum_of_two_int8_reference_convs(combine, groups):
    g = torch.Generator().manual_seed(groups)
    x = torch.randint(-128, 128, (2, 8, 7, 7), generator=g, dtype=torch.int64).to(torch.int8)
    w = torch.randn(8, 8 // groups, 3, 3, generator=g) * 0.1
    bias = torch.randn(8, generator=g) * 0.05
    w_scale = (w.abs().amax(dim=(1, 2, 3)) / 127.5).to(torch.float32)
    x_scale, out_scale, k = 0.02, 0.01, 7
    y = split_conv2d(
        x,
        x_scale,
        w,
        w_scale,
        k,
        out_scale,
        DType.INT8,
        combine,
        bias=bias,
        padding=1,
        stride=2,
        groups=groups,
    )
    w_hi, w_lo = split_weight(w, w_scale, k)
    acc_hi = conv2d_reference(x.numpy(), w_hi.numpy(), stride=2, padding=1, groups=groups)
    acc_lo = conv2d_reference(x.numpy(), w_lo.numpy(), stride=2, padding=1, groups=groups)
    from quantlab.numerics import reference

    unit = x_scale * w_scale.double()
    b = torch.from_numpy(reference.quantize_bias(bias, x_scale, w_scale)).reshape(1, -1, 1, 1)

    lib_ref = reference.int_conv2d(x, w_lo, stride=2, padding=1, groups=groups)
    assert_bits_equal(
        torch.from_numpy(np.asarray(lib_ref, dtype=np.int64)), torch.from_numpy(acc_lo)
    )
    acc_hi = torch.from_numpy(acc_hi) + b
    acc_lo = torch.from_numpy(acc_lo)
    assert_bits_equal(exact_conv2d(x, w_hi, stride=2, padding=1, groups=groups) + b, acc_hi)
    real = unit / out_scale
    ref = torch.empty_like(y)
    for c in range(8):  # per-channel reference requantization
        parts = [(acc_hi[:, c], 0), (acc_lo[:, c], -k)]
        ref[:, c] = combine_reference(parts, float(real[c]), DType.INT8, combine, Round.HALF_UP)
    assert_bits_equal(y, ref)


def test_split_matmul_int16_operands_equal_exact_product():
    g = torch.Generator().manual_seed(9)
    a = torch.randint(-32768, 32640, (5, 40), generator=g).to(torch.int16)
    b = torch.randint(-32768, 32640, (40, 6), generator=g).to(torch.int16)
    real = 2.0**-30 * 1.37
    for split_a, split_b in [(True, False), (False, True), (True, True)]:
        y = split_matmul(
            a,
            b,
            split_a,
            split_b,
            real,
            DType.INT16,
            SplitCombine.WIDE_ACCUMULATOR,
            overflow=Overflow.SATURATE,
        )
        prod = a.long() @ b.long()
        if split_a and split_b:  # four passes -> exact product in one wide accumulator
            ref = combine_reference(
                [(prod, 0)], real, DType.INT16, SplitCombine.WIDE_ACCUMULATOR, Round.HALF_UP
            )
            assert_bits_equal(y, ref)
    sep = split_matmul(a, b, True, True, real, DType.INT16, SplitCombine.SEPARATE_REQUANT)
    assert int((sep.long() - y.long()).abs().max()) <= 3


def test_float_output_combine():
    acc_hi = torch.tensor([1000, -3, 7])
    acc_lo = torch.tensor([5, 100, -64])
    y = combine_split(acc_hi, acc_lo, 7, 0.001, DType.FLOAT32, SplitCombine.WIDE_ACCUMULATOR)
    exact = (acc_hi.double() + acc_lo.double() / 128) * 0.001
    assert torch.allclose(y.double(), exact, rtol=2**-23, atol=0)
    y16 = combine_split(acc_hi, acc_lo, 7, 0.001, DType.FLOAT16, SplitCombine.SEPARATE_REQUANT)
    assert torch.equal(y16, y16.half().float())


def test_bad_inputs():
    with pytest.raises(ValueError, match="combine"):
        combine_split(torch.ones(2), torch.ones(2), 7, 0.1, DType.INT8, "wide")
    with pytest.raises(ValueError, match="MUL_SHIFT, FLOAT_RESCALE"):
        combine_split(
            torch.ones(2, dtype=torch.int64),
            torch.ones(2, dtype=torch.int64),
            7,
            0.1,
            DType.INT8,
            SplitCombine.WIDE_ACCUMULATOR,
            scheme=Requant.MUL_SHIFT_DOUBLE,
        )
    with pytest.raises(ValueError, match="at least one"):
        combine_partials([], 0.1, DType.INT8, SplitCombine.WIDE_ACCUMULATOR)


@pytest.mark.parametrize("rounding", [Round.HALF_UP, Round.HALF_EVEN, Round.HALF_AWAY])
def test_separate_partial_requant_equals_numerics_requantize(rounding):
    from quantlab.numerics.requant import make_requant, requantize

    g = torch.Generator().manual_seed(11)
    acc = torch.randint(-(2**31), 2**31, (4000,), generator=g)
    for real in (3.3e-5, 0.0123, 0.49):
        mine = requant_partial(acc, real, rounding, Requant.MUL_SHIFT, 31)
        theirs = requantize(acc, make_requant(real, Requant.MUL_SHIFT), DType.INT16, rounding)
        assert_bits_equal(mine.clamp(-32768, 32767).to(torch.int16), theirs)


def test_split_on_an_op_without_weight_fails_clearly():
    assert check_split_target("features.0.0:conv2d#0", "conv2d", True, 7) == 7
    assert check_split_target(":matmul#0", "matmul", False, 7) == 7  # its second operand
    with pytest.raises(ValueError, match=r"':bmm#0' \(bmm\), which has no weight"):
        check_split_target(":bmm#0", "bmm", False, 7)
    with pytest.raises(ValueError, match="no weight"):
        check_split_target(":sigmoid#0", "sigmoid", False, 8)
    with pytest.raises(ValueError, match="weight_split k=9"):
        check_split_target("fc:linear#0", "linear", True, 9)


def test_tiny_real_scale_flushes_to_zero_like_requantize():
    from quantlab.numerics.requant import make_requant, requantize

    acc = torch.tensor([0, 5, -(2**31), 2**31 - 1])
    mine = requant_partial(acc, 8.3e-11, Round.HALF_UP, Requant.MUL_SHIFT, 31)
    theirs = requantize(acc, make_requant(8.3e-11, Requant.MUL_SHIFT), DType.INT16, Round.HALF_UP)
    assert mine.tolist() == theirs.tolist() == [0, 0, 0, 0]
    y = combine_split(
        acc,
        acc,
        7,
        torch.tensor([8.3e-11, 0.01, 1e-3, 2e-4], dtype=torch.float64),
        DType.INT8,
        SplitCombine.SEPARATE_REQUANT,
        axis=0,
    )
    assert y[0] == 0


@pytest.mark.parametrize("combine", list(SplitCombine))
def test_split_linear_equals_reference(combine):
    from quantlab.numerics import reference

    g = torch.Generator().manual_seed(21)
    x = torch.randint(-128, 128, (3, 5, 40), generator=g).to(torch.int8)
    w = torch.randn(6, 40, generator=g) * 0.2
    bias = torch.randn(6, generator=g) * 0.1
    ws = (w.abs().amax(1) / 127.5).to(torch.float32)
    y = split_linear(x, 0.03, w, ws, 8, 0.02, DType.INT16, combine, bias=bias)
    hi, lo = split_weight(w, ws, 8)
    unit = 0.03 * ws.double()
    acc_hi = torch.from_numpy(np.asarray(reference.int_linear(x, hi), dtype=np.int64))
    acc_hi = acc_hi + torch.from_numpy(reference.quantize_bias(bias, 0.03, ws))
    acc_lo = torch.from_numpy(np.asarray(reference.int_linear(x, lo), dtype=np.int64))
    ref = torch.empty_like(y)
    for c in range(6):
        parts = [(acc_hi[..., c], 0), (acc_lo[..., c], -8)]
        ref[..., c] = combine_reference(
            parts, float(unit[c] / 0.02), DType.INT16, combine, Round.HALF_UP
        )
    assert_bits_equal(y, ref)


@pytest.mark.parametrize("combine", list(SplitCombine))
@pytest.mark.parametrize("op", ["linear", "conv2d"])
def test_split_bias_is_the_int32_bias_of_every_gemm(op, combine):
    """The split GEMM adds the int32 bias codes every GEMM adds (the ONNX rule
    round_half_even(fl32(bias / fl32(s_x * s_w))) saturated to int32; numerics.reference),
    not float64 quotients: biases at float32 ties round differently, and a bias beyond int32
    saturates before the accumulator adds a negative sum. FLOAT32 output (out_scale 1: the
    value of the combined accumulator), so one bias code shows."""
    from quantlab.numerics import reference

    g = torch.Generator().manual_seed(11)
    c, k_in, k, sx = 64, 16, 8, 0.03
    w = torch.rand(c, k_in, generator=g) * 0.2 + 0.01  # positive: x = -128 gives negative sums
    ws = (w.abs().amax(1) / 127.5).to(torch.float32)
    u32 = torch.tensor(sx, dtype=torch.float32) * ws
    n = torch.randint(0, 1 << 12, (c,), generator=g).double()
    bias = ((n + 0.5) * u32.double()).float()  # fl32 quotients at (or next to) a tie
    bias[0] = 1e6  # about 2**37 codes: saturates to 2**31 - 1
    x = torch.stack([torch.zeros(k_in), torch.full((k_in,), -128.0)]).to(torch.int8)
    codes = reference.quantize_bias(bias, sx, ws)
    unit = sx * ws.double()
    old = np.round(bias.double().numpy() / unit.numpy())  # float64, unsaturated
    assert codes[0] == 2**31 - 1 and (old != codes).sum() > 1  # the cases that tell them apart
    if op == "linear":
        y = split_linear(x, sx, w, ws, k, 1.0, DType.FLOAT32, combine, bias=bias)
    else:
        x4, w4 = x.reshape(2, k_in, 1, 1), w.reshape(c, k_in, 1, 1)
        y = split_conv2d(x4, sx, w4, ws, k, 1.0, DType.FLOAT32, combine, bias=bias)
        y = y.reshape(2, c)
    hi, lo = split_weight(w, ws, k)
    acc_hi, _ = reference.accumulate(reference.int_linear(x, hi) + codes)
    acc_lo, _ = reference.accumulate(reference.int_linear(x, lo))
    want = combine_split(
        torch.from_numpy(acc_hi), torch.from_numpy(acc_lo), k, unit, DType.FLOAT32, combine, axis=-1
    )
    assert_bits_equal(y, want)
