"""Prepared constants (``requantize_int32``, ``add_constants``, ``norm_constants``) give the
bits of the integer references on random and adversarial inputs."""

import zlib

import numpy as np
import pytest
import torch
from bits import assert_bits_equal, edge_values

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import NormLayout
from quantlab.numerics.norm_integer import norm_constants, norm_fixed
from quantlab.numerics.requant import Requant, int32_requant, make_requant, requantize_int32
from quantlab.numerics.rounding import Round
from quantlab.numerics.scaled_add import add_constants, add_inter_scale
from tests.numerics.test_norm import calibrated, params, rows_data

# below 1 (fast right shifts), exactly 1 and 2**-31 (the shift bounds), above 1 (left shifts)
MULTIPLIERS = [0.5, 0.0123, 0.3333333, 0.9999999, 2.0**-31, 1e-6, 1.0, 3.7, 0.0]


def _accs(seed: int, n: int = 200) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rand = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64)
    small = torch.randint(-(2**12), 2**12, (n,), generator=g, dtype=torch.int64)
    return torch.cat([edge_values(DType.INT32), rand, small])


@pytest.mark.parametrize("scheme", [Requant.MUL_SHIFT, Requant.FLOAT_RESCALE])
@pytest.mark.parametrize("mode", [Round.HALF_UP, Round.HALF_EVEN])
@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
def test_requantize_int32_matches_reference(scheme, mode, out):
    acc = _accs(zlib.crc32(f"{scheme.name}{mode.name}{out.name}".encode()) % 1000)
    for m in MULTIPLIERS:
        prepared = int32_requant(make_requant(m, scheme), out, mode)
        got = requantize_int32(acc, prepared)
        assert got.dtype == torch.int64
        real = m if scheme is not Requant.FLOAT_RESCALE else np.float32(m)
        exp = ref.requantize(acc, real, scheme, out, mode)
        assert_bits_equal(got, torch.from_numpy(exp), inputs={"acc": acc})


def test_requantize_int32_ties_half_up():
    # acc * q exactly halfway between two outputs, both signs, for the fast form
    params = make_requant(2.0**-4, Requant.MUL_SHIFT)
    prepared = int32_requant(params, DType.INT16, Round.HALF_UP)
    assert prepared.fast
    acc = torch.arange(-40, 41, dtype=torch.int64) * 8 + 8  # k/2 + 1/2 after the shift
    exp = ref.requantize(acc, 2.0**-4, Requant.MUL_SHIFT, DType.INT16, Round.HALF_UP)
    assert_bits_equal(requantize_int32(acc, prepared), torch.from_numpy(exp))


@pytest.mark.parametrize("scheme", [Requant.MUL_SHIFT, Requant.FLOAT_RESCALE])
@pytest.mark.parametrize("out", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("shift", [14, 15])
def test_add_with_constants_matches_reference(scheme, out, shift):
    g = torch.Generator().manual_seed(5 + shift)
    x = torch.cat([edge_values(DType.INT16), torch.randint(-32768, 32768, (300,), generator=g)])
    y = torch.cat([-edge_values(DType.INT16), torch.randint(-32768, 32768, (300,), generator=g)])
    x, y = x.to(torch.int16), y.clamp(-32768, 32767).to(torch.int16)
    for sx, sy, so in [(0.0123, 0.00377, 0.02), (1e-4, 1e-4, 1e-6), (0.5, 2.0**-20, 0.7)]:
        k = add_constants(sx, sy, so, out, scheme, Round.HALF_UP, shift)
        got = add_inter_scale(x, sx, y, sy, so, out, scheme, Round.HALF_UP, shift, constants=k)
        exp = ref.add_inter_scale(x, sx, y, sy, so, out, scheme, Round.HALF_UP, shift)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(exp), {"x": x, "y": y})


def test_norm_constants_reused_across_inputs_match_reference():
    layout = NormLayout.layer(32)
    w, b = params(32, 3)
    x0 = rows_data(3, (6, 32), spread=2.0)
    codes, s_in, scales, s_out = calibrated(x0, layout, w, b, DType.INT16, DType.INT8)
    k = norm_constants(s_in, 32, w, b, 1e-5, scales, s_out, DType.INT8)
    g = torch.Generator().manual_seed(9)
    others = [
        codes,
        torch.randint(-32768, 32768, (4, 32), generator=g, dtype=torch.int16),
        torch.full((3, 32), -32768, dtype=torch.int16),  # constant rows: variance 0
        torch.tensor([[32767, -32768] * 16], dtype=torch.int16),  # the widest spread
    ]
    for c in others:
        got = norm_fixed(c, s_in, layout, w, b, 1e-5, scales, s_out, DType.INT8, constants=k)
        want = ref.norm_fixed(c, s_in, layout, w, b, 1e-5, scales, s_out, DType.INT8)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want), {"codes": c})
    with pytest.raises(ValueError, match="rows of 32 elements"):
        norm_fixed(
            codes[:, :16],
            s_in,
            NormLayout.layer(16),
            w[:16],
            b[:16],
            1e-5,
            scales,
            s_out,
            DType.INT8,
            constants=k,
        )


def test_lut_softmax_int32_widths_match_reference_on_extremes():
    from quantlab.numerics.lut import lut_softmax
    from tests.numerics.lut.test_lut_composite import _softmax_reference

    g = torch.Generator().manual_seed(12)
    rows = [
        torch.randint(-32768, 32768, (5, 128), generator=g),  # full range: d saturates
        torch.full((2, 128), 32767),  # all equal at the top: every e maximal
        torch.full((2, 128), -32768),
        torch.tensor([[-32768, 32767] * 64]),  # x - max(x) = -65535 before saturation
        torch.randint(-40, 40, (4, 128), generator=g),  # many near-maximal e: the largest e*r
    ]
    codes = torch.cat(rows).to(torch.int16)
    from quantlab.numerics.lut.composite import SOFTMAX_EXP_SCALE

    tie = SOFTMAX_EXP_SCALE * (1 / 32767) * 2  # ratio 1/2: every odd e * r is a tie
    for s_in, s_out in [(16 / 32767.5, 1 / 32767), (1e-4, 1 / 60000), (2e-3, tie)]:
        got = lut_softmax(codes, s_in, DType.INT16, -1, s_out, DType.INT16)
        assert_bits_equal(got, _softmax_reference(codes, s_in, s_out), {"codes": codes})
