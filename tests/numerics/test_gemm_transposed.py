"""The exact transposed convolution (``numerics.gemm.int_conv_transpose``) and its quantized
form (``qconv_transpose``) against the slow integer references: the tap-scatter loops of
``reference.int_conv_transpose2d`` and the requantization references.

Random shapes with strides, padding, output padding, dilation and groups, int8 and int16 codes,
and adversarial extremes: every code at the dtype's minimum (the largest sums), where the float32
path's bound 2**24 is met exactly, and where it is passed by one term (the float64 path).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal

from quantlab.numerics import reference as R
from quantlab.numerics.accumulator import Overflow
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import int_conv_transpose, qconv_transpose, transposed_terms
from quantlab.numerics.requant import requant_scale
from quantlab.simulate.profiles import platform_config


def _torch_shape_ok(x, w, kw) -> bool:
    conv = F.conv_transpose2d if w.dim() == 4 else F.conv_transpose1d
    try:
        conv(x[:1].double(), w.double(), **kw)
    except RuntimeError:
        return False
    return True


def _reference(x, w, kw, zero_point=0):
    if w.dim() == 4:
        return R.int_conv_transpose2d(x, w, zero_point=zero_point, **kw)
    one = {k: (v[0] if isinstance(v, (tuple, list)) else v) for k, v in kw.items()}
    return R.int_conv_transpose1d(x, w, zero_point=zero_point, **one)


def _random_case(g: torch.Generator, i: int):
    nsp = 2 if i % 3 else 1
    groups = (1, 2, 3)[i % 3]
    cin = groups * int(torch.randint(1, 5, (1,), generator=g))
    cout_g = int(torch.randint(1, 4, (1,), generator=g))

    def ints(lo, hi):
        return tuple(int(v) for v in torch.randint(lo, hi, (nsp,), generator=g))

    k, s, d, size = ints(1, 5), ints(1, 4), ints(1, 3), ints(1, 7)
    p = tuple(int(torch.randint(0, kk, (1,), generator=g)) for kk in k)
    op = tuple(int(torch.randint(0, max(ss, dd), (1,), generator=g)) for ss, dd in zip(s, d))
    kw = dict(stride=s, padding=p, output_padding=op, groups=groups, dilation=d)
    return nsp, cin, cout_g, k, size, kw


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_exact_transposed_convolution_matches_the_tap_scatter_reference(dtype):
    g = torch.Generator().manual_seed(11 if dtype is DType.INT8 else 12)
    checked = 0
    for i in range(160):
        nsp, cin, cout_g, k, size, kw = _random_case(g, i)
        x = torch.randint(dtype.qmin, dtype.qmax + 1, (2, cin, *size), generator=g)
        w = torch.randint(dtype.qmin, dtype.qmax + 1, (cin, cout_g, *k), generator=g)
        x, w = x.to(dtype.torch_dtype), w.to(dtype.torch_dtype)
        if i % 5 == 0:  # the largest sums: every code at the minimum
            x.fill_(dtype.qmin)
            w.fill_(dtype.qmin)
        if not _torch_shape_ok(x, w, kw):
            continue
        got = int_conv_transpose(x, w, **kw)
        assert got.dtype == torch.int64
        assert_bits_equal(got, torch.from_numpy(_reference(x, w, kw)))
        assert_bits_equal(int_conv_transpose(x[0], w, **kw), got[0])  # unbatched input
        checked += 1
    assert checked > 120


@pytest.mark.parametrize("extra_terms", [0, 1])
def test_sums_at_and_past_the_float32_bound_stay_exact(extra_terms):
    """1024 int8 terms of -128 x -128 sum to 2**24 exactly (K * 128 * 128 = 2**24: the float32
    path); with one term more, -127 x -127, the sum is the odd 2**24 + 16129, which float32
    cannot hold (the float64 path)."""
    cin = 1024 + extra_terms
    w = torch.full((cin, 2, 1, 1), -128, dtype=torch.int8)
    x = torch.full((1, cin, 2, 2), -128, dtype=torch.int8)
    if extra_terms:
        x[:, -1] = -127
        w[-1] = -127
    assert transposed_terms(w, 1) * 128 * 128 == 2**24 + extra_terms * 128 * 128
    kw = dict(stride=2, padding=0, output_padding=1, groups=1, dilation=1)
    got = int_conv_transpose(x, w, **kw)
    want = 1024 * 128 * 128 + extra_terms * 127 * 127
    assert int(got.max()) == want
    assert want % 2 == extra_terms  # odd past 2**24: not a float32 value
    assert_bits_equal(got, torch.from_numpy(_reference(x, w, kw)))


def test_exact_transposed_convolution_rejects_float_codes():
    x = torch.zeros(1, 2, 3, 3)
    w = torch.zeros(2, 2, 2, 2, dtype=torch.int8)
    with pytest.raises(TypeError, match="int8 or int16 codes"):
        int_conv_transpose(x, w)


CONTRACTS = ("j6m", "tflite", "onnxruntime")


@pytest.mark.parametrize("profile", CONTRACTS)
@pytest.mark.parametrize("act", [DType.INT8, DType.UINT8, DType.INT16])
def test_quantized_transposed_convolution_matches_the_requantization_reference(profile, act):
    """qconv_transpose: centred exact sums + int32 bias codes, the contract's accumulator and
    requantization, the output zero point; per-output-channel weight scales along dim 1."""
    plat = platform_config(profile)
    c = plat.gemm_contract("conv_transpose2d", False, activation=act)
    g = torch.Generator().manual_seed(10 * CONTRACTS.index(profile) + act.bits + act.qmin)
    checked = 0
    for i in range(24):
        _, cin, cout_g, k, size, kw = _random_case(g, 3 * i + 1 + i % 2)  # 2-d cases
        groups = kw["groups"]
        cout = groups * cout_g
        x = torch.randint(act.qmin, act.qmax + 1, (2, cin, *size), generator=g).to(act.torch_dtype)
        w = torch.randint(-127, 128, (cin, cout_g, *k), generator=g).to(torch.int8)
        if not _torch_shape_ok(x.to(torch.int16), w, kw):
            continue
        zx = (
            0
            if act is DType.INT16
            else int(torch.randint(act.qmin, act.qmax + 1, (1,), generator=g))
        )
        zy = (
            0
            if act is DType.INT16
            else int(torch.randint(act.qmin, act.qmax + 1, (1,), generator=g))
        )
        sx = float(torch.empty(()).uniform_(2e-3, 5e-2, generator=g))
        sw = torch.empty(cout).uniform_(1e-3, 2e-2, generator=g)
        bias = torch.randint(-3000, 3001, (cout,), generator=g)
        acc = _reference(x.to(torch.int64), w, kw, zero_point=zx) + bias.numpy().reshape(
            1, -1, 1, 1
        )
        so = float(np.abs(acc).max() or 1) * sx * float(sw.max()) / ((act.qmax - act.qmin) / 2)
        y, _ = qconv_transpose(x, sx, w, sw, bias, so, act, c, zero_points=(zx, zy), **kw)
        a, _ = R.accumulate(acc, c.accumulator, c.accumulator_overflow is Overflow.SATURATE)
        real = requant_scale(sx, sw, so, c.requant)
        want = R.requantize(
            a,
            real,
            c.requant,
            act,
            c.requant_round,
            1,
            zero_point=zy,
            mult_bits=c.requant_mult_bits,
        )
        assert_bits_equal(y.to(torch.int64), torch.from_numpy(want.astype(np.int64)))
        checked += 1
    assert checked >= 16
