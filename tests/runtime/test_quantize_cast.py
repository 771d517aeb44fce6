"""Quantizing a float tensor where no code holds the quotient: NaN, infinities and values beyond
the int32 range give the codes each runtime's quantize op gives (``QuantizeCast``, the profile's
``quantize_cast``): onnxruntime's QuantizeLinear (NaN -> the lowest code), LiteRT's QUANTIZE
under its reference kernels (an x86 int32 conversion first, so NaN, +inf and huge values give
the lowest code, and the zero point is added in wrapping int32) and under its default
interpreter (XNNPACK's 8-bit convert: NaN -> the highest code). Each case mixes these values
with random ones and rounding ties, with and without zero points."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from bits import assert_bits_equal

from quantlab.numerics import reference as ref
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import QuantizeCast
from quantlab.numerics.quantize_tail import QuantizeTail
from quantlab.platforms import load_platform

F32_BELOW_2_31 = 2147483520.0  # the largest float32 below 2**31
SPECIAL = [
    np.nan,
    -np.nan,
    np.inf,
    -np.inf,
    0.0,
    -0.0,
    1e30,
    -1e30,
    3.4e38,
    -3.4e38,
    F32_BELOW_2_31,
    -F32_BELOW_2_31,
    2.0**31,
    -(2.0**31),
    -2147483904.0,  # the float32 after -2**31, away from zero
    F32_BELOW_2_31 - 128,
]
_DTYPES = {
    np.dtype(np.int8): DType.INT8,
    np.dtype(np.uint8): DType.UINT8,
    np.dtype(np.int16): DType.INT16,
}


def _inputs(seed: int, scale: float, ties: bool = True) -> np.ndarray:
    """Special values (at scale 1, so each quotient is the value itself: the int32 limits are
    hit exactly; scaled up by ``scale`` where the case's scale is not 1), random values across
    the code range and beyond, and rounding ties k + 0.5 (``ties``)."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):  # 3.4e38 * 3.5 is inf, as meant
        special = np.array(SPECIAL, np.float32) * np.float32(scale)
    rand = (rng.standard_normal(200) * 150 * scale).astype(np.float32)
    parts = [special, rand]
    if ties:
        parts.append(((np.arange(-300, 300) + 0.5) * scale).astype(np.float32))
    x = np.concatenate(parts)
    return x[rng.permutation(x.size)].astype(np.float32)


def _quantlab(x: np.ndarray, scale: float, dt, zp: int, p) -> np.ndarray:
    """Codes of ``x`` as platform ``p`` quantizes in fixed mode, checked against the
    reference."""
    out = _DTYPES[np.dtype(dt)]
    codes = p.quantize_codes(torch.from_numpy(x), scale, out, zp)
    rules = dict(zero_point=zp, cast=p.quantize_cast, divide=p.quantize_divide)
    want = ref.quantize(x, scale, out, p.fake_round, tail=p.quantize_tail, **rules)
    assert_bits_equal(codes.to(torch.int64), torch.from_numpy(want))  # fast form == reference
    return codes.numpy()


# --- onnxruntime ---------------------------------------------------------------------------


def _ort_quantize_linear(x: np.ndarray, scale: float, zp: int, dt) -> np.ndarray:
    pytest.importorskip("onnxruntime")
    from ort_graphs import quantize_linear

    return quantize_linear(x, scale, zp, dt)


@pytest.mark.parametrize(
    "dt, zp", [(np.int8, 0), (np.int8, -7), (np.uint8, 128), (np.uint8, 3), (np.int16, 0)]
)
@pytest.mark.parametrize("profile", ["onnxruntime", "onnxruntime_no_vnni"])
def test_quantize_linear_matches_onnxruntime(dt, zp, profile):
    p = load_platform(profile)
    assert p.quantize_cast is QuantizeCast.NAN_TO_LOWEST
    for seed, scale in enumerate((1.0, 0.0371, 3.5)):
        x = _inputs(seed, scale)
        want = _ort_quantize_linear(x, scale, zp, dt)
        got = _quantlab(x, scale, dt, zp, p)
        assert_bits_equal(torch.from_numpy(got), torch.from_numpy(want))
        assert set(got[np.isnan(x)].tolist()) == {np.iinfo(dt).min}


# --- LiteRT --------------------------------------------------------------------------------


def _litert_quantize(
    x: np.ndarray, scale: float, zp: int, dt, kernels, shape=None
) -> tuple[np.ndarray, bool]:
    """LiteRT's QUANTIZE of ``x`` (as a [1, n] tensor, or of ``shape``), flattened."""
    pytest.importorskip("ai_edge_litert")
    import litert_models as L

    shape = [1, x.size] if shape is None else list(shape)
    case = L.QuantizeCase(x.reshape(shape), L.QParams(np.float32(scale), zp), dt)
    res = L.run(L.quantize_model(case), [case.x], kernels)
    return res.y.reshape(-1), res.delegated


@pytest.mark.parametrize(
    "dt, zp", [(np.int8, 0), (np.int8, 3), (np.uint8, 128), (np.uint8, 3), (np.int16, 0)]
)
def test_quantize_matches_litert_reference_kernels(dt, zp):
    import litert_models as L

    p = load_platform("tflite")
    assert p.quantize_cast is QuantizeCast.INT32_CAST
    for seed, scale in enumerate((1.0, 0.0371, 3.5)):
        x = _inputs(seed, scale)
        want, _ = _litert_quantize(x, scale, zp, dt, L.Kernels.REFERENCE)
        got = _quantlab(x, scale, dt, zp, p)
        assert_bits_equal(torch.from_numpy(got), torch.from_numpy(want))
    # +inf and 2**31 go to the lowest code; with zero point 128 the largest float32 below
    # 2**31 does too (its int32 sum with the zero point wraps)
    x = np.array([np.inf, 2.0**31, F32_BELOW_2_31], np.float32)
    want, _ = _litert_quantize(x, 1.0, zp, dt, L.Kernels.REFERENCE)
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    assert want.tolist() == [lo, lo, lo if zp == 128 else hi]


@pytest.mark.parametrize("dt, zp", [(np.int8, 0), (np.int8, 3), (np.uint8, 128), (np.uint8, 3)])
def test_quantize_matches_xnnpack(dt, zp):
    """XNNPACK's 8-bit convert: fl32(x * fl32(1 / s)) rounded half to even (LiteRT's reference
    kernels divide and round ties away from zero), NaN -> the highest code, the rest
    saturates."""
    import litert_models as L

    p = load_platform("litert_xnnpack")
    assert p.quantize_cast is QuantizeCast.NAN_TO_HIGHEST
    for seed, scale in enumerate((1.0, 0.0371, 3.5)):
        x = _inputs(seed, scale)
        want, delegated = _litert_quantize(x, scale, zp, dt, L.Kernels.DEFAULT)
        assert delegated
        got = _quantlab(x, scale, dt, zp, p)
        assert_bits_equal(torch.from_numpy(got), torch.from_numpy(want))
        assert set(got[np.isnan(x)].tolist()) == {np.iinfo(dt).max}
    ties = np.arange(-40, 40, dtype=np.float32) + np.float32(0.5)
    away, _ = _litert_quantize(ties, 1.0, zp, dt, L.Kernels.REFERENCE)
    even, _ = _litert_quantize(ties, 1.0, zp, dt, L.Kernels.DEFAULT)
    assert (away != even).any()  # the two kernels round ties apart


def _near_ties(scale: float, lo: int, hi: int) -> np.ndarray:
    """Float32 values within 3 ulps of (k + 0.5) * scale for k in [lo, hi): where fl32(x * fl32(1
    / s)), fl32(x / s) and the double quotient x / s round apart."""
    f32 = np.float32
    base = ((np.arange(lo, hi) + 0.5) * scale).astype(f32)
    steps = [base]
    up, down = base, base
    for _ in range(3):
        up, down = np.nextafter(up, f32(np.inf)), np.nextafter(down, f32(-np.inf))
        steps += [up, down]
    return np.concatenate(steps).astype(f32)


@pytest.mark.parametrize("zp", [0, 5])
@pytest.mark.parametrize("tail", range(8))
def test_int16_quantize_matches_litert_blocks_and_tail(tail, zp):
    """LiteRT's own int16 QUANTIZE (not delegated): whole blocks of 8 elements by rne(fl32(x *
    fl32(1 / s))), the last n mod 8 by the double quotient rounded half away from zero; NaN,
    infinities and overflow to the lowest code in both loops. Near-ties, exact ties and the
    special values land in the blocks and in the tail (the elements are shuffled)."""
    import litert_models as L

    p = load_platform("litert_xnnpack")
    assert p.quantize_tail is QuantizeTail.SCALAR_FLOAT64_HALF_AWAY
    missed = 0
    for seed, scale in enumerate((1.0, 0.0371, 3.5)):
        rng = np.random.default_rng(100 * tail + seed)
        x = np.concatenate([_inputs(seed, scale), _near_ties(scale, -300, 300)])
        x = x[rng.permutation(x.size)]
        x = x[: (x.size // 8 - 1) * 8 + tail]  # n mod 8 == tail
        assert x.size % 8 == tail
        # the tail holds exact ties, near ties and a NaN where it has room
        end = [np.float32(2.5 * scale), np.float32(-2.5 * scale), np.float32(np.nan)]
        end += list(_near_ties(scale, 7, 9)[:4])
        x[x.size - tail :] = np.array(end[:tail], np.float32)
        want, delegated = _litert_quantize(x, scale, zp, np.int16, L.Kernels.DEFAULT)
        assert not delegated
        got = _quantlab(x, scale, np.int16, zp, p)
        assert_bits_equal(torch.from_numpy(got), torch.from_numpy(want))
        one_rule = replace(p, quantize_tail=QuantizeTail.NONE)
        old = one_rule.quantize_codes(torch.from_numpy(x), scale, DType.INT16, zp).numpy()
        assert (old[: x.size - tail] == want[: x.size - tail]).all()  # the blocks: one rule
        missed += int((old != want).sum())
    assert missed > 0 if tail else missed == 0


def test_int16_quantize_tail_is_last_in_nhwc_order():
    """A 4-d tensor: LiteRT holds it NHWC, so the tail is the last elements in that order;
    quantlab's NCHW codes of the same values match LiteRT's element for element."""
    import litert_models as L

    p = load_platform("litert_xnnpack")
    scale, nhwc = 0.25, (1, 3, 5, 6)  # 90 elements: a tail of 2; x / s exact
    rng = np.random.default_rng(5)
    x = (rng.integers(-400, 400, nhwc) * 0.125).astype(np.float32)  # ties and integers
    # exact ties at the last but one element in NHWC order (in the tail) and in NCHW order
    # (not in the tail)
    x[0, -1, -1, -2] = np.float32(2.5 * scale)
    x[0, -1, -2, -1] = np.float32(-4.5 * scale)
    want, _ = _litert_quantize(x, scale, 0, np.int16, L.Kernels.DEFAULT, shape=nhwc)
    nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    got = _quantlab(nchw, scale, np.int16, 0, p)
    assert_bits_equal(torch.from_numpy(got.transpose(0, 2, 3, 1).ravel()), torch.from_numpy(want))
    # half away in the tail (3; the vector loop gives 2), half to even before it (-4)
    assert want.reshape(nhwc)[0, -1, -1, -2] == 3 and want.reshape(nhwc)[0, -1, -2, -1] == -4
