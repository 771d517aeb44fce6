"""QAT fake quant equals torch's fake-quant kernels bit for bit (with and without a fused
clamp), on random values, values at and next to rounding ties, and out-of-range values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics.dtypes import DType
from quantlab.numerics.rounding import Round
from quantlab.simulate.qat import qat_fake_quant


def _values(scale: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.tensor(scale, dtype=torch.float32)
    k = torch.arange(-140, 141, dtype=torch.float32)
    ties = (k + 0.5) * s  # near ties of x / s (and of x * fl(1/s))
    nudged = torch.cat([torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1)])
    rnd = torch.randn(20000, generator=g) * scale * 60
    return torch.cat([ties, nudged, rnd, k * s, torch.tensor([1e30, -1e30, 0.0, -0.0])])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_per_tensor_equals_torch(seed, dtype):
    g = torch.Generator().manual_seed(100 + seed)
    for scale in torch.rand(4, generator=g).tolist() + [1 / 127.5, 0.1, 3.0517578125e-05]:
        s = torch.tensor(scale, dtype=torch.float32)
        x = _values(float(s), seed)
        want = torch.fake_quantize_per_tensor_affine(x, float(s), 0, dtype.qmin, dtype.qmax)
        got = qat_fake_quant(x, s, dtype, Round.HALF_EVEN)
        assert_bits_equal(got, want, inputs={"x": x})
        for lo, hi in ((0.0, 6.0), (-1.0, 1.0), (None, 0.5), (0.0, None)):
            clamped = torch.clamp(x, lo, hi)
            want = torch.fake_quantize_per_tensor_affine(
                clamped, float(s), 0, dtype.qmin, dtype.qmax
            )
            got = qat_fake_quant(x, s, dtype, Round.HALF_EVEN, bounds=(lo, hi))
            assert_bits_equal(got, want, inputs={"x": x})


@pytest.mark.parametrize("seed", [3, 4])
def test_per_channel_equals_torch_kernel(seed):
    # quantlab computes x * fl32(1/s) per channel itself; torch's kernel is the independent side
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, 4, 3, 3, generator=g)
    s = w.abs().amax(dim=(1, 2, 3)) / 127.5
    ties = (torch.arange(-40, 40, dtype=torch.float32).reshape(8, 10) + 0.5) * s.reshape(8, 1)
    near = torch.cat([ties, torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1)], 1)
    w = torch.cat([w.reshape(8, -1), near], 1)
    zp = torch.zeros(8, dtype=torch.int32)
    for lo in (-128, -127):
        want = torch.fake_quantize_per_channel_affine(w, s, zp, 0, lo, 127)
        got = qat_fake_quant(w, s, DType.INT8, Round.HALF_EVEN, axis=0, qmin=lo)
        assert_bits_equal(got, want, inputs={"w": w})
    clamped = torch.fake_quantize_per_channel_affine(w.clamp(-0.5, 0.6), s, zp, 0, -128, 127)
    got = qat_fake_quant(w, s, DType.INT8, Round.HALF_EVEN, axis=0, bounds=(-0.5, 0.6))
    assert_bits_equal(got, clamped)


def test_other_tie_rules_divide_like_the_reference():
    # oracle: reference.quantize (fl32(x / s) rounded with Fractions), then the exact product
    # code * s rounded once to float32
    from quantlab.numerics import reference as ref

    g = torch.Generator().manual_seed(3)
    sc = torch.tensor(0.01)
    k = torch.arange(-140, 141, dtype=torch.float32)
    x = torch.cat([torch.randn(400, generator=g), (k + 0.5) * sc, k * sc])
    for mode in (Round.HALF_UP, Round.HALF_AWAY, Round.FLOOR):
        for lo, bounds in ((None, None), (-127, (-1.0, 0.7))):
            xin = x if bounds is None else x.clamp(*bounds)
            codes = ref.quantize(xin, sc, DType.INT8, mode)
            if lo is not None:
                codes = np.maximum(codes, lo)
            want = (codes.astype(np.float64) * np.float64(np.float32(sc))).astype(np.float32)
            got = qat_fake_quant(x, sc, DType.INT8, mode, qmin=lo, bounds=bounds)
            assert_bits_equal(got, torch.from_numpy(want), inputs={"x": x})
