"""quantlab's arithmetic contract: every bit quantlab produces is decided in this package.

Submodules: ``dtypes`` (formats), ``rounding`` (one rounding vocabulary), ``scales`` (scale
validation), ``quantize`` (symmetric quantize / dequantize / fake quant), ``requant``
(accumulator -> codes, add rules), ``accumulator`` and ``contract`` (the int32 accumulator and
the ``GemmContract`` a platform composes), ``gemm`` (exact integer conv / linear / matmul and
quantized ops), ``split`` (high/low int8 splits), ``float16`` (correctly rounded float16
emulation), ``grid_sample``, ``lut``, ``periodic``, ``reference`` (slow twins used by tests)
and ``selftest`` (start-up check of the fast paths' exactness). It imports nothing from the
rest of quantlab.
"""

from quantlab.numerics.accumulator import Overflow, accumulate
from quantlab.numerics.contract import GemmContract, requantize_accumulator
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import (
    GemmPath,
    GemmStats,
    clamp_int16_operand,
    coarsen_int16_matmul_scale,
    finish_gemm,
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
    Divide,
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
    rescale_multiplier,
)
from quantlab.numerics.rounding import Round, round_float, rshift_round, saturate

__all__ = [
    "DType",
    "Divide",
    "GemmContract",
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
    "finish_gemm",
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
    "requantize_accumulator",
    "rescale_multiplier",
    "round_float",
    "rshift_round",
    "saturate",
]
