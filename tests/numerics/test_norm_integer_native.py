"""The integer LayerNorm's element-wise passes in C (quantlab.numerics.norm_integer_native):
the codes of the torch int64 form (``norm_integer._norm_shifted``, tied to the integer reference
by test_norm.py) on random, full-range, constant, alternating and saturating rows, with every
affine combination, in the build the CPU loads (its AVX-512 DQ loops here), the baseline build
and the AVX2 code alone; and the torch form wherever the C loops do not apply."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from native_builds import BUILDS, use_build

from quantlab.numerics import norm_integer, norm_integer_native
from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import J6_NORM, EpsMode, NormLayout
from quantlab.numerics.norm_calibrate import norm_steps, output_scale, scales_from_steps
from quantlab.numerics.norm_integer import norm_constants, norm_fixed
from quantlab.numerics.norm_integer_native import norm_shifted_rows
from quantlab.numerics.quantize import compute_scale
from tests.bits import assert_bits_equal

I8, I16 = DType.INT8, DType.INT16
needs_cc = pytest.mark.skipif(
    norm_integer_native.KERNELS.lib() is None, reason="no C compiler to build the kernels"
)


def _scales(x, layout, w, b, in_dtype, out_dtype):
    s_in = float(compute_scale(x.abs().max(), in_dtype))
    steps = norm_steps(x.to(torch.float64), layout, w, b, 1e-5)
    return s_in, scales_from_steps(steps, J6_NORM), output_scale(steps, out_dtype)


def _torch_form(codes, layout, k, out_dtype):
    return norm_integer._norm_shifted(codes, layout, k, J6_NORM).to(out_dtype.torch_dtype)


def _rows(g, shape, in_dtype) -> list[torch.Tensor]:
    """Random codes, each row at its own spread and offset, and adversarial rows: every code
    at the minimum, at the maximum, alternating extremes (the largest differences and
    squares), a constant row (variance 0)."""
    lo, hi = in_dtype.qmin, in_dtype.qmax
    spread = torch.exp(torch.rand(shape[0], 1, generator=g) * 5)
    rnd = torch.randn(shape, generator=g) * spread + torch.randn(shape[0], 1, generator=g) * 20
    rnd = rnd.round().clamp(lo, hi)
    alt = torch.tensor([lo, hi]).repeat(shape[1])[: shape[1]].expand(shape)
    rows = [rnd, torch.full(shape, lo), torch.full(shape, hi), alt, torch.full(shape, 3)]
    return [r.to(in_dtype.torch_dtype).contiguous() for r in rows]


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("in_dtype,out_dtype", [(I8, I8), (I16, I16), (I8, I16), (I16, I8)])
def test_the_native_rows_equal_the_int64_torch_form(build, in_dtype, out_dtype, monkeypatch):
    use_build(build, norm_integer_native.KERNELS, monkeypatch)
    kernels = norm_integer_native.KERNELS
    g = torch.Generator().manual_seed(hash((build, in_dtype.name, out_dtype.name)) % 1000)
    checked = 0
    for n_rows, n in ((1, 1), (3, 7), (17, 64), (5, 384)):
        layout = NormLayout.layer(n)
        x = torch.randn(n_rows, n, generator=g) * 2 + 0.5
        w = torch.rand(n, generator=g) + 0.5
        b = torch.randn(n, generator=g) * 0.3
        for wb in ((w, b), (w, None), (None, b), (None, None)):
            s_in, sc, so = _scales(x, layout, *wb, in_dtype, out_dtype)
            tight = dataclasses.replace(sc, diff=sc.diff / 8, square=sc.square / 20)
            for scales, s_out in ((sc, so), (tight, so / 10), (sc, so * 1e3)):
                k = norm_constants(s_in, n, *wb, 1e-5, scales, s_out, out_dtype)
                assert k.shifts is not None
                for codes in _rows(g, (n_rows, n), in_dtype):
                    got = norm_shifted_rows(codes, layout, k, J6_NORM, out_dtype, kernels)
                    assert got is not None and got.dtype == out_dtype.torch_dtype
                    want = _torch_form(codes, layout, k, out_dtype)
                    assert_bits_equal(got, want, {"codes": codes})
                    checked += 1
    assert checked == 4 * 4 * 3 * 5


@needs_cc
def test_layer_norm_over_several_trailing_dims_and_a_batch():
    g = torch.Generator().manual_seed(5)
    layout = NormLayout.layer((4, 6))
    x = torch.randn(2, 3, 4, 6, generator=g)
    w, b = torch.rand(4, 6, generator=g) + 0.5, torch.randn(4, 6, generator=g)
    s_in, sc, so = _scales(x, layout, w, b, I16, I16)
    k = norm_constants(s_in, 24, w, b, 1e-5, sc, so, I16)
    codes = torch.randint(-30000, 30000, (2, 3, 4, 6), generator=g, dtype=torch.int16)
    got = norm_shifted_rows(codes, layout, k, J6_NORM, I16)
    assert got.shape == codes.shape
    assert_bits_equal(got, _torch_form(codes, layout, k, I16))


@needs_cc
def test_constants_follow_each_norm_constants_object():
    """Two constants objects used in turn (two LayerNorms of a model) each get their own
    kernel constants."""
    g = torch.Generator().manual_seed(6)
    layout = NormLayout.layer(16)
    x = torch.randn(4, 16, generator=g)
    codes = torch.randint(-128, 128, (4, 16), generator=g, dtype=torch.int8)
    ks = []
    for wb in ((torch.rand(16, generator=g) + 0.5, None), (None, torch.randn(16, generator=g))):
        s_in, sc, so = _scales(x, layout, *wb, I8, I8)
        ks.append(norm_constants(s_in, 16, *wb, 1e-5, sc, so, I8))
    for _ in range(2):
        for k in ks:
            got = norm_shifted_rows(codes, layout, k, J6_NORM, I8)
            assert_bits_equal(got, _torch_form(codes, layout, k, I8))


def test_where_the_native_rows_do_not_apply_norm_fixed_runs_the_torch_form(monkeypatch):
    """A group layout, non-contiguous codes or no kernel: norm_shifted_rows declines (None)
    and norm_fixed gives the torch form's codes."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 8, 10, generator=g)
    w, b = torch.rand(8, generator=g) + 0.5, torch.randn(8, generator=g)
    group = NormLayout.group(4)
    s_in, sc, so = _scales(x, group, w, b, I8, I8)
    codes = torch.randint(-128, 128, (2, 8, 10), generator=g, dtype=torch.int8)
    k = norm_constants(s_in, 20, w, b, 1e-5, sc, so, I8)
    assert norm_shifted_rows(codes, group, k, J6_NORM, I8) is None
    args = (s_in, group, w, b, 1e-5, sc, so, I8)
    assert_bits_equal(norm_fixed(codes, *args), _torch_form(codes, group, k, I8))

    layer = NormLayout.layer(10)
    s_in, sc, so = _scales(x, layer, None, None, I8, I8)
    k = norm_constants(s_in, 10, None, None, 1e-5, sc, so, I8)
    strided = codes.transpose(0, 1).contiguous().transpose(0, 1)  # the same codes, other strides
    assert not strided.is_contiguous()
    assert norm_shifted_rows(strided, layer, k, J6_NORM, I8) is None
    want = _torch_form(codes, layer, k, I8)
    assert_bits_equal(norm_fixed(strided, s_in, layer, None, None, 1e-5, sc, so, I8), want)
    monkeypatch.setattr(norm_integer_native.KERNELS, "lib", lambda: None)
    assert norm_shifted_rows(codes, layer, k, J6_NORM, I8) is None
    assert_bits_equal(norm_fixed(codes, s_in, layer, None, None, 1e-5, sc, so, I8), want)


