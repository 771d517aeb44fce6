"""Every public numerics function rejects a bad scale (zero, negative, NaN, inf) with a
ValueError that names the argument and the value, instead of returning silent codes."""

from __future__ import annotations

import math
import re

import pytest
import torch

from quantlab.numerics import gemm, periodic, split
from quantlab.numerics import grid_sample as G
from quantlab.numerics.code_bounds import bound_codes, constant_codes
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import (
    build_lut,
    default_spec,
    get_function,
    input_range,
    lut_fake,
    lut_fake_codes,
    lut_softmax,
)
from quantlab.numerics.lut.composite import inverse_sigmoid_composite
from quantlab.numerics.quantize import compute_scale, dequantize, fake_quant, quantize
from quantlab.numerics.requant import Requant, requant_scale, rescale_multiplier
from quantlab.numerics.rounding import Round
from quantlab.numerics.scaled_add import add_float_rescale, add_inter_scale, inter_scale
from quantlab.platforms import PlatformConfig

BAD = [0.0, -0.25, math.nan, math.inf, -math.inf]

X = torch.linspace(-3, 3, 24).reshape(2, 3, 2, 2)
C8 = torch.arange(-12, 12, dtype=torch.int8).reshape(2, 3, 2, 2)
W8 = torch.ones(4, 3, 1, 1, dtype=torch.int8)
A8 = torch.arange(-6, 6, dtype=torch.int8).reshape(3, 4)
B8 = torch.ones(4, 2, dtype=torch.int8)
ACC = torch.arange(-8, 8, dtype=torch.int64).reshape(4, 4)
I16 = torch.arange(-40, 40, dtype=torch.int16)
J6M = PlatformConfig().gemm_contract()
OPERAND_MAX = PlatformConfig().int16_operand_max


def _qgrid():
    grid = torch.zeros(2, 3, 3, 2)
    return G.quantize_grid(grid, 2, 2, False, G.GridCoord.NORMALIZED)


def _cases():
    """(function name, argument name, call taking the bad value) for every public entry."""
    return [
        ("quantize", "scale", lambda v: quantize(X, v, DType.INT8)),
        ("quantize per channel", "scale", lambda v: quantize(X, [0.1, v], DType.INT8, axis=0)),
        ("dequantize", "scale", lambda v: dequantize(C8, v)),
        ("fake_quant", "scale", lambda v: fake_quant(X, v, DType.INT16)),
        ("requant_scale", "x_scale", lambda v: requant_scale(v, 0.1, 0.1, Requant.MUL_SHIFT)),
        (
            "requant_scale",
            "w_scale",
            lambda v: requant_scale(0.1, [0.1, v], 0.1, Requant.MUL_SHIFT),
        ),
        ("requant_scale", "out_scale", lambda v: requant_scale(0.1, 0.1, v, Requant.FLOAT_RESCALE)),
        ("quantize_bias", "x_scale", lambda v: gemm.quantize_bias(torch.ones(4), v, 0.5)),
        ("quantize_bias", "w_scale", lambda v: gemm.quantize_bias(torch.ones(4), 0.5, v)),
        ("acc_scale", "w_scale", lambda v: gemm.acc_scale(0.5, v)),
        (
            "finish_gemm",
            "out_scale",
            lambda v: gemm.finish_gemm(ACC, 0.1, 0.1, None, v, DType.INT8, J6M, -1),
        ),
        (
            "finish_gemm float output",
            "x_scale",
            lambda v: gemm.finish_gemm(ACC, v, 0.1, None, None, DType.FLOAT32, J6M, -1),
        ),
        ("qconv2d", "w_scale", lambda v: gemm.qconv2d(C8, 0.1, W8, v, None, 0.1, DType.INT8, J6M)),
        ("qmatmul", "x_scale", lambda v: gemm.qmatmul(A8, v, B8, 0.1, None, 0.1, DType.INT8, J6M)),
        (
            "qlinear",
            "out_scale",
            lambda v: gemm.qlinear(A8, 0.1, B8.t(), 0.1, None, v, DType.INT8, J6M),
        ),
        (
            "coarsen_int16_matmul_scale",
            "scale",
            lambda v: gemm.coarsen_int16_matmul_scale(v, 512, OPERAND_MAX),
        ),
        ("inter_scale", "y_scale", lambda v: inter_scale(0.1, v)),
        (
            "add_inter_scale",
            "out_scale",
            lambda v: add_inter_scale(
                C8, 0.1, C8, 0.2, v, DType.INT8, Requant.MUL_SHIFT, Round.HALF_UP
            ),
        ),
        (
            "add_float_rescale",
            "out_scale",
            lambda v: add_float_rescale(C8, 0.1, C8, 0.2, v, DType.INT8),
        ),
        (
            "add_float_rescale",
            "x_scale",
            lambda v: add_float_rescale(C8, v, C8, 0.2, 0.1, DType.INT8),
        ),
        ("split_weight", "scale", lambda v: split.split_weight(X, v, 7, axis=None)),
        ("split_fake_weight", "scale", lambda v: split.split_fake_weight(X, v, 7, axis=None)),
        ("split_error_bound", "scale", lambda v: split.split_error_bound(v, 7)),
        (
            "combine_split",
            "real_scale",
            lambda v: split.combine_split(
                ACC, ACC, 7, v, DType.INT8, split.SplitCombine.WIDE_ACCUMULATOR
            ),
        ),
        (
            "split_conv2d",
            "x_scale",
            lambda v: split.split_conv2d(
                C8,
                v,
                torch.ones(4, 3, 1, 1),
                torch.full((4,), 0.01),
                7,
                0.1,
                DType.INT8,
                split.SplitCombine.WIDE_ACCUMULATOR,
            ),
        ),
        (
            "split_linear",
            "out_scale",
            lambda v: split.split_linear(
                A8,
                0.1,
                torch.ones(2, 4),
                torch.full((2,), 0.01),
                7,
                v,
                DType.INT8,
                split.SplitCombine.SEPARATE_REQUANT,
            ),
        ),
        (
            "grid_sample_fixed",
            "x_scale",
            lambda v: G.grid_sample_fixed(C8[:, :, :2, :2], v, DType.INT8, _qgrid()),
        ),
        ("build_lut", "out_scale", lambda v: build_lut("tanh", DType.INT8, 0.05, DType.INT8, v)),
        ("lut_fake", "out_scale", lambda v: lut_fake(X, "sigmoid", DType.INT8, v)),
        ("lut_fake_codes", "out_scale", lambda v: lut_fake_codes(X, "exp", DType.INT16, v)),
        (
            "lut_softmax",
            "in_scale",
            lambda v: lut_softmax(C8, v, DType.INT8, -1, 1 / 255, DType.INT8),
        ),
        (
            "inverse_sigmoid_composite",
            "in_scale",
            lambda v: inverse_sigmoid_composite(I16, v, 0.01),
        ),
        (
            "needs_period_reduction",
            "x_scale",
            lambda v: periodic.needs_period_reduction(v, DType.INT16),
        ),
        ("period_reduce", "x_scale", lambda v: periodic.period_reduce(I16, v, DType.INT16)),
        (
            "rescale_multiplier",
            "out_scale",
            lambda v: rescale_multiplier(0.1, v, Requant.MUL_SHIFT, 4),
        ),
        ("bound_codes", "scale", lambda v: bound_codes(0.0, 6.0, v, DType.INT8)),
        (
            "requant_partial",
            "real",
            lambda v: split.requant_partial(ACC, v, Round.HALF_UP, Requant.FLOAT_RESCALE, 31),
        ),
        (
            "input_range",
            "in_scale",
            lambda v: input_range(
                get_function("tanh"), default_spec("tanh"), DType.INT8, v, DType.INT8, 0.01
            ),
        ),
    ]


