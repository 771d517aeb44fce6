"""LiteRT's reference kernels follow the integer rules of ``tflite_oracle``, bit for bit, and
quantlab's ``tflite`` profile gives the same bits (``quantlab_bridge``).

Each family runs ``N_CASES`` seeded one-op models (built in memory from the schema, int8 with
nonzero zero points or 16x8) in LiteRT single-threaded with ``OpResolverType.BUILTIN_REF``
and compares every output code with the numpy int64 oracle. The second group of tests shows
that the cases tell the rules apart: a plausible neighbouring rule (one rounding instead of
two, ties to even in the RELU6 bound, an integer multiplier for FULLY_CONNECTED, an int32
accumulator for 16x8 with an int64 bias, saturation instead of wrapping) gives other bits on
some of the same cases.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import litert_cases as C  # noqa: E402
import litert_models as L  # noqa: E402
import quantlab_bridge as B  # noqa: E402
import tflite_oracle as T  # noqa: E402
from bits import assert_bits_equal  # noqa: E402
from litert_models import Activation  # noqa: E402
from oracle_ops import INT32_MAX, INT32_MIN, conv_acc, fc_acc, round_half_even, wrap_int32  # noqa: E402  # noqa: E402

N_CASES = 300
i8, i16, i32, i64 = np.int8, np.int16, np.int32, np.int64

_CONV = (L.conv2d_model, T.conv, lambda c: [c.x])
_FC = (L.fully_connected_model, T.fully_connected, lambda c: [c.x])
_ADD = (L.add_model, T.add, lambda c: [c.a, c.b])

# family -> (case of a seed, model builder, oracle, graph inputs)
FAMILIES = {
    "conv_int8": (lambda s: C.conv_case(s, False, i8, i32), *_CONV),
    "depthwise_int8": (lambda s: C.conv_case(s, True, i8, i32), *_CONV),
    "fc_int8_per_tensor": (lambda s: C.fully_connected_case(s, i8, i32, False), *_FC),
    "fc_int8_per_channel": (lambda s: C.fully_connected_case(s, i8, i32, True), *_FC),
    "fc_int8_no_bias": (lambda s: C.fully_connected_case(s, i8, None, s % 2 == 0), *_FC),
    "conv_16x8_int64_bias": (lambda s: C.conv_case(s, False, i16, i64), *_CONV),
    "conv_16x8_int32_bias": (lambda s: C.conv_case(s, False, i16, i32), *_CONV),
    "depthwise_16x8_int64_bias": (lambda s: C.conv_case(s, True, i16, i64), *_CONV),
    "fc_16x8_int64_bias": (lambda s: C.fully_connected_case(s, i16, i64, s % 2 == 0), *_FC),
    "fc_16x8_int32_bias": (lambda s: C.fully_connected_case(s, i16, i32, s % 2 == 0), *_FC),
    "fc_16x8_no_bias": (lambda s: C.fully_connected_case(s, i16, None, s % 2 == 0), *_FC),
    "add_int8": (lambda s: C.add_case(s, i8), *_ADD),
    "add_int16": (lambda s: C.add_case(s, i16), *_ADD),
}


@pytest.fixture(scope="module")
def litert_runs():
    """family -> [(seed, case, LiteRT reference output)], computed once per family."""
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            make, build, _, inputs = FAMILIES[family]
            runs = []
            for seed in range(N_CASES):
                case = make(seed)
                runs.append((seed, case, L.run(build(case), inputs(case), L.Kernels.REFERENCE).y))
            cache[family] = runs
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_kernels_match_oracle(family, litert_runs):
    oracle = FAMILIES[family][2]
    for seed, case, y in litert_runs(family):
        try:
            assert_bits_equal(oracle(case), y)
        except AssertionError as e:
            raise AssertionError(f"{family} seed {seed}: {e}") from None


@pytest.mark.parametrize("family", FAMILIES)
def test_tflite_profile_matches_reference_kernels(family, litert_runs):
    """quantlab's ``tflite`` profile (qconv2d / qlinear / add_codes with its per-family rules,
    zero points and bound rule) gives LiteRT's reference kernels' bits on every case; 16x8
    models converted with an int32 bias (quantized_bias_type=INT32) under the profile's
    ``int16_bias_dtype=INT32``."""
    from dataclasses import replace

    from quantlab.numerics.dtypes import DType
    from quantlab.platforms import load_platform

    platform = load_platform("tflite")
    if family.endswith("16x8_int32_bias"):
        platform = replace(platform, int16_bias_dtype=DType.INT32)
    kernel = {L.conv2d_model: B.litert_conv, L.fully_connected_model: B.litert_fully_connected}
    ours = kernel.get(FAMILIES[family][1], B.litert_add)
    for seed, case, y in litert_runs(family):
        try:
            assert_bits_equal(ours(case, platform), y)
        except AssertionError as e:
            raise AssertionError(f"tflite profile, {family} seed {seed}: {e}") from None


def test_every_family_has_hundreds_of_cases_with_zero_points(litert_runs):
    assert N_CASES >= 200
    zero_points = {c.xq.zero_point for _, c, _ in litert_runs("conv_int8")}
    assert len(zero_points - {0}) > 50


@pytest.mark.parametrize("family", ["conv_16x8_int64_bias", "fc_16x8_int64_bias"])
def test_16x8_cases_accumulate_past_int32(family, litert_runs):
    """Some cases' exact sums pass 2**31, so the matches above cover the int64 accumulator."""
    acc = conv_acc if family.startswith("conv") else fc_acc
    over = sum(int(np.abs(acc(c)).max() > INT32_MAX) for _, c, _ in litert_runs(family))
    assert over >= 10


