"""LUT ops with zero points against onnxruntime: DequantizeLinear -> the float op(s) quantlab's
exporter writes for a table op -> QuantizeLinear, on every uint8 / int8 code (nonzero zero
points, power-of-two scales for ties, observer output scales whose saturated outputs land on
ties) gives the bits of the ``onnxruntime`` profile's direct table (``ZeroPointLut`` with
``TableValues.RUNTIME_FLOAT32``: fl32 dequantize, onnxruntime's float32 kernels, fl32
quotient), whether onnxruntime fuses the group into com.microsoft QLinearSigmoid (its 256-entry
table) or runs it in float32. The exact float64 table does not."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

import ort_lut_models as M  # noqa: E402
import quantlab_bridge as B  # noqa: E402
from bits import assert_bits_equal  # noqa: E402
from mlas_inputs import GELU_EMULATED  # noqa: E402

from quantlab.numerics.lut import TableValues  # noqa: E402
from quantlab.platforms import load_platform  # noqa: E402

N_CASES = 100


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["uint8", "int8"])
@pytest.mark.parametrize("op", list(M.OPS))
def test_lut_ops_match_onnxruntime(op, dtype):
    """Every op's table gives onnxruntime's codes; GELU on a CPU where onnxruntime computes
    it otherwise than the profile emulates (``mlas_inputs.GELU_EMULATED``) is held to one
    code."""
    platform = load_platform("onnxruntime")
    zero_points = 0
    for seed in range(N_CASES):
        c = M.lut_case(seed, op, dtype)
        zero_points += c.zx != 0 and c.zy != 0
        got, want = B.ort_lut(c, platform), M.run_lut(c)
        if op == "gelu" and not GELU_EMULATED:
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1, f"seed {seed}"
            continue
        try:
            assert_bits_equal(got, want)
        except AssertionError as e:
            raise AssertionError(f"{op} {np.dtype(dtype).name} seed {seed}: {e}") from None
    assert zero_points > N_CASES * 0.9


@pytest.mark.parametrize("op", ["tanh", "sin", "sqrt"])
def test_exact_float64_tables_differ_from_onnxruntime(op):
    """The float64 table (the function and quotient exact, J6's assumption) misses onnxruntime:
    saturated tanh outputs on +-127.5 ties that MLAS's float32 kernel decides, float32 inputs and
    quotients for sin, NaN below zero for sqrt (the lowest code)."""
    platform = dataclasses.replace(
        load_platform("onnxruntime"), lut_table_values=TableValues.EXACT_FLOAT64
    )
    differ = sum(
        not np.array_equal(B.ort_lut(c, platform), M.run_lut(c))
        for c in (M.lut_case(seed, op, dt) for seed in range(N_CASES) for dt in (np.uint8, np.int8))
    )
    assert differ > 0


def test_sigmoid_is_fused_into_qlinear_sigmoid(tmp_path):
    c = M.lut_case(0, "sigmoid", np.uint8)
    M.run_lut(c, tmp_path / "opt.onnx")
    kinds = {n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node}
    assert kinds == {"QLinearSigmoid"}, kinds


# (input scale, output scale) where onnxruntime's HardSigmoid, fl32(fl32(x / 6) + 0.5) with the
# float32 1/6, rounds one int8 code across a quantization boundary the exact function does not
HARDSIGMOID_EDGES = [
    (float.fromhex("0x1.3a4fb2p-4"), float.fromhex("0x1.33ddfep-7")),
    (float.fromhex("0x1.6bc2ecp-5"), float.fromhex("0x1.d5cc62p-6")),
]


@pytest.mark.parametrize("op", ["hardsigmoid", "hardswish"])
def test_hardsigmoid_tables_take_onnxruntimes_float32_steps(op):
    """The runtime table computes HardSigmoid's product and sum in float32 as onnxruntime does
    (HardSwish multiplies by it); on these scales the exact function's table differs by a code."""
    platform = load_platform("onnxruntime")
    exact = dataclasses.replace(platform, lut_table_values=TableValues.EXACT_FLOAT64)
    x = np.arange(-128, 128).astype(np.int8)
    differ = 0
    for sx, sy in HARDSIGMOID_EDGES:
        c = M.LutCase(op, x, np.float32(sx), 0, np.float32(sy), 0)
        want = M.run_lut(c)
        assert_bits_equal(B.ort_lut(c, platform), want)
        differ += not np.array_equal(B.ort_lut(c, exact), want)
    if op == "hardsigmoid":
        assert differ == len(HARDSIGMOID_EDGES)
