"""Requantization: int32 accumulator -> int8/int16 output codes (j6-numerics section 7).

Scheme enum only; the kernels are added alongside (see requant functions below).
"""

from __future__ import annotations

import enum


class Requant(enum.Enum):
    """How an accumulator is rescaled to output codes.

    FLOAT_RESCALE:    float32(acc) * float32(s_in*s_w/s_out), rounded (ONNX Runtime QLinear ops).
    MUL_SHIFT:        integer multiplier + shift with a single rounding (TFLite single rounding,
                      TOSA SINGLE_ROUND); tie rule from the platform's ``requant_round``.
    MUL_SHIFT_DOUBLE: gemmlowp/TFLite default double rounding (SRDHM half up, then
                      RoundingDivideByPOT half away).
    MUL_SHIFT_INT64:  TFLite 16x8 int64 path: 16-bit reduced multiplier, one half-up rounding.
    """

    FLOAT_RESCALE = "float_rescale"
    MUL_SHIFT = "mul_shift"
    MUL_SHIFT_DOUBLE = "mul_shift_double"
    MUL_SHIFT_INT64 = "mul_shift_int64"