# --------------------------------------------------------------------------- neighbouring rules


def _single_rounding(acc, q, shift):
    """round(acc * q / 2**(31 - shift)) once, ties toward +inf (TFLITE_SINGLE_ROUNDING)."""
    total = 31 - np.asarray(shift, np.int64)
    return (np.asarray(acc, np.int64) * q + (np.int64(1) << (total - 1))) >> total


def _bounds_half_even_f64(act, scale, zp, dtype):
    """RELU6 bound zp + round(6 / scale) in float64, ties to even."""
    lo, hi = T.activation_range(act, scale, zp, dtype)
    if act is Activation.RELU6:
        hi = min(int(np.iinfo(dtype).max), zp + int(round_half_even(6.0 / np.float64(scale))))
    return lo, hi


def _conv_requant(c, acc, rescale, bounds=T.activation_range):
    q, e = T.per_channel_multipliers(c.xq.scale, c.w_scale, c.yq.scale, acc.shape[-1])
    return T.finish(rescale(acc, q, e), c.yq, c.activation, c.x.dtype, bounds)


def conv_single_rounding(c):
    return _conv_requant(c, wrap_int32(conv_acc(c)), _single_rounding)


def conv_relu6_half_even(c):
    return _conv_requant(c, wrap_int32(conv_acc(c)), T.mbqm32, _bounds_half_even_f64)


def fc_integer_multiplier(c):
    """FULLY_CONNECTED through the integer multiplier (what the optimized builtin kernel uses)."""
    acc = wrap_int32(fc_acc(c))
    q, e = T.per_channel_multipliers(c.xq.scale, c.w_scale, c.yq.scale, acc.shape[-1])
    return T.finish(T.mbqm32(acc, q, e), c.yq, c.activation, c.x.dtype)


def conv_int32_saturated(c):
    """16x8 as an int8 conv: int32 accumulator that saturates, double rounding."""
    acc = np.clip(conv_acc(c), INT32_MIN, INT32_MAX)
    return _conv_requant(c, acc, T.mbqm32)


NEIGHBOURS = {
    "conv_int8 one rounding": ("conv_int8", conv_single_rounding),
    "conv_int8 RELU6 bound half to even (float64)": ("conv_int8", conv_relu6_half_even),
    "fc_int8_per_channel integer multiplier": ("fc_int8_per_channel", fc_integer_multiplier),
    "fc_int8_per_tensor integer multiplier": ("fc_int8_per_tensor", fc_integer_multiplier),
    "conv_16x8_int64_bias int32 accumulator": ("conv_16x8_int64_bias", conv_int32_saturated),
    "conv_16x8_int32_bias saturating accumulator": ("conv_16x8_int32_bias", conv_int32_saturated),
}


@pytest.mark.parametrize("rule", NEIGHBOURS)
def test_cases_tell_the_rule_from_a_neighbour(rule, litert_runs):
    family, neighbour = NEIGHBOURS[rule]
    differing = sum(int((neighbour(c) != y).sum()) for _, c, y in litert_runs(family))
    assert differing > 0, f"{rule}: no case separates it from LiteRT's rule"


# --------------------------------------------------------------------------- fused RELU6 bound


@pytest.mark.parametrize("seed", range(8))
def test_relu6_bound_rounds_half_away_in_float32(seed):
    """A 1x1 FULLY_CONNECTED driven past 6.0: its largest output is the RELU6 bound, at scales
    where 6.0f / scale is exactly k + 0.5 (LiteRT rounds away: k + 1 + zp)."""
    rng = np.random.default_rng(700 + seed)
    sy = C.relu6_tie_scale(rng)
    zy = int(rng.integers(-100, 0))
    x = np.arange(-128, 128, dtype=np.int8).reshape(-1, 1)
    w = np.array([[127]], np.int8)
    case = L.FullyConnectedCase(
        x,
        L.QParams(np.float32(0.05), 0),
        w,
        np.array([0.05], np.float32),
        None,
        L.QParams(sy, zy),
        Activation.RELU6,
    )
    y = L.run(L.fully_connected_model(case), [x], L.Kernels.REFERENCE).y
    lo, hi = T.activation_range(Activation.RELU6, sy, zy, np.int8)
    assert (int(y.min()), int(y.max())) == (lo, hi)
    assert hi - zy == int(np.float32(6.0) / sy) + 1  # the tie k + 0.5 went up


def test_depthwise_16x8_takes_only_an_int64_bias():
    """DEPTHWISE_CONV_2D 16x8 has no int32-bias kernel: LiteRT refuses the model."""
    case = C.conv_case(0, True, i16, i32)
    with pytest.raises(RuntimeError, match="INT32 != INT64"):
        L.run(L.conv2d_model(case), [case.x], L.Kernels.REFERENCE)


@pytest.mark.parametrize("family", ["conv_16x8_int32_bias", "fc_16x8_int32_bias"])
def test_int32_bias_16x8_needs_its_rule(family, litert_runs):
    """The int64-bias rule (the profile's default ``int16_bias_dtype``) misses LiteRT's bits on
    some int32-bias cases: the choice is the profile's, not incidental."""
    from quantlab.platforms import load_platform

    platform = load_platform("tflite")
    kernel = {L.conv2d_model: B.litert_conv, L.fully_connected_model: B.litert_fully_connected}
    ours = kernel[FAMILIES[family][1]]
    differ = sum(not np.array_equal(ours(c, platform), y) for _, c, y in litert_runs(family))
    assert differ > 0
