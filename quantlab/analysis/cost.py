"""A documented cost model for mixed precision: MACs x operand bytes, plus LUT and split overheads.

Unit: one *int8-MAC equivalent* (int8 x int8 multiply-accumulate). The model is the bit-operations
count of mixed-precision literature (BOPs = MACs x bits_a x bits_w), expressed in bytes so that
an all-int8 GEMM costs exactly its MAC count. It is a relative measure for comparing precision
choices of one model on one platform, not a latency prediction (all weights below are assumed).

Per op (one row of ``Simulator.ops``):

- GEMM (conv1d, conv2d, conv_transpose1d/2d, linear, matmul):
  ``MACs x bytes(input) x bytes(weight)``; a matmul's second operand counts as the weight.
  With the high/low weight split (``weight_split`` 7 or 8) the GEMM runs twice on int8 halves
  and the two outputs are combined: ``2 x MACs x bytes(input) x 1 + out_elements x split_combine``.
- LUT ops (``simulate.fixed_lut.LUT_FUNCS``: sigmoid, tanh, exp, log, sqrt, rsqrt, sin, cos,
  erf, tan, atan, sinh, cosh, atanh, asinh, asin, acos, acosh, gelu, silu, hardsigmoid,
  hardswish, leaky_relu, prelu, elu, softplus, mish, log_sigmoid, softsign, selu, tanhshrink,
  expm1, exp2, erfc, log2, log10, log1p, celu, logit, reciprocal, inverse_sigmoid, pow with an
  exponent other than 2, whose category is LUT; pow(x, 2) is a mul):
  ``out_elements x lut_interp x bytes(output)``; an int8-in/int8-out op on a platform with a
  direct 256-entry table (``platform.lut_direct_int8``) costs ``lut_direct``.
- view-only ops (reshape, permute, slicing, ...): 0.
- every other op (add, mul, pooling, softmax, ...): ``out_elements x elementwise x bytes(output)``.

bytes(dtype): int8 1, int16 2, float16 2, int32 4, float32 4; an op that runs in float (unsupported
op, or no dtype recorded) counts as float32. MACs = ``flops / flops_per_mac``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from quantlab.numerics.dtypes import DType
from quantlab.simulate.fixed_lut import LUT_FUNCS

GEMM_TYPES = frozenset(
    {"conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "linear", "matmul"}
)
LUT_TYPES = LUT_FUNCS
VIEW_TYPES = frozenset(
    "reshape view permute transpose t flatten squeeze unsqueeze contiguous expand expand_as "
    "chunk split unbind narrow select view_as reshape_as movedim detach getitem pixel_shuffle "
    "pixel_unshuffle".split()
)


@dataclass(frozen=True)
class CostModel:
    """Weights of the cost model, in int8-MAC equivalents (all assumed, see module docstring)."""

    flops_per_mac: float = 2.0  # Simulator.ops counts a multiply-accumulate as 2 flops
    lut_interp: float = 4.0  # index, two table reads, interpolation, per output element (assumed)
    lut_direct: float = 1.0  # one read of a 256-entry table (int8 in, int8 out) (assumed)
    elementwise: float = 1.0  # one arithmetic step per output element (assumed)
    split_combine: float = 2.0  # shift + add of the two split halves per output element (assumed)

    def __post_init__(self) -> None:
        for name in ("flops_per_mac", "lut_interp", "lut_direct", "elementwise", "split_combine"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"CostModel.{name} must be a finite number >= 0, got {v!r}")
        if self.flops_per_mac <= 0:
            raise ValueError(f"CostModel.flops_per_mac must be > 0, got {self.flops_per_mac}")


def dtype_bytes(value) -> int:
    """Bytes of one element of ``value`` (a DType, its name/value; None, "" or NaN = float32)."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return 4
    dt = value if isinstance(value, DType) else DType.parse(str(value).split(".")[-1])
    return max(dt.bits // 8, 1)


def _dtype_list(value) -> list:
    """``Simulator.ops`` input dtypes: "INT8,INT16" (one per activation input, "" unknown)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, DType):
        return [value]
    return [v for v in str(value).split(",") if v.strip()]


def _elements(shape) -> int:
    if shape is None or (isinstance(shape, float) and math.isnan(shape)):
        return 0
    if isinstance(shape, str):
        shape = [int(s) for s in shape.strip("()[] ").replace(" ", "").split(",") if s]
    if len(shape) and isinstance(shape[0], list | tuple):  # several outputs
        return sum(_elements(s) for s in shape)
    return math.prod(int(s) for s in shape)


def _get(row: pd.Series, name: str, default=None):
    v = row.get(name, default)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return default
    return v


def op_cost(row: pd.Series, lut_direct_int8: bool, model: CostModel = CostModel()) -> float:
    """Cost of one op (a row of ``Simulator.ops``) in int8-MAC equivalents; see module doc."""
    op_type = str(row["op_type"])
    supported = bool(_get(row, "supported", True))
    out_dtype = _get(row, "output_dtype") if supported else None
    out_bytes = dtype_bytes(out_dtype)
    elements = _elements(_get(row, "output_shape"))
    ins = (_dtype_list(_get(row, "input_dtype")) or [out_dtype]) if supported else [None]
    if op_type in GEMM_TYPES:
        macs = float(_get(row, "flops", 0.0)) / model.flops_per_mac
        in_bytes = dtype_bytes(ins[0])
        split = int(_get(row, "weight_split", 0) or 0) if supported else 0
        if split:
            return 2.0 * macs * in_bytes + elements * model.split_combine
        if bool(_get(row, "has_weight", True)):
            w_bytes = dtype_bytes(_get(row, "weight_dtype") if supported else None)
        else:  # matmul of two activations: the second one plays the weight
            w_bytes = dtype_bytes(ins[1] if len(ins) > 1 else ins[0])
        return macs * in_bytes * w_bytes
    if op_type in LUT_TYPES and str(_get(row, "category", "LUT")) == "LUT":  # pow 2: a mul
        in_dtype = ins[0]
        direct = lut_direct_int8 and dtype_bytes(in_dtype) == 1 and out_bytes == 1
        if direct and DType.parse(str(out_dtype).split(".")[-1]) is DType.INT8:
            return elements * model.lut_direct
        return elements * model.lut_interp * out_bytes
    if op_type in VIEW_TYPES:
        return 0.0
    return elements * model.elementwise * out_bytes


def op_costs(ops: pd.DataFrame, lut_direct_int8: bool, model: CostModel = CostModel()) -> pd.Series:
    """Cost of every op of ``ops`` (``Simulator.ops``), indexed like ``ops``."""
    if "op_type" not in ops.columns:
        raise ValueError(f"ops table needs an 'op_type' column; got {list(ops.columns)}")
    return ops.apply(lambda r: op_cost(r, lut_direct_int8, model), axis=1).astype(float)


def model_cost(ops: pd.DataFrame, lut_direct_int8: bool, model: CostModel = CostModel()) -> float:
    """Total cost of one forward pass (sum of ``op_costs``), in int8-MAC equivalents."""
    return float(op_costs(ops, lut_direct_int8, model).sum()) if len(ops) else 0.0
