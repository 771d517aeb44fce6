"""elu and softplus against onnxruntime: the float32 values of ``runtime_values``'s elu and
softplus (Eigen's vectorized exp and log1p) are onnxruntime's Elu and Softplus bits, the
numpy-free forms equal their slow twins, and the onnxruntime profile's tables on every code
(zero points, int16) give DequantizeLinear -> Elu / Softplus -> QuantizeLinear's codes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402
from ort_graphs import session, through_float_op  # noqa: E402

from quantlab.numerics import eigen_float32 as E  # noqa: E402
from quantlab.numerics.dtypes import DType  # noqa: E402
from quantlab.numerics.lut import default_spec  # noqa: E402
from quantlab.numerics.lut.runtime_values import runtime_float32  # noqa: E402
from quantlab.numerics.lut.zero_point import build_zero_point_lut  # noqa: E402
from quantlab.numerics.reference import eigen_float32 as R  # noqa: E402
from quantlab.numerics.reference.lut_zero_point import evaluate_zero_point_lut  # noqa: E402
from quantlab.platforms import load_platform  # noqa: E402

OPS = {"elu": "Elu", "softplus": "Softplus"}


def _attrs(func: str, alpha: float) -> dict:
    return {"alpha": alpha} if func == "elu" else {}


def _onnxruntime_float(func: str, x: np.ndarray, alpha: float) -> np.ndarray:
    node = helper.make_node(OPS[func], ["x"], ["y"], **_attrs(func, alpha))
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))
    return session([node], [x_info], TensorProto.FLOAT, []).run(None, {"x": x})[0]


def _values() -> np.ndarray:
    """Every int16 code times three scales, and the edges of exp's clamps; a multiple of 4
    long, so that every value goes through Eigen's packets."""
    codes = np.arange(-32768, 32768, dtype=np.float32)
    edges = np.array([88.72, 88.723, 88.75, -87.3, -88.0, -103.99, -104.0, -104.1, 0.0, -0.0,
                      1e-30, -1e-30, 15.0, 15.5, 16.0, 20.0], np.float32)  # fmt: skip
    return np.concatenate([codes * np.float32(s) for s in (2.0**-13, 0.0371, 3.7)] + [edges])


@pytest.mark.parametrize(("func", "alpha"), [("elu", 1.0), ("elu", 0.3), ("softplus", 1.0)])
def test_float32_values_are_onnxruntimes(func, alpha):
    x = _values()
    assert x.size % 4 == 0
    want = _onnxruntime_float(func, x, alpha)
    spec = dataclasses.replace(default_spec(func), alpha=alpha)
    got = runtime_float32(func, torch.from_numpy(x), spec).numpy()
    differ = got.view(np.int32) != want.view(np.int32)
    assert not differ.any(), f"{int(differ.sum())} values differ, e.g. at {x[differ][:5]}"
    # torch's float32 function is another one
    plain = (torch.nn.functional.elu(torch.from_numpy(x), alpha) if func == "elu"
             else torch.nn.functional.softplus(torch.from_numpy(x))).numpy()  # fmt: skip
    assert (plain.view(np.int32) != want.view(np.int32)).any()


def test_softplus_above_15_is_x_as_torchs_threshold_makes_it():
    """The exporter writes Softplus for thresholds of at least 15: above it onnxruntime's
    x + log1p(exp(-x)) rounds to x in float32, as torch's softplus returns x there."""
    x = np.float32(15.0) + np.arange(0, 2**20, dtype=np.float32) * np.float32(2.0**-10)
    got = runtime_float32("softplus", torch.from_numpy(x), default_spec("softplus")).numpy()
    assert np.array_equal(got, x)


