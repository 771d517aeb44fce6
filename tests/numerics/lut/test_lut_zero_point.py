"""Look-up tables on codes with zero points (``numerics.lut.zero_point``): every input code of
random and adversarial cases (int8 / uint8 inputs and outputs, zero points at the ends of the
code range, power-of-two scales that make exact rounding ties) gives the bits of the slow
reference, in direct mode (both 8-bit), through the segment LUT on centred codes, and as
onnxruntime computes each code (``TableValues.RUNTIME_FLOAT32``: direct at every width)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics import DType
from quantlab.numerics.lut import J6_FORMAT, TableValues, build_lut, default_spec
from quantlab.numerics.lut.zero_point import build_zero_point_lut

FUNCS = (
    "sigmoid",
    "tanh",
    "exp",
    "gelu",
    "silu",
    "log",
    "reciprocal",
    "sqrt",
    "sin",
    "hardsigmoid",
    "hardswish",
    "leaky_relu",
)
SEGMENT_FORMAT = dataclasses.replace(J6_FORMAT, direct_int8=False)
RUNTIME_FORMAT = dataclasses.replace(J6_FORMAT, values=TableValues.RUNTIME_FLOAT32)
OUT_DTYPES = (DType.INT8, DType.UINT8, DType.INT16)


def _case(seed: int):
    g = torch.Generator().manual_seed(seed)

    def pick(n):
        return int(torch.randint(0, n, (1,), generator=g))

    func = FUNCS[seed % len(FUNCS)]
    in_dt = (DType.INT8, DType.UINT8)[pick(2)]
    out_dt = OUT_DTYPES[pick(3)]
    ends = [in_dt.qmin, in_dt.qmax, in_dt.qmin + 1]
    zx = ends[pick(3)] if pick(4) == 0 else pick(256) + in_dt.qmin
    zo = 0 if out_dt is DType.INT16 else pick(256) + out_dt.qmin
    if pick(3) == 0:  # power-of-two scales: exact ties in the table rounding
        xs, so = 2.0 ** -(2 + pick(5)), 2.0 ** -(4 + pick(6))
    else:
        xs = float(torch.empty(()).uniform_(0.005, 0.08, generator=g))
        so = float(torch.empty(()).uniform_(0.002, 0.05, generator=g))
    if out_dt is DType.INT16:
        so /= 256
    return func, in_dt, xs, zx, out_dt, so, zo


@pytest.mark.parametrize(
    "fmt", [J6_FORMAT, SEGMENT_FORMAT, RUNTIME_FORMAT], ids=["direct", "segment", "runtime"]
)
def test_every_code_matches_the_reference(fmt):
    runtime = fmt.values is TableValues.RUNTIME_FLOAT32
    for seed in range(4 * len(FUNCS)):
        func, in_dt, xs, zx, out_dt, so, zo = _case(seed)
        t = build_zero_point_lut(func, in_dt, xs, zx, out_dt, so, zo, fmt=fmt)
        assert t.direct == (runtime or (fmt.direct_int8 and out_dt.bits == 8))
        codes = torch.arange(in_dt.qmin, in_dt.qmax + 1).to(in_dt.torch_dtype)
        got = t.evaluate(codes)
        assert got.dtype == out_dt.torch_dtype
        try:
            assert_bits_equal(got, t.evaluate_reference(codes))
        except AssertionError as e:
            raise AssertionError(f"seed {seed} {func} {in_dt.name}->{out_dt.name}: {e}") from None


def test_direct_table_is_the_definition_and_the_symmetric_table_without_zero_points():
    """Direct mode: saturate(round_half_even(f((x - zx) s_in) / s_out) + zo), the zero point
    added after rounding; with zero points 0 on int8 it is build_lut's direct table."""
    xs, so = 0.0625, 1 / 256  # sigmoid(0) / so = 128: a code, ties elsewhere
    t = build_zero_point_lut("sigmoid", DType.UINT8, xs, 100, DType.UINT8, so, 0)
    x = torch.arange(0, 256)
    want = torch.round(torch.sigmoid((x - 100).double() * xs) / so).clamp(0, 255)
    assert_bits_equal(t.evaluate(x.to(torch.uint8)), want.to(torch.uint8))
    t0 = build_zero_point_lut("tanh", DType.INT8, 0.03, 0, DType.INT8, 0.01, 0)
    sym = build_lut("tanh", DType.INT8, 0.03, DType.INT8, 0.01)
    codes = torch.arange(-128, 128).to(torch.int8)
    assert_bits_equal(t0.evaluate(codes), sym.evaluate(codes))


def test_segment_mode_is_the_segment_lut_on_centred_codes():
    """Segment mode: the segment LUT indexed by x - zx (int16 codes: they leave int8), output
    codes before the zero point in int16, then + zo, saturated."""
    zx, zo = -100, -128
    t = build_zero_point_lut("exp", DType.INT8, 0.02, zx, DType.INT8, 0.05, zo, fmt=SEGMENT_FORMAT)
    assert t.lut.in_dtype is DType.INT16 and t.lut.out_dtype is DType.INT16
    x = torch.arange(-128, 128)
    inner = t.lut.evaluate_reference((x - zx).to(torch.int16)).to(torch.int64)
    assert_bits_equal(t.evaluate(x.to(torch.int8)), (inner + zo).clamp(-128, 127).to(torch.int8))
    lo, hi = t.lut.points[0], t.lut.points[-1]
    assert -128 - zx <= lo < hi <= 127 - zx  # tables over the codes the input can reach


def test_refuses_16_bit_codes_with_a_zero_point():
    spec = default_spec("sigmoid")
    with pytest.raises(ValueError, match="in_dtype is INT16 with zero point 5.*SYMMETRIC"):
        build_zero_point_lut("sigmoid", DType.INT16, 1e-3, 5, DType.INT8, 0.01, 0, spec)
    with pytest.raises(ValueError, match="out_dtype's zero point 300 is outside"):
        build_zero_point_lut("sigmoid", DType.INT8, 1e-2, 0, DType.UINT8, 0.01, 300, spec)


@pytest.mark.parametrize(
    "func", ["tanh", "sigmoid", "exp", "silu", "rsqrt", "reciprocal", "hardswish"]
)
def test_runtime_tables_on_int16_codes_match_the_reference(func):
    """A RUNTIME_FLOAT32 table on int16 codes is direct over all 65536 codes (onnxruntime
    computes each one); sampled codes, both ends and zero match the reference."""
    xs = {"exp": 2.0**-11, "rsqrt": 2.0**-9, "reciprocal": 2.0**-9}.get(func, 3e-4)
    so = {"exp": 2.0**-7, "rsqrt": 2.0**-8, "reciprocal": 2.0**-5}.get(func, 2.0**-15)
    t = build_zero_point_lut(func, DType.INT16, xs, 0, DType.INT16, so, 0, fmt=RUNTIME_FORMAT)
    assert t.direct and len(t.direct_table) == 65536
    g = torch.Generator().manual_seed(len(func))
    codes = torch.cat(
        [
            torch.randint(-32768, 32768, (1500,), generator=g),
            torch.tensor([-32768, -1, 0, 1, 32767]),
        ]
    ).to(torch.int16)
    assert_bits_equal(t.evaluate(codes), t.evaluate_reference(codes))
