"""RGB <-> NV12: the int64 fast path against a per-pixel exact-rational reference, every matrix,
range and rounding, on random, extreme and tie-producing pixels."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics.rounding import Round, round_rational
from quantlab.numerics.yuv import YuvMatrix, YuvRange, div_round, nv12_to_rgb, rgb_to_nv12

ROUNDS = list(Round)
CASES = list(itertools.product(YuvMatrix, YuvRange))


def _coef(matrix: YuvMatrix):
    kr, kb, d = matrix.value
    return Fraction(kr, d), Fraction(kb, d)


def _spans(rng: YuvRange):
    if rng is YuvRange.FULL:
        return 0, Fraction(1), Fraction(1)
    return 16, Fraction(219, 255), Fraction(224, 255)


def _clamp8(v: int) -> int:
    return min(255, max(0, v))


def ref_rgb_to_nv12(rgb: np.ndarray, matrix, rng, rounding):
    """Per pixel in exact rationals: Y, then U, V as the mean of the 2x2 block."""
    kr, kb = _coef(matrix)
    kg = 1 - kr - kb
    y0, ys, cs = _spans(rng)
    b_, _, h, w = rgb.shape
    y = np.zeros((b_, h, w), np.uint8)
    uv = np.zeros((b_, h // 2, w // 2, 2), np.uint8)
    for n in range(b_):
        yf = {}
        for i in range(h):
            for j in range(w):
                r, g, b = (int(v) for v in rgb[n, :, i, j])
                yf[i, j] = kr * r + kg * g + kb * b
                y[n, i, j] = _clamp8(round_rational(y0 + yf[i, j] * ys, rounding))
        for i in range(h // 2):
            for j in range(w // 2):
                cb = cr = Fraction(0)
                for di in (0, 1):
                    for dj in (0, 1):
                        r, _, b = (int(v) for v in rgb[n, :, 2 * i + di, 2 * j + dj])
                        yy = yf[2 * i + di, 2 * j + dj]
                        cb += (b - yy) / (2 * (1 - kb))
                        cr += (r - yy) / (2 * (1 - kr))
                uv[n, i, j, 0] = _clamp8(round_rational(128 + cb / 4 * cs, rounding))
                uv[n, i, j, 1] = _clamp8(round_rational(128 + cr / 4 * cs, rounding))
    return y, uv


def ref_nv12_to_rgb(y: np.ndarray, uv: np.ndarray, matrix, rng, rounding) -> np.ndarray:
    kr, kb = _coef(matrix)
    kg = 1 - kr - kb
    y0, ys, cs = _spans(rng)
    b_, h, w = y.shape
    out = np.zeros((b_, 3, h, w), np.uint8)
    for n, i, j in itertools.product(range(b_), range(h), range(w)):
        yy = (int(y[n, i, j]) - y0) / ys
        cb = (int(uv[n, i // 2, j // 2, 0]) - 128) / cs
        cr = (int(uv[n, i // 2, j // 2, 1]) - 128) / cs
        r = yy + 2 * (1 - kr) * cr
        b = yy + 2 * (1 - kb) * cb
        g = yy - (2 * kr * (1 - kr) * cr + 2 * kb * (1 - kb) * cb) / kg
        for c, v in enumerate((r, g, b)):
            out[n, c, i, j] = _clamp8(round_rational(v, rounding))
    return out


def _images(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    rnd = torch.randint(0, 256, (2, 3, 4, 6), generator=gen, dtype=torch.uint8)
    edge = torch.tensor([0, 1, 2, 127, 128, 129, 254, 255], dtype=torch.uint8)
    ext = edge[torch.randint(0, len(edge), (1, 3, 4, 6), generator=gen)]
    return torch.cat([rnd, ext])


def test_div_round_matches_the_rational_rule_on_ties_and_signs():
    num = torch.arange(-60, 61, dtype=torch.int64)
    for den, mode in itertools.product((1, 2, 3, 4, 10), ROUNDS):
        want = torch.tensor([round_rational(Fraction(int(n), den), mode) for n in num])
        assert_bits_equal(div_round(num, den, mode), want)
    with pytest.raises(ValueError, match="positive denominator"):
        div_round(num, 0, Round.HALF_UP)


@pytest.mark.parametrize("matrix,rng", CASES, ids=lambda v: v.name)
@pytest.mark.parametrize("rounding", [Round.HALF_UP, Round.HALF_EVEN, Round.FLOOR], ids=str)
def test_rgb_to_nv12_and_back_match_the_exact_reference(matrix, rng, rounding):
    rgb = _images(7)
    y, uv = rgb_to_nv12(rgb, matrix, rng, rounding)
    ry, ruv = ref_rgb_to_nv12(rgb.numpy(), matrix, rng, rounding)
    assert_bits_equal(y, torch.from_numpy(ry))
    assert_bits_equal(uv, torch.from_numpy(ruv))
    back = nv12_to_rgb(y, uv, matrix, rng, rounding)
    assert_bits_equal(back, torch.from_numpy(ref_nv12_to_rgb(ry, ruv, matrix, rng, rounding)))


def test_every_nv12_code_decodes_as_the_reference():
    """All 256 Y values against a grid of U, V codes (extremes clamp), full and limited."""
    ys = torch.arange(256, dtype=torch.uint8).view(1, 16, 16)
    cu = torch.tensor([0, 1, 16, 100, 127, 128, 129, 200, 240, 255], dtype=torch.uint8)
    gen = torch.Generator().manual_seed(3)
    uv = cu[torch.randint(0, len(cu), (1, 8, 8, 2), generator=gen)]
    for matrix, rng in CASES:
        got = nv12_to_rgb(ys, uv, matrix, rng, Round.HALF_UP)
        want = ref_nv12_to_rgb(ys.numpy(), uv.numpy(), matrix, rng, Round.HALF_UP)
        assert_bits_equal(got, torch.from_numpy(want))


def test_grey_survives_full_range_exactly():
    """R = G = B = v gives Y = v, U = V = 128 and back v (full range, any matrix)."""
    v = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(1, 3, 16, 16).contiguous()
    for matrix in YuvMatrix:
        y, uv = rgb_to_nv12(v, matrix, YuvRange.FULL, Round.HALF_UP)
        assert torch.equal(y, v[:, 0]) and bool((uv == 128).all())
        assert torch.equal(nv12_to_rgb(y, uv, matrix, YuvRange.FULL, Round.HALF_UP), v)


def test_bad_shapes_and_dtypes_are_named():
    with pytest.raises(ValueError, match="even height and width"):
        rgb_to_nv12(
            torch.zeros(1, 3, 3, 4, dtype=torch.uint8),
            YuvMatrix.BT601,
            YuvRange.FULL,
            Round.HALF_UP,
        )
    with pytest.raises(ValueError, match="uint8"):
        rgb_to_nv12(torch.zeros(1, 3, 4, 4), YuvMatrix.BT601, YuvRange.FULL, Round.HALF_UP)
    with pytest.raises(ValueError, match="do not match"):
        nv12_to_rgb(
            torch.zeros(1, 4, 4, dtype=torch.uint8),
            torch.zeros(1, 1, 2, 2, dtype=torch.uint8),
            YuvMatrix.BT601,
            YuvRange.FULL,
            Round.HALF_UP,
        )
