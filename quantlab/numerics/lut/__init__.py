"""Segment look-up tables: how a fixed-point NPU evaluates nonlinear functions, bit-exactly.

``build_lut`` turns a function, scales and dtypes into integer parameters (``SegmentLut``);
``SegmentLut.evaluate`` computes output codes (one gather through a cached code map) and
``evaluate_reference`` is its slow integer twin (``quantlab.numerics.reference``);
``lut_fake`` is the QAT counterpart (exact float function, then output fake quant).
Facts: j6-numerics.md s.3, horizon-plugin.md s.1, bit-exact-emulation.md s.4.
"""

from quantlab.numerics.lut.analysis import (
    analyze,
    max_error_lsb,
    mean_error_lsb,
    profile,
    table_bounds,
)
from quantlab.numerics.lut.composite import inverse_sigmoid_composite, lut_softmax
from quantlab.numerics.lut.data_weighted import InputHistogram
from quantlab.numerics.lut.fake import lut_fake, lut_fake_codes
from quantlab.numerics.lut.formats import J6_FORMAT, TOSA_LIKE_FORMAT, LutFormat, TableValues
from quantlab.numerics.lut.functions import FUNCTIONS, LutFunction, default_spec, get_function
from quantlab.numerics.lut.ranges import input_range
from quantlab.numerics.lut.segment import SegmentLut, Tail
from quantlab.numerics.lut.spec import LutSpec, RangeRule
from quantlab.numerics.lut.strategies import Strategy
from quantlab.numerics.lut.table import build_lut

__all__ = [
    "FUNCTIONS",
    "InputHistogram",
    "J6_FORMAT",
    "TOSA_LIKE_FORMAT",
    "LutFormat",
    "LutFunction",
    "LutSpec",
    "RangeRule",
    "SegmentLut",
    "Strategy",
    "TableValues",
    "Tail",
    "analyze",
    "build_lut",
    "default_spec",
    "get_function",
    "input_range",
    "inverse_sigmoid_composite",
    "lut_fake",
    "lut_fake_codes",
    "lut_softmax",
    "max_error_lsb",
    "mean_error_lsb",
    "profile",
    "table_bounds",
]
