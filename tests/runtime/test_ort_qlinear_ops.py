"""The numpy oracles of onnxruntime's QLinearAdd and QLinearGlobalAveragePool (the kernels a
QDQ Add / GlobalAveragePool fuse into) match onnxruntime bit for bit on random cases: int8 with
zero point 0 and uint8 with zero point 128 (quantlab's two activation encodings), and arbitrary
output zero points."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantlab.numerics.code_bounds import BoundRule, bound_codes
from quantlab.numerics.dtypes import DType
from quantlab.numerics.float_window_pool import float_window_avg_pool2d, global_mean_in_range
from quantlab.numerics.fma_add import qlinear_add as profile_qlinear_add
from quantlab.numerics.pair_table import every_pair
from quantlab.numerics.qlinear_mul import qlinear_mul, qlinear_mul_reference
from quantlab.numerics.reference.fma_add import qlinear_add as ref_qlinear_add

ort = pytest.importorskip("onnxruntime")
from onnx import numpy_helper  # noqa: E402
from ort_qlinear_ops import (  # noqa: E402
    F32,
    _fma_f32,
    qlinear_add,
    qlinear_global_average_pool,
    run_qlinear_add,
    run_qlinear_average_pool,
    run_qlinear_global_average_pool,
    run_qlinear_mul,
)

N_ADD = 300


def _add_scales(rng, exact_ties: bool = False) -> tuple:
    """(sa, sb, sc) of an add case: operand scales in [1e-3, 0.1] (``exact_ties``: powers of
    two, whose sums land on exact ties), the output's near their sum."""
    sa, sb = F32(rng.uniform(1e-3, 0.1)), F32(rng.uniform(1e-3, 0.1))
    if exact_ties:
        sa, sb = F32(2.0 ** -int(rng.integers(3, 8))), F32(2.0 ** -int(rng.integers(3, 8)))
    return sa, sb, F32((sa + sb) * rng.uniform(0.5, 1.5))


N_GAP = 200


def _zero_points(rng, dt, seed):
    info = np.iinfo(dt)
    z = 0 if dt == np.int8 else 128
    zc = z if seed % 4 < 2 else int(rng.integers(info.min, info.max + 1))
    return z, zc


def _code_pair(rng, seed: int, one_element: bool = False):
    """(dtype, a, b) of a seeded add / mul case: int8 codes (odd seeds) or uint8, a of shape
    (1-3, 1-69), b of a's shape, of its last dim (every 5th seed) or, with ``one_element``, one
    code (every 6th seed)."""
    dt = np.int8 if seed % 2 else np.uint8
    info = np.iinfo(dt)
    shape = (int(rng.integers(1, 4)), int(rng.integers(1, 70)))
    a = rng.integers(info.min, info.max + 1, shape).astype(dt)
    b_shape = shape[-1:] if seed % 5 == 0 else shape
    if one_element and seed % 6 == 0:
        b_shape = (1,)
    return dt, a, rng.integers(info.min, info.max + 1, b_shape).astype(dt)


