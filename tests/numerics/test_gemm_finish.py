"""finish_gemm and requantize: the MUL_SHIFT / HALF_UP fast form gives the bits of the general
form and of the integer reference (per tensor and per channel, bias folded into the rounding
offset or through the accumulator, many channel chunks, fused clamps, float32 sums)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from bits import assert_bits_equal, edge_values

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import (
    GemmContract,
    GemmPath,
    GemmStats,
    finish_gemm,
    int_conv2d,
    shift_form,
)
from quantlab.numerics.gemm import finish as finish_mod
from quantlab.numerics.quantize import QuantStats
from quantlab.numerics.requant import Requant, make_requant, requantize
from quantlab.numerics.rounding import Round

# AUTO's int8 paths are what these tests check (conftest pins the probe to "slow")
pytestmark = pytest.mark.usefixtures("int8_product_fast")

J6 = GemmContract()  # MUL_SHIFT, HALF_UP, int32 saturating accumulator


@pytest.fixture
def torch_passes(monkeypatch):
    """The fast form by torch passes (float64 or int64), as where no C compiler is found: the
    one C pass (``requant_native``, tested in test_requant_native.py) off."""
    monkeypatch.setattr(shift_form, "_finish_native", lambda *a, **kw: None)


@pytest.fixture(params=["one C pass", "torch passes"])
def fast_form(request, monkeypatch):
    if request.param == "torch passes":
        monkeypatch.setattr(shift_form, "_finish_native", lambda *a, **kw: None)
    return request.param


def _accs(seed: int, n: int = 4000) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rnd = torch.randint(-(1 << 31), 1 << 31, (n,), generator=g, dtype=torch.int64)
    small = torch.randint(-5000, 5000, (n,), generator=g, dtype=torch.int64)
    return torch.cat([edge_values(DType.INT32), rnd, small])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("mult_bits", [31, 15])
def test_requantize_fast_form_equals_general_form(seed, out, mult_bits):
    # stats= forces the general (rshift_round) form, itself checked against the reference
    g = torch.Generator().manual_seed(100 + seed)
    acc = _accs(seed)
    reals = torch.cat(
        [
            torch.rand(6, generator=g, dtype=torch.float64) * 10.0 ** -torch.arange(6),
            torch.tensor([0.5, 0.25, 2.0**-20, 0.999999, 1e-9, 0.0, 3.0], dtype=torch.float64),
        ]
    )
    for real in reals:
        p = make_requant(real, Requant.MUL_SHIFT, mult_bits)
        fast = requantize(acc, p, out, Round.HALF_UP)
        general = requantize(acc, p, out, Round.HALF_UP, stats=QuantStats())
        assert_bits_equal(fast, general, inputs={"acc": acc})
    acc2 = acc[: 13 * 300].reshape(300, 13)
    p = make_requant(reals, Requant.MUL_SHIFT, mult_bits)
    fast = requantize(acc2, p, out, Round.HALF_UP, axis=1)
    assert_bits_equal(fast, requantize(acc2, p, out, Round.HALF_UP, axis=1, stats=QuantStats()))
    some = acc2[:40]
    want = ref.requantize(some, reals.numpy(), Requant.MUL_SHIFT, out, Round.HALF_UP, 1, mult_bits)
    assert_bits_equal(fast[:40].to(torch.int64), torch.from_numpy(want))


def _reference_finish(acc, xs, ws, bias, so, axis, clamp=None):
    a = acc.numpy().astype(np.int64)
    if bias is not None:
        b = ref.quantize_bias(bias, xs, ws)
        shape = [1] * a.ndim
        shape[axis] = -1
        a = a + b.reshape(shape)
    a, _ = ref.accumulate(a)
    real = np.float64(np.float32(xs)) * np.asarray(ws, dtype=np.float32).astype(np.float64)
    real = real / np.float64(np.float32(so))
    out = ref.requantize(a, real, Requant.MUL_SHIFT, DType.INT8, Round.HALF_UP, axis)
    if clamp is not None:
        out = np.minimum(np.maximum(out, clamp[0]), clamp[1])
    return torch.from_numpy(out)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finish_gemm_fast_form_matches_reference_over_many_chunks(
    per_channel, seed, fast_form, monkeypatch
):
    monkeypatch.setattr(shift_form, "CHUNK_ELEMENTS", 700)  # several channel chunks
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (2, 40, 9, 9), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (16, 40, 3, 3), generator=g, dtype=torch.int8)
    if seed == 2:  # adversarial: all operands at the extremes
        x = torch.full_like(x, -128)
        w = torch.full_like(w, -128)
    xs = torch.tensor(0.02)
    ws = torch.rand(16, generator=g) * 0.01 + 1e-4 if per_channel else torch.tensor(0.004)
    bias = torch.randn(16, generator=g)
    so = torch.tensor(0.7 if seed == 2 else 0.05)
    acc = int_conv2d(x, w, 1, 1)
    want = _reference_finish(acc, xs, ws, bias, so, 1)
    general = finish_gemm(acc, xs, ws, bias, so, DType.INT8, J6, 1, stats=GemmStats())
    assert_bits_equal(general.to(torch.int64), want)
    bound = 360 * 128 * 128
    for b in (bound, 1 << 31, None):  # bias in the offset / through the accumulator / measured
        kept = acc.clone()
        got = finish_gemm(acc, xs, ws, bias, so, DType.INT8, J6, 1, sum_bound=b)
        assert_bits_equal(got.to(torch.int64), want)
        assert_bits_equal(acc, kept)  # reuse_acc=False leaves the sums alone
    acc32 = int_conv2d(x, w, 1, 1, as_int64=False)  # the INT32 path's int32 sums
    assert acc32.dtype == torch.int32
    got = finish_gemm(acc32, xs, ws, bias, so, DType.INT8, J6, 1, sum_bound=bound, reuse_acc=True)
    assert_bits_equal(got.to(torch.int64), want)
    accf = int_conv2d(x, w, 1, 1, path=GemmPath.FLOAT32, as_int64=False)  # one float32 chunk
    assert accf.dtype == torch.float32
    got = finish_gemm(accf, xs, ws, bias, so, DType.INT8, J6, 1, sum_bound=bound, reuse_acc=True)
    assert_bits_equal(got.to(torch.int64), want)
    clamped = finish_gemm(acc.clone(), xs, ws, bias, so, DType.INT8, J6, 1, clamp_codes=(0, 50))
    assert_bits_equal(clamped.to(torch.int64), _reference_finish(acc, xs, ws, bias, so, 1, (0, 50)))


def test_finish_gemm_constants_are_keyed_by_value_not_by_object():
    g = torch.Generator().manual_seed(4)
    acc = torch.randint(-(1 << 20), 1 << 20, (6, 5), generator=g)
    bias = torch.randn(5, generator=g)
    a = finish_gemm(acc, 0.02, torch.full((5,), 0.01), bias, 0.3, DType.INT8, J6, 1)
    bias.mul_(3.0)  # the same tensor object, new values
    b = finish_gemm(acc, 0.02, torch.full((5,), 0.01), bias, 0.3, DType.INT8, J6, 1)
    want = _reference_finish(acc, 0.02, np.full(5, 0.01, np.float32), bias, 0.3, 1)
    assert_bits_equal(b.to(torch.int64), want)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("scales", [(0.5, 0.5, 1.0), (0.02, 0.0037, 0.05), (0.9, 0.7, 1e-3)])
@pytest.mark.usefixtures("torch_passes")
def test_finish_gemm_float64_form_is_exact_up_to_its_limit(out, scales, monkeypatch):
    # the float64 passes run only while (max|acc| * max q + max|offset|) <= 2**53; at the limit,
    # on rounding ties (scales 0.5 * 0.5 / 1: every acc = 2 mod 4 is a tie) and past the limit
    # (int64 passes) the codes are the general form's and the reference's
    calls = []
    real_float64 = shift_form._finish_float64

    def spy(*a, **kw):
        calls.append(1)
        return real_float64(*a, **kw)

    monkeypatch.setattr(shift_form, "_finish_float64", spy)
    xs, ws, so = (torch.tensor(v) for v in scales)
    g = torch.Generator().manual_seed(7)
    bias = torch.tensor([0.37])
    # the output-window proof (tested below) off: this test is about the max|acc| limit
    k = dataclasses.replace(finish_mod._constants(xs, ws, bias, so, out, J6), float_window=-1)
    limit = k.float_limit
    assert limit > 0
    near = torch.tensor([limit, -limit, limit - 1, 1 - limit, 0, 1, -1, 2, -2, 6, -6])
    rnd = torch.randint(-limit, limit + 1, (3000,), generator=g)
    ties = torch.arange(-4002, 4003, 4)
    for values, float_path in ((torch.cat([near, rnd, ties]), True), (near + limit, False)):
        if float_path is False and int(values.abs().max()) + k.bias_max >= 1 << 31:
            values = values.clamp(-(1 << 30), 1 << 30)
            float_path = int(values.abs().max()) <= limit
        acc = values.reshape(-1, 1)
        calls.clear()
        got = finish_gemm(acc, xs, ws, bias, so, out, J6, 1, sum_bound=None, constants=k)
        assert bool(calls) is float_path
        general = finish_gemm(acc, xs, ws, bias, so, out, J6, 1, stats=GemmStats())
        assert_bits_equal(got, general, inputs={"acc": acc})
        for reuse in (False, True):  # float64 sums: widened in place, or left alone
            acc64 = acc.to(torch.float64)
            got64 = finish_gemm(acc64, xs, ws, bias, so, out, J6, 1, reuse_acc=reuse, constants=k)
            assert_bits_equal(got64, general, inputs={"acc": acc})
            if not reuse:
                assert_bits_equal(acc64, acc.to(torch.float64))
        for clamp in ((0, out.qmax), (3, 90), (-5, 40)):  # fused relus: lo >= 0 truncates
            calls.clear()
            got_c = finish_gemm(acc, xs, ws, bias, so, out, J6, 1, clamp_codes=clamp, constants=k)
            assert bool(calls) is float_path
            want_c = general.to(torch.int64).clamp_min(clamp[0]).clamp_max(clamp[1])
            assert_bits_equal(got_c.to(torch.int64), want_c, inputs={"acc": acc})
        real = np.float64(np.float32(xs)) * np.float64(np.float32(ws)) / np.float64(np.float32(so))
        a = acc.numpy().astype(np.int64) + ref.quantize_bias(bias, xs, ws).reshape(1, -1)
        want = ref.requantize(a, np.array([real]), Requant.MUL_SHIFT, out, Round.HALF_UP, 1)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.usefixtures("torch_passes")
def test_finish_gemm_float64_form_with_a_carry_for_wide_bias_codes(out, per_channel, monkeypatch):
    """Bias codes large enough that bias * q passes 2**53 (a folded BatchNorm's shift over a
    tiny weight scale): the offset splits into an integer carry added after the floor and a
    remainder; the float64 passes then give the general form's and the reference's codes, on
    random sums, sums at the limit, and sums where the result crosses the saturation bounds."""
    calls = []
    real_float64 = shift_form._finish_float64
    monkeypatch.setattr(
        shift_form, "_finish_float64", lambda *a, **k: calls.append(1) or real_float64(*a, **k)
    )
    g = torch.Generator().manual_seed(11)
    channels = 6
    xs, so = torch.tensor(0.031), torch.tensor(0.045)
    if per_channel:
        ws = torch.tensor([2e-6, 3.7e-5, 1.1e-4, 0.004, 0.0091, 5e-7])
    else:
        ws = torch.tensor(3e-6)
    bias = torch.tensor([0.8, -1.3, 0.05, -0.02, 2.4, -0.7])
    k = finish_mod._constants(xs, ws, bias, so, out, J6)
    assert k.float_carry is not None and k.float_limit > 0  # the wide-offset form applies
    # the proof's bound: limit * max q + max|offset - carry * 2**n| <= 2**53, carry integral
    n, q = k.shift.to(torch.int64), k.params.multiplier.to(torch.int64)
    carry = k.float_carry.to(torch.int64)
    assert torch.equal(carry.to(torch.float64), k.float_carry)
    rest = k.offset_with_bias - (carry << n)
    assert k.float_limit * int(q.max()) + int(rest.abs().max()) <= 1 << 53
    assert int(rest.abs().max()) <= 1 << (int(n.max()) - 1)
    limit = min(k.float_limit, (1 << 31) - k.bias_max - 1)
    near = torch.tensor([limit, -limit, limit - 1, 1 - limit, 0, 1, -1])
    values = torch.cat([near, torch.randint(-limit, limit + 1, (600,), generator=g)])
    values = torch.cat([values, torch.randint(-(1 << 12), 1 << 12, (600,), generator=g)])
    acc = values[: (values.numel() // channels) * channels].reshape(-1, channels)
    calls.clear()
    got = finish_gemm(acc, xs, ws, bias, so, out, J6, 1, sum_bound=None)
    assert calls
    general = finish_gemm(acc, xs, ws, bias, so, out, J6, 1, stats=GemmStats())
    assert_bits_equal(got, general, inputs={"acc": acc})
    real = np.float64(np.float32(xs)) * np.asarray(ws, dtype=np.float32).astype(np.float64)
    real = np.broadcast_to(real / np.float64(np.float32(so)), (channels,))
    a = acc.numpy().astype(np.int64) + ref.quantize_bias(bias, xs, ws).reshape(1, -1)
    want = ref.requantize(a, real, Requant.MUL_SHIFT, out, Round.HALF_UP, 1)
    assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))
    for clamp in ((0, out.qmax), (-5, 40)):
        got_c = finish_gemm(acc, xs, ws, bias, so, out, J6, 1, clamp_codes=clamp)
        want_c = general.to(torch.int64).clamp_min(clamp[0]).clamp_max(clamp[1])
        assert_bits_equal(got_c.to(torch.int64), want_c, inputs={"acc": acc})
    if k.float_limit + k.bias_max + channels < (1 << 31):  # past the limit: the int64 passes
        past = (torch.arange(channels) + k.float_limit + 1).reshape(1, channels)
        calls.clear()
        got_p = finish_gemm(past, xs, ws, bias, so, out, J6, 1, sum_bound=None, constants=k)
        assert not calls
        general_p = finish_gemm(past, xs, ws, bias, so, out, J6, 1, stats=GemmStats())
        assert_bits_equal(got_p, general_p, inputs={"acc": past})


def _boundary_sums(k, lo: int, hi: int, channels: int) -> torch.Tensor:
    """Per channel, the sums around each place the fast form's result crosses a clamp bound or
    a rounding step near one (v = (acc * q + offset) / 2**n at lo, lo + 1/2, hi + 1/2, hi + 1
    and 0), two either side, within int32."""
    n = k.shift.expand(channels).tolist()
    q = k.params.multiplier.expand(channels).tolist()
    off = k.offset_with_bias.expand(channels).tolist()
    cols = []
    for c in range(channels):
        vals = []
        for half_steps in (2 * lo, 2 * lo + 1, 2 * hi + 1, 2 * hi + 2, 0, 1, -1):
            target = (half_steps << n[c]) // 2 - off[c]  # acc * q at that value
            a = -((-target) // q[c])  # the smallest acc reaching it
            vals += [a + d for d in (-2, -1, 0, 1, 2)]
        cols.append(torch.tensor(vals).clamp(-(1 << 30), 1 << 30))
    return torch.stack(cols, 1)


@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.usefixtures("torch_passes")
def test_finish_gemm_float64_form_inside_its_output_window(out, per_channel, seed, monkeypatch):
    """Sums far past the max|acc| limit still take the float64 passes when the output window
    allows (``_float_window``): on sums across the whole int32 range, at the clamp bounds and
    at the rounding ties next to them, with fused clamps, as int64, float32 and float64 sums,
    the codes are the general form's and the reference's."""
    calls = []
    real_float64 = shift_form._finish_float64
    monkeypatch.setattr(
        shift_form, "_finish_float64", lambda *a, **kw: calls.append(1) or real_float64(*a, **kw)
    )
    g = torch.Generator().manual_seed(30 + seed)
    channels = 5
    xs, so = torch.tensor(0.0123), torch.tensor(0.077)
    # multipliers xs * ws / so from about 2**-13 (int8) or 2**-6 (int16) up: the window holds
    if per_channel:
        ws = torch.tensor(
            [0.5, 3e-3, 1.7e-3, 6e-4, 0.04] if out is DType.INT8 else [0.5, 0.3, 0.12, 2.0, 0.9]
        )
    else:
        ws = torch.tensor(0.0021 if out is DType.INT8 else 0.25)
    bias = torch.randn(channels, generator=g) * 0.5
    k = finish_mod._constants(xs, ws, bias, so, out, J6)
    assert k.float_carry is None and k.float_window >= out.qmax + 1
    n = k.shift.to(torch.int64)
    off = k.offset_with_bias.abs()
    assert bool(((k.float_window << n) + off <= 1 << 53).all())  # the proof's bound, per channel
    assert not bool((((k.float_window + 1) << n) + off <= 1 << 53).all())  # the largest such
    wide = torch.randint(-(1 << 30), 1 << 30, (400, channels), generator=g)
    limit = torch.randint(-k.float_limit, k.float_limit + 1, (400, channels), generator=g)
    acc = torch.cat([wide, limit, _boundary_sums(k, out.qmin, out.qmax, channels)])
    assert int(acc.abs().max()) > k.float_limit  # past the max|acc| proof
    general = finish_gemm(acc, xs, ws, bias, so, out, J6, 1, stats=GemmStats())
    real = np.float64(np.float32(xs)) * np.asarray(ws, dtype=np.float32).astype(np.float64)
    real = np.broadcast_to(real / np.float64(np.float32(so)), (channels,))
    a = acc.numpy().astype(np.int64) + ref.quantize_bias(bias, xs, ws).reshape(1, -1)
    want = ref.requantize(a, real, Requant.MUL_SHIFT, out, Round.HALF_UP, 1)
    assert_bits_equal(general.to(torch.int64), torch.from_numpy(want))
    for clamp in (None, (0, out.qmax), (-5, 40), (3, 3)):
        lo, hi = clamp or (out.qmin, out.qmax)
        w = general.to(torch.int64).clamp(lo, hi)
        sums = _boundary_sums(k, lo, hi, channels)
        w_sums = finish_gemm(sums, xs, ws, bias, so, out, J6, 1, stats=GemmStats())
        for a_ in (acc, acc.to(torch.float64), sums):
            calls.clear()
            got = finish_gemm(
                a_, xs, ws, bias, so, out, J6, 1, sum_bound=1 << 30, clamp_codes=clamp
            )
            assert calls  # the float64 passes, with no measured bound
            expect = w_sums.to(torch.int64).clamp(lo, hi) if a_ is sums else w
            assert_bits_equal(got.to(torch.int64), expect, inputs={"acc": a_})
    small = acc.clamp(-(1 << 23), 1 << 23).to(torch.float32)  # float32 sums hold exact integers
    got = finish_gemm(small, xs, ws, bias, so, out, J6, 1, sum_bound=1 << 23)
    w_small = finish_gemm(small.to(torch.int64), xs, ws, bias, so, out, J6, 1, stats=GemmStats())
    assert_bits_equal(got, w_small)


@pytest.mark.parametrize(
    "contract",
    [J6, GemmContract(requant=Requant.FLOAT_RESCALE, requant_round=Round.HALF_EVEN)],
    ids=["fast form", "FLOAT_RESCALE"],
)
@pytest.mark.parametrize("out", [DType.INT8, DType.UINT8, DType.INT16])
def test_with_values_gives_the_codes_and_their_float32_values(contract, out, fast_form):
    """``with_values``: the same codes, and values fl32(code * fl32(out_scale)) as the fixed
    kernels' ``emit`` computes them, on every path (the one C pass, the torch passes, the
    general form with statistics)."""
    from quantlab.simulate.fixed_common import emit

    g = torch.Generator().manual_seed(9)
    channels = 5
    acc = torch.randint(-(1 << 20), 1 << 20, (4, channels, 6, 7), generator=g)
    xs, so = torch.tensor(0.0123), torch.tensor(0.0771)
    ws = torch.rand(channels, generator=g) * 0.01 + 1e-4
    bias = torch.randn(channels, generator=g)
    zero_points = (0, 3) if contract.requant is Requant.FLOAT_RESCALE else (0,)
    for stats, clamp, zp in itertools.product((None, GemmStats()), (None, (0, 100)), zero_points):
        kw = dict(stats=stats, clamp_codes=clamp, sum_bound=1 << 20, out_zero_point=zp)
        codes = finish_gemm(acc, xs, ws, bias, so, out, contract, 1, **kw)
        both = finish_gemm(acc, xs, ws, bias, so, out, contract, 1, with_values=True, **kw)
        assert_bits_equal(both[0], codes)
        value, info = emit(codes, so, out, zp)
        assert_bits_equal(both[1], value)
        assert_bits_equal(emit(both[0], so, out, zp, value=both[1])[0], value)
        assert info.codes is codes
    with pytest.raises(ValueError, match="INT8, UINT8 or INT16"):
        finish_gemm(acc, xs, ws, bias, None, DType.INT32, contract, 1, with_values=True)
    with pytest.raises(ValueError, match="one out_scale"):
        finish_gemm(acc, xs, ws, bias, so.repeat(2), out, contract, 1, with_values=True)
