"""quantlab's arithmetic contract: every bit quantlab produces is decided in this package.

Submodules: ``dtypes`` (formats), ``rounding`` (one rounding vocabulary), ``scales`` (scale
validation), ``quantize`` (quantize / dequantize / fake quant, zero points, fused-activation
bounds), ``requant`` (accumulator -> codes, J6 and float-rescale adds), ``add_rules`` (TFLite
and XNNPACK integer adds), ``accumulator`` and ``contract`` (the accumulator and the
``GemmContract`` / per-family ``GemmRule`` a platform composes), ``gemm`` (exact integer conv /
linear / matmul and quantized ops), ``split`` (high/low int8 splits), ``float16`` (correctly
rounded float16 emulation), ``grid_sample``, ``lut``, ``periodic``, ``reference`` (slow twins
used by tests) and ``selftest`` (start-up check of the fast paths' exactness). It imports
nothing from the rest of quantlab.
"""

from quantlab.numerics.accumulator import Overflow, accumulate
from quantlab.numerics.add_rules import add_left_shift, add_shared_shift
from quantlab.numerics.code_bounds import BoundRule, bound_codes
from quantlab.numerics.contract import (
    GemmContract,
    GemmFamily,
    GemmRule,
    contract_for,
    requantize_accumulator,
)
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import (
    GemmPath,
    GemmStats,
    centre_codes,
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
    check_zero_point,
    compute_scale,
    compute_zero_point_scale,
    dequantize,
    fake_cast,
    fake_quant,
    quantize,
)
from quantlab.numerics.requant import (
    Requant,
    RequantParams,
    make_requant,
    requant_scale,
    requantize,
    rescale_multiplier,
)
from quantlab.numerics.rounding import Round, round_float, rshift_round, saturate
from quantlab.numerics.scaled_add import add_float_rescale, add_inter_scale

__all__ = [
    "BoundRule",
    "DType",
    "Divide",
    "GemmContract",
    "GemmFamily",
    "GemmRule",
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
    "add_left_shift",
    "add_shared_shift",
    "bound_codes",
    "centre_codes",
    "check_zero_point",
    "clamp_int16_operand",
    "coarsen_int16_matmul_scale",
    "compute_scale",
    "compute_zero_point_scale",
    "contract_for",
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
