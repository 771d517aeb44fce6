"""``norm_native``'s C row mean stands in for torch's ``mean`` over the last dim of a
contiguous float32 (rows, n) tensor only where it gives the same bits: against torch on every
length from one vector to past the cascade's second level, at magnitudes from 1e-30 to 1e30,
with cancellation, ties, signed zeros, NaN and infinities, in all three builds and under
torch's AVX2 and baseline dispatches; the fused LayerNorm pass that uses it gives the torch
steps' bits, and where the C mean declines the torch means run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from bits import assert_bits_equal
from native_builds import BUILDS, use_build
from toolchain import CC

from quantlab.numerics import norm_native
from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import NormLayout
from quantlab.numerics.norm_calibrate import fake_affine
from tests.numerics.test_norm import calibrated, params
from tests.numerics.test_norm_fake import _torch_steps

needs_cc = pytest.mark.skipif(CC is None, reason="the native kernel needs a C compiler")

LENGTHS = [*range(16, 140), 255, 256, 257, 383, 384, 385, 511, 512, 513, 767, 768, 1023, 1024,
           1025, 2048, 4095, 4097, 8191, 8193, 16384, 20001]  # fmt: skip


def _rows(n: int, kind: int, g: torch.Generator, rows: int = 3) -> torch.Tensor:
    x = torch.randn(rows, n, generator=g)
    if kind == 1:
        x = x * 1e30
    elif kind == 2:
        x = x * 1e-30
    elif kind == 3:  # cancellation: large values of both signs around a small mean
        x = torch.cat([x[:, : n // 2] * 1e7, -x[:, : n // 2] * 1e7, x[:, n // 2 * 2 :]], 1)
    elif kind == 4:  # few distinct values: sums land on ties
        x = torch.round(x * 4) / 8
    elif kind == 5:  # signed zeros, NaN and infinities
        x = torch.zeros(rows, n)
        x[0] = -0.0
        x[1, n // 3] = float("inf")
        x[2, n // 2] = float("nan")
    return x


@pytest.fixture(params=BUILDS)
def kernels(request, monkeypatch):
    """The norm_fake library as ``request.param`` builds it, in place of the loaded one."""
    use_build(request.param, norm_native.KERNELS, monkeypatch)
    return norm_native.KERNELS.lib()


@needs_cc
def test_the_probes_find_the_lanes_torch_sums_with():
    assert norm_native._lanes() in (8, 16)


@needs_cc
@pytest.mark.parametrize("kind", range(6))
def test_the_c_row_means_are_torchs_bits(kernels, kind):
    g = torch.Generator().manual_seed(kind)
    lanes = norm_native._lanes()
    assert lanes in (8, 16)  # the probes found torch's order
    for n in LENGTHS:
        x = _rows(n, kind, g)
        got = torch.empty(3)
        kernels.torch_row_means(x.data_ptr(), 3, n, lanes, got.data_ptr())
        assert_bits_equal(got, x.mean(1), {"mean": x.mean(1)})
        one = x[2:].contiguous()  # a single row: torch sums it alone (fewer than GRAIN_SIZE)
        kernels.torch_row_means(one.data_ptr(), 1, n, lanes, got.data_ptr())
        assert_bits_equal(got[:1], one.mean(1))


@needs_cc
def test_the_other_lane_count_gives_other_bits():
    """The probes decide: the lane count they reject sums in another order, which random rows
    show."""
    g = torch.Generator().manual_seed(7)
    lanes = norm_native._lanes()
    assert lanes in (8, 16)
    other = 16 if lanes == 8 else 8
    x = torch.randn(64, 384, generator=g)
    got = torch.empty(64)
    norm_native.KERNELS.lib().torch_row_means(x.data_ptr(), 64, 384, other, got.data_ptr())
    assert not torch.equal(got.view(torch.int32), x.mean(1).view(torch.int32))


def test_rows_torch_sums_otherwise_are_declined(monkeypatch):
    """Rows shorter than 16 values (torch's scalar loop), one row of GRAIN_SIZE values or more
    with several threads (torch sums it in parallel pieces), and a torch whose sums the probes
    do not reproduce: no C mean."""
    monkeypatch.setattr(norm_native, "_lanes", lambda: 8)
    assert norm_native.torch_sum_lanes(4, 15) == 0
    assert norm_native.torch_sum_lanes(4, 16) == 8
    assert norm_native.torch_sum_lanes(2, 100_000) == 8
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert norm_native.torch_sum_lanes(1, norm_native._GRAIN_SIZE) == 0
        assert norm_native.torch_sum_lanes(1, norm_native._GRAIN_SIZE - 1) == 8
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setattr(norm_native, "_lanes", lambda: 0)
    assert norm_native.torch_sum_lanes(4, 384) == 0
    assert norm_native.torch_row_means(torch.randn(4, 384)) is None


@needs_cc
@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_under_torchs_other_dispatches_the_c_means_are_its_bits(capability):
    """torch chosen to run its AVX2 or baseline kernels (ATEN_CPU_CAPABILITY): the probes find
    a lane count and every length and kind gives torch's bits."""
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path[:0] = {[os.path.dirname(os.path.dirname(__file__)), os.path.dirname(__file__)]!r}
        from quantlab.numerics import norm_native
        from test_torch_row_mean import LENGTHS, _rows
        assert torch.backends.cpu.get_cpu_capability() == {capability.upper()!r}
        assert norm_native._lanes() in (8, 16)
        g = torch.Generator().manual_seed(3)
        for kind in range(6):
            for n in LENGTHS:
                x = _rows(n, kind, g)
                got = norm_native.torch_row_means(x)
                same = got.view(torch.int32) == x.mean(1).view(torch.int32)
                assert bool(same.all()), (n, kind)
        print("ok", norm_native._lanes())
        """
    )
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("ok")


@needs_cc
@pytest.mark.parametrize("n", [16, 48, 384, 1000])
def test_the_fused_pass_gives_the_torch_steps_and_the_two_pass_bits(kernels, n, monkeypatch):
    """The composite in one pass per row (its means by the C loop) against the torch steps and
    against the kernels' two-pass form (torch's means), on random, tied, saturating and NaN
    rows, with and without gamma and beta."""
    g = torch.Generator().manual_seed(n)
    layout = NormLayout.layer(n)
    x = torch.randn(4, 9, n, generator=g) * 3 + 1
    w, b = params(n, n)
    _, _, sc, so = calibrated(x, layout, w, b, DType.INT16, DType.INT8)
    gamma, beta = fake_affine(w, b, sc)
    ties = torch.round(x / (sc.diff / 2)) * (sc.diff / 2)
    nan = x.clone()
    nan.view(-1)[::11] = float("nan")
    for v in (x, ties, x * 9, nan):
        for gb in ((gamma, beta), (gamma, None), (None, beta), (None, None)):
            kernel = norm_native.rows_kernel(layout, 1e-5, sc, so, DType.INT8, DType.INT16, *gb)
            fused = kernel(v)
            with monkeypatch.context() as m:
                m.setattr(norm_native, "torch_sum_lanes", lambda rows, n: 0)
                two_pass = kernel(v)
            want = _torch_steps(v, layout, sc, so, DType.INT8, *gb)
            assert_bits_equal(fused, want, {"x": v})
            assert_bits_equal(two_pass, want, {"x": v})
