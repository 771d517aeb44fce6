"""onnxruntime's LayerNorm rows in C (quantlab.numerics.ort_layer_norm_native): the bits of the
torch form of the same operations (ort_layer_norm(..., native=False)), which
tests/runtime/test_ort_layer_norm.py checks against onnxruntime, on every row length up to 80
and longer ones, on rows that cancel, constant and zero rows, tiny and huge values, with and
without bias, in every build of the kernel; and the torch form where no compiler builds it."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from native_builds import BUILDS, use_build, without_compiler

from quantlab.numerics import ort_layer_norm_native as K
from quantlab.numerics.ort_layer_norm import ort_layer_norm

LENGTHS = [*range(8, 81), 127, 128, 255, 384, 768, 1000, 1027]


def _rows(kind: str, r: int, n: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(r, n, generator=g)
    if kind == "offset":  # a large common offset the mean must cancel
        return x * 1e-3 + 1000.0 * torch.randn(r, 1, generator=g).sign()
    if kind == "scales":  # rows of very different magnitudes, subnormal to huge
        return x * torch.logspace(-40, 30, r).reshape(r, 1)
    if kind == "constant":
        return torch.full((r, n), 0.1) * torch.arange(r).reshape(r, 1)
    return x


@pytest.mark.parametrize("build", BUILDS)
def test_native_rows_give_the_torch_forms_bits(build, monkeypatch):
    use_build(build, K.KERNELS, monkeypatch)
    g = torch.Generator().manual_seed(0)
    for n in LENGTHS:
        for kind in ("random", "offset", "scales", "constant"):
            x = _rows(kind, 5, n, g)
            w = torch.randn(n, generator=g)
            b = torch.randn(n, generator=g) if n % 2 else None
            eps = 1e-5 if n % 3 else 1e-12
            want = ort_layer_norm(x, 1, w, b, eps, native=False)
            got = ort_layer_norm(x, 1, w, b, eps)
            assert_bits_equal(got, want)
    # over two dims, no weight, a non-contiguous input, zero rows
    x = torch.randn(3, 4, 6, 10, generator=g).transpose(0, 1)
    assert_bits_equal(
        ort_layer_norm(x, 2, None, None, 1e-5), ort_layer_norm(x, 2, None, None, 1e-5, native=False)
    )
    z = torch.zeros(4, 33)
    assert_bits_equal(
        ort_layer_norm(z, 1, None, torch.ones(33), 1e-5),
        ort_layer_norm(z, 1, None, torch.ones(33), 1e-5, native=False),
    )


def test_native_kernel_is_used_and_differs_from_the_unfused_sum():
    """The C kernel runs (not the torch fallback) and its fused variance lanes matter: on
    these rows an unfused accumulation gives other bits."""
    assert K.KERNELS.lib() is not None
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 384, generator=g) * 3 + 0.7
    y = K.mlas_rows(x, torch.ones(384), None, torch.tensor(1e-5))
    assert_bits_equal(y, ort_layer_norm(x, 1, None, None, 1e-5, native=False))
    mean = x.double().mean(1).float()[:, None]
    var = ((x - mean) ** 2).sum(1) / 384
    plain = (x - mean) * (1.0 / torch.sqrt(var + 1e-5))[:, None]
    assert not torch.equal(y, plain)


def test_without_a_compiler_the_torch_form_runs(monkeypatch):
    without_compiler(K, monkeypatch)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 40, generator=g)
    with pytest.warns(RuntimeWarning, match="onnxruntime LayerNorm kernel"):
        got = ort_layer_norm(x, 1, None, None, 1e-5)
    assert_bits_equal(got, ort_layer_norm(x, 1, None, None, 1e-5, native=False))
