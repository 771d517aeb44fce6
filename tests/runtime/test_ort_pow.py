"""pow against onnxruntime: the float32 values of ``runtime_values``'s pow (fl32(x * x) for the
exponent 2, fl32(fl32(x * x) * x) for 3, the C library's powf otherwise) are onnxruntime's
Pow bits, and the onnxruntime profile's pow table on every code (zero points, int16) gives
DequantizeLinear -> Pow -> QuantizeLinear's codes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from ort_graphs import session, through_float_op  # noqa: E402

from quantlab.numerics.dtypes import DType  # noqa: E402
from quantlab.numerics.lut import default_spec  # noqa: E402
from quantlab.numerics.lut.runtime_values import runtime_float32  # noqa: E402
from quantlab.numerics.lut.zero_point import build_zero_point_lut  # noqa: E402
from quantlab.platforms import load_platform  # noqa: E402

EXPONENTS = (2.0, 3.0, 0.5, -1.0, 1.5, -0.5, 1.0 / 3.0, 4.0, -2.0)


def _onnxruntime_pow(x: np.ndarray, e: float) -> np.ndarray:
    node = helper.make_node("Pow", ["x", "e"], ["y"])
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))
    e_init = numpy_helper.from_array(np.array(e, np.float32), "e")
    return session([node], [x_info], TensorProto.FLOAT, [e_init]).run(None, {"x": x})[0]


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.view(np.int32) == b.view(np.int32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("e", EXPONENTS)
def test_pow_float32_values_are_onnxruntimes(e):
    """On every int16 code times three scales (negative bases, zero, tiny and huge values)."""
    codes = np.arange(-32768, 32768, dtype=np.float32)
    x = np.concatenate([codes * np.float32(s) for s in (2.0**-13, 0.0371, 3.7)])
    want = _onnxruntime_pow(x, e)
    spec = dataclasses.replace(default_spec("pow"), exponent=e)
    got = runtime_float32("pow", torch.from_numpy(x), spec).numpy()
    assert _same_bits(got, want).all(), f"{int((~_same_bits(got, want)).sum())} values differ"
    # torch's own float32 pow is another function
    if e not in (2.0, 3.0):
        plain = torch.pow(torch.from_numpy(x), float(np.float32(e))).numpy()
        assert not _same_bits(plain, want).all()


def _onnxruntime_table(codes, sx, zx, sy, zy, e) -> np.ndarray:
    exponent = numpy_helper.from_array(np.array(e, np.float32), "e")
    pow_node = helper.make_node("Pow", ["v", "e"], ["p"])
    return through_float_op(codes, sx, zx, sy, zy, [pow_node], [exponent])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16], ids=["uint8", "int8", "int16"])
@pytest.mark.parametrize("e", [0.5, 3.0, -1.0, 1.5])
def test_the_profiles_pow_table_gives_onnxruntimes_codes(e, dtype):
    platform = load_platform("onnxruntime")
    spec = dataclasses.replace(default_spec("pow"), exponent=e)
    info = np.iinfo(dtype)
    codes = np.arange(info.min, info.max + 1).astype(dtype)
    dt = DType.parse(np.dtype(dtype).name.upper())
    rng = np.random.default_rng(int(e * 8) + info.bits)
    for trial in range(6):
        zx = zy = 0
        if info.bits == 8:
            zx, zy = (int(rng.integers(info.min, info.max + 1)) for _ in range(2))
        sx = np.float32(2.0**-5 if trial % 3 == 0 else rng.uniform(0.005, 0.08))
        sx = np.float32(sx / 256) if info.bits == 16 else sx
        with np.errstate(all="ignore"):
            y = np.abs((codes.astype(np.float64) - zx) * float(sx)) ** e
        amax = float(y[np.isfinite(y)].max())
        sy = np.float32(amax / info.max / rng.uniform(0.3, 1.0))  # some outputs saturate
        want = _onnxruntime_table(codes, sx, zx, sy, zy, e)
        table = build_zero_point_lut(
            "pow", dt, float(sx), zx, dt, float(sy), zy, spec, platform.lut_format()
        )
        got = table.evaluate(torch.from_numpy(codes)).numpy()
        differ = int((got != want).sum())
        assert differ == 0, f"trial {trial}: {differ} of {codes.size} codes differ"
