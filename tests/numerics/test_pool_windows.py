"""Window sums and counts of average pools whose windows differ (padding, ceil_mode,
divisor_override, adaptive sizes that do not divide): equal to a slow loop over the windows in
Python integers, and, divided as torch divides, to torch's float64 pools bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pool_reference import slow_adaptive, slow_avg_pool

from quantlab.numerics.pool_windows import adaptive_bounds, adaptive_window_sums, window_sums


def _codes(gen, shape, lo=-32768, hi=32767):
    x = torch.randint(lo, hi + 1, shape, generator=gen)
    x.view(-1)[:4] = torch.tensor([lo, hi, lo, hi])[: x.numel()]  # the extremes, adversarial
    return x


def _avg_cases():
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        k = tuple(int(v) for v in torch.randint(1, 5, (2,), generator=gen))
        s = tuple(int(v) for v in torch.randint(1, 4, (2,), generator=gen))
        p = tuple(int(torch.randint(0, kk // 2 + 1, (1,), generator=gen)) for kk in k)
        h, w = (int(v) for v in torch.randint(max(k), 12, (2,), generator=gen))
        ceil_mode, include_pad = (
            bool(torch.rand(1, generator=gen) < 0.5),
            bool(torch.rand(1, generator=gen) < 0.5),
        )
        divisor = [None, None, 3][int(torch.randint(0, 3, (1,), generator=gen))]
        yield _codes(gen, (2, 3, h, w)), k, s, p, ceil_mode, include_pad, divisor


@pytest.mark.parametrize("case", list(_avg_cases()), ids=lambda c: f"k{c[1]}s{c[2]}p{c[3]}")
def test_avg_pool_window_sums_and_counts_equal_the_slow_loop_and_torch(case):
    codes, k, s, p, ceil_mode, include_pad, divisor = case
    sums, counts = window_sums(codes, k, s, p, ceil_mode, include_pad, divisor)
    want_sums, want_counts = slow_avg_pool(codes, k, s, p, ceil_mode, include_pad, divisor)
    assert torch.equal(sums, want_sums) and torch.equal(counts, want_counts)
    mean = F.avg_pool2d(codes.double(), k, s, p, ceil_mode, include_pad, divisor)
    assert torch.equal(sums.double() / counts.double(), mean)  # torch's own division, bitwise


@pytest.mark.parametrize("size", [(1, 1), (5, 7), (13, 4), (7, 7), (3, 9)])
@pytest.mark.parametrize("out", [(1, 2), (3, 3), (4, 5), (7, 2)])
def test_adaptive_window_sums_and_counts_equal_the_slow_loop_and_torch(size, out):
    gen = torch.Generator().manual_seed(size[0] * 31 + out[1])
    codes = _codes(gen, (2, 2, *size))
    sums, counts = adaptive_window_sums(codes, out)
    want_sums, want_counts = slow_adaptive(codes, *out)
    assert torch.equal(sums, want_sums) and torch.equal(counts, want_counts)
    # torch divides the exact sum by the window's height, then by its width
    (h0, h1), (w0, w1) = adaptive_bounds(size[0], out[0]), adaptive_bounds(size[1], out[1])
    mean = F.adaptive_avg_pool2d(codes.double(), out)
    kh, kw = (h1 - h0).double()[:, None], (w1 - w0).double()[None, :]
    assert torch.equal(sums.double() / kh / kw, mean)


def test_sums_that_could_leave_float64_exactness_are_refused():
    big = torch.full((1, 1, 4, 4), 1 << 51, dtype=torch.int64)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        window_sums(big, (2, 2), (1, 1), (1, 1), False, True, None)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        adaptive_window_sums(big, (3, 3))
    assert math.log2(32768 * (1 << 20)) < 53  # int16 codes over a million values: exact