def test_exp_and_log1p_equal_their_slow_twins():
    """Random and edge values, every step an exact rational rounded once to float32."""
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(4000, generator=g) * 40, torch.from_numpy(_values()[-16:])])
    assert np.array_equal(E.eigen_exp(x).numpy().view(np.int32),
                          R.eigen_exp(x).view(np.int32))  # fmt: skip
    v = torch.cat([torch.rand(3000, generator=g) * 10, torch.rand(1000, generator=g) * 1e-6,
                   torch.tensor([0.0, 1e-30, 3e38, 5.9e-8, 6e-8, -0.5, -0.999])])  # fmt: skip
    assert np.array_equal(E.eigen_log1p(v).numpy().view(np.int32),
                          R.eigen_log1p(v).view(np.int32))  # fmt: skip


def _onnxruntime_table(func, codes, sx, zx, sy, zy, alpha) -> np.ndarray:
    node = helper.make_node(OPS[func], ["v"], ["p"], **_attrs(func, alpha))
    return through_float_op(codes, sx, zx, sy, zy, [node])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16], ids=["uint8", "int8", "int16"])
@pytest.mark.parametrize(("func", "alpha"), [("elu", 1.0), ("elu", 0.3), ("softplus", 1.0)])
def test_the_profiles_tables_give_onnxruntimes_codes(func, alpha, dtype):
    platform = load_platform("onnxruntime")
    spec = dataclasses.replace(default_spec(func), alpha=alpha)
    info = np.iinfo(dtype)
    codes = np.arange(info.min, info.max + 1).astype(dtype)
    dt = DType.parse(np.dtype(dtype).name.upper())
    rng = np.random.default_rng(info.bits + int(alpha * 10))
    for trial in range(4):
        zx = zy = 0
        if info.bits == 8:
            zx, zy = (int(rng.integers(info.min, info.max + 1)) for _ in range(2))
        sx = np.float32(2.0**-4 if trial % 2 == 0 else rng.uniform(0.01, 0.4))
        sx = np.float32(sx / 256) if info.bits == 16 else sx
        x = (codes.astype(np.float64) - zx) * float(sx)
        y = torch.nn.functional.elu(torch.from_numpy(x), alpha) if func == "elu" else \
            torch.nn.functional.softplus(torch.from_numpy(x))  # fmt: skip
        sy = np.float32(float(y.abs().max()) / info.max / rng.uniform(0.3, 1.0))  # some saturate
        want = _onnxruntime_table(func, codes, sx, zx, sy, zy, alpha)
        table = build_zero_point_lut(
            func, dt, float(sx), zx, dt, float(sy), zy, spec, platform.lut_format()
        )
        got = table.evaluate(torch.from_numpy(codes)).numpy()
        differ = int((got != want).sum())
        assert differ == 0, f"trial {trial}: {differ} of {codes.size} codes differ"
        if info.bits == 8:  # the slow reference entry by entry
            ref = evaluate_zero_point_lut(table, torch.from_numpy(codes)).numpy()
            assert np.array_equal(ref, got)


@pytest.mark.parametrize(("beta", "threshold"), [(2.0, 5.0), (1.0, 2.0)])
def test_a_softplus_onnx_cannot_express_holds_the_function_itself(beta, threshold):
    """ONNX's Softplus has no beta and no threshold (the exporter refuses a beta, or a
    threshold below 15): the profile's table then holds torch's float64 softplus rounded to
    float32, as the reference computes it."""
    platform = load_platform("onnxruntime")
    spec = dataclasses.replace(default_spec("softplus"), beta=beta, threshold=threshold)
    codes = torch.arange(-128, 128).to(torch.int8)
    table = build_zero_point_lut(
        "softplus", DType.INT8, 0.05, 3, DType.INT8, 0.02, -100, spec, platform.lut_format()
    )
    ref = evaluate_zero_point_lut(table, codes)
    assert np.array_equal(table.evaluate(codes).numpy(), ref.numpy())
    x = (codes.double() - 3) * 0.05
    ideal = torch.nn.functional.softplus(x, beta=beta, threshold=threshold) / 0.02 - 100
    assert (
        float((table.evaluate(codes).double() - ideal.clamp(-128, 127)).abs().max()) <= 0.5 + 1e-9
    )
