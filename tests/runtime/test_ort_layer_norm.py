"""onnxruntime's float32 LayerNormalization (CPU, x86-64 with AVX2): ``ort_layer_norm`` gives
its bits on random and adversarial rows of every length class (below 8 values: the scalar
Welford kernel; 8 and more: MLAS's AVX2 kernel with each tail length), with and without bias,
over one and two trailing dims; its fused multiply-add and square root are the correctly
rounded operations; ``ort_group_norm`` gives the bits of a group norm's ONNX form (Reshape,
LayerNormalization per group, Reshape, Mul, Add); and fixed mode on the onnxruntime profile
computes a LayerNorm, a GroupNorm and an InstanceNorm between DequantizeLinear and
QuantizeLinear with onnxruntime's codes."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from bits import assert_bits_equal
from onnx import TensorProto, helper, numpy_helper
from ort_graphs import session
from torch import nn

from quantlab.export.ort_host import onnxruntime_profile
from quantlab.numerics.ieee32 import fma32, sqrt32
from quantlab.numerics.ort_layer_norm import ort_group_norm, ort_layer_norm

pytestmark = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
    reason="onnxruntime takes MLAS's AVX2 LayerNorm kernel on x86-64 CPUs with AVX2 only",
)


def _ort_layer_norm(x: np.ndarray, nd: int, w, b, eps: float) -> np.ndarray:
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "b"))
        ins.append("b")
    node = helper.make_node("LayerNormalization", ins, ["y"], axis=-nd, epsilon=eps)
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))
    return session([node], [xi], TensorProto.FLOAT, inits).run(None, {"x": x})[0]


def _rows(rng, shape, kind: str) -> np.ndarray:
    if kind == "offset":  # E[x^2] - E[x]^2 cancels in float32 when a single pass forms it
        return (rng.standard_normal(shape) * 0.01 + 1000).astype(np.float32)
    if kind == "constant":
        return np.full(shape, 3.25, np.float32)
    if kind == "zeros":
        return np.zeros(shape, np.float32)
    scale = rng.choice([0.01, 1.0, 100.0])
    return (rng.standard_normal(shape) * scale + rng.choice([0.0, 3.0])).astype(np.float32)


@pytest.mark.parametrize("kind", ["random", "offset", "constant", "zeros"])
def test_ort_layer_norm_equals_onnxruntime(kind):
    rng = np.random.default_rng(["random", "offset", "constant", "zeros"].index(kind))
    lengths = [*range(1, 34), 63, 64, 65, 127, 209, 384, 767, 1024]
    for i, n in enumerate(lengths):
        nd = 2 if i % 5 == 0 and n % 2 == 0 else 1
        shape = (int(rng.integers(1, 5)), *((2, n // 2) if nd == 2 else (n,)))
        x = _rows(rng, shape, kind)
        w = rng.standard_normal(shape[-nd:]).astype(np.float32)
        b = rng.standard_normal(shape[-nd:]).astype(np.float32) if i % 3 else None
        eps = float(rng.choice([1e-5, 1e-6, 1e-12, 0.1]))
        got = torch.from_numpy(_ort_layer_norm(x, nd, w, b, eps))
        bt = None if b is None else torch.from_numpy(b)
        want = ort_layer_norm(torch.from_numpy(x), nd, torch.from_numpy(w), bt, eps)
        assert_bits_equal(want, got)


def test_torch_layer_norm_differs_from_onnxruntime():
    """Why quantlab emulates it: torch's float32 layer norm rounds otherwise."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((64, 384)).astype(np.float32)
    w, b = np.ones(384, np.float32), np.zeros(384, np.float32)
    got = _ort_layer_norm(x, 1, w, b, 1e-5)
    plain = torch.nn.functional.layer_norm(torch.from_numpy(x), (384,), eps=1e-5).numpy()
    assert (plain != got).sum() > 0


def _round32(exact: Fraction) -> float:
    """The float32 nearest ``exact`` (ties to even), by comparing the float32 neighbours of
    its float64 rounding."""
    r = np.float32(float(exact))
    cands = [np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))]

    def key(v):
        return abs(Fraction(float(v)) - exact), int(np.float32(v).view(np.uint32)) & 1

    return float(min(cands, key=key))


def test_fma32_rounds_once():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(3000).astype(np.float32)
    b = rng.standard_normal(3000).astype(np.float32)
    c = rng.standard_normal(3000).astype(np.float32)
    # adversarial: c cancels a * b to a tie of float32 after the product's low bits
    a[:500] = np.float32(1 + 2**-12)
    b[:500] = np.float32(1 + 2**-12)
    c[:500] = -np.float32(1.0) * rng.choice([1.0, 0.5, 2.0], 500).astype(np.float32)
    got = fma32(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c))
    for i in range(len(a)):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        assert got[i].item() == _round32(exact), i


