"""ONNX Runtime's QLinearMul arithmetic (CPU, MLAS, x86): the multiply a QDQ graph's
DequantizeLinear -> Mul -> QuantizeLinear is fused into when all three are 8-bit.

MLAS (``qlmul.cpp``, SSE2 kernel) forms M = fl32(fl32(sa * sb) / sc) once; per element the
exact product acc = (a - za) * (b - zb) (16-bit operands, an int32 product), then
v = fl32(fl32(fl32(acc) * M) + zc): the output zero point is added in float32, before the
rounding, so it can round the product's fraction away (with zc = 128 a quotient 3.4999999
becomes 131.5); c = cvt(v) half to even (x86's conversion: a value outside int32 gives
-2**31), saturated to int16 and then to the 8-bit type. quantlab's codes are symmetric (zero
point 0); a runtime holding int8 codes as uint8 with zero point 128 (``zero_point``) sees
a + 128, b + 128 and zc + 128 and returns c + 128, which changes zc and so the bits.
Pure functions on integer tensors; 8-bit operands read a table of every pair of codes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics import pair_table
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import INT32_LIMIT
from quantlab.numerics.scales import check_tensor_scale


def ratio(x_scale, y_scale, out_scale) -> float:
    """M = fl32(fl32(sa * sb) / sc), the float32 factor every product is multiplied by."""
    sa = check_tensor_scale(x_scale, "x_scale")
    sb = check_tensor_scale(y_scale, "y_scale")
    sc = check_tensor_scale(out_scale, "out_scale")
    return float((sa * sb) / sc)


def qlinear_mul(
    x: Tensor,
    x_scale: Tensor | float,
    y: Tensor,
    y_scale: Tensor | float,
    out_scale: Tensor | float,
    out: DType,
    zero_point: int = 0,
    zero_points: tuple[int, int, int] = (0, 0, 0),
) -> Tensor:
    """Output codes (``out``'s torch dtype) of ONNX Runtime's QLinearMul on codes ``x``, ``y``
    (integer tensors, broadcasting) with zero points ``zero_points`` = (x's, y's, output's),
    held by the runtime shifted by ``zero_point`` (0: as they are; 128: int8 codes as uint8):
    the module doc's formula, every float step one IEEE float32 operation, ties to even."""
    if x.is_floating_point() or y.is_floating_point():
        raise TypeError(f"x and y must hold integer codes, got {x.dtype} and {y.dtype}")
    m = ratio(x_scale, y_scale, out_scale)
    return _PAIR_TABLES.apply(
        (m, *zero_points, zero_point, out),
        x,
        y,
        lambda a, b: _mul_codes(a, b, m, zero_points, zero_point, out),
    )


def _mul_codes(
    x: Tensor, y: Tensor, m: float, zero_points: tuple, zero_point: int, out: DType
) -> Tensor:
    """``qlinear_mul``'s formula on each pair of codes."""
    zx, zy, zo = zero_points
    acc = (x.to(torch.int64) - zx) * (y.to(torch.int64) - zy)  # |acc| <= 2**16: exact
    v = acc.to(torch.float32).mul_(m).add_(float(zo + zero_point))  # two float32 roundings
    v = v.round_()  # half to even
    v = torch.where((v >= -INT32_LIMIT) & (v < INT32_LIMIT), v, -INT32_LIMIT)  # cvtps2dq
    return v.sub_(zero_point).clamp_(out.qmin, out.qmax).to(out.torch_dtype)


# (M, zero points, zero_point, out, x dtype, y dtype) -> ``_mul_codes`` of every pair of codes
_PAIR_TABLES = pair_table.PairTables()


def qlinear_mul_reference(
    x, x_scale, y, y_scale, out_scale, out: DType, zero_point: int = 0, zero_points=(0, 0, 0)
) -> np.ndarray:
    """Slow twin of ``qlinear_mul`` on equal-shaped codes: Python ints and numpy float32
    scalars, one element at a time; int64 codes."""
    f32 = np.float32
    m = f32(f32(f32(x_scale) * f32(y_scale)) / f32(out_scale))
    zx, zy, zo = zero_points
    xs, ys = np.asarray(x).reshape(-1), np.asarray(y).reshape(-1)
    res = []
    for a, b in zip(xs.tolist(), ys.tolist(), strict=True):
        acc = (a - zx) * (b - zy)
        v = f32(f32(f32(acc) * m) + f32(zo + zero_point))
        r = int(np.rint(float(v)))
        r = r if -INT32_LIMIT <= r < INT32_LIMIT else -INT32_LIMIT
        r = min(max(r, -32768), 32767)  # int16 pack
        res.append(min(max(r - zero_point, out.qmin), out.qmax))
    return np.array(res, dtype=np.int64).reshape(np.asarray(x).shape)
