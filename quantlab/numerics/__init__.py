"""quantlab's arithmetic contract: every bit quantlab produces is decided in this package.

Submodules: ``dtypes`` (formats), ``rounding`` (one rounding vocabulary), ``quantize``
(symmetric quantize / dequantize / fake quant), ``requant`` (accumulator -> codes, add rules),
``gemm`` (exact integer conv / linear / matmul and quantized ops), ``float16`` (correctly
rounded float16 emulation), ``reference`` (slow numpy int64 twins used by tests) and
``selftest`` (start-up check of the fast paths' exactness).
"""

from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import (
    GemmPath,
    GemmStats,
    Overflow,
    accumulate,
    clamp_int16_operand,
    coarsen_int16_matmul_scale,
    int16_matmul_scale_factor,
    int_conv1d,
    int_conv2d,
    int_linear,
    int_matmul,
    qconv1d,
    qconv2d,
    qlinear,
    qmatmul,
    quantize_bias,
)
from quantlab.numerics.quantize import (
    QuantStats,
    ScaleRule,
    compute_scale,
    dequantize,
    fake_cast,
    fake_quant,
    quantize,
)
from quantlab.numerics.requant import (
    Requant,
    RequantParams,
    add_float_rescale,
    add_inter_scale,
    make_requant,
    requant_scale,
    requantize,
)
from quantlab.numerics.rounding import Round, round_float, rshift_round, saturate

__all__ = [
    "DType",
    "GemmPath",
    "GemmStats",
    "Overflow",
    "QuantStats",
    "Requant",
    "RequantParams",
    "Round",
    "ScaleRule",
    "accumulate",
    "add_float_rescale",
    "add_inter_scale",
    "clamp_int16_operand",
    "coarsen_int16_matmul_scale",
    "compute_scale",
    "dequantize",
    "fake_cast",
    "fake_quant",
    "int16_matmul_scale_factor",
    "int_conv1d",
    "int_conv2d",
    "int_linear",
    "int_matmul",
    "make_requant",
    "qconv1d",
    "qconv2d",
    "qlinear",
    "qmatmul",
    "quantize",
    "quantize_bias",
    "requant_scale",
    "requantize",
    "round_float",
    "rshift_round",
    "saturate",
]