@pytest.mark.parametrize("chunk", range(3))
def test_qlinear_add_oracle_matches_onnxruntime(chunk):
    rng = np.random.default_rng(100 + chunk)
    for seed in range(chunk * N_ADD // 3, (chunk + 1) * N_ADD // 3):
        dt, a, b = _code_pair(rng, seed)
        sa, sb, sc = _add_scales(rng, exact_ties=seed % 7 == 0)
        z, zc = _zero_points(rng, dt, seed)
        got = run_qlinear_add(a, sa, z, b, sb, z, sc, zc)
        want = qlinear_add(a, sa, z, b, sb, z, sc, zc)
        assert np.array_equal(got, want), f"case {seed}: {int((got != want).sum())} differ"


def test_profile_add_with_asymmetric_uint8_operands_matches_onnxruntime():
    """quantlab's QLinearAdd kernel on uint8 codes with their own zero points (x's, y's,
    output's) equals onnxruntime's QLinearAdd on the same codes."""
    rng = np.random.default_rng(41)
    for seed in range(30):
        shape = (2, int(rng.integers(1, 70)))
        a = rng.integers(0, 256, shape).astype(np.uint8)
        b = rng.integers(0, 256, shape).astype(np.uint8)
        za, zb, zc = (int(v) for v in rng.integers(0, 256, 3))
        sa, sb, sc = _add_scales(rng, exact_ties=seed % 7 == 0)
        ort = run_qlinear_add(a, sa, za, b, sb, zb, sc, zc)
        got = profile_qlinear_add(
            torch.from_numpy(a.astype(np.int64)),
            float(sa),
            torch.from_numpy(b.astype(np.int64)),
            float(sb),
            float(sc),
            DType.UINT8,
            0,
            (za, zb, zc),
        )
        assert np.array_equal(got.numpy().astype(np.int64), ort.astype(np.int64)), f"case {seed}"


def test_qlinear_global_average_pool_oracle_matches_onnxruntime():
    rng = np.random.default_rng(7)
    for seed in range(N_GAP):
        dt = np.int8 if seed % 2 else np.uint8
        info = np.iinfo(dt)
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 40)))
        shape += (int(rng.integers(1, 9)), int(rng.integers(1, 9)))
        x = rng.integers(info.min, info.max + 1, shape).astype(dt)
        sx = F32(rng.uniform(1e-3, 0.1))
        sy = F32(sx * rng.uniform(0.3, 2.0))
        if seed % 5 == 0:  # power-of-two scales and 2**k pixels: exact ties
            x = x[:, :, :2, :2]
            sx, sy = F32(2.0**-5), F32(2.0**-6)
        z, zy = _zero_points(rng, dt, seed)
        got = run_qlinear_global_average_pool(x, sx, z, sy, zy)
        want = qlinear_global_average_pool(x, sx, z, sy, zy)
        assert np.array_equal(got, want), f"case {seed}: {int((got != want).sum())} differ"


@pytest.mark.parametrize("zero_point", [0, 128])
def test_profile_add_rule_matches_onnxruntime(zero_point):
    """numerics.fma_add.qlinear_add (the onnxruntime profile's RESCALE_FLOAT_FMA add) on
    symmetric int8 codes equals onnxruntime's QLinearAdd on those codes held with zero point 0
    (int8) or 128 (uint8), on 1.2 million uint8 adds (the two fused multiply-adds of the
    uint8 kernel differ from a rounded inner product plus the constant about once in 400,000)."""
    rng = np.random.default_rng(40 + zero_point)
    dt = np.int8 if zero_point == 0 else np.uint8
    shape = (1, 40000) if zero_point else (4, 500)  # the rare case needs the uint8 kernel
    for seed in range(30):
        a = rng.integers(-128, 128, shape).astype(np.int8)
        b = rng.integers(-128, 128, shape).astype(np.int8)
        sa, sb = F32(rng.uniform(1e-3, 0.1)), F32(rng.uniform(1e-3, 0.1))
        if seed % 6 == 0:
            sa, sb = F32(2.0 ** -int(rng.integers(3, 8))), F32(2.0**-5)
        sc = F32((sa + sb) * rng.uniform(0.3, 1.5))
        held = [(v.astype(np.int16) + zero_point).astype(dt) for v in (a, b)]
        ort = run_qlinear_add(held[0], sa, zero_point, held[1], sb, zero_point, sc, zero_point)
        got = profile_qlinear_add(
            torch.from_numpy(a),
            float(sa),
            torch.from_numpy(b),
            float(sb),
            float(sc),
            DType.INT8,
            zero_point,
        )
        want = ort.astype(np.int16) - zero_point
        assert np.array_equal(got.numpy().astype(np.int16), want), f"case {seed}"


