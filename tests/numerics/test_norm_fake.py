"""``norm_fake`` (the normalisation composite's QAT form) against the composite written out with
the public ``fake_quant`` at every step: identical float32 bits on random rows of every layout,
with and without gamma / beta, at both output dtypes and several roundings, and on adversarial
rows (NaN, +-inf, huge values, constant rows, a NaN gamma) that take its NaN-kept first pass
back to the steps with NaN made code 0. Its in-place step fake quants leave the caller's
tensors alone. For LayerNorm rows (HALF_EVEN) the elementwise steps run in C
(``norm_native``): the same bits as the torch steps on random, tied, saturating and NaN
values, and the torch steps where the C kernel declines or cannot be built."""

import warnings

import pytest
import torch
from bits import assert_bits_equal
from native_builds import BUILDS, use_build, without_compiler
from toolchain import CC

from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import J6_NORM, NormContract, NormLayout
from quantlab.numerics.norm_calibrate import (
    _norm_fake_steps,
    fake_affine,
    norm_fake,
    norm_fake_fn,
)
from quantlab.numerics.norm_native import rows_kernel
from quantlab.numerics.quantize import fake_quant
from quantlab.numerics.rounding import Round
from tests.numerics.test_norm import calibrated, params, rows_data

LAYOUTS = {
    "layer_norm": (NormLayout.layer(48), (3, 7, 48), 48),
    "layer_norm_2d": (NormLayout.layer((4, 6)), (5, 4, 6), None),
    "group_norm": (NormLayout.group(4), (2, 16, 5, 5), 16),
    "instance_norm": (NormLayout.instance(), (2, 8, 6, 6), 8),
}


def written_out(x, layout, w, b, eps, sc, so, out, contract=J6_NORM, rounding=Round.HALF_EVEN):
    """The composite step by step, each fake quant by ``fake_quant`` (BY_SCALE, NaN -> 0)."""
    dt, aff = contract.inter_dtype, contract.affine_dtype

    def fq(t, scale, dtype=dt):
        return fake_quant(t, torch.tensor(scale, dtype=torch.float32), dtype, rounding)

    g = fq(w, sc.gamma, aff) if w is not None else None
    bb = fq(b, sc.beta, aff) if b is not None else None
    xf = x.to(torch.float32)
    rows = layout.rows(xf)
    mu = fq(rows.mean(1, keepdim=True), sc.mean)
    d = fq(rows - mu, sc.diff)
    v = fq(fq(d * d, sc.square).mean(1, keepdim=True), sc.var)
    r = fq(torch.rsqrt(v + eps), sc.rsqrt)
    last = g is None and bb is None
    y = fq(d * r, so if last else sc.normed, out if last else dt).reshape(x.shape)
    if g is not None:
        gv = layout.affine(g, xf, "weight")
        y = fq(y * gv, so, out) if bb is None else fq(y * gv, sc.scaled)
    if bb is not None:
        y = fq(y + layout.affine(bb, xf, "bias"), so, out)
    return y


def _case(kind, affine, out, seed):
    layout, shape, c = LAYOUTS[kind]
    x = rows_data(seed, shape, spread=2.0) * 3
    if c is None:  # gamma / beta of normalized_shape
        w, b = params(24, seed, affine)
        w = None if w is None else w.reshape(4, 6)
        b = None if b is None else b.reshape(4, 6)
    else:
        w, b = params(c, seed, affine)
    codes, s_in, sc, so = calibrated(x, layout, w, b, DType.INT16, out)
    return codes.to(torch.float32) * s_in, layout, w, b, sc, so


def _check(x, layout, w, b, sc, so, out, **kw):
    before = [t.clone() for t in (x, w, b) if t is not None]
    got = norm_fake(x, layout, w, b, 1e-5, sc, so, out, **kw)
    want = written_out(x, layout, w, b, 1e-5, sc, so, out, **kw)
    assert got.dtype == torch.float32
    assert_bits_equal(got, want)
    for t, was in zip([t for t in (x, w, b) if t is not None], before):
        assert_bits_equal(t, was)  # the caller's tensors are not written
    return got


