"""numerics.exp_table_softmax (ONNX Runtime's QLinearSoftmax rule) equals its slow scalar twin
on random and adversarial rows: both 8-bit dtypes, output zero points, any axis, rows of one
element (the table's largest entry times Y, beyond FLOAT32_MAX, is formed in double), rows
spanning the whole table, tiny and huge scales."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics.dtypes import DType
from quantlab.numerics.exp_table_softmax import (
    exp_table,
    exp_table_softmax,
    exp_table_softmax_reference,
    output_multiplier,
)


def _case(rng, seed):
    out = DType.UINT8 if seed % 2 else DType.INT8
    shape = [int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 70))]
    if seed % 9 == 0:
        shape[-1] = 1
    lo = out.qmin if seed % 3 else out.qmax - int(rng.integers(0, 20))
    x = torch.from_numpy(rng.integers(lo, out.qmax + 1, shape)).to(out.torch_dtype)
    if seed % 11 == 0:  # the whole table: the row's ends are 255 codes apart
        x.view(-1, shape[-1])[:, 0] = out.qmin
        x.view(-1, shape[-1])[:, -1] = out.qmax
    sx = float(np.float32(rng.choice([rng.uniform(1e-3, 0.5), 2.0**-4, 1.5])))
    sy = float(np.float32(rng.choice([1 / 256, 1 / 255, 1 / 127, rng.uniform(1e-3, 0.05)])))
    zy = 0 if seed % 4 else int(rng.integers(out.qmin, out.qmax + 1))
    dim = int(rng.integers(-3, 3))
    return x, sx, dim, sy, out, zy


@pytest.mark.parametrize("chunk", range(2))
def test_exp_table_softmax_matches_reference(chunk):
    rng = np.random.default_rng(300 + chunk)
    for seed in range(chunk * 60, (chunk + 1) * 60):
        x, sx, dim, sy, out, zy = _case(rng, seed)
        got = exp_table_softmax(x, sx, dim, sy, out, zy)
        want = exp_table_softmax_reference(x.numpy(), sx, dim, sy, out, zy)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


def test_exp_table_row_stays_finite_and_output_multiplier_truncates():
    for d in (1, 2, 128, 4096):
        t = exp_table(0.1, d)
        assert t.dtype == np.float32 and np.isfinite(t).all()
        assert np.isfinite(np.float32(t[-1]) * np.float32(d))
    assert output_multiplier(np.float32(1 / 255)) == 254.0  # fl32(1/255) is above 1/255
    assert output_multiplier(1 / 256) == 256.0


def test_exp_table_softmax_rejects_what_the_kernel_does_not_take():
    x = torch.zeros(2, 3, dtype=torch.int16)
    with pytest.raises(ValueError, match="INT8 or UINT8"):
        exp_table_softmax(x, 0.1, -1, 1 / 256, DType.INT16)
    with pytest.raises(TypeError, match="integer codes"):
        exp_table_softmax(x.float(), 0.1, -1, 1 / 256, DType.INT8)
    with pytest.raises(ValueError, match="y_scale"):
        exp_table_softmax(x, 0.1, -1, 0.0, DType.INT8)


@pytest.mark.parametrize("shape", [(40, 700), (3, 100, 50), (260, 9), (300, 1)])
def test_row_sums_add_in_element_order_in_float32(shape):
    """The row sum is the running float32 sum, not numpy's pairwise sum nor a wider one: on
    rows mixing magnitudes (where the order changes the bits) it equals a scalar loop, with
    few rows (numpy's accumulate) and many (column by column)."""
    from quantlab.numerics.exp_table_softmax import COLUMN_SUM_MIN_ROWS, row_sums_in_order

    rng = np.random.default_rng(5)
    v = (rng.uniform(0, 1, shape) * 10.0 ** rng.integers(-6, 6, shape)).astype(np.float32)
    rows = v.reshape(-1, shape[-1])
    want = np.zeros(len(rows), dtype=np.float32)
    for r, row in enumerate(rows):
        for t in row:
            want[r] = np.float32(want[r] + t)
    want = want.reshape(shape[:-1])
    got = row_sums_in_order(v)
    assert got.dtype == np.float32 and got.shape == shape[:-1]
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    if shape[-1] > 8:
        assert not np.array_equal(v.sum(axis=-1).view(np.int32), want.view(np.int32))
        assert not np.array_equal(v.astype(np.float64).sum(-1).astype(np.float32), want)
    assert (len(rows) >= COLUMN_SUM_MIN_ROWS) == (shape != (40, 700))


def test_many_rows_match_reference():
    rng = np.random.default_rng(9)
    x = torch.from_numpy(rng.integers(0, 256, (4, 80, 16))).to(torch.uint8)  # 320 rows
    x[0, 0] = 255  # a row of one value
    for dim in (-1, 1):
        got = exp_table_softmax(x, 0.11, dim, 1 / 256, DType.UINT8, 3)
        want = exp_table_softmax_reference(x.numpy(), 0.11, dim, 1 / 256, DType.UINT8, 3)
        assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


@pytest.mark.parametrize("d", [128, 513])
def test_exp_table_softmax_long_rows_match_reference(d):
    rng = np.random.default_rng(d)
    x = torch.from_numpy(rng.integers(-128, 128, (2, 3, d))).to(torch.int8)
    got = exp_table_softmax(x, 0.07, -1, 1 / 256, DType.UINT8, 0)
    want = exp_table_softmax_reference(x.numpy(), 0.07, -1, 1 / 256, DType.UINT8, 0)
    assert_bits_equal(got.to(torch.int64), torch.from_numpy(want))


def test_wide_codes_far_from_zero_give_the_bits_of_their_8bit_offsets():
    # only max(x) - x enters: int64 codes near 2**31 (past int32) read as their 8-bit offsets
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.integers(0, 256, (300, 12))).to(torch.uint8)
    want = exp_table_softmax(x, 0.09, -1, 1 / 256, DType.UINT8, 0)
    for offset in (2**31 - 100, -(2**40)):
        wide = x.to(torch.int64) + offset
        assert_bits_equal(exp_table_softmax(wide, 0.09, -1, 1 / 256, DType.UINT8, 0), want)
