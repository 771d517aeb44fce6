"""numerics.exp_table_softmax (the onnxruntime profile's softmax rule) gives onnxruntime's
QLinearSoftmax bits: int8 and uint8 codes, input and output zero points, rows from 1 to 512
elements, a non-last axis, and rows where rounding fl32(T * Y) / sum instead of
fl32(T / sum) * Y, or one float32 product of T and fl32(Y / sum), would change the result."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

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
