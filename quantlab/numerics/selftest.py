"""Start-up self-test: the fast paths of the exact GEMM must equal torch int64 on adversarial
data.

The exactness of the fast paths is proved from a bound (``gemm.plan``), but the proof assumes
the BLAS / oneDNN kernels use no reduced-precision or transform-based algorithm, and that the
int8 matrix product does not saturate. This test checks those assumptions on the running
machine with operands that break any such shortcut: all odd, near the maximum, one sign, so
that partial sums far exceed 2**24 (plain float32 gets them wrong) and int8 pair sums exceed
int16 (a saturating int8 kernel gets them wrong); and int8 extremes of both signs. The exact
GEMM functions call ``ensure_selftest`` before their first product; AUTO then stops using
(with a warning) any path that failed.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quantlab.numerics.gemm.kernels import conv_planned, matmul_planned
from quantlab.numerics.gemm.plan import INT8_HALVES_MAX, GemmPath, plan_conv, plan_matmul
from quantlab.numerics.gemm.precision import exact_float_kernels


@dataclass(frozen=True)
class SelfTestCase:
    """One adversarial product on one path: how many outputs differ from torch int64."""

    name: str
    path: GemmPath
    outputs: int
    mismatches: int

    @property
    def ok(self) -> bool:
        return self.mismatches == 0


def _adversarial(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    hi = torch.iinfo(dtype).max  # odd: 127 or 32767
    return (hi - 2 * torch.randint(0, 3, shape, generator=g)).to(dtype)


def _halves(shape, seed: int) -> torch.Tensor:
    """int16 codes near INT8_HALVES_MAX, one sign: their int8 halves are near 127 (what a
    saturating int8 kernel gets wrong)."""
    g = torch.Generator().manual_seed(seed)
    return (INT8_HALVES_MAX - 2 * torch.randint(0, 3, shape, generator=g)).to(torch.int16)


def _extremes(shape, seed: int) -> torch.Tensor:
    """int8 codes -128 or 127 at random: the largest products of both signs."""
    g = torch.Generator().manual_seed(seed)
    return torch.where(torch.randint(0, 2, shape, generator=g) == 1, 127, -128).to(torch.int8)


def _matmul(a, b, path: GemmPath) -> torch.Tensor:
    plan = plan_matmul(a, b, path)
    with exact_float_kernels():
        return matmul_planned(a, b, a.shape[-1], plan)


def _conv(x, w, path: GemmPath, padding: int = 1, groups: int = 1, stride: int = 1):
    plan = plan_conv(x, w, groups, path, stride=stride, padding=padding)
    kw = dict(stride=stride, padding=padding, dilation=1, groups=groups)
    cin_g = x.shape[1] // groups
    with exact_float_kernels():
        return conv_planned(x, w, F.conv2d, kw, groups, cin_g, plan).to(torch.int64)


def run_selftest() -> list[SelfTestCase]:
    """Adversarial matmul and conv2d (int8 with K > 1032, int16; depthwise) on every fast path
    (~60 ms)."""
    cases = []
    mm8 = (_adversarial((4, 2100), torch.int8, 1), _adversarial((2100, 3), torch.int8, 2))
    mm8x = (_extremes((5, 2100), 9), _extremes((2100, 4), 10))
    mm16 = (_adversarial((3, 600), torch.int16, 3), _adversarial((600, 2), torch.int16, 4))
    mm16h = (_halves((3, 2100), 13), _adversarial((2100, 3), torch.int8, 14))
    mm16hh = (_halves((3, 600), 15), -_halves((600, 2), 16))
    cv8 = (_adversarial((1, 256, 4, 4), torch.int8, 5), _adversarial((3, 256, 3, 3), torch.int8, 6))
    pw8 = (_adversarial((2, 600, 3, 3), torch.int8, 11), _extremes((4, 600, 1, 1), 12))
    cv16 = (_adversarial((1, 64, 4, 4), torch.int16, 7), _adversarial((2, 64, 3, 3), torch.int8, 8))
    cv16h = (_halves((1, 64, 4, 4), 17), _extremes((2, 64, 3, 3), 18))
    dw8 = (_extremes((2, 16, 9, 9), 19), _extremes((32, 1, 3, 3), 20))
    dw16 = (_adversarial((1, 8, 9, 10), torch.int16, 21), _extremes((8, 1, 5, 5), 22))
    halves = [GemmPath.INT32_SPLIT, GemmPath.FLOAT64]
    fast = [GemmPath.INT32, GemmPath.FLOAT32, GemmPath.FLOAT64]
    for name, (a, b), paths in (
        ("matmul int8 K=2100", mm8, fast),
        ("matmul int8 extremes K=2100", mm8x, fast),
        ("matmul int16 K=600", mm16, [GemmPath.FLOAT64]),
        ("matmul int16 x int8 halves K=2100", mm16h, halves),
        ("matmul int16 x int16 halves K=600", mm16hh, halves),
    ):
        ref = _matmul(a, b, GemmPath.INT64)
        for p in paths:
            got = _matmul(a, b, p)
            cases.append(SelfTestCase(name, p, ref.numel(), int((got != ref).sum())))
    for name, (x, w), paths, padding in (
        ("conv2d int8 K=2304", cv8, fast, 1),
        ("conv2d 1x1 int8 K=600", pw8, fast, 0),
        ("conv2d int16 x int8 K=576", cv16, [GemmPath.FLOAT32_SPLIT, GemmPath.FLOAT64], 1),
        ("conv2d int16 x int8 halves K=576", cv16h, [*halves, GemmPath.FLOAT32_SPLIT], 1),
    ):
        ref = _conv(x, w, GemmPath.INT64, padding)
        for p in paths:
            got = _conv(x, w, p, padding)
            cases.append(SelfTestCase(name, p, ref.numel(), int((got != ref).sum())))
    # depthwise: stride 1 and 2, two outputs per channel; int16 sums beyond 2**24
    for name, (x, w), stride in (
        ("depthwise conv2d int8 extremes 3x3", dw8, 1),
        ("depthwise conv2d int16 x int8 5x5 stride 2", dw16, 2),
    ):
        ref = _conv(x, w, GemmPath.INT64, 2, x.shape[1], stride)
        got = _conv(x, w, GemmPath.INT32_DEPTHWISE, 2, x.shape[1], stride)
        cases.append(
            SelfTestCase(name, GemmPath.INT32_DEPTHWISE, ref.numel(), int((got != ref).sum()))
        )
    return cases


_LOCK = threading.Lock()
_STATE: dict = {"done": False, "disabled": frozenset()}


def ensure_selftest() -> frozenset[GemmPath]:
    """Run ``run_selftest`` once per process; returns the fast paths that failed it (empty
    when all pass). A failing path is reported once with a RuntimeWarning."""
    if _STATE["done"]:
        return _STATE["disabled"]
    with _LOCK:
        if not _STATE["done"]:
            disabled = set()
            for case in run_selftest():
                if not case.ok:
                    disabled.add(case.path)
                    warnings.warn(
                        f"exact GEMM self-test: {case.name} on path {case.path.name} differs from "
                        f"int64 in {case.mismatches}/{case.outputs} outputs; AUTO will not use "
                        "this path",
                        RuntimeWarning,
                        stacklevel=3,
                    )
            _STATE.update(done=True, disabled=frozenset(disabled))
    return _STATE["disabled"]
