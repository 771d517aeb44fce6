"""Exact integer GEMM and quantized GEMM ops, by concept:

``plan`` (choosing a provably exact path), ``precision`` (torch's float precision pinned and
restored around the float paths), ``kernels`` (the planned kernels; ``depthwise_native``: the
depthwise convolutions' C loop), ``exact`` (int_conv1d,
int_conv2d, int_linear, int_matmul; ``prepare_conv`` checks and plans a convolution once),
``finish`` (bias, accumulator contract, requantization; ``shift_form``: its MUL_SHIFT fast
form; ``rescale32``: its FLOAT_RESCALE form in float32 where provably the same;
``requant_native``: both fast forms in one C pass),
``transposed`` (int_conv_transpose), ``quantized`` (qconv1d, qconv2d, qconv_transpose,
qlinear, qmatmul), ``int16_operands`` (the J6 int16 operand
rules). The start-up self-test is
``quantlab.numerics.selftest``.
"""

from quantlab.numerics.accumulator import Overflow, accumulate
from quantlab.numerics.contract import GemmContract, GemmFamily
from quantlab.numerics.gemm.exact import (
    PreparedConv,
    auto_excluded,
    int_conv1d,
    int_conv2d,
    int_linear,
    int_matmul,
    prepare_conv,
)
from quantlab.numerics.gemm.finish import (
    GemmStats,
    acc_scale,
    finish_constants,
    finish_gemm,
    quantize_bias,
)
from quantlab.numerics.gemm.int16_operands import (
    clamp_int16_operand,
    coarsen_int16_matmul_scale,
    int16_matmul_scale_factor,
    int16_operand_range,
)
from quantlab.numerics.gemm.pair_saturation import pair_saturated_conv, pair_saturated_matmul
from quantlab.numerics.gemm.plan import (
    FLOAT32_EXACT,
    FLOAT64_EXACT,
    GemmPath,
    GemmPlan,
    conv_macs,
    operand_bound,
    plan_conv,
    plan_gemm,
    plan_matmul,
)
from quantlab.numerics.gemm.precision import exact_float_kernels
from quantlab.numerics.gemm.quantized import (
    centre_codes,
    check_gemm_operands,
    qconv1d,
    qconv2d,
    qconv_transpose,
    qlinear,
    qmatmul,
)
from quantlab.numerics.gemm.transposed import int_conv_transpose, transposed_terms

__all__ = [
    "auto_excluded",
    "pair_saturated_conv",
    "pair_saturated_matmul",
    "FLOAT32_EXACT",
    "FLOAT64_EXACT",
    "GemmContract",
    "GemmFamily",
    "GemmPath",
    "GemmPlan",
    "GemmStats",
    "Overflow",
    "PreparedConv",
    "acc_scale",
    "accumulate",
    "centre_codes",
    "check_gemm_operands",
    "clamp_int16_operand",
    "coarsen_int16_matmul_scale",
    "conv_macs",
    "exact_float_kernels",
    "finish_constants",
    "finish_gemm",
    "int16_matmul_scale_factor",
    "int16_operand_range",
    "int_conv1d",
    "int_conv2d",
    "int_conv_transpose",
    "int_linear",
    "int_matmul",
    "operand_bound",
    "plan_conv",
    "plan_gemm",
    "plan_matmul",
    "prepare_conv",
    "qconv1d",
    "qconv2d",
    "qconv_transpose",
    "qlinear",
    "qmatmul",
    "quantize_bias",
    "transposed_terms",
]
