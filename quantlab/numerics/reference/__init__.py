"""Slow, obviously-correct twins of the fast numerics, for tests only.

Integer sums are numpy int64 (no BLAS, no floats); requantization and rounding use Python ints
and ``fractions.Fraction`` element by element, following the published C code line by line
where a runtime defines the bits (gemmlowp, TFLite). Float32 steps a runtime performs in float32
are done with numpy float32 scalars. Every function takes tensors or arrays and returns a numpy
array (int64 for integers) or a tensor, so tests compare it with ``assert_bits_equal``.
The references round with their own code (``reference.rounding``, exact rationals), never with
``quantlab.numerics.rounding``. Modules by concept: ``rounding``, ``gemm``, ``requant``
(also quantize and the add rules), ``float16``, ``grid_sample``, ``resize``, ``lut``,
``norm``, ``embedding``.
"""

from quantlab.numerics.reference.embedding import embedding_fixed
from quantlab.numerics.reference.float16 import (
    f16_binary,
    f16_conv2d,
    f16_matmul,
    round_to_float16,
)
from quantlab.numerics.reference.gemm import (
    accumulate,
    int_conv1d,
    int_conv2d,
    int_conv_transpose1d,
    int_conv_transpose2d,
    int_linear,
    int_matmul,
)
from quantlab.numerics.reference.grid_sample import grid_sample_reference
from quantlab.numerics.reference.lut import evaluate_lut
from quantlab.numerics.reference.norm import norm_fixed
from quantlab.numerics.reference.requant import (
    add_float_rescale,
    add_inter_scale,
    add_left_shift,
    add_shared_shift,
    bound_code,
    quantize,
    quantize_bias,
    quantize_multiplier,
    requantize,
    requantize_value,
    rounding_divide_by_pot,
    srdhm,
)
from quantlab.numerics.reference.resize import resize_bilinear_reference
from quantlab.numerics.reference.rounding import round_fraction

__all__ = [
    "accumulate",
    "add_float_rescale",
    "add_inter_scale",
    "add_left_shift",
    "add_shared_shift",
    "bound_code",
    "embedding_fixed",
    "evaluate_lut",
    "f16_binary",
    "f16_conv2d",
    "f16_matmul",
    "grid_sample_reference",
    "int_conv1d",
    "int_conv2d",
    "int_conv_transpose1d",
    "int_conv_transpose2d",
    "int_linear",
    "int_matmul",
    "norm_fixed",
    "quantize",
    "quantize_bias",
    "quantize_multiplier",
    "requantize",
    "requantize_value",
    "resize_bilinear_reference",
    "round_fraction",
    "round_to_float16",
    "rounding_divide_by_pot",
    "srdhm",
]
