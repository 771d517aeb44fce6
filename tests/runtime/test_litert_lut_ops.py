"""LOGISTIC and TANH on int8 codes with input zero points: LiteRT's reference kernels and its
default interpreter give, on every code of 100 random cases each, the bits of the ``tflite`` /
``litert_xnnpack`` profile's zero-point LUT (the direct table saturate(round(f((x - zx) sx) /
sy) + zy), at the output scale and zero point the int8 kernels require)."""

from __future__ import annotations

import pytest

pytest.importorskip("ai_edge_litert")

import litert_cases as C  # noqa: E402
import litert_models as L  # noqa: E402
import quantlab_bridge as B  # noqa: E402
from bits import assert_bits_equal  # noqa: E402

from quantlab.platforms import load_platform  # noqa: E402

N_CASES = 100


@pytest.mark.parametrize("op", ["sigmoid", "tanh"])
@pytest.mark.parametrize(
    "kernels, profile",
    [(L.Kernels.REFERENCE, "tflite"), (L.Kernels.DEFAULT, "litert_xnnpack")],
    ids=["reference", "default"],
)
def test_lut_ops_match_litert(op, kernels, profile):
    platform = load_platform(profile)
    zero_points = 0
    for seed in range(N_CASES):
        c = C.lut_case(seed, op)
        zero_points += c.xq.zero_point != 0
        y = L.run(L.lut_model(c), [c.x], kernels).y
        try:
            assert_bits_equal(B.litert_lut(c, platform), y)
        except AssertionError as e:
            raise AssertionError(f"{profile} {op} seed {seed}: {e}") from None
    assert zero_points > N_CASES * 0.9
