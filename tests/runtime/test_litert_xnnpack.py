"""LiteRT's default interpreter (XNNPACK delegate) on int8 ops follows ``xnnpack_oracle``.

A plain ``Interpreter()`` hands int8 CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED and ADD to
XNNPACK, which requantizes in float32 with ties to even; each case must be delegated and
give the oracle's bits, and quantlab's ``litert_xnnpack`` profile must give the same bits
(``quantlab_bridge``). The same cases under the reference kernels give other bits on some
outputs, which is why the two are separate rules (and profiles).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

import litert_cases as C  # noqa: E402
import litert_models as L  # noqa: E402
import quantlab_bridge as B  # noqa: E402
import tflite_oracle as T  # noqa: E402
import xnnpack_oracle as X  # noqa: E402
from bits import assert_bits_equal  # noqa: E402
from litert_models import Activation  # noqa: E402

N_CASES = 300
i8, i32 = np.int8, np.int32

# family -> (case of a seed, model builder, XNNPACK oracle, reference oracle, graph inputs)
FAMILIES = {
    "conv_int8": (lambda s: C.conv_case(s, False, i8, i32), L.conv2d_model, X.conv, T.conv),
    "depthwise_int8": (lambda s: C.conv_case(s, True, i8, i32), L.conv2d_model, X.conv, T.conv),
    "fc_int8_per_tensor": (
        lambda s: C.fully_connected_case(s, i8, i32, False),
        L.fully_connected_model,
        X.fully_connected,
        T.fully_connected,
    ),
    "fc_int8_per_channel": (
        lambda s: C.fully_connected_case(s, i8, i32, True),
        L.fully_connected_model,
        X.fully_connected,
        T.fully_connected,
    ),
    "add_int8": (lambda s: C.add_case(s, i8), L.add_model, X.add, T.add),
}


def _inputs(case):
    return [case.a, case.b] if isinstance(case, L.AddCase) else [case.x]


@pytest.fixture(scope="module")
def default_runs():
    """family -> [(seed, case, RunResult of the default interpreter)]."""
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            make, build = FAMILIES[family][:2]
            cases = [(s, make(s)) for s in range(N_CASES)]
            cache[family] = [
                (s, c, L.run(build(c), _inputs(c), L.Kernels.DEFAULT)) for s, c in cases
            ]
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_default_interpreter_matches_xnnpack_oracle(family, default_runs):
    oracle = FAMILIES[family][2]
    for seed, case, r in default_runs(family):
        assert r.delegated, f"{family} seed {seed}: XNNPACK did not take the operator"
        try:
            assert_bits_equal(oracle(case), r.y)
        except AssertionError as e:
            raise AssertionError(f"{family} seed {seed}: {e}") from None


@pytest.mark.parametrize("family", FAMILIES)
def test_litert_xnnpack_profile_matches_default_interpreter(family, default_runs):
    """quantlab's ``litert_xnnpack`` profile gives the default interpreter's bits."""
    from quantlab.platforms import load_platform

    platform = load_platform("litert_xnnpack")
    kernel = {L.conv2d_model: B.litert_conv, L.fully_connected_model: B.litert_fully_connected}
    ours = kernel.get(FAMILIES[family][1], B.litert_add)
    for seed, case, r in default_runs(family):
        try:
            assert_bits_equal(ours(case, platform), r.y)
        except AssertionError as e:
            raise AssertionError(f"litert_xnnpack profile, {family} seed {seed}: {e}") from None


@pytest.mark.parametrize("family", FAMILIES)
def test_xnnpack_and_reference_kernels_differ_on_some_cases(family, default_runs):
    reference = FAMILIES[family][3]
    differing = sum(int((reference(c) != r.y).sum()) for _, c, r in default_runs(family))
    assert differing > 0


@pytest.mark.parametrize("seed", range(8))
def test_relu6_bound_rounds_half_to_even(seed):
    """At scales where 6.0f / scale is exactly k + 0.5, XNNPACK's RELU6 bound is
    lrintf(k + 0.5 + zp): the even neighbour (LiteRT's reference kernels round away)."""
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
    r = L.run(L.fully_connected_model(case), [x], L.Kernels.DEFAULT)
    assert r.delegated
    lo, hi = X.activation_range(Activation.RELU6, sy, zy)
    assert (int(r.y.min()), int(r.y.max())) == (lo, hi)
    k = int(np.float32(6.0) / sy)
    assert hi == k + zy + (k + zy) % 2  # k + zy + 0.5 went to the even neighbour