def test_sqrt32_is_correctly_rounded():
    rng = np.random.default_rng(2)
    v = np.concatenate([rng.random(20000) * 10, rng.random(2000) * 1e-30, [0.0, 1.0, 4.0]])
    v = v.astype(np.float32)
    got = sqrt32(torch.from_numpy(v)).numpy()
    # the float64 square root rounded to float32: correct (53 >= 2 * 24 + 2 bits)
    want = np.array([np.float32(math.sqrt(float(t))) for t in v])
    assert np.array_equal(got, want)


def test_fixed_mode_layer_norm_has_onnxruntimes_codes(tmp_path):
    """A LayerNorm (int16 output) between two linear layers, exported as QDQ: onnxruntime's
    codes are fixed mode's on several inputs (torch's layer norm misses some)."""
    pytest.importorskip("onnx")
    from quantlab.export import runtime as R
    from quantlab.export import to_onnx_qdq
    from quantlab.numerics.dtypes import DType
    from quantlab.qconfig import OpQConfig, QConfigSpec
    from quantlab.simulate import Mode, Simulator

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 48), nn.LayerNorm(48), nn.Linear(48, 8)).eval()
    g = torch.Generator().manual_seed(1)
    # int16 output codes: a last-bit difference of the float layer norm moves one often
    spec = QConfigSpec(by_type={"layer_norm": OpQConfig(output_dtype=DType.INT16)})
    sim = Simulator(model, onnxruntime_profile(), spec)
    sim.calibrate([(torch.randn(64, 16, generator=g),) for _ in range(2)], progress=False)
    xs = [(torch.randn(64, 16, generator=g) * s,) for s in (0.5, 1.0, 2.0, 4.0)]
    info = to_onnx_qdq(sim, tmp_path / "ln.onnx", xs[0], probe=True)
    sess = R.session(info.path)
    norm = info.op_tensors["1:layer_norm#0"]
    for x in xs:
        (got,) = R.run(sess, info.input_names, x, [norm])
        want = sim.trace(*x, mode=Mode.FIXED).qinfo["1:layer_norm#0"].codes
        codes = R.codes_from_runtime(got, norm in info.offset_tensors)
        assert_bits_equal(torch.from_numpy(codes), want.to(torch.int64))


def _ort_group_norm(x: np.ndarray, groups: int, w, b, eps: float) -> np.ndarray:
    """onnxruntime's output of a group norm's ONNX form, built here node by node."""
    n, c = x.shape[:2]
    rest = x.size // (n * groups)
    per_channel = [c] + [1] * (x.ndim - 2)
    inits = [
        numpy_helper.from_array(np.array([n, groups, rest], np.int64), "grouped"),
        numpy_helper.from_array(np.ones(rest, np.float32), "ones"),
        numpy_helper.from_array(np.array(x.shape, np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "grouped"], ["g"]),
        helper.make_node("LayerNormalization", ["g", "ones"], ["l"], axis=-1, epsilon=eps),
        helper.make_node("Reshape", ["l", "shape"], ["y" if w is None and b is None else "r"]),
    ]
    last = "r"
    for t, kind, op in ((w, "w", "Mul"), (b, "b", "Add")):
        if t is None:
            continue
        inits.append(numpy_helper.from_array(t.reshape(per_channel), kind))
        out = "y" if kind == "b" or b is None else f"{kind}_out"
        nodes.append(helper.make_node(op, [last, kind], [out]))
        last = out
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))
    return session(nodes, [xi], TensorProto.FLOAT, inits).run(None, {"x": x})[0]


@pytest.mark.parametrize("native", [True, False])
def test_ort_group_norm_equals_onnxruntime_on_its_onnx_form(native):
    """Groups of fewer than 8 values (the Welford kernel) and of 8 and more (MLAS's, every
    tail), 1-d and 2-d layouts, with and without weight and bias, rows of every kind."""
    rng = np.random.default_rng(11)
    kinds = ["random", "offset", "constant", "zeros"]
    cases = [(4, 2, (3,)), (6, 3, (1,)), (8, 8, (2, 2)), (8, 2, (5, 5)), (6, 1, (7,)),
             (16, 4, (3, 3)), (12, 3, (9, 9)), (4, 4, (11,)), (32, 8, (6, 6))]  # fmt: skip
    for i, (c, groups, spatial) in enumerate(cases):
        x = _rows(rng, (int(rng.integers(1, 4)), c, *spatial), kinds[i % 4])
        w = rng.uniform(0.25, 4.0, c).astype(np.float32) if i % 3 else None
        b = rng.standard_normal(c).astype(np.float32) if i % 2 else None
        eps = float(rng.choice([1e-5, 1e-6, 0.1]))
        got = torch.from_numpy(_ort_group_norm(x, groups, w, b, eps))
        wt, bt = (None if t is None else torch.from_numpy(t) for t in (w, b))
        want = ort_group_norm(torch.from_numpy(x), groups, wt, bt, eps, native=native)
        assert_bits_equal(want, got)


