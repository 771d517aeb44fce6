"""The one-pass C requantization (``gemm.requant_native``) against the int64 torch form and the
numpy reference, bit for bit, on random and adversarial sums; and ``finish_gemm`` taking it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bits import assert_bits_equal, edge_values
from native_builds import BUILDS, use_build

from quantlab.numerics import native
from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import GemmContract, GemmStats, finish_gemm, rescale32
from quantlab.numerics.gemm import requant_native as RN
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round, half_up_offset

CC = native.compiler()
needs_cc = pytest.mark.skipif(CC is None, reason="the native requantization needs a C compiler")
J6 = GemmContract()  # MUL_SHIFT, HALF_UP, int32 saturating accumulator
OUTS = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int16: (-32768, 32767)}
_DT = {torch.int8: DType.INT8, torch.uint8: DType.UINT8, torch.int16: DType.INT16}


@pytest.fixture(params=BUILDS)
def build(request, monkeypatch):
    """The kernels as the CPU loads them, the baseline build (no CPU-specific clones), or the
    code a CPU with AVX2 and no AVX-512 runs."""
    use_build(request.param, RN.KERNELS, monkeypatch)
    return request.param


def _int64_form(acc, q, off, n, axis, lo, hi):
    """floor((acc * q + off) / 2**n) clamped to [lo, hi], by int64 torch ops."""
    a = acc.to(torch.int64)
    shape = [1] * a.dim()
    shape[axis] = -1

    def along(t):
        return t.reshape(shape) if t.numel() > 1 else t.reshape(())

    return ((a * along(q) + along(off)) >> along(n)).clamp(lo, hi)


def _constants(g, channels: int, bias_max: int):
    """Multipliers and shifts across their whole range (extremes included) and offsets
    2**(n-1) + b * q with |b| <= bias_max."""
    q = torch.randint(0, 1 << 31, (channels,), generator=g)
    n = torch.randint(1, 63, (channels,), generator=g)
    # the largest q, zero, a power of two, and small q with small n, where consecutive sums
    # reach every residue of acc * q + off modulo 2**n (an off-by-one shows)
    k = min(5, channels)
    q[:k] = torch.tensor([(1 << 31) - 1, 0, 1 << 30, 1, 3])[:k]
    n[:k] = torch.tensor([1, 62, 31, 2, 3])[:k]
    b = torch.randint(-bias_max, bias_max + 1, (channels,), generator=g)
    b[:2] = torch.tensor([bias_max, -bias_max])[: min(2, channels)]
    return q, half_up_offset(n) + b * q, n


def _sums(g, shape, axis, q, off, n, limit):
    """Random sums within +-limit, the extremes, and per channel the sums at and next to each
    rounding tie (acc * q + off a multiple of 2**(n-1)) and each code step near 0."""
    acc = torch.randint(-limit, limit + 1, shape, generator=g)
    flat = acc.movedim(axis, -1).reshape(-1, shape[axis])
    rows = flat.shape[0]
    edges = torch.cat(
        [edge_values(DType.INT32).clamp(-limit, limit), torch.tensor([limit, -limit])]
    )
    for c in range(shape[axis]):
        qc, oc, nc = (int(t.reshape(-1)[c if t.numel() > 1 else 0]) for t in (q, off, n))
        vals = [int(v) for v in edges]
        if qc:
            for half_steps in range(-6, 7):
                target = (half_steps << nc) // 2 - oc  # acc * q at that value
                a = -((-target) // qc)
                vals += [a + d for d in (-2, -1, 0, 1, 2) if abs(a + d) <= limit]
        col = torch.tensor(vals)
        k = min(rows, col.numel())
        flat[:k, c] = col[torch.randperm(col.numel(), generator=g)[:k]]
    return flat.reshape(acc.movedim(axis, -1).shape).movedim(-1, axis).contiguous()


# "37 channels, last axis": rows longer than the vector loop's lanes, so its body and its
# remainder both run on every kind of constant (7 channels barely fill one vector)
LAYOUTS = {
    "per channel, axis 1": (7, (3, 7, 5, 9)),
    "per channel, last axis": (7, (60, 7)),
    "37 channels, last axis": (37, (40, 37)),
    "per tensor": (1, (3, 1, 5, 9)),
}


@needs_cc
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_pass_matches_the_int64_form_and_the_reference(seed, layout, build):
    g = torch.Generator().manual_seed(seed)
    channels, shape = LAYOUTS[layout]
    axis = 1
    bias_max = 1 << 20
    limit = (1 << 31) - 1 - bias_max  # |acc| + |b| < 2**31: the fast form's domain
    q, off, n = _constants(g, channels, bias_max)
    acc = _sums(g, shape, axis, q, off, n, limit)
    constants = RN.channel_constants(q, off, n, channels)
    assert constants is not None
    for dtype, (lo0, hi0) in OUTS.items():
        for lo, hi in ((lo0, hi0), (0, min(hi0, 6)), (3, 3), (max(lo0, -5), 40)):
            want = _int64_form(acc, q, off, n, axis, lo, hi)
            for a in (acc.to(torch.int32), acc, acc.to(torch.float64)):
                got = RN.requantize_shift(a, constants, axis, lo, hi, dtype)
                assert got is not None and got.dtype == dtype
                assert_bits_equal(got.to(torch.int64), want, inputs={"acc": acc})
                codes, values = RN.requantize_shift(a, constants, axis, lo, hi, dtype, 0.0371)
                assert_bits_equal(codes, got)
                s = torch.tensor(0.0371, dtype=torch.float32)
                assert_bits_equal(values, got.to(torch.float32) * s)
            small = acc.clamp(-(1 << 24), 1 << 24)  # float32 sums hold integers to 2**24
            got = RN.requantize_shift(small.to(torch.float32), constants, axis, lo, hi, dtype)
            assert_bits_equal(got.to(torch.int64), _int64_form(small, q, off, n, axis, lo, hi))
    # the numpy reference's requantization (HALF_UP, multiplier and shift as encoded)
    some = acc.to(torch.int64)[:2] if axis == 1 and acc.dim() == 4 else acc.to(torch.int64)
    got = RN.requantize_shift(some.contiguous(), constants, axis, -128, 127, torch.int8)
    for c in range(channels):
        qc, oc, nc = (int(t[c if t.numel() > 1 else 0]) for t in (q, off, n))
        a = some.select(axis, c).numpy().astype(object)  # Python integers: exact
        want = np.clip((a * qc + oc) // (1 << nc), -128, 127).astype(np.int64)
        assert_bits_equal(got.select(axis, c).to(torch.int64), torch.from_numpy(want))


@needs_cc
def test_what_the_pass_does_not_take():
    q, off, n = torch.tensor([5, 6]), torch.tensor([1, 2]), torch.tensor([1, 1])
    k = RN.channel_constants(q, off, n, 2)
    acc = torch.zeros(4, 2, dtype=torch.int32)
    assert RN.requantize_shift(acc.t(), k, 0, -128, 127, torch.int8) is None  # not contiguous
    assert RN.requantize_shift(acc.to(torch.int16), k, 1, -128, 127, torch.int8) is None
    assert RN.requantize_shift(acc, k, 1, -128, 127, torch.int32) is None
    assert RN.requantize_shift(torch.zeros(4, 3, dtype=torch.int32), k, 1, 0, 1, torch.int8) is None
    assert RN.channel_constants(q, off, n, 3) is None  # two channels' constants, three channels
    assert RN.channel_constants(torch.tensor(1 << 31), off[:1], n[:1], 1) is None
    assert RN.channel_constants(q[:1], off[:1], torch.tensor(63), 1) is None
    assert RN.channel_constants(q[:1], off[:1], torch.tensor(0), 1) is None


def _j6_case(g, channels):
    xs, so = torch.tensor(0.0123), torch.tensor(0.077)
    ws = torch.rand(channels, generator=g) * 0.01 + 1e-4
    bias = torch.randn(channels, generator=g) * 3
    return xs, ws, bias, so


@needs_cc
@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
def test_finish_gemm_takes_the_one_pass_with_the_general_forms_bits(out, build, monkeypatch):
    """finish_gemm's fast form runs as the one C pass (bias in the offset, and after the
    accumulator contract when the stated bound allows int32 overflow), with the bits of the
    general form (``stats=``) and of the numpy reference, fused clamps included."""
    calls = []
    real = RN.requantize_shift

    def spy(*a, **kw):
        got = real(*a, **kw)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(RN, "requantize_shift", spy)
    g = torch.Generator().manual_seed(5)
    channels = 6
    xs, ws, bias, so = _j6_case(g, channels)
    wide = torch.randint(-(1 << 31), 1 << 31, (300, channels), generator=g)
    small = torch.randint(-(1 << 16), 1 << 16, (300, channels), generator=g)
    acc = torch.cat([wide, small, edge_values(DType.INT32).repeat(channels, 1).t()])
    general = finish_gemm(acc, xs, ws, bias, so, out, J6, 1, stats=GemmStats())
    real_m = np.float64(np.float32(xs)) * ws.numpy().astype(np.float64) / np.float64(np.float32(so))
    a, _ = ref.accumulate(acc.numpy().astype(np.int64) + ref.quantize_bias(bias, xs, ws))
    want = ref.requantize(a, real_m, Requant.MUL_SHIFT, out, Round.HALF_UP, 1)
    assert_bits_equal(general.to(torch.int64), torch.from_numpy(want))
    for clamp in (None, (0, out.qmax), (-5, 40)):
        lo, hi = clamp or (out.qmin, out.qmax)
        expect = general.to(torch.int64).clamp_min(lo).clamp_max(hi)
        for sums, bound in ((acc, None), (acc.to(torch.int32), 1 << 31), (small, 1 << 16)):
            calls.clear()
            got = finish_gemm(
                sums, xs, ws, bias, so, out, J6, 1, sum_bound=bound, clamp_codes=clamp
            )
            assert calls == [True]  # the C pass ran
            rows = expect if sums is not small else expect[300:600]
            assert_bits_equal(got.to(torch.int64), rows, inputs={"acc": sums})


def _numpy_rescale(acc, m, b, axis, lo, hi, zp):
    """clamp(round_half_even(fl32(fl32(acc + b) * m)) + zp, lo, hi) in numpy float32."""
    shape = [1] * acc.dim()
    shape[axis] = -1
    a = acc.numpy().astype(np.float32)  # exact: |acc| <= 2**24
    t = (a + b.numpy().reshape(shape)) * m.numpy().reshape(shape)
    return torch.from_numpy(np.clip(np.rint(t).astype(np.int64) + zp, lo, hi))


@needs_cc
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", ["per channel, axis 1", "per channel, last axis", "per tensor"])
def test_float_rescale_pass_matches_the_float32_passes_and_numpy(seed, layout, build):
    """ONNX Runtime's float32 requantization in one pass: the codes of ``rescale32``'s torch
    passes and of numpy float32, on random sums up to 2**24, the extremes, and ties (M a power
    of two with sums that land on a half), with zero points, fused clamps and values."""
    g = torch.Generator().manual_seed(40 + seed)
    channels = 1 if layout == "per tensor" else 8
    shape = (60, channels) if layout == "per channel, last axis" else (3, channels, 5, 9)
    m = (torch.rand(channels, generator=g) * 0.02 + 1e-4).to(torch.float32)
    b = torch.randint(-(1 << 16), 1 << 16, (channels,), generator=g).to(torch.float32)
    ties_m = torch.tensor([0.5, 0.25, 2.0**-10, 1.0])
    m[: min(4, channels)] = ties_m[: min(4, channels)]  # halves: round half to even decides
    b[: min(2, channels)] = torch.tensor([0.0, 3.0])[: min(2, channels)]
    limit = 1 << 24
    acc = torch.randint(-limit, limit + 1, shape, generator=g)
    flat = acc.view(-1)
    flat[:64] = torch.cat([edge_values(DType.INT16), torch.tensor([limit, -limit])])[:64]
    near = torch.arange(-300, 300)  # small sums: every tie of M = 1/2 and 1/4
    flat[64 : 64 + near.numel()] = near[: max(0, min(near.numel(), flat.numel() - 64))]
    constants = RN.rescale_constants(m, b, channels)
    assert constants is not None
    for dtype, (lo0, hi0) in OUTS.items():
        zp = {torch.uint8: 128, torch.int8: -3, torch.int16: 0}[dtype]
        for lo, hi in ((lo0, hi0), (zp, hi0), (max(lo0, zp - 40), min(hi0, zp + 90))):
            want = _numpy_rescale(acc, m, b, 1, lo, hi, zp)
            along = [1] * acc.dim()
            along[1] = -1
            passes = rescale32.rescale_codes(
                acc, m.reshape(along), b.reshape(along), _DT[dtype], Round.HALF_EVEN, lo, hi, zp,
                False,
            )  # fmt: skip
            assert_bits_equal(passes.to(torch.int64), want, inputs={"acc": acc})
            for a in (acc.to(torch.int32), acc, acc.to(torch.float32), acc.to(torch.float64)):
                got = RN.requantize_rescale(a, constants, 1, lo, hi, zp, dtype)
                assert got is not None and got.dtype == dtype
                assert_bits_equal(got.to(torch.int64), want, inputs={"acc": acc})
                codes, values = RN.requantize_rescale(a, constants, 1, lo, hi, zp, dtype, 0.0371)
                assert_bits_equal(codes, got)
                s = torch.tensor(0.0371, dtype=torch.float32)
                assert_bits_equal(values, (got.to(torch.float32) - zp) * s)
    assert RN.rescale_constants(m, b[:3], channels) is None or channels == 1
    assert RN.rescale_constants(m.double(), None, channels) is None


@needs_cc
def test_finish_gemm_float_rescale_takes_the_one_pass(monkeypatch, build):
    """FLOAT_RESCALE with HALF_EVEN (the onnxruntime profile) runs as the one C pass, with the
    general form's codes (``stats=``), zero points and fused clamps included."""
    calls = []
    real = RN.requantize_rescale
    monkeypatch.setattr(
        RN, "requantize_rescale", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    ort = GemmContract(requant=Requant.FLOAT_RESCALE, requant_round=Round.HALF_EVEN)
    g = torch.Generator().manual_seed(12)
    channels = 6
    xs, ws, bias, so = _j6_case(g, channels)
    acc = torch.randint(-(1 << 24), 1 << 24, (2, channels, 11, 13), generator=g)
    for zp, out in ((128, DType.UINT8), (0, DType.INT8), (-7, DType.INT8)):
        for clamp in (None, (zp, out.qmax)):
            kw = dict(clamp_codes=clamp, out_zero_point=zp)
            general = finish_gemm(acc, xs, ws, bias, so, out, ort, 1, stats=GemmStats(), **kw)
            calls.clear()
            got = finish_gemm(acc, xs, ws, bias, so, out, ort, 1, sum_bound=1 << 24, **kw)
            assert calls
            assert_bits_equal(got, general, inputs={"acc": acc})


@needs_cc
def test_float_rescale_pass_on_every_sum_of_a_range(build):
    """Every sum in [-2**15, 2**15) on every channel, with multipliers that map the range
    across the int8 codes: thousands of products land within a float32 step of a half, where
    any other order of the two roundings (say acc * m + b * m) shows."""
    g = torch.Generator().manual_seed(77)
    channels = 6
    m = torch.tensor([0.0037, 0.00391, 0.0021, 0.0111, 0.00777, 0.0049])
    b = torch.randint(-300, 300, (channels,), generator=g).to(torch.float32)
    acc = torch.arange(-(1 << 15), 1 << 15).repeat(channels, 1).t().contiguous()
    constants = RN.rescale_constants(m, b, channels)
    for zp in (0, 5):
        want = _numpy_rescale(acc, m, b, 1, -128, 127, zp)
        got = RN.requantize_rescale(acc.to(torch.int32), constants, 1, -128, 127, zp, torch.int8)
        assert_bits_equal(got.to(torch.int64), want, inputs={"acc": acc})
        accs = acc.t().contiguous()  # channels first: the per-row loop
        got = RN.requantize_rescale(accs, constants, 0, -128, 127, zp, torch.int8)
        assert_bits_equal(got.to(torch.int64).t(), want)
