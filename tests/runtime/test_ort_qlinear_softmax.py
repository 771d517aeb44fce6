"""numerics.exp_table_softmax (the onnxruntime profile's softmax rule) gives onnxruntime's
QLinearSoftmax bits: int8 and uint8 codes, input and output zero points, rows from 1 to 60594
elements, a non-last axis, rows where rounding fl32(T * Y) / sum instead of fl32(T / sum) * Y,
or one float32 product of T and fl32(Y / sum), would change the result, near-ties that only the
double quotient (T * Y) / sum rounds as onnxruntime does (two RT-DETR attention rows among
them), exact ties (half to even), Y read through one-element rows (the float32 1 / sy, and a
subnormal sy), and a row length where the C library's logf is not the correctly rounded one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from quantlab.numerics import exp_table_softmax as ets
from quantlab.numerics.dtypes import DType
from quantlab.numerics.exp_table_softmax import exp_table, exp_table_softmax

ort = pytest.importorskip("onnxruntime")
from ort_qlinear_ops import F32, run_qlinear_softmax  # noqa: E402

_DT = {np.dtype(np.int8): DType.INT8, np.dtype(np.uint8): DType.UINT8}


def _profile(x: np.ndarray, sx, sy, zy, axis=-1) -> np.ndarray:
    got = exp_table_softmax(torch.from_numpy(x), float(sx), axis, float(sy), _DT[x.dtype], zy)
    return got.numpy()


def test_exp_table_softmax_matches_onnxruntime_on_random_rows():
    rng = np.random.default_rng(21)
    compared = 0
    for seed in range(160):
        dt = np.int8 if seed % 2 else np.uint8
        info = np.iinfo(dt)
        d = int(rng.choice([1, 2, 3, 17, 64, 128, 200, 512])) if seed % 3 else 128
        rows = int(rng.integers(1, 5))
        lo = info.min if seed % 4 else info.max - int(rng.integers(0, 60))
        x = rng.integers(lo, info.max + 1, (rows, d)).astype(dt)
        sx = F32(rng.uniform(0.005, 0.3))
        sy = F32(rng.choice([1 / 256, 1 / 255, 1 / 127, 1 / 149, rng.uniform(0.001, 0.02)]))
        zx = int(rng.integers(info.min, info.max + 1))
        zy = (
            int(rng.integers(info.min, info.max + 1))
            if seed % 3 == 0
            else (0 if dt == np.uint8 else -128)
        )
        got = run_qlinear_softmax(x, sx, zx, sy, zy)
        want = _profile(x, sx, sy, zy)
        assert np.array_equal(got, want), f"case {seed}: {int((got != want).sum())} differ"
        compared += got.size
    assert compared > 20000


def test_exp_table_softmax_matches_onnxruntime_on_a_middle_axis():
    rng = np.random.default_rng(22)
    x = rng.integers(0, 256, (2, 37, 5)).astype(np.uint8)
    got = run_qlinear_softmax(x, F32(0.07), 128, F32(1 / 256), 0, axis=1)
    assert np.array_equal(got, _profile(x, F32(0.07), F32(1 / 256), 0, axis=1))


def _quotient_first_cases(rng, want: int):
    """Two-element rows (codes 255, 255 - d) where rne(fl32(T / sum) * Y) and
    rne(T * fl32(Y / sum)) differ: rows that tell the two readings apart."""
    found = []
    d = np.arange(256)
    while len(found) < want:
        sx = F32(rng.uniform(0.005, 0.3))
        t = exp_table(float(sx), 2)
        s = (F32(t[255]) + t[255 - d]).astype(F32)
        for y in rng.integers(100, 400, 5):
            y = F32(y)
            for v in (np.full(256, t[255], F32), t[255 - d]):
                a = np.rint(((v / s).astype(F32) * y).astype(np.float64))
                b = np.rint((v * (y / s).astype(F32)).astype(np.float64))
                found += [(sx, int(j), float(y)) for j in np.nonzero(a != b)[0]]
    return found[:want]


def test_exp_table_softmax_takes_the_quotient_first_as_onnxruntime_does():
    for sx, d, y in _quotient_first_cases(np.random.default_rng(23), 12):
        sy = F32(1 / (y + 0.5))
        assert math.floor(F32(1) / sy) == y
        x = np.array([[255, 255 - d]], np.uint8)
        got = run_qlinear_softmax(x, sx, 0, sy, 0)
        assert np.array_equal(got, _profile(x, sx, sy, 0)), (sx, d, y)


# Two-element rows (codes top, top - d) at x scale sx and Y = floor(1 / sy) whose double quotient
# (T * Y) / sum lies within float32 rounding of a half: fl32(fl32(T / sum) * Y) rounds them to
# the other integer (e.g. 180.5000008: onnxruntime 181, the float32 quotient 180.5 gives 180).
_NEAR_TIES = [
    (0.1149781197309494, 26, 2077),  # 99.4999959 -> 99
    (0.20126500725746155, 13, 2651),  # 180.5000008 -> 181
    (0.009658640250563622, 41, 220),  # 131.4999991 -> 131 and 88.5000009 -> 89
    (0.3782545328140259, 7, 2034),  # 134.5000059 -> 135
    (0.062456682324409485, 87, 115),  # 114.5000021 -> 115
    (0.13225451111793518, 25, 99),  # 95.4999968 -> 95
    (0.01495276391506195, 203, 229),  # 218.5000016 -> 219
    (0.028404397889971733, 121, 2808),  # 87.4999999 -> 87
]


def _sy(y: int) -> np.float32:
    sy = F32(1 / (y + 0.5))
    assert ets.output_multiplier(sy) == y
    return sy


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_exp_table_softmax_rounds_near_ties_by_the_double_quotient(dt):
    top = int(np.iinfo(dt).max)
    zy = 0 if dt == np.uint8 else -128
    for sx, d, y in _NEAR_TIES:
        x = np.array([[top, top - d], [top - d, top]], dt)
        for z in (zy, zy + 5):
            got = run_qlinear_softmax(x, F32(sx), 0, _sy(y), z)
            assert np.array_equal(got, _profile(x, F32(sx), _sy(y), z)), (sx, d, y, z)


@pytest.mark.parametrize(
    "d, step, sx, y",
    [
        (3, 5, 0.2591637074947357, 579),
        (64, 29, 0.3146066665649414, 1820),
        (64, 29, 0.22604118287563324, 2522),
        (1000, 31, 0.305591881275177, 2441),
    ],
)
def test_exp_table_softmax_rounds_near_ties_in_longer_rows(d, step, sx, y):
    offsets = (np.arange(d) * step) % 97
    for dt, zy in ((np.uint8, 0), (np.uint8, 7), (np.int8, -128), (np.int8, -60)):
        top = int(np.iinfo(dt).max)
        x = np.stack([top - offsets, (top - offsets)[::-1]]).astype(dt)
        got = run_qlinear_softmax(x, F32(sx), 3, _sy(y), zy)
        assert np.array_equal(got, _profile(x, F32(sx), _sy(y), zy)), (d, dt, zy)


# Two rows of 64 codes from RT-DETR's first encoder attention (uint8, zero point 128; x scale
# 0.005626685, y scale 0.000163517, so Y = 6115): in row 0 one quotient is 108.5000035
# (onnxruntime 109), in row 1 four lie as near a half.
_RTDETR_ROWS = bytes.fromhex(
    "93928d887c6f6665a09e9a94897c7172a5a29f988f817777a2a09b958b7e7473"
    "9a97948e83766c6c92918d867c6e6565908d8a84786c62618f8d8a85796c6261"
    "b1acafb5b6afa19aada7abb0b2aa9e96aca6aab0b2a99c95aea9acb2b3ab9f98"
    "b1acb0b5b7afa29ab3aeb0b7b9b1a49cb3aeb1b7b9b0a49cb3adb0b6b7b0a39c"
)


def test_exp_table_softmax_matches_onnxruntime_on_rtdetr_attention_rows():
    x = np.frombuffer(_RTDETR_ROWS, np.uint8).reshape(2, 64).copy()
    sx, sy = F32(0.005626684986054897), F32(0.00016351707745343447)
    assert ets.output_multiplier(sy) == 6115
    got = run_qlinear_softmax(x, sx, 128, sy, 128)
    assert np.array_equal(got, _profile(x, sx, sy, 128))
    assert got[0, 26] == 128 + 109
    x8 = (x.astype(np.int16) - 128).astype(np.int8)
    for zy in (0, -128):
        got = run_qlinear_softmax(x8, sx, 0, sy, zy)
        assert np.array_equal(got, _profile(x8, sx, sy, zy)), zy


def test_exact_ties_round_half_to_even():
    # a row of D equal codes: sum = D * T exactly, so each quotient is Y / D
    for d, y, want in ((2, 255, 128), (2, 253, 126), (4, 254, 64), (4, 250, 62)):
        x = np.full((1, d), 200, np.uint8)
        got = run_qlinear_softmax(x, F32(0.1), 0, _sy(y), 0)
        assert (got == want).all() and np.array_equal(got, _profile(x, F32(0.1), _sy(y), 0))


def test_output_multiplier_is_the_float32_quotient_floored():
    # a one-element row gives Y: fl32(1 / fl32(1/3)) is 3.0 (the double quotient is below 3)
    for sy, want in ((F32(1 / 3), 3), (F32(1 / 10), 10), (F32(1 / 255), 254), (F32(0.75), 1)):
        x = np.array([[17]], np.uint8)
        got = run_qlinear_softmax(x, F32(0.1), 0, sy, 0)
        assert got[0, 0] == want and np.array_equal(got, _profile(x, F32(0.1), sy, 0))
    # a subnormal y scale: 1 / sy overflows float32, and the multiplier is floor(1 / sy) in double
    x = np.array([[255, 0, 128, 250]], np.uint8)
    for sx in (F32(1.0), F32(0.05)):
        got = run_qlinear_softmax(x, sx, 0, F32(1e-40), 3)
        assert np.array_equal(got, _profile(x, sx, F32(1e-40), 3))
    assert got.tolist() == [[255, 255, 255, 255]]


def test_exp_table_takes_the_c_librarys_logf(monkeypatch):
    """At D = 60594 glibc's logf(fl32(FLT_MAX / D)) is one float32 ulp off the correctly rounded
    logarithm; the table's shift follows the C library, as onnxruntime's does."""
    d = 60594
    x = (255 - np.random.default_rng(d).geometric(0.01, d).clip(0, 255)).astype(np.uint8)
    x[0] = 255
    sx, sy = F32(0.3), _sy(3880)
    got = run_qlinear_softmax(x[None], sx, 0, sy, 0)
    assert np.array_equal(got, _profile(x[None], sx, sy, 0))
    arg = float(F32(np.finfo(F32).max) / F32(d))
    if ets.c_logf(arg) != float(F32(math.log(arg))):  # this C library's logf is off here
        monkeypatch.setattr(ets, "c_logf", lambda v: float(F32(math.log(v))))
        ets._table.cache_clear()
        try:
            assert not np.array_equal(got, _profile(x[None], sx, sy, 0))
        finally:
            monkeypatch.undo()
            ets._table.cache_clear()
