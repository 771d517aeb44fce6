"""Integer LUT evaluation: the fast gather equals the numpy reference on every input code."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import (
    FUNCTIONS,
    J6_FORMAT,
    TOSA_LIKE_FORMAT,
    LutFormat,
    Strategy,
    build_lut,
    default_spec,
    lut_fake,
    lut_fake_codes,
)
from quantlab.numerics.lut.analysis import sample_scales
from quantlab.numerics.lut.gather import gather_serial
from quantlab.numerics.lut.segment import all_codes
from quantlab.numerics.rounding import Round

I8, I16 = DType.INT8, DType.INT16
AUTO_STRATEGIES = (Strategy.EVENLY, Strategy.CURVATURE, Strategy.SQRT_CURVATURE, Strategy.MINIMAX)


def _spec(func: str, strategy: Strategy | None):
    spec = default_spec(func)
    if strategy is None:
        return spec
    return replace(spec, strategy=strategy, dividing_points=None)


def _build(func, strategy, in_dt=I16, out_dt=I16, fmt=J6_FORMAT):
    s_in, s_out = sample_scales(func, in_dt, out_dt)
    return build_lut(func, in_dt, s_in, out_dt, s_out, _spec(func, strategy), fmt)


def _check_all_codes(lut) -> None:
    codes = all_codes(lut.in_dtype).to(lut.in_dtype.torch_dtype)
    fast = lut.evaluate(codes)
    ref = lut.evaluate_reference(codes)
    assert_bits_equal(fast, ref, inputs={"code": codes})


@pytest.mark.parametrize(
    "strategy", [None, *AUTO_STRATEGIES], ids=lambda s: getattr(s, "name", "DEFAULT")
)
@pytest.mark.parametrize("func", sorted(FUNCTIONS))
def test_int16_all_codes_fast_equals_reference(func, strategy):
    _check_all_codes(_build(func, strategy))


@pytest.mark.parametrize("func", sorted(FUNCTIONS))
def test_int8_inputs_fast_equals_reference(func):
    seg = _build(func, None, I8, I16)  # int8 in, int16 out: segment format
    assert not seg.direct
    _check_all_codes(seg)
    direct = _build(func, None, I8, I8)  # int8 in, int8 out: direct table
    assert direct.direct
    _check_all_codes(direct)


@pytest.mark.parametrize("func", sorted(FUNCTIONS))
def test_direct_table_is_the_fake_counterpart(func):
    """int8 -> int8 has only output rounding: the table equals round(f(q s_in) / s_out)."""
    lut = _build(func, None, I8, I8)
    codes = all_codes(I8)
    fake = lut_fake_codes(codes.double() * lut.in_scale, func, I8, lut.out_scale, spec=lut.spec)
    assert_bits_equal(lut.evaluate(codes.to(torch.int8)).to(torch.int64), fake)


@pytest.mark.parametrize("mode", list(Round), ids=lambda r: r.name)
def test_interpolation_rounding_modes(mode):
    fmt = LutFormat(interp_round=mode)
    for func in ("sigmoid", "exp", "reciprocal"):
        _check_all_codes(_build(func, Strategy.CURVATURE, fmt=fmt))


@pytest.mark.parametrize(
    "fmt",
    [
        TOSA_LIKE_FORMAT,
        LutFormat(tables=4, entries=32, index_frac_bits=6),
        LutFormat(tables=8, entries=17, index_frac_bits=0),
        LutFormat(tables=2, entries=129, index_frac_bits=10, slope_bits=20),
    ],
    ids=["tosa_like", "4x32f6", "8x17f0", "2x129f10"],
)
def test_other_formats_are_profiles_of_the_same_code(fmt):
    for func in ("tanh", "gelu" if fmt.tables == 6 else "silu", "log"):
        lut = _build(func, Strategy.EVENLY, fmt=fmt)
        assert lut.tables.shape[1] == fmt.entries
        assert len(lut.points) - 1 <= fmt.tables
        _check_all_codes(lut)


def test_random_shapes_and_dtype():
    lut = _build("silu", None)
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(-32768, 32768, (3, 5, 7), generator=g, dtype=torch.int32).to(torch.int16)
    out = lut.evaluate(codes)
    assert out.shape == codes.shape and out.dtype == torch.int16
    assert_bits_equal(out, lut.evaluate_reference(codes))
    t = codes.transpose(0, 2)  # non-contiguous input
    assert_bits_equal(lut.evaluate(t), lut.evaluate_reference(t.contiguous()))


def test_torch_gather_equals_numpy_gather():
    for in_dt, out_dt in ((I16, I16), (I8, I16), (I8, I8)):
        lut = _build("exp", None, in_dt, out_dt)
        codes = all_codes(in_dt).to(in_dt.torch_dtype).reshape(-1, 8)
        assert_bits_equal(gather_serial(lut.code_map(), codes), lut.evaluate(codes))


def test_wrong_input_dtype_is_rejected():
    lut = _build("tanh", None)
    with pytest.raises(ValueError, match="int16"):
        lut.evaluate(torch.zeros(4, dtype=torch.int32))


def test_symmetric_mirror_and_edge():
    lut = _build("tanh", None)  # symmetric evenly
    codes = torch.tensor([1, 100, 32767, -1, -100, -32767, -32768], dtype=torch.int16)
    y = lut.evaluate(codes).to(torch.int64)
    assert y[3] == -y[0] and y[4] == -y[1] and y[5] == -y[2]
    assert y[6] == -y[2]  # -qmin does not fit: answered as -f(qmax)


def test_lut_fake_is_exact_function_then_fake_quant():
    x = torch.linspace(-6, 6, 1001)
    s = 1 / 32767.5
    y = lut_fake(x, "sigmoid", I16, s)
    assert y.dtype == torch.float32
    expected = (torch.round(torch.sigmoid(x.double()) / s).clamp(-32768, 32767) * s).float()
    assert_bits_equal(y, expected)


def test_lut_fake_non_finite_inputs():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    s = 1 / 32767.5
    for func in ("sigmoid", "exp", "log", "reciprocal", "inverse_sigmoid"):
        y = lut_fake(x, func, I16, s)
        assert torch.isfinite(y).all(), func
        assert y[0] == 0.0


def test_large_gather_equals_the_code_map_and_the_reference():
    """A large input (two million codes, 2 torch threads, torch parallelises the gather) gives
    the bits of indexing the code map by code mod 2**16 and of the integer reference.
    (That no thread is started is checked in tests/test_global_state.py.)"""
    lut = build_lut("tanh", DType.INT16, 8 / 32767.5, DType.INT16, 1 / 32767.5)
    g = torch.Generator().manual_seed(7)
    n = ((1 << 21) + 12345) // 7 * 7
    codes = torch.randint(-32768, 32768, (n,), generator=g).to(torch.int16)
    codes = codes.reshape(7, -1).t()  # 2-D and not contiguous
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = lut.evaluate(codes)
    finally:
        torch.set_num_threads(threads)
    table = lut.code_map().to(torch.int64)
    assert_bits_equal(got, table[codes.to(torch.int64) % 65536].to(torch.int16))
    assert_bits_equal(got[:4096], lut.evaluate_reference(codes[:4096]))
