"""onnxruntime's QLinearConv and QLinearMatMul with nonzero zero points follow ``ort_oracle``.

uint8 and int8 activations with arbitrary zero points, uint8 or int8 weights with a nonzero
zero point (one for every channel in QLinearConv, one per column in QLinearMatMul), int32
bias; every output code of onnxruntime must equal the numpy oracle's. A quarter of the cases
use power-of-two scales, where exact ties show the ties-to-even rule. With symmetric int8
weights (zero point 0, quantlab's weights) quantlab's ``onnxruntime`` profile must give
onnxruntime's bits for uint8 and int8 activations with nonzero zero points.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import dataclasses  # noqa: E402

import onnx_qlinear_models as Q  # noqa: E402
import ort_oracle as O  # noqa: E402
import quantlab_bridge as B  # noqa: E402
from bits import assert_bits_equal  # noqa: E402
from oracle_ops import round_half_away  # noqa: E402

N_CASES = 150
DTYPES = {"u8u8": (np.uint8, np.uint8), "u8s8": (np.uint8, np.int8), "s8s8": (np.int8, np.int8)}


def _check(label, seed, oracle_y, ort_y):
    try:
        assert_bits_equal(oracle_y, ort_y)
    except AssertionError as e:
        raise AssertionError(f"{label} seed {seed}: {e}") from None


@pytest.mark.parametrize("dtypes", DTYPES)
def test_qlinearconv_with_zero_points_matches_oracle(dtypes):
    act, wt = DTYPES[dtypes]
    zero_points = set()
    for seed in range(N_CASES):
        c = Q.qlinearconv_case(seed, act, wt)
        zero_points.add((c.zx, c.zw, c.zy))
        _check(f"QLinearConv {dtypes}", seed, O.qlinearconv(c), Q.run_qlinearconv(c))
    assert sum(zx != 0 and zy != 0 for zx, _, zy in zero_points) > N_CASES // 2


@pytest.mark.parametrize("dtypes", DTYPES)
def test_qlinearmatmul_with_zero_points_matches_oracle(dtypes):
    act, wt = DTYPES[dtypes]
    for seed in range(N_CASES):
        c = Q.qlinearmatmul_case(seed, act, wt)
        _check(f"QLinearMatMul {dtypes}", seed, O.qlinearmatmul(c), Q.run_qlinearmatmul(c))


def test_ties_go_to_even_not_away():
    """On the power-of-two cases, rounding ties away from zero would change some outputs."""
    differing = 0
    for seed in range(1, 4 * 40, 4):
        c = Q.qlinearconv_case(seed, np.int8, np.int8)
        m = (np.float32(c.sx) * c.sw.astype(np.float32)) / np.float32(c.sy)
        f = O.conv_acc(c).astype(np.float32) * m.reshape(1, -1, 1, 1)
        away = np.clip(round_half_away(f) + c.zy, -128, 127).astype(np.int8)
        differing += int((away != Q.run_qlinearconv(c)).sum())
    assert differing > 0


PROFILE_CASES = 80


@pytest.mark.parametrize("act", ["uint8", "int8"])
def test_onnxruntime_profile_with_zero_points(act):
    """quantlab's profile of this machine's onnxruntime (``onnxruntime``, or
    ``onnxruntime_no_vnni`` where uint8 x int8 product pairs saturate; qconv2d / qmatmul,
    activation zero points, integer bias) gives onnxruntime's QLinearConv and QLinearMatMul
    bits, int8 weights with zw = 0."""
    from quantlab.export.ort_host import onnxruntime_profile
    from quantlab.platforms import load_platform

    platform = load_platform(onnxruntime_profile())
    dt = np.dtype(act).type
    nonzero = 0
    for seed in range(PROFILE_CASES):
        c = dataclasses.replace(Q.qlinearconv_case(seed, dt, np.int8), zw=0)
        _check(
            f"profile QLinearConv {act}", seed, Q.run_qlinearconv(c), B.ort_qlinearconv(c, platform)
        )
        m = Q.qlinearmatmul_case(seed, dt, np.int8)
        m = dataclasses.replace(m, zb=np.zeros_like(m.zb))
        _check(
            f"profile QLinearMatMul {act}",
            seed,
            Q.run_qlinearmatmul(m),
            B.ort_qlinearmatmul(m, platform),
        )
        nonzero += c.zx != 0 and c.zy != 0 and m.za != 0
    assert nonzero > PROFILE_CASES // 2
