"""SUB with activation zero points: quantlab's sub (the profile's add of a and -b, codes -b and
zero point -zb: ``fixed_common.sub_codes``) gives the bits of LiteRT's SUB, under the reference
kernels (``tflite``: int8 with zero points and int16) and the default interpreter (XNNPACK,
``litert_xnnpack``), on the ADD cases of ``litert_cases`` (ties, RELU / RELU6 included)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import litert_cases as C  # noqa: E402
import litert_models as L  # noqa: E402
import quantlab_bridge as B  # noqa: E402
from bits import assert_bits_equal  # noqa: E402

from quantlab.platforms import load_platform  # noqa: E402

N_CASES = 200


@pytest.mark.parametrize(
    "dtype, kernels, profile",
    [
        (np.int8, L.Kernels.REFERENCE, "tflite"),
        (np.int16, L.Kernels.REFERENCE, "tflite"),
        (np.int8, L.Kernels.DEFAULT, "litert_xnnpack"),
    ],
    ids=["reference-int8", "reference-int16", "xnnpack-int8"],
)
def test_sub_matches_litert(dtype, kernels, profile):
    platform = load_platform(profile)
    with_zero_points = 0
    for seed in range(N_CASES):
        c = C.add_case(seed, dtype)
        run = L.run(L.sub_model(c), [c.a, c.b], kernels)
        assert run.delegated == (kernels is L.Kernels.DEFAULT)
        with_zero_points += c.aq.zero_point != 0 or c.bq.zero_point != 0
        try:
            assert_bits_equal(B.litert_sub(c, platform), run.y)
        except AssertionError as e:
            raise AssertionError(f"{profile} seed {seed}: {e}") from None
    assert with_zero_points > (N_CASES // 2 if dtype == np.int8 else -1)


def test_sub_is_not_the_add():
    """The cases tell a - b from a + b (the negation matters)."""
    c = C.add_case(0, np.int8)
    y = L.run(L.sub_model(c), [c.a, c.b], L.Kernels.REFERENCE).y
    assert not np.array_equal(B.litert_add(c, load_platform("tflite")), y)