@pytest.mark.parametrize("out", [DType.INT8, DType.INT16], ids=["int8", "int16"])
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_random_rows_match_the_written_out_composite(kind, affine, out):
    for seed in range(3):
        x, layout, w, b, sc, so = _case(kind, affine, out, seed)
        _check(x, layout, w, b, sc, so, out)
        # new data beyond the calibrated ranges: every step saturates somewhere
        _check(x * 4 + 1, layout, w, b, sc, so, out)


@pytest.mark.parametrize("rounding", [Round.HALF_EVEN, Round.FLOOR, Round.HALF_UP, Round.TRUNC])
def test_every_rounding_and_contract_match(rounding):
    x, layout, w, b, sc, so = _case("layer_norm", (True, True), DType.INT8, 4)
    for contract in (J6_NORM, NormContract(inter_dtype=DType.INT8, affine_dtype=DType.INT8)):
        _check(x, layout, w, b, sc, so, DType.INT8, contract=contract, rounding=rounding)


def test_adversarial_rows_match_the_written_out_composite():
    """NaN, +inf, -inf and both infinities in one row (mean NaN), a huge row (its sums
    overflow), constant rows (variance 0) and zeros: every row's result as written out, the
    NaN rows included (their NaN made code 0 at each step)."""
    for kind in ("layer_norm", "group_norm"):
        x, layout, w, b, sc, so = _case(kind, (True, True), DType.INT16, 5)
        rows = layout.rows(x.clone())
        n = rows.shape[1]
        rows[0, 3] = float("nan")
        rows[1, 0] = float("inf")
        rows[2, 1] = float("-inf")
        rows[3, :2] = torch.tensor([float("inf"), float("-inf")])
        rows[4] = 3e38
        rows[5] = 0.0
        if rows.shape[0] > 6:
            rows[6] = torch.linspace(-1e30, 1e30, n)
        y = rows.reshape(x.shape)
        for out in (DType.INT8, DType.INT16):
            got = _check(y, layout, w, b, sc, so, out)
            assert not torch.isnan(got).any()  # NaN is code 0 at every step
        _check(x, layout, w, b, sc, so, DType.INT8)  # the same rows without them


def test_a_nan_gamma_or_beta_is_code_zero_from_its_own_fake_quant():
    x, layout, w, b, sc, so = _case("layer_norm", (True, True), DType.INT8, 6)
    for which in ("w", "b"):
        w2, b2 = w.clone(), b.clone()
        (w2 if which == "w" else b2)[5] = float("nan")
        got = _check(x, layout, w2, b2, sc, so, DType.INT8)
        assert not torch.isnan(got).any()


def test_kept_affine_and_an_input_with_gradient_give_the_same_bits():
    x, layout, w, b, sc, so = _case("layer_norm", (True, True), DType.INT16, 7)
    want = written_out(x, layout, w, b, 1e-5, sc, so, DType.INT16)
    kept = fake_affine(w, b, sc)
    assert_bits_equal(norm_fake(x, layout, w, b, 1e-5, sc, so, DType.INT16, affine=kept), want)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    got = norm_fake(xg, layout, wg, b, 1e-5, sc, so, DType.INT16)
    assert_bits_equal(got.detach(), want)
    assert_bits_equal(xg.detach(), x)
    x64 = x.to(torch.float64)  # a float64 input: computed on its float32 value
    assert_bits_equal(norm_fake(x64, layout, w, b, 1e-5, sc, so, DType.INT16), want)


needs_cc = pytest.mark.skipif(CC is None, reason="the native kernel needs a C compiler")


