"""The radix sort of the MSE search (``calibration.sort_native``) gives numpy's ascending order
of float32 values, written as float64, bit for bit; ``BatchValues`` sorts through it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantlab.calibration.mse_search import BatchValues, sorted_values
from quantlab.calibration.sort_native import KERNELS, sort_float64

F32 = np.finfo(np.float32)


def _cases() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    special = np.array(
        [np.inf, -np.inf, F32.max, -F32.max, F32.tiny, -F32.tiny, F32.smallest_subnormal,
         -F32.smallest_subnormal, 1.0, -1.0, 0.5, -0.5], np.float32,
    )  # fmt: skip
    out = [np.empty(0, np.float32), np.array([3.0], np.float32), special]
    for n in (2, 7, 2048, 2049, 100_003):
        out.append(rng.standard_normal(n).astype(np.float32))  # both signs
        out.append(np.abs(rng.standard_normal(n)).astype(np.float32) * 1e-3)  # after a ReLU
        out.append(rng.integers(-5, 6, n).astype(np.float32) * np.float32(0.25))  # duplicates
        bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        out.append(np.where(np.isnan(x), np.float32(7.0), x))  # every exponent, no NaN
    out.append(np.full(5000, -2.5, np.float32))  # one digit everywhere: passes skipped
    out.append(np.concatenate([special, special[::-1]] * 300))
    return out


@pytest.mark.parametrize("i", range(len(_cases())))
def test_radix_sort_is_numpys_order_bit_for_bit(i):
    if KERNELS.lib() is None:
        pytest.fail("the C radix sort did not build here; the suite expects a C compiler")
    x = _cases()[i]
    got = sort_float64(x)
    want = np.sort(x).astype(np.float64)
    assert got.dtype == np.float64 and got.shape == want.shape
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


def test_negative_zero_sorts_before_positive_zero():
    x = np.array([0.0, -0.0, -1.0, 1.0, -0.0], np.float32)
    got = sort_float64(x)
    assert got.tolist() == [-1.0, 0.0, 0.0, 0.0, 1.0]
    assert np.signbit(got).tolist() == [True, True, True, False, False]


def test_other_dtypes_and_shapes_are_declined():
    assert sort_float64(np.zeros(4, np.float64)) is None
    assert sort_float64(np.zeros(4, np.float16)) is None
    assert sort_float64(np.zeros((2, 2), np.float32)) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_batch_values_ascending_is_the_sorted_float64_values(dtype):
    """float32 batches sort through the radix sort, the others through numpy: both give the
    nonzero values' ascending float64 array."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 17, 19, generator=g).relu().to(dtype)
    v = BatchValues(x)
    want = sorted_values(x.reshape(-1)[x.reshape(-1) != 0].to(torch.float64))
    assert torch.equal(v.x64, x.reshape(-1)[x.reshape(-1) != 0].to(torch.float64))
    assert v.ascending().dtype == torch.float64
    assert torch.equal(v.ascending(), want)
