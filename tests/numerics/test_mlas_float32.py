"""MLAS's float32 tanh / logistic / exp / GELU (numerics.mlas_float32) and Eigen's log and
sin / cos (numerics.eigen_float32) equal their Fraction twins bit for bit on random and
adversarial inputs (clamp edges, zero, tiny and subnormal values, the exp range's ends,
overflow to inf, the integer reduction of large sin / cos arguments); the general fused
multiply-add equals an exactly rounded a * r + c."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from quantlab.numerics.fma import fma_float32
from quantlab.numerics.mlas_float32 import mlas_tanh
from quantlab.numerics.reference.eigen_float32 import eigen_log as eigen_log_reference
from quantlab.numerics.reference.eigen_float32 import eigen_sincos
from quantlab.numerics.reference.fma_add import round_to_float32
from quantlab.numerics.reference.mlas_float32 import mlas as ref_mlas
from tests.bits import assert_bits_equal
from tests.mlas_inputs import CASES, float32_inputs

F32 = np.float32


@pytest.mark.parametrize("func", list(CASES))
def test_mlas_kernels_equal_their_fraction_twin(func):
    fast, (lo, hi), edges = CASES[func]
    x = float32_inputs(lo, hi, edges, seed=len(func))
    got = fast(torch.from_numpy(x))
    if func in ("sin", "cos"):
        want = eigen_sincos(x, sine=func == "sin")
    else:
        want = eigen_log_reference(x) if func == "log" else ref_mlas(func, x)
    assert_bits_equal(got, torch.from_numpy(want), inputs={"x": torch.from_numpy(x)})


def test_mlas_kernels_refuse_float64():
    with pytest.raises(TypeError, match="float32"):
        mlas_tanh(torch.zeros(3, dtype=torch.float64))


def test_fma_float32_rounds_once_on_any_float32_operands():
    rng = np.random.default_rng(7)
    n = 3000
    a = (rng.normal(0, 1, n) * 10.0 ** rng.integers(-20, 20, n)).astype(F32)
    r = (rng.normal(0, 1, n) * 10.0 ** rng.integers(-15, 15, n)).astype(F32)
    c = (rng.normal(0, 1, n) * 10.0 ** rng.integers(-30, 30, n)).astype(F32)
    # a third on near-midpoints: c = -fl32(a * r) + a half ulp of it, plus a remainder
    k = n // 3
    prod = (a[:k].astype(np.float64) * r[:k].astype(np.float64)).astype(F32)
    c[:k] = (-prod.astype(np.float64) + np.spacing(prod).astype(np.float64) * 0.5).astype(F32)
    got = fma_float32(torch.from_numpy(a), torch.from_numpy(r), torch.from_numpy(c))
    want = [
        round_to_float32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
        for x, y, z in zip(a, r, c)
    ]
    assert_bits_equal(got, torch.tensor(want, dtype=torch.float32))
