"""lut_softmax's element-wise passes in C (quantlab.numerics.lut.softmax_native): the codes of
its torch passes on random and adversarial rows (saturated differences, equal rows, alternating
extremes, saturating sums and products), both product forms, in the build the CPU loads, the
baseline build and the AVX2 code alone; the torch passes wherever the C loops do not apply."""

from __future__ import annotations

import pytest
import torch
from native_builds import BUILDS, use_build

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import composite, lut_softmax, softmax_native
from tests.bits import assert_bits_equal

I8, I16 = DType.INT8, DType.INT16
needs_cc = pytest.mark.skipif(
    softmax_native.KERNELS.lib() is None, reason="no C compiler to build the kernels"
)


def _use_build(build: str, monkeypatch) -> None:
    use_build(build, softmax_native.KERNELS, monkeypatch)


def _torch_passes(monkeypatch, *args, **kw) -> torch.Tensor:
    """lut_softmax with the C passes declined: its torch passes."""
    with monkeypatch.context() as m:
        m.setattr(softmax_native, "softmax_rows", lambda *a, **k: None)
        m.setattr(softmax_native, "exp_rows", lambda *a, **k: None)
        m.setattr(softmax_native, "product_rows", lambda *a, **k: None)
        return lut_softmax(*args, **kw)


def _codes(g, shape, dtype: DType = I16) -> list[torch.Tensor]:
    """Random codes at several spreads, and adversarial rows: all at the minimum, all at the
    maximum, alternating extremes (for int16, differences that saturate the exp index at 0),
    one large code among small ones."""
    lo, hi, dt = dtype.qmin, dtype.qmax, dtype.torch_dtype
    out = [
        (torch.randn(shape, generator=g) * s).round().clamp(lo, hi).to(dt)
        for s in (3.0, 300.0, 9000.0)
    ]
    out.append(torch.full(shape, lo, dtype=dt))
    out.append(torch.full(shape, hi, dtype=dt))
    alt = torch.tensor([lo, hi], dtype=dt).repeat(shape[-1])[: shape[-1]]
    out.append(alt.expand(shape).contiguous())
    spike = torch.zeros(shape, dtype=dt)
    spike[..., 0] = hi * 2 // 3
    out.append(spike)
    return out


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("in_dtype,out_dtype", [(I16, I8), (I16, I16), (I8, I8), (I8, I16)])
@pytest.mark.parametrize("form", ["one pass per row", "exp and product passes"])
def test_the_native_passes_give_the_torch_passes_codes(
    build, in_dtype, out_dtype, form, monkeypatch
):
    """Every step per row in C (``softmax_rows``: the sum's requantization and the reciprocal
    table too), or the exp and product passes with those two in torch between them: the torch
    passes' codes."""
    _use_build(build, monkeypatch)
    if form == "exp and product passes":
        monkeypatch.setattr(softmax_native, "softmax_rows", lambda *a, **k: None)
    g = torch.Generator().manual_seed(3 if out_dtype is I8 else 4)
    checked = 0
    for shape in ((2, 2), (3, 7), (2, 5, 33), (4, 128)):
        for in_scale in (1e-4, 1e-3, 0.05):
            n = shape[-1]
            kws = [{}, {"out_scale": 0.25 / out_dtype.qmax}]  # products saturating at qmax
            if n >= 16:  # a quarter of the default sum scale: large sums saturate
                kws.append({"sum_scale": n * composite.SOFTMAX_EXP_SCALE / 4})
            for kw in kws:
                for x in _codes(g, shape, in_dtype):
                    got = lut_softmax(x, in_scale, in_dtype, -1, out_dtype=out_dtype, **kw)
                    want = _torch_passes(
                        monkeypatch, x, in_scale, in_dtype, -1, out_dtype=out_dtype, **kw
                    )
                    assert got.dtype == out_dtype.torch_dtype
                    assert_bits_equal(got, want, {"codes": x})
                    checked += 1
    assert checked == (2 * 2 + 2 * 3) * 3 * 7


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("out_dtype", [I8, I16])
def test_both_product_forms_give_the_torch_codes(build, out_dtype, monkeypatch):
    """The general form (clamp at both bounds) on signed e, r and ratios of either sign, and
    the nonnegative form (clamp at qmax first) on nonnegative ones, against
    composite._product_half_up_codes and against requant_half_up of the int64 product (the
    contract), with ties p = k + 1/2, p one ulp below 1/2 (where floor(p + 1/2) would give 1)
    and saturating products."""
    _use_build(build, monkeypatch)
    g = torch.Generator().manual_seed(8)
    shape = (6, 40)
    below_half = 0.5 - 2.0**-54  # the largest double below 1/2
    for nonnegative in (False, True):
        for ratio in (1e-6, 3.0517578125e-05, 0.5, below_half, 7.3, -0.01, -below_half, -1.0):
            if nonnegative and ratio <= 0:
                continue
            lo = 0 if nonnegative else I16.qmin
            e = torch.randint(lo, I16.qmax + 1, shape, generator=g, dtype=torch.int16)
            r = torch.randint(lo, I16.qmax + 1, (6, 1), generator=g, dtype=torch.int16)
            e[0, :4] = torch.tensor([0, 1, 2, 3], dtype=torch.int16)  # ties at ratio 0.5
            r[0, 0] = 1
            qmin, qmax, dt = out_dtype.qmin, out_dtype.qmax, out_dtype.torch_dtype
            got = softmax_native.product_rows(e, r, ratio, qmin, qmax, dt, nonnegative)
            want = composite._product_half_up_codes(e, r, ratio, out_dtype, nonnegative)
            assert got is not None
            assert_bits_equal(got, want, {"e": e, "r": r})
            exact = composite.requant_half_up(e.long() * r.long(), ratio, out_dtype)
            assert_bits_equal(got, exact.to(dt), {"e": e, "r": r})
            if abs(ratio) == below_half:
                assert got[0, 1] == 0  # p = +-(1/2 - 2**-54) rounds half up to 0


