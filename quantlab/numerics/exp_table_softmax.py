"""ONNX Runtime's QLinearSoftmax (com.microsoft, CPU): the kernel a QDQ graph's
DequantizeLinear -> Softmax -> QuantizeLinear is fused into when both ends are 8-bit.

A 256-entry float32 table of exponentials, indexed by how far a code lies below its row's
maximum: T[i] = fl32(exp((i - 255 + b) * sx)) in double precision, i = 255 - (max(x) - x),
with b = max(0, logf(fl32(FLT_MAX / fl32(D))) - 5) / sx so that the sum of a row of D entries
stays finite: logf is the C library's float32 logarithm, which onnxruntime calls (glibc's is one
float32 ulp off the correctly rounded value for some D, the first at D = 60594), the rest double.
Per row: a float32 sum of T over the row, in element order. Per element, in double:
q = rne(fl64(T * Y) / sum) (T * Y exact for a float32 Y, the quotient rounded to double, then to
an integer, ties to even), with Y = floor(fl32(1 / sy)), or floor(1 / sy) in double if that
float32 quotient overflows; output code q + zy, saturated to the output dtype. The input's zero
point and how the runtime stores codes (int8, or uint8 shifted by 128) cancel: only max(x) - x
enters, and the shift moves q + zy and the saturation bounds alike. Y truncates 1 / sy, so the
output is biased low by up to one part in Y.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.scales import check_scale_float

FLOAT32_MAX = float(np.finfo(np.float32).max)
TABLE_HEADROOM = 5.0  # natural-log units left free below FLOAT32_MAX / D for the row sum
TABLE_ENTRIES = 256


def exp_table(x_scale: float, reduce_len: int) -> np.ndarray:
    """The 256 float32 exponentials T[i] = fl32(exp((i - 255 + b) * sx)) (module doc), indexed by
    255 - (max(x) - x); ``reduce_len`` is the softmax axis's length D (>= 1)."""
    sx = float(np.float32(check_scale_float(x_scale, "x_scale")))
    if reduce_len < 1:
        raise ValueError(f"reduce_len must be >= 1, got {reduce_len}")
    shift = c_logf(float(np.float32(FLOAT32_MAX) / np.float32(reduce_len)))
    shift = max(0.0, shift - TABLE_HEADROOM) / sx
    return np.array(
        [math.exp((i - 255 + shift) * sx) for i in range(TABLE_ENTRIES)], dtype=np.float32
    )


@functools.cache
def _libc_logf():
    """The C library's ``logf`` (the one onnxruntime calls), or None where ctypes finds none."""
    for name in (None, "m"):  # the process's own symbols first, then libm by name
        try:
            f = ctypes.CDLL(name if name is None else ctypes.util.find_library(name)).logf
        except (OSError, AttributeError, TypeError):
            continue
        f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
        return f
    return None


def c_logf(v: float) -> float:
    """logf(fl32(v)) as the C library computes it (float32 result, as a Python float); the
    correctly rounded fl32(log(v)) where no C library is reachable."""
    f = _libc_logf()
    v32 = float(np.float32(v))
    return float(f(v32)) if f is not None else float(np.float32(math.log(v32)))


def output_multiplier(y_scale: float) -> float:
    """Y = floor(fl32(1 / sy)) (the runtime's integer output multiplier, exact in float32), or
    floor(1 / sy) in double where the float32 quotient overflows (a subnormal sy)."""
    sy = np.float32(check_scale_float(y_scale, "y_scale"))
    with np.errstate(over="ignore"):
        inv = np.float32(1.0) / sy
    if np.isfinite(inv):
        return float(np.floor(inv))
    return float(math.floor(1.0 / float(sy)))


def _check(x: Tensor, out: DType) -> None:
    if x.is_floating_point():
        raise TypeError(f"x must hold integer codes, got {x.dtype}")
    if out.bits != 8 or not out.is_int:
        raise ValueError(f"out must be INT8 or UINT8 (the runtime's 8-bit kernel), got {out.name}")
    if x.dtype in (torch.int8, torch.uint8):  # 256 codes: any row spans at most 255
        return
    if x.numel() and int(x.max()) - int(x.min()) > 255:
        raise ValueError("x must hold 8-bit codes (a row spans at most 255 codes)")