def test_torch_group_norm_differs_from_onnxruntime():
    """Why quantlab computes the ONNX form's steps: torch's float32 group norm rounds
    otherwise."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((8, 32, 12, 12)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, 32).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    got = _ort_group_norm(x, 4, w, b, 1e-5)
    plain = torch.nn.functional.group_norm(
        torch.from_numpy(x), 4, torch.from_numpy(w), torch.from_numpy(b), 1e-5
    ).numpy()
    assert (plain != got).sum() > 0


_GROUPED = {  # a normalisation of 16 channels (affine or not) and its op name
    "group": (lambda affine: nn.GroupNorm(4, 16, affine=affine), "1:group_norm#0"),
    "instance": (lambda affine: nn.InstanceNorm2d(16, affine=affine), "1:instance_norm#0"),
}


@pytest.mark.parametrize("encoding", ["UNSIGNED_OFFSET", "SIGNED"])
@pytest.mark.parametrize("dtype", ["INT8", "INT16"])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("norm", sorted(_GROUPED))
def test_fixed_mode_grouped_norms_have_onnxruntimes_codes(norm, affine, dtype, encoding, tmp_path):
    """A GroupNorm or an InstanceNorm between two convolutions, exported as QDQ in either int8
    encoding: onnxruntime's codes of it are fixed mode's on several inputs (int16 codes: a
    last-bit difference of the float norm would move one often), and so is the model's output
    where the norm's codes are int8 (a convolution of int16 codes sums in float32 between
    DequantizeLinear and QuantizeLinear, in an order torch does not promise); onnxruntime runs
    every exported step as its own kernel (nothing fused), and the op table says how it runs.
    A SIGNED export failed to load: onnxruntime's Q/DQ propagation through the first Reshape
    wrote a QuantizeLinear of mismatched types (kornia's TFeat)."""
    from ort_encodings import require_modelled

    from quantlab.export import ActivationEncoding, to_onnx_qdq
    from quantlab.export import runtime as R
    from quantlab.numerics.dtypes import DType
    from quantlab.qconfig import OpQConfig, QConfigSpec
    from quantlab.simulate import Mode, Simulator

    make, name = _GROUPED[norm]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), make(affine), nn.ReLU(),
                          nn.Conv2d(16, 4, 1)).eval()  # fmt: skip
    if affine:
        with torch.no_grad():
            model[1].weight.uniform_(0.5, 2.0)
            model[1].bias.uniform_(-1.0, 1.0)
    g = torch.Generator().manual_seed(1)
    op_type = name.split(":")[1].split("#")[0]
    spec = QConfigSpec(by_type={op_type: OpQConfig(output_dtype=DType.parse(dtype))})
    sim = Simulator(model, onnxruntime_profile(), spec)
    sim.calibrate([(torch.randn(4, 3, 6, 6, generator=g),) for _ in range(2)], progress=False)
    xs = [(torch.randn(4, 3, 6, 6, generator=g) * s,) for s in (0.5, 1.0, 2.0, 4.0)]
    enc = ActivationEncoding[encoding]
    require_modelled(enc)
    info = to_onnx_qdq(sim, tmp_path / "gn.onnx", xs[0], probe=True, encoding=enc)
    sess = R.session(info.path, tmp_path / "opt.onnx")
    kernels = R.kernels_by_op(tmp_path / "opt.onnx", [name])[name]
    steps = ["Mul", "Add"] if affine else []
    assert kernels == ["Reshape", "LayerNormalization", "Reshape", *steps]  # every step its own
    out_tensor = info.op_tensors[name]
    for x in xs:
        got, out = R.run(sess, info.input_names, x, [out_tensor, info.output_names[0]])
        trace = sim.trace(*x, mode=Mode.FIXED)
        codes = R.codes_from_runtime(got, out_tensor in info.offset_tensors)
        assert_bits_equal(torch.from_numpy(codes), trace.qinfo[name].codes.long())
        if dtype == "INT8":
            assert_bits_equal(torch.from_numpy(out), sim.run(*x, mode=Mode.FIXED))
    kernel = sim.ops.set_index("op_type").loc[op_type, "fixed_kernel"]
    assert kernel.startswith("float between dequantize and quantize (LayerNormalization")


def test_an_instance_norm_of_running_statistics_is_refused_at_export(tmp_path):
    from quantlab.export import UnsupportedOpError, to_onnx_qdq
    from quantlab.simulate import Simulator

    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.InstanceNorm2d(8, track_running_stats=True))
    model.eval()
    sim = Simulator(model, "onnxruntime")
    sim.calibrate([(torch.randn(2, 3, 4, 4),)], progress=False)
    with pytest.raises(UnsupportedOpError, match="instance_norm with running statistics"):
        to_onnx_qdq(sim, tmp_path / "m.onnx", (torch.randn(2, 3, 4, 4),))
