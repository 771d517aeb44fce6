"""The one-pass C requantization (``gemm.shift_native``) against the int64 torch form and the
numpy reference, bit for bit, on random and adversarial sums; and ``finish_gemm`` taking it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bits import assert_bits_equal, edge_values

from quantlab.numerics import native
from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import GemmContract, GemmStats, finish_gemm
from quantlab.numerics.gemm import shift_native as SN
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round, half_up_offset

CC = native.compiler()
needs_cc = pytest.mark.skipif(CC is None, reason="the native requantization needs a C compiler")
J6 = GemmContract()  # MUL_SHIFT, HALF_UP, int32 saturating accumulator
OUTS = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int16: (-32768, 32767)}


@pytest.fixture(params=["as loaded", "baseline"])
def build(request, monkeypatch):
    """The build the CPU loads, or the baseline build (no CPU-specific clones)."""
    if request.param == "baseline":
        kernels = native.Kernels(
            "requant_shift_baseline", "#define QL_NO_CLONES\n" + SN.SOURCE, SN.configure, "test"
        )
        monkeypatch.setattr(SN, "KERNELS", kernels)
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


@needs_cc
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["per channel, axis 1", "per channel, last axis", "per tensor"])
def test_one_pass_matches_the_int64_form_and_the_reference(seed, layout, build):
    g = torch.Generator().manual_seed(seed)
    channels = 1 if layout == "per tensor" else 7
    shape, axis = ((3, channels, 5, 9), 1) if layout != "per channel, last axis" else ((60, 7), 1)
    bias_max = 1 << 20
    limit = (1 << 31) - 1 - bias_max  # |acc| + |b| < 2**31: the fast form's domain
    q, off, n = _constants(g, channels, bias_max)
    acc = _sums(g, shape, axis, q, off, n, limit)
    constants = SN.channel_constants(q, off, n, channels)
    assert constants is not None
    for dtype, (lo0, hi0) in OUTS.items():
        for lo, hi in ((lo0, hi0), (0, min(hi0, 6)), (3, 3), (max(lo0, -5), 40)):
            want = _int64_form(acc, q, off, n, axis, lo, hi)
            for a in (acc.to(torch.int32), acc, acc.to(torch.float64)):
                got = SN.requantize_shift(a, constants, axis, lo, hi, dtype)
                assert got is not None and got.dtype == dtype
                assert_bits_equal(got.to(torch.int64), want, inputs={"acc": acc})
                codes, values = SN.requantize_shift(a, constants, axis, lo, hi, dtype, 0.0371)
                assert_bits_equal(codes, got)
                s = torch.tensor(0.0371, dtype=torch.float32)
                assert_bits_equal(values, got.to(torch.float32) * s)
            small = acc.clamp(-(1 << 24), 1 << 24)  # float32 sums hold integers to 2**24
            got = SN.requantize_shift(small.to(torch.float32), constants, axis, lo, hi, dtype)
            assert_bits_equal(got.to(torch.int64), _int64_form(small, q, off, n, axis, lo, hi))
    # the numpy reference's requantization (HALF_UP, multiplier and shift as encoded)
    some = acc.to(torch.int64)[:2] if axis == 1 and acc.dim() == 4 else acc.to(torch.int64)
    got = SN.requantize_shift(some.contiguous(), constants, axis, -128, 127, torch.int8)
    for c in range(channels):
        qc, oc, nc = (int(t[c if t.numel() > 1 else 0]) for t in (q, off, n))
        a = some.select(axis, c).numpy().astype(object)  # Python integers: exact
        want = np.clip((a * qc + oc) // (1 << nc), -128, 127).astype(np.int64)
        assert_bits_equal(got.select(axis, c).to(torch.int64), torch.from_numpy(want))


@needs_cc
def test_what_the_pass_does_not_take():
    q, off, n = torch.tensor([5, 6]), torch.tensor([1, 2]), torch.tensor([1, 1])
    k = SN.channel_constants(q, off, n, 2)
    acc = torch.zeros(4, 2, dtype=torch.int32)
    assert SN.requantize_shift(acc.t(), k, 0, -128, 127, torch.int8) is None  # not contiguous
    assert SN.requantize_shift(acc.to(torch.int16), k, 1, -128, 127, torch.int8) is None
    assert SN.requantize_shift(acc, k, 1, -128, 127, torch.int32) is None
    assert SN.requantize_shift(torch.zeros(4, 3, dtype=torch.int32), k, 1, 0, 1, torch.int8) is None
    assert SN.channel_constants(q, off, n, 3) is None  # two channels' constants, three channels
    assert SN.channel_constants(torch.tensor(1 << 31), off[:1], n[:1], 1) is None
    assert SN.channel_constants(q[:1], off[:1], torch.tensor(63), 1) is None
    assert SN.channel_constants(q[:1], off[:1], torch.tensor(0), 1) is None


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
    real = SN.requantize_shift

    def spy(*a, **kw):
        got = real(*a, **kw)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(SN, "requantize_shift", spy)
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
