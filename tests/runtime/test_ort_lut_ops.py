"""LUT ops with zero points against onnxruntime: DequantizeLinear -> Sigmoid / Tanh / Exp ->
QuantizeLinear on every uint8 / int8 code (nonzero zero points, power-of-two scales for ties)
gives the bits of the ``onnxruntime`` profile's direct table (``ZeroPointLut``:
saturate(round_half_even(f((x - zx) sx) / sy) + zy), float64), whether onnxruntime fuses the
group into com.microsoft QLinearSigmoid (its 256-entry table) or runs it in float32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

import ort_lut_models as M  # noqa: E402
import quantlab_bridge as B  # noqa: E402
from bits import assert_bits_equal  # noqa: E402

from quantlab.platforms import load_platform  # noqa: E402

N_CASES = 100


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])
@pytest.mark.parametrize("op", list(M.OPS))
def test_lut_ops_match_onnxruntime(op, dtype):
    platform = load_platform("onnxruntime")
    zero_points = 0
    for seed in range(N_CASES):
        c = M.lut_case(seed, op, dtype)
        zero_points += c.zx != 0 and c.zy != 0
        try:
            assert_bits_equal(B.ort_lut(c, platform), M.run_lut(c))
        except AssertionError as e:
            raise AssertionError(f"{op} {np.dtype(dtype).name} seed {seed}: {e}") from None
    assert zero_points > N_CASES * 0.9


def test_sigmoid_is_fused_into_qlinear_sigmoid(tmp_path):
    c = M.lut_case(0, "sigmoid", np.uint8)
    M.run_lut(c, tmp_path / "opt.onnx")
    kinds = {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    assert kinds == {"QLinearSigmoid"}, kinds