def exp_table_softmax(
    x: Tensor,
    x_scale: float,
    dim: int,
    y_scale: float,
    out: DType,
    y_zero_point: int = 0,
) -> Tensor:
    """Output codes (``out``'s torch dtype, INT8 or UINT8) of ONNX Runtime's QLinearSoftmax on
    8-bit codes ``x`` along ``dim`` (module doc): float32 table, float32 row sum in element
    order, rne((T * Y) / sum) in double + ``y_zero_point``, saturated to ``out``."""
    _check(x, out)
    xm = torch.movedim(x, dim, -1)
    xm = xm.to(torch.int32 if x.dtype in _NARROW else torch.int64)  # wide codes stay wide
    d = xm.shape[-1]
    table = _table(float(np.float32(check_scale_float(x_scale, "x_scale"))), d)
    index = (xm - xm.amax(dim=-1, keepdim=True)).add_(255)  # 255 - (max(x) - x), in [0, 255]
    v = table.index_select(0, index.reshape(-1)).reshape(index.shape)
    total = torch.from_numpy(row_sums_in_order(v.numpy())).to(torch.float64)
    y = output_multiplier(y_scale)
    # in double: T * Y is exact (two 24-bit significands), one rounding for the quotient, then
    # half to even; the zero point and the bounds are small integers, exact in double
    q = v.to(torch.float64).mul_(y).div_(total.unsqueeze(-1)).round_()
    if y_zero_point:
        q.add_(int(y_zero_point))
    q = q.clamp_(out.qmin, out.qmax).to(out.torch_dtype)
    return torch.movedim(q, -1, dim)


_NARROW = (torch.int8, torch.uint8, torch.int16, torch.int32)
COLUMN_SUM_MIN_ROWS = 256  # from here on, adding column by column beats numpy's accumulate


def row_sums_in_order(v: np.ndarray) -> np.ndarray:
    """Float32 sums of the rows of ``v`` (last axis), one float32 addition per element in
    element order (no pairwise or wider accumulation). Many rows: the columns are added one at
    a time into a float32 vector of running sums (each numpy add is elementwise, so a row's
    running sum is formed from its previous one); few rows: the last column of numpy's float32
    ``add.accumulate`` along the rows, which does the same additions row by row."""
    d = v.shape[-1]
    if d == 0:
        return np.zeros(v.shape[:-1], dtype=np.float32)
    rows = v.size // d
    if rows < COLUMN_SUM_MIN_ROWS:
        return np.ascontiguousarray(np.add.accumulate(v, axis=-1, dtype=np.float32)[..., -1])
    columns = np.ascontiguousarray(np.moveaxis(v, -1, 0).reshape(d, rows), dtype=np.float32)
    total = columns[0].copy()
    for column in columns[1:]:
        np.add(total, column, out=total)
    return total.reshape(v.shape[:-1])


@functools.lru_cache(maxsize=256)
def _table(x_scale: float, reduce_len: int) -> Tensor:
    """``exp_table`` as a float32 tensor, built once per (scale, row length)."""
    return torch.from_numpy(exp_table(x_scale, reduce_len))


def exp_table_softmax_reference(
    x: np.ndarray,
    x_scale: float,
    dim: int,
    y_scale: float,
    out: DType,
    y_zero_point: int = 0,
) -> np.ndarray:
    """Slow twin of ``exp_table_softmax``: one scalar operation at a time (float32 sums, double
    quotients, Python's half-to-even ``round``), row by row; int64 codes."""
    xm = np.moveaxis(np.asarray(x, dtype=np.int64), dim, -1)
    table = exp_table(x_scale, xm.shape[-1])
    y = output_multiplier(y_scale)
    res = np.zeros(xm.shape, dtype=np.int64)
    for idx in np.ndindex(*xm.shape[:-1]):
        row = xm[idx]
        top = int(row.max())
        vals = [table[255 - (top - int(c))] for c in row]
        total = np.float32(0.0)
        for v in vals:
            total = np.float32(total + v)
        for j, v in enumerate(vals):
            q = round(float(v) * y / float(total)) + int(y_zero_point)  # Python floats: double
            res[idx + (j,)] = min(max(q, out.qmin), out.qmax)
    return np.moveaxis(res, -1, dim)