ADD_CODES = dataclasses.replace(J6_NORM, eps_mode=EpsMode.ADD_CODES)
CONTRACTS = [
    (J6_NORM, 1e-5, True),  # eps in the table
    (ADD_CODES, 1e-5, True),  # eps added to the variance's codes
    (ADD_CODES, 3.0, True),  # eps codes large enough to reach the clamp at qmax
    (dataclasses.replace(J6_NORM, requant_mult_bits=15), 1e-5, True),
    (J6_NORM, 1e-5, False),  # the per-row terms in torch, between the two C loops
    (ADD_CODES, 3.0, False),
]


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("contract,eps,per_row", CONTRACTS)
def test_the_per_row_terms_in_c_equal_the_torch_form(build, contract, eps, per_row, monkeypatch):
    """The per-row terms (the row sum, the mean's and the variance's requantizations, the eps
    add and its clamp, the rsqrt table read through its code map) run in C (``ni_rows``) where
    ``_per_row`` gives their constants, else (forced here) in torch between the two C loops;
    either way the codes are the torch form's, for every pair of code dtypes and affine
    combination, on random and adversarial rows."""
    use_build(build, norm_integer_native.KERNELS, monkeypatch)
    if not per_row:
        monkeypatch.setattr(norm_integer_native, "_per_row", lambda k, c: None)
    kernels = norm_integer_native.KERNELS
    g = torch.Generator().manual_seed(hash((build, str(contract), eps)) % 1000)
    for in_dtype, out_dtype in ((I8, I8), (I16, I16), (I8, I16), (I16, I8)):
        for n_rows, n in ((1, 1), (6, 33), (9, 384)):
            layout = NormLayout.layer(n)
            x = torch.randn(n_rows, n, generator=g) * 2 + 0.5
            w = torch.rand(n, generator=g) + 0.5
            b = torch.randn(n, generator=g) * 0.3
            for wb in ((w, b), (None, None)):
                s_in = float(compute_scale(x.abs().max(), in_dtype))
                steps = norm_steps(x.to(torch.float64), layout, *wb, eps)
                sc, so = scales_from_steps(steps, contract), output_scale(steps, out_dtype)
                k = norm_constants(s_in, n, *wb, eps, sc, so, out_dtype, contract)
                assert k.shifts is not None
                assert (norm_integer_native._per_row(k, contract) is not None) == per_row
                if eps > 1:
                    assert k.eps_codes > 0
                for codes in _rows(g, (n_rows, n), in_dtype):
                    got = norm_shifted_rows(codes, layout, k, contract, out_dtype, kernels)
                    assert got is not None
                    want = norm_integer._norm_shifted(codes, layout, k, contract)
                    assert_bits_equal(got, want.to(out_dtype.torch_dtype), {"codes": codes})


