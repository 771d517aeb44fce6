"""QAT fake quant equals torch's fake-quant kernels bit for bit (with and without a fused
clamp), on random values, values at and next to rounding ties, and out-of-range values."""

from __future__ import annotations

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


def test_per_channel_and_other_rounding():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(8, 4, 3, 3, generator=g)
    s = w.abs().amax(dim=(1, 2, 3)) / 127.5
    want = torch.fake_quantize_per_channel_affine(
        w, s, torch.zeros(8, dtype=torch.int32), 0, -128, 127
    )
    assert_bits_equal(qat_fake_quant(w, s, DType.INT8, Round.HALF_EVEN, axis=0), want)
    from quantlab.numerics.quantize import fake_quant

    x = torch.randn(100, generator=g)
    sc = torch.tensor(0.01)
    assert_bits_equal(
        qat_fake_quant(x, sc, DType.INT8, Round.HALF_UP),
        fake_quant(x, sc, DType.INT8, Round.HALF_UP),
    )