def test_clip_bound_codes_in_float32_match_onnxruntime():
    """A QDQ Clip (DequantizeLinear -> Clip -> QuantizeLinear at one scale) in onnxruntime gives
    the bound codes ``bound_codes(..., rule=BoundRule.FLOAT32_HALF_EVEN)`` gives; at scale
    fl32(2/51) the bound 1.0 is a float32 tie (25.5 -> 26) that the float64 quotient misses
    (25.4999 -> 25)."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"]),
        helper.make_node("Clip", ["f", "lo"], ["c"]),
        helper.make_node("QuantizeLinear", ["c", "s", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "clip",
        [
            helper.make_tensor_value_info("x", TensorProto.INT8, [256]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("lo", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [256])],
        [numpy_helper.from_array(np.asarray(0, np.int8), "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    scales = [F32(2.0 / 51.0)] + [F32(v) for v in rng.uniform(1e-3, 0.1, 40)]
    bounds = [1.0, 0.25, 6.0, -0.5, -np.inf, np.inf] + [float(v) for v in rng.uniform(-3, 3, 40)]
    x = np.arange(-128, 128, dtype=np.int8)
    for s in scales:
        for lo in bounds:
            feed = {"x": x, "s": np.asarray(s, F32), "lo": np.asarray(lo, F32)}
            (y,) = sess.run(None, feed)
            for rule in (BoundRule.FLOAT32_HALF_EVEN, BoundRule.FLOAT64_HALF_EVEN):
                lo_c, hi_c = bound_codes(lo, None, float(s), DType.INT8, rule=rule)
                want = np.clip(x.astype(np.int64), lo_c, hi_c)
                if rule is BoundRule.FLOAT32_HALF_EVEN or not np.isfinite(lo):
                    assert np.array_equal(y.astype(np.int64), want), f"scale {s}, bound {lo}"
    assert bound_codes(1.0, None, float(scales[0]), DType.INT8, True)[0] == 26
    assert bound_codes(1.0, None, float(scales[0]), DType.INT8)[0] == 25


N_POOL = 240


def _pool_case(rng, seed: int):
    """Codes, scales and window of one average pool: uint8 / zero point 128 or int8 / 0 (with
    another output zero point on every fourth), arbitrary scales, power-of-two scales whose
    window means land on ties, or scales in a simple ratio whose means land on real ties that
    the float32 rounding of the products decides."""
    dt = np.int8 if seed % 2 else np.uint8
    info = np.iinfo(dt)
    kernel = [(3, 3), (2, 2), (3, 2), (5, 5), (1, 3)][seed % 5]
    strides = [(1, 1), (2, 2), (1, 2)][seed % 3]
    pads = (min(kernel[0] // 2, seed % 2), min(kernel[1] // 2, (seed // 2) % 2))
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 6)))
    shape += (int(rng.integers(kernel[0], 10)), int(rng.integers(kernel[1], 10)))
    x = rng.integers(info.min, info.max + 1, shape).astype(dt)
    sx = F32(rng.uniform(1e-3, 0.1))
    sy = F32(sx * rng.uniform(0.3, 2.0))
    if seed % 3 == 0:  # power-of-two scales: the float32 sums are exact and halves are ties
        sx, sy = F32(2.0 ** -int(rng.integers(3, 8))), F32(2.0 ** -int(rng.integers(3, 8)))
    elif seed % 3 == 1:  # a simple ratio (clamp bounds over 255): real ties float32 decides
        sx, sy = F32(1.5 / 255), F32(1 / 255)
    z, zy = _zero_points(rng, dt, seed)
    return x, sx, z, sy, zy, kernel, strides, pads


def _profile_pool(x, sx, z, sy, zy, kernel, strides, pads, include_pad=True) -> np.ndarray:
    """quantlab's FLOAT_WINDOW_SUM rule on the runtime's codes: int8 as they are; uint8 as
    quantlab holds them (codes - 128, the runtime's 128 a held offset)."""
    off = 128 if x.dtype == np.uint8 else 0
    out = DType.INT8
    codes = float_window_avg_pool2d(
        torch.from_numpy(x.astype(np.int64) - off),
        torch.tensor(sx),
        int(z) - off,
        kernel,
        strides,
        pads,
        torch.tensor(sy),
        int(zy) - off,
        out,
        held_offset=off,
        count_include_pad=include_pad,
    )
    return (codes.numpy() + off).astype(x.dtype)


def test_float_window_average_pool_matches_onnxruntime_qlinear_average_pool():
    """numerics.float_window_pool gives QLinearAveragePool's bits on every case (padded, the
    padding counted or not, strided, rectangular windows; ties); the exact integer mean,
    requantized once, does not."""
    rng = np.random.default_rng(11)
    integer_differs = 0
    for seed in range(N_POOL):
        case = _pool_case(rng, seed)
        include_pad = seed % 4 != 3  # every fourth: only the positions inside count
        got = run_qlinear_average_pool(*case, count_include_pad=include_pad)
        want = _profile_pool(*case, include_pad)
        assert np.array_equal(got, want), f"case {seed}: {int((got != want).sum())} differ"
        x, sx, z, sy, zy, kernel, strides, pads = case
        if pads == (0, 0):
            window_sum = torch.nn.functional.avg_pool2d(
                torch.from_numpy(x.astype(np.float64) - int(z)),
                kernel,
                strides,
                0,
                divisor_override=1,
            )
            n = kernel[0] * kernel[1]
            exact = np.rint(window_sum.numpy() * float(sx) / (float(sy) * n)) + int(zy)
            exact = np.clip(exact, np.iinfo(x.dtype).min, np.iinfo(x.dtype).max)
            integer_differs += int((exact != got).sum())
    assert integer_differs > 0


def test_global_mean_in_range_is_the_scales_qlinear_global_average_pool_runs():
    """QLinearGlobalAveragePool refuses scales whose ratio fl32(sx / fl32(sy * N)) lies outside
    [2**-32, 256) ("parameter out of computation range"): ``global_mean_in_range`` says which,
    so that the exporter writes a float ReduceMean for the others."""
    x = np.random.default_rng(3).integers(0, 256, (1, 2, 4, 4)).astype(np.uint8)
    sx = F32(0.1)
    for ratio in (255.9, 256.0, 300.0, 1.0, 2.0**-32, 2.0**-33):
        sy = F32(sx / (16 * ratio))
        runs = global_mean_in_range(torch.tensor(sx), torch.tensor(sy), 16)
        try:
            run_qlinear_global_average_pool(x, sx, 128, sy, 128)
            ran = True
        except Exception as err:  # onnxruntime's own error type
            assert "out of computation range" in str(err)
            ran = False
        assert ran == runs, ratio


N_MUL = 240


@pytest.mark.parametrize("chunk", range(2))
def test_qlinear_mul_matches_onnxruntime(chunk):
    """quantlab's QLinearMul (the output zero point added in float32 before the rounding)
    gives onnxruntime's codes: int8 and uint8, zero points 0 / 128 and random, broadcasting
    and one-element operands, output scales that saturate; its slow twin agrees."""
    rng = np.random.default_rng(300 + chunk)
    for seed in range(chunk * N_MUL // 2, (chunk + 1) * N_MUL // 2):
        dt, a, b = _code_pair(rng, seed, one_element=True)
        info = np.iinfo(dt)
        sa, sb = F32(rng.uniform(1e-3, 0.1)), F32(rng.uniform(1e-3, 0.1))
        sc = F32(sa * sb * rng.uniform(5, 400))
        z = 0 if dt == np.int8 else 128
        za, zb, zc = (z, z, z) if seed % 3 else (int(v) for v in rng.integers(info.min, 128, 3))
        ort_codes = run_qlinear_mul(a, sa, za, b, sb, zb, sc, zc)
        out = DType.INT8 if dt == np.int8 else DType.UINT8
        got = qlinear_mul(
            torch.from_numpy(a), sa, torch.from_numpy(b), sb, sc, out, 0, (za, zb, zc)
        )
        assert np.array_equal(got.numpy(), ort_codes), f"case {seed}"
        a_full, b_full = np.broadcast_arrays(a.astype(np.int64), b.astype(np.int64))
        slow = qlinear_mul_reference(a_full, sa, b_full, sb, sc, out, 0, (za, zb, zc))
        assert np.array_equal(slow, ort_codes), f"case {seed}"


def test_qlinear_mul_of_int8_codes_held_as_uint8():
    """Symmetric int8 codes that onnxruntime holds as uint8 + 128: the zero point 128 enters
    the float32 sum, so with M a hair above 1/2 an odd product's k + 0.5 + e (e below half an
    ulp of 128 + k) becomes an exact tie there and rounds to even; the output zero point added
    after the rounding (a GEMM's rule) gives k + 1 for those."""
    rng = np.random.default_rng(7)
    a = rng.integers(-15, 16, (16, 64)).astype(np.int8)
    b = rng.integers(-15, 16, (16, 64)).astype(np.int8)
    sa, sb = F32(0.02), F32(0.03)
    sc = F32(F32(sa * sb) / F32(0.50000006))
    m = F32(F32(sa * sb) / sc)
    assert 0.5 < m < 0.5 + 2.0**-20
    held = [(v.astype(np.int16) + 128).astype(np.uint8) for v in (a, b)]
    ort_codes = run_qlinear_mul(held[0], sa, 128, held[1], sb, 128, sc, 128).astype(np.int16)
    ort_codes -= 128
    got = qlinear_mul(torch.from_numpy(a), sa, torch.from_numpy(b), sb, sc, DType.INT8, 128)
    assert np.array_equal(got.numpy(), ort_codes)
    after = qlinear_mul(torch.from_numpy(a), sa, torch.from_numpy(b), sb, sc, DType.INT8, 0)
    assert (after.numpy() != ort_codes).sum() > 50  # 98 of these 1,024


def test_qlinear_add_fuses_its_zero_point_products_as_onnxruntime_does():
    """onnxruntime's QLinearAdd forms its constant zc - (r_a * za + r_b * zb) with one fused
    multiply-add (fma(r_a, za, fl32(r_b * zb))): over every pair of codes, the cases whose
    codes that rounding moves (random zero points) give onnxruntime's codes, and separate
    roundings of the two products would not."""
    rng = np.random.default_rng(21)
    moved = 0
    for t in range(60):
        dt = np.uint8 if t % 2 else np.int8
        info = np.iinfo(dt)
        out = DType.UINT8 if dt == np.uint8 else DType.INT8
        a, b = every_pair(out.torch_dtype, out.torch_dtype)
        za, zb, zc = (int(v) for v in rng.integers(info.min, info.max + 1, 3))
        sa, sb, sc = _add_scales(rng)
        got = profile_qlinear_add(a, float(sa), b, float(sb), float(sc), out, 0, (za, zb, zc))
        ra, rb = F32(sa / sc), F32(sb / sc)
        apart = F32(F32(zc) - F32(F32(ra * F32(za)) + F32(rb * F32(zb))))
        rest = _fma_f32(b.numpy().astype(F32), rb, apart)
        old = np.rint(_fma_f32(a.numpy().astype(F32), ra, rest).astype(np.float64))
        old = np.clip(old, info.min, info.max)
        if (old != got.numpy()).any():
            moved += 1
            want = run_qlinear_add(a.numpy()[None], sa, za, b.numpy()[None], sb, zb, sc, zc)[0]
            assert np.array_equal(got.numpy(), want), t
            assert not np.array_equal(old, want), t
            at = np.nonzero(old != got.numpy())[0]  # the slow twin on the moved pairs
            slow = ref_qlinear_add(a[at], sa, b[at], sb, sc, out, 0, (za, zb, zc))
            assert np.array_equal(slow, want[at]), t
    assert moved >= 3  # 4 of these 60


def test_profile_add_of_uint8_codes_is_not_shifted():
    """The onnxruntime profile's add (``add_codes``) holds int8 codes as uint8 + 128, and
    uint8 codes (asymmetric activations) as they are: over every pair of uint8 codes, the
    cases where a shift by 128 would move a code give onnxruntime's codes unshifted."""
    from quantlab.platforms import load_platform
    from quantlab.simulate.fixed_common import add_codes

    p = load_platform("onnxruntime")
    rng = np.random.default_rng(8)
    a, b = every_pair(torch.uint8, torch.uint8)
    checked = 0
    for t in range(40):
        za, zb, zc = (int(v) for v in rng.integers(0, 256, 3))
        sa, sb, sc = _add_scales(rng)
        got = add_codes(p, a, sa, b, sb, sc, DType.UINT8, (za, zb, zc)).numpy()
        shifted = profile_qlinear_add(
            a, float(sa), b, float(sb), float(sc), DType.UINT8, 128, (za, zb, zc)
        )
        if (shifted.numpy() != got).any():
            checked += 1
            want = run_qlinear_add(a.numpy()[None], sa, za, b.numpy()[None], sb, zb, sc, zc)[0]
            assert np.array_equal(got, want), t
    assert checked >= 2