def _torch_steps(x, layout, sc, so, out, gamma, beta, eps=1e-5):
    run = (x, layout, eps, sc, so, out, J6_NORM, Round.HALF_EVEN, gamma, beta)
    return _norm_fake_steps(*run, keep_nan=False)


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("seed", range(12))
def test_the_native_rows_equal_the_torch_steps_on_random_and_tied_values(seed, build, monkeypatch):
    """The C elementwise steps against the torch steps: random sizes, scales from tiny to
    huge, inputs on and beyond the calibrated ranges, values whose quotients fall exactly on
    half codes (ties), NaN and infinities; identical bits every time, by the build the CPU
    loads (its AVX-512 loops here), by the baseline build (no per-CPU loops) and by the AVX2
    code alone."""
    from quantlab.numerics import norm_native

    use_build(build, norm_native.KERNELS, monkeypatch)
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 700, (1,), generator=g))
    shape = (int(torch.randint(1, 9, (1,), generator=g)), 3, n)
    layout = NormLayout.layer(n)
    spread = float(10 ** torch.empty(1).uniform_(-3, 3, generator=g))
    x = torch.randn(shape, generator=g) * spread + torch.randn(shape[0], 1, 1, generator=g)
    w, b = params(n, seed)
    out = (DType.INT8, DType.INT16)[seed % 2]
    _, _, sc, so = calibrated(x, layout, w, b, DType.INT16, out)
    if seed % 3 == 0:  # ties: multiples of half a diff step
        x = torch.round(x / (sc.diff / 2)) * (sc.diff / 2)
    if seed % 4 == 1:
        x = x * 7  # beyond the calibrated ranges
    if seed % 5 == 2:
        flat = x.view(-1)
        flat[:: max(1, flat.numel() // 5)] = torch.tensor(float("nan"))
        flat[1] = float("inf")
    gamma, beta = fake_affine(w, b, sc)
    for gb in ((gamma, beta), (gamma, None), (None, beta), (None, None)):
        kernel = rows_kernel(layout, 1e-5, sc, so, out, DType.INT16, *gb)
        assert kernel is not None
        got = kernel(x)
        assert got is not None
        assert_bits_equal(got, _torch_steps(x, layout, sc, so, out, *gb), {"x": x})


def test_where_the_native_rows_do_not_apply_the_torch_steps_run():
    """Other layouts, a non-contiguous input, float64, a gradient: the C kernels decline
    (None) and norm_fake computes by torch, with the written-out bits."""
    x, layout, w, b, sc, so = _case("layer_norm", (True, True), DType.INT16, 9)
    gamma, beta = fake_affine(w, b, sc)
    args = (1e-5, sc, so, DType.INT16, DType.INT16, gamma, beta)
    wide = torch.cat([x, x], dim=-1)[..., ::2]  # the same values, not contiguous
    assert not wide.is_contiguous()
    for declined in (wide, x.double(), x.clone().requires_grad_()):
        assert rows_kernel(layout, *args)(declined) is None
    assert rows_kernel(NormLayout.group(4), *args) is None
    _check(wide.contiguous(), layout, w, b, sc, so, DType.INT16)
    _check(wide, layout, w, b, sc, so, DType.INT16)


@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_the_prepared_form_gives_norm_fake_on_every_input(kind):
    """``norm_fake_fn`` made once, run on new inputs (random, beyond the calibrated range,
    NaN, not contiguous, float64, with a gradient): the written-out bits every time; bad
    arguments raise when it is made; an input whose trailing dims are not normalized_shape
    raises on the call, even where its size would fit the rows."""
    x, layout, w, b, sc, so = _case(kind, (True, True), DType.INT8, 11)
    f = norm_fake_fn(layout, w, b, 1e-5, sc, so, DType.INT8)
    nan = x.clone()
    nan.view(-1)[::7] = float("nan")
    wide = torch.cat([x, x], dim=-1)[..., ::2]
    for v in (x, x * 5, nan, wide, x.double(), x.clone().requires_grad_()):
        want = written_out(v.detach(), layout, w, b, 1e-5, sc, so, DType.INT8)
        assert_bits_equal(f(v).detach(), want)
    with pytest.raises(ValueError, match="out_dtype must be INT8 or INT16"):
        norm_fake_fn(layout, w, b, 1e-5, sc, so, DType.INT32)
    with pytest.raises(ValueError, match="eps"):
        norm_fake_fn(layout, w, b, -1.0, sc, so, DType.INT8)
    if kind == "layer_norm":  # (3, 7, 48): the same values as (3, 48, 7) do not fit
        with pytest.raises(ValueError, match="does not end in normalized_shape"):
            f(x.reshape(3, 48, 7))


def test_without_a_compiler_the_torch_steps_run_with_one_warning(monkeypatch):
    from quantlab.numerics import norm_native

    without_compiler(norm_native, monkeypatch)
    x, layout, w, b, sc, so = _case("layer_norm", (True, True), DType.INT8, 10)
    with pytest.warns(RuntimeWarning, match="no C compiler found"):
        _check(x, layout, w, b, sc, so, DType.INT8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        _check(x * 3, layout, w, b, sc, so, DType.INT8)
