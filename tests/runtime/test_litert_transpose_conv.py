"""LiteRT's TRANSPOSE_CONV gives the bits of quantlab's ``qconv_transpose`` under the profiles'
contracts for ``conv_transpose2d``.

Seeded one-op TRANSPOSE_CONV cases (``litert_cases.transpose_conv_case``, models by
``litert_models.transpose_conv_model``: strides 1-3, kernels 1-5, SAME and VALID, int8
activations with zero points or 16x8 with an int64 bias (the converter's default) or an int32
one, per-tensor or per-channel weight scales, with and without bias, fused NONE / RELU /
RELU6) run single-threaded in LiteRT, and every output code is compared with
``qconv_transpose`` (``quantlab_bridge.litert_transpose_conv``; torch layout: x NCHW, weights
(I, O, KH, KW)) whose padding / output_padding reproduce TFLite's
(``transpose_conv_torch_args``; SAME cases where TFLite pads one row more after than before
have no torch form and are not drawn).

- Reference kernels (``Kernels.REFERENCE``): the ``tflite`` profile's contract
  (``gemm_contract("conv_transpose2d", False, activation=...)``: the CONV rules).
- Default interpreter (``Kernels.DEFAULT``): the XNNPACK delegate takes an int8
  TRANSPOSE_CONV unless it is SAME with a kernel smaller than its stride
  (xnnpack_delegate.cc ``CalculateTransposeConvPaddings``); delegated cases give the
  ``litert_xnnpack`` profile's bits. The others run LiteRT's builtin kernel
  (``optimized_integer_ops::TransposeConvV2``, whose requantization is the reference's
  double rounding on x86), and give the ``tflite`` profile's bits: the ``litert_xnnpack``
  profile's int8 CONV rule (float32 rescale) misses some of them. 16x8 is never delegated
  (int64 bias: the reference kernel; int32 bias: TransposeConvV2 with an int32 accumulator).

Case variants: TIES (power-of-two scales: many sums on a rounding tie), RELU6_TIE (6.0f / sy
is k + 0.5), EXTREME (activations and zero points at the ends of the range, weights +-127 or
0), WIDE (16x8: sums past 2**31). The last tests show that the cases tell the rules apart.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import litert_models as L  # noqa: E402
import torch  # noqa: E402
from bits import assert_bits_equal  # noqa: E402
from litert_cases import transpose_conv_case, transpose_conv_sums  # noqa: E402
from litert_models import Activation, Padding, TransposeConvCase  # noqa: E402
from quantlab_bridge import litert_transpose_conv  # noqa: E402

from quantlab.numerics import DType  # noqa: E402
from quantlab.numerics.gemm import int_conv_transpose  # noqa: E402
from quantlab.simulate.profiles import platform_config  # noqa: E402

i8, i16, i32, i64 = np.int8, np.int16, np.int32, np.int64
INT32_MAX = (1 << 31) - 1

# family -> (activation dtype, bias dtype, number of cases); 16x8_int32_bias models carry
# quantized_bias_type=INT32 (what the converter writes with its int32-bias option), with or
# without a bias
FAMILIES = {
    "int8": (i8, i32, 300),
    "16x8_int64_bias": (i16, i64, 150),
    "16x8_int32_bias": (i16, i32, 100),
}


def _profile(name: str, family: str):
    platform = platform_config(name)
    if family == "16x8_int32_bias":  # the converter's quantized_bias_type=INT32
        platform = replace(platform, int16_bias_dtype=DType.INT32)
    return platform


# --------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def runs():
    """family -> [(seed, case, reference output, default interpreter's RunResult)]."""
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            act, bias, count = FAMILIES[family]
            out = []
            for seed in range(count):
                c = transpose_conv_case(seed, act, bias)
                model = L.transpose_conv_model(c, bias if family == "16x8_int32_bias" else None)
                ref = L.run(model, [c.x], L.Kernels.REFERENCE).y
                out.append((seed, c, ref, L.run(model, [c.x], L.Kernels.DEFAULT)))
            cache[family] = out
        return cache[family]

    return get


def _check(expected, y, what: str) -> None:
    try:
        assert_bits_equal(expected, y)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


@pytest.mark.parametrize("family", FAMILIES)
def test_tflite_profile_matches_reference_kernels(family, runs):
    platform = _profile("tflite", family)
    for seed, c, ref, _ in runs(family):
        _check(litert_transpose_conv(c, platform), ref, f"tflite, {family} seed {seed}")


def _xnnpack_takes(c: TransposeConvCase) -> bool:
    """The delegate's rule: int8, and not SAME with a kernel smaller than the stride."""
    small = any(k < s for k, s in zip(c.w.shape[1:3], c.stride))
    return c.x.dtype == np.int8 and not (c.padding is Padding.SAME and small)


@pytest.mark.parametrize("family", FAMILIES)
def test_default_interpreter_matches_its_profile(family, runs):
    """Delegated cases: the ``litert_xnnpack`` profile; the others (LiteRT's builtin
    TransposeConvV2): the ``tflite`` profile."""
    xnn, ref = _profile("litert_xnnpack", family), _profile("tflite", family)
    for seed, c, _, r in runs(family):
        assert r.delegated == _xnnpack_takes(c), f"{family} seed {seed}: delegation"
        platform, name = (xnn, "litert_xnnpack") if r.delegated else (ref, "tflite")
        _check(litert_transpose_conv(c, platform), r.y, f"default, {name}, seed {seed}")


def test_default_interpreter_delegates_some_int8_cases_and_not_others(runs):
    delegated = [r.delegated for _, _, _, r in runs("int8")]
    assert sum(delegated) >= 100 and len(delegated) - sum(delegated) >= 15


def test_sums_match_tflite_scatter(runs):
    """qconv_transpose's exact sums (torch padding / output_padding) are TFLite's scatter
    sums (``transpose_conv_sums``) on every case."""
    for family in FAMILIES:
        for seed, c, _, _ in runs(family):
            pad, out_pad = L.transpose_conv_torch_args(
                c.x.shape[1:3], c.out_hw, c.w.shape[1:3], c.stride, c.padding
            )
            x = torch.from_numpy(c.x.astype(np.int16) - np.int16(c.xq.zero_point))
            acc = int_conv_transpose(
                x.permute(0, 3, 1, 2).contiguous(),
                torch.from_numpy(c.w).permute(3, 0, 1, 2).contiguous(),
                c.stride,
                pad,
                out_pad,
            )
            _check(acc.permute(0, 2, 3, 1).numpy(), transpose_conv_sums(c), f"{family} seed {seed}")


def test_cases_cover_the_parameters(runs):
    cases = [c for f in FAMILIES for _, c, _, _ in runs(f)]
    assert {s for c in cases for s in c.stride} == {1, 2, 3}
    assert {k for c in cases for k in c.w.shape[1:3]} == {1, 2, 3, 4, 5}
    assert {c.padding for c in cases} == set(Padding)
    assert {c.activation for c in cases} == set(Activation)
    assert any(c.bias is None for c in cases)
    assert any(c.w_scale.size == 1 for c in cases) and any(c.w_scale.size > 1 for c in cases)
    int8 = [(c, y) for _, c, y, _ in runs("int8")]
    assert sum(c.xq.zero_point != 0 and c.yq.zero_point != 0 for c, _ in int8) > 150
    assert any(c.xq.zero_point == -128 for c, _ in int8)
    assert any(c.xq.zero_point == 127 for c, _ in int8)
    # SAME cases with TFLite padding > 0 on both sides and with an output_padding
    args = [
        L.transpose_conv_torch_args(c.x.shape[1:3], c.out_hw, c.w.shape[1:3], c.stride, c.padding)
        for c in cases
    ]
    assert any(max(p) > 0 for p, _ in args) and any(max(op) > 0 for _, op in args)
    # outputs saturate at both ends of the range in every family
    for f in FAMILIES:
        info = np.iinfo(FAMILIES[f][0])
        ys = [y for _, c, y, _ in runs(f) if c.activation is Activation.NONE]
        assert any((y == info.min).any() for y in ys) and any((y == info.max).any() for y in ys)


# --------------------------------------------------------------------------- neighbouring rules


def _differing(family, runs, platform, default: bool = False, delegated=None) -> int:
    total = 0
    for _, c, ref, r in runs(family):
        if delegated is not None and r.delegated != delegated:
            continue
        y = r.y if default else ref
        total += int((litert_transpose_conv(c, platform) != y).sum())
    return total


def test_xnnpack_rule_misses_reference_bits(runs):
    """The ``litert_xnnpack`` contract (float32 rescale, ties to even) gives other bits than
    the reference kernels on some int8 cases, and the ``tflite`` contract other bits than the
    delegated runs: each match above needs its profile."""
    assert _differing("int8", runs, platform_config("litert_xnnpack")) > 0
    assert _differing("int8", runs, platform_config("tflite"), True, True) > 0


def test_undelegated_default_runs_are_not_xnnpack_bits(runs):
    """LiteRT's builtin int8 TransposeConvV2 (SAME, kernel < stride) is not the
    ``litert_xnnpack`` profile's CONV rule: it misses some of those runs' bits."""
    assert _differing("int8", runs, platform_config("litert_xnnpack"), True, False) > 0


def test_16x8_sums_pass_int32_and_need_the_int64_accumulator(runs):
    """Some 16x8 int64-bias cases' exact sums pass 2**31; an int32 accumulator that wraps
    (the int32-bias rule) gives other bits on them."""
    over = [transpose_conv_sums(c) for _, c, _, _ in runs("16x8_int64_bias")]
    assert sum(int(np.abs(a).max() > INT32_MAX) for a in over) >= 5
    int32_rule = replace(platform_config("tflite"), int16_bias_dtype=DType.INT32)
    differ = 0
    for _, c, ref, _ in runs("16x8_int64_bias"):
        if c.bias is not None:
            c = replace(c, bias=c.bias.astype(np.int32))
        differ += int((litert_transpose_conv(c, int32_rule) != ref).sum())
    assert differ > 0


def test_16x8_int32_bias_wraps(runs):
    """16x8 with an int32 bias: some sums pass 2**31 and the matches above hold through the
    int32 accumulator's wrap, in the reference and the builtin optimized kernel alike."""
    over = [transpose_conv_sums(c) for _, c, _, _ in runs("16x8_int32_bias")]
    assert sum(int(np.abs(a).max() > INT32_MAX) for a in over) >= 3


def test_16x8_without_bias_follows_the_bias_type_option(runs):
    """A 16x8 TRANSPOSE_CONV without a bias runs the int64 kernel unless its options say
    quantized_bias_type=INT32: the same cases without the option give the ``tflite``
    profile's default (int64) bits, and other bits than with it on some outputs."""
    default = platform_config("tflite")
    differ = 0
    no_bias = [(s, c, y) for s, c, y, _ in runs("16x8_int32_bias") if c.bias is None]
    assert len(no_bias) >= 10
    for seed, c, with_option in no_bias:
        y = L.run(L.transpose_conv_model(c), [c.x], L.Kernels.REFERENCE).y
        _check(litert_transpose_conv(c, default), y, f"no option, seed {seed}")
        differ += int((y != with_option).sum())
    assert differ > 0