@needs_cc
def test_per_row_constants_follow_the_contracts_eps_mode():
    """One NormConstants used with two contracts that differ in where eps enters: each gets
    its own per-row constants (the eps add in C or not), each the torch form's codes; the
    constants go when the NormConstants object does."""
    g = torch.Generator().manual_seed(9)
    layout = NormLayout.layer(48)
    x = torch.randn(5, 48, generator=g) * 2
    steps = norm_steps(x.to(torch.float64), layout, None, None, 0.5)
    sc, so = scales_from_steps(steps, ADD_CODES), output_scale(steps, I16)
    s_in = float(compute_scale(x.abs().max(), I16))
    k = norm_constants(s_in, 48, None, None, 0.5, sc, so, I16, ADD_CODES)
    assert k.eps_codes > 0
    codes = torch.round(x / s_in).clamp(I16.qmin, I16.qmax).to(torch.int16)  # x's own codes
    got = {}
    for contract in (ADD_CODES, J6_NORM, ADD_CODES):
        out = norm_shifted_rows(codes, layout, k, contract, I16)
        want = norm_integer._norm_shifted(codes, layout, k, contract).to(torch.int16)
        assert_bits_equal(out, want)
        got[contract.eps_mode] = out
    assert not torch.equal(got[EpsMode.ADD_CODES], got[EpsMode.IN_TABLE])
    key = id(k)
    kept = norm_integer_native._KEPT[key][1]
    assert sum(isinstance(w, tuple) and w[0] == "per row" for w in kept) == 2
    del k
    import gc

    gc.collect()
    assert key not in norm_integer_native._KEPT