CASES = _cases()


@pytest.mark.parametrize("bad", BAD, ids=str)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_bad_scale_is_rejected_naming_argument_and_value(case, bad):
    _, arg, call = case
    shown = re.escape(str(bad))
    with pytest.raises(ValueError, match=rf"\b{arg}\b.*{shown}"):
        call(bad)


@pytest.mark.parametrize("amax", [1e41, 1e300])
def test_compute_scale_rejects_an_amax_whose_scale_is_not_a_float32(amax):
    with pytest.raises(ValueError, match=r"amax.*float32"):
        compute_scale(amax, DType.INT8)
    with pytest.raises(ValueError, match="amax"):
        compute_scale(torch.tensor([1.0, amax]), DType.INT16, narrow_range=True)


def test_compute_scale_rejects_nan_amax_naming_it():
    with pytest.raises(ValueError, match=r"amax.*nan"):
        compute_scale(math.nan, DType.INT8)


@pytest.mark.parametrize("bad", [-0.25, math.nan, math.inf], ids=str)
def test_a_real_multiplier_may_be_zero_but_not_negative_or_nonfinite(bad):
    from quantlab.numerics.contract import GemmContract, requantize_accumulator
    from quantlab.numerics.requant import make_requant

    assert int(make_requant(0.0, Requant.MUL_SHIFT).multiplier) == 0  # an all-zero output
    with pytest.raises(ValueError, match=rf"real_scale.*{re.escape(str(bad))}"):
        make_requant(bad, Requant.MUL_SHIFT)
    with pytest.raises(ValueError, match=rf"real_scale.*{re.escape(str(bad))}"):
        requantize_accumulator(ACC, bad, DType.INT8, GemmContract())


@pytest.mark.parametrize("bad", [0.0, -0.0, math.nan, math.inf, -math.inf, 1e-45], ids=str)
def test_a_constant_operand_must_be_finite_nonzero_with_a_float32_scale(bad):
    with pytest.raises(ValueError, match=r"constant"):
        constant_codes(bad)


@pytest.mark.parametrize("c", [1.0, -1.0, 0.125, -3.7, 1e30])
def test_constant_codes_are_qmax_at_the_rounded_scale_shared_per_value(c):
    """+-qmax at fl32(|c| / qmax) (one float64 division, one rounding); the scale is one 0-d
    tensor per value (cached scales are never written), the code a new tensor each call."""
    code, s = constant_codes(c)
    code2, s2 = constant_codes(c)
    assert code.dtype == torch.int64 and int(code) == (32767 if c > 0 else -32767)
    assert s.dtype == torch.float32 and s.dim() == 0
    assert float(s) == float(torch.tensor(abs(c) / 32767, dtype=torch.float64).float())
    assert s2 is s and code2 is not code