def test_other_axes_and_layouts_take_the_torch_passes(monkeypatch):
    """A softmax over another axis, or over non-contiguous codes: the C passes decline and
    lut_softmax gives the torch passes' codes (and the same codes as the last-axis form)."""
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(3, 5, 6, generator=g) * 500).round().to(torch.int16)
    assert softmax_native.exp_rows(x.transpose(1, 2), torch.zeros(65536, dtype=torch.int16)) is None
    over_mid = lut_softmax(x, 1e-3, I16, 1)
    assert_bits_equal(over_mid, lut_softmax(x.transpose(1, 2).contiguous(), 1e-3).transpose(1, 2))
    strided = x.transpose(1, 2)
    assert_bits_equal(lut_softmax(strided, 1e-3), _torch_passes(monkeypatch, strided, 1e-3))
    monkeypatch.setattr(softmax_native.KERNELS, "lib", lambda: None)
    assert softmax_native.exp_rows(x, torch.zeros(65536, dtype=torch.int16)) is None
    assert_bits_equal(lut_softmax(x, 1e-3), _torch_passes(monkeypatch, x, 1e-3))


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
def test_the_exp_pass_gathers_and_sums_through_any_map(build, monkeypatch):
    """The exp pass alone with a random full-range map (negative entries, neighbours that
    differ): the index x - max(x) + 32768 clamped at 0, the gather and the int64 row sums,
    against the torch formula, on rows whose differences reach -65535."""
    _use_build(build, monkeypatch)
    g = torch.Generator().manual_seed(10)
    exp_map = torch.randint(-32768, 32768, (65536,), generator=g, dtype=torch.int16)
    for x in _codes(g, (5, 37)) + _codes(g, (5, 37), I8):
        e, sums = softmax_native.exp_rows(x, exp_map)
        top = x.amax(dim=-1, keepdim=True).to(torch.int32) + I16.qmin
        index = (x.to(torch.int32) - top).clamp_min(0)
        want = exp_map.index_select(0, index.reshape(-1)).reshape(x.shape)
        assert_bits_equal(e, want, {"codes": x})
        assert_bits_equal(sums, want.sum(dim=-1, keepdim=True, dtype=torch.int64))


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
def test_the_product_rounds_half_up_near_every_kind_of_tie(build, monkeypatch):
    """p = e * ratio on the doubles within 8 steps of k + 1/2 (ratio itself stepped, e from -3
    to 3), for k from -4 to 4 and around powers of two up to 2**15, where floor(p + 1/2) could
    round: both product forms against requant_half_up of the int64 product."""
    import numpy as np

    _use_build(build, monkeypatch)
    e = torch.arange(-3, 4, dtype=torch.int16).repeat(2, 1)
    r = torch.ones(2, 1, dtype=torch.int16)
    edges = {k + 0.5 for k in range(-5, 5)}
    edges |= {s * (2.0**m + d) for m in range(16) for d in (-0.5, 0.5) for s in (1, -1)}
    checked = 0
    for edge in sorted(edges):
        ratio = edge
        for _ in range(8):
            ratio = float(np.nextafter(ratio, -np.inf))
        for _ in range(17):
            for nonnegative in (False, True):
                ee, rr = (e.abs(), r) if nonnegative else (e, r)
                if nonnegative and ratio <= 0:
                    continue
                exact = composite.requant_half_up(ee.long() * rr.long(), ratio, I16).to(torch.int16)
                got = softmax_native.product_rows(
                    ee.contiguous(), rr, ratio, I16.qmin, I16.qmax, torch.int16, nonnegative
                )
                assert_bits_equal(got, exact, {"ratio": ratio})
                torch_form = composite._product_half_up_codes(ee, rr, ratio, I16, nonnegative)
                assert_bits_equal(torch_form, exact, {"ratio": ratio})
                checked += 1
            ratio = float(np.nextafter(ratio, np.inf))
    assert checked > 1000
