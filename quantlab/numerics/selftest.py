"""Start-up self-test: the float fast paths of ``gemm`` must equal torch int64 on adversarial data.

The exactness of the float paths is proved from a bound (``gemm`` module docstring), but the
proof assumes the BLAS / oneDNN kernels use no reduced-precision or transform-based algorithm.
This test checks that assumption on the running machine with operands that break any
such shortcut: all odd, near the maximum, one sign, so that partial sums far exceed 2**24
(plain float32 gets them wrong). ``gemm`` runs it once per process before its first product
and stops using (with a warning) any path that fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantlab.numerics import gemm


@dataclass(frozen=True)
class SelfTestCase:
    """One adversarial product on one path: how many outputs differ from torch int64."""

    name: str
    path: gemm.GemmPath
    outputs: int
    mismatches: int

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


def _adversarial(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    hi = torch.iinfo(dtype).max  # odd: 127 or 32767
    return (hi - 2 * torch.randint(0, 3, shape, generator=g)).to(dtype)


def run_selftest() -> list[SelfTestCase]:
    """Adversarial matmul and conv2d (int8 with K > 1032, int16) on every float path (~50 ms)."""
    cases = []
    mm8 = (_adversarial((4, 2100), torch.int8, 1), _adversarial((2100, 3), torch.int8, 2))
    mm16 = (_adversarial((3, 600), torch.int16, 3), _adversarial((600, 2), torch.int16, 4))
    cv8 = (_adversarial((1, 256, 4, 4), torch.int8, 5), _adversarial((3, 256, 3, 3), torch.int8, 6))
    cv16 = (_adversarial((1, 64, 4, 4), torch.int16, 7), _adversarial((2, 64, 3, 3), torch.int8, 8))
    fast = [gemm.GemmPath.FLOAT32, gemm.GemmPath.FLOAT64]
    for name, (a, b), paths in (
        ("matmul int8 K=2100", mm8, fast),
        ("matmul int16 K=600", mm16, [gemm.GemmPath.FLOAT64]),
    ):
        ref = gemm.int_matmul(a, b, gemm.GemmPath.INT64)
        for p in paths:
            got = gemm.int_matmul(a, b, p)
            cases.append(SelfTestCase(name, p, ref.numel(), int((got != ref).sum())))
    for name, (x, w), paths in (
        ("conv2d int8 K=2304", cv8, fast),
        ("conv2d int16 x int8 K=576", cv16, [gemm.GemmPath.FLOAT32_SPLIT, gemm.GemmPath.FLOAT64]),
    ):
        ref = gemm.int_conv2d(x, w, padding=1, path=gemm.GemmPath.INT64)
        for p in paths:
            got = gemm.int_conv2d(x, w, padding=1, path=p)
            cases.append(SelfTestCase(name, p, ref.numel(), int((got != ref).sum())))
    return cases
