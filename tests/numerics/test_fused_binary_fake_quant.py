"""``fake_quant_native.binary``: an add or multiply and its output fake quant in one C pass give
torch's op followed by the per-tensor fake quant (``fake_quant_fn``, HALF_EVEN by the
reciprocal), bit for bit: same shapes, operands broadcast over leading dims, Python numbers,
NaN, infinities, ties and saturation, in the build the CPU loads, the baseline build and the
AVX2 code alone; what it does not take is refused before anything is computed."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from native_builds import BUILDS, use_build
from toolchain import CC

from quantlab.numerics import fake_quant_native as FQN
from quantlab.numerics.dtypes import DType
from quantlab.numerics.fake_quant_plan import fake_quant_fn, native_constants
from quantlab.numerics.quantize import Divide
from quantlab.numerics.rounding import Round

needs_cc = pytest.mark.skipif(CC is None, reason="the native fake quant needs a C compiler")
OPS = {"add": torch.add, "mul": torch.mul}


def _point(scale: float, dtype: DType):
    fq = fake_quant_fn(torch.tensor(scale), dtype, Round.HALF_EVEN, Divide.BY_RECIPROCAL)
    return fq, native_constants(fq)


def _values(g, shape, scale: float, dtype: DType) -> torch.Tensor:
    """Random values over the code range and beyond, with ties of the sum's grid, the
    saturation edges and special values spread in."""
    x = torch.randn(shape, generator=g) * scale * dtype.qmax / 2
    flat = x.view(-1)
    special = [float("nan"), float("inf"), -float("inf"), -0.0, 0.5 * scale, 1.5 * scale]
    special += [(dtype.qmax + 0.5) * scale, (dtype.qmin - 0.5) * scale, 1e30, -1e-30]
    k = min(len(special), flat.numel())
    flat[torch.randperm(flat.numel(), generator=g)[:k]] = torch.tensor(special[:k])
    return x


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_the_fused_pass_gives_torchs_op_then_the_fake_quant(build, op, dtype, monkeypatch):
    use_build(build, FQN.KERNELS, monkeypatch)
    g = torch.Generator().manual_seed(7)
    scale = 0.0371 if dtype is DType.INT8 else 0.0371 / 256
    fq, (rf, sf, lo, hi) = _point(scale, dtype)
    shapes = [  # (x, other): same shape, broadcast over leading dims, one value
        ((1, 12, 128, 128), (1, 1, 1, 128)),  # on two threads: 2**17 values and more
        ((3, 5, 7), (3, 5, 7)),
        ((3, 5, 7), (5, 7)),
        ((2, 40000), (1, 40000)),  # runs longer than a thread's share
        ((3, 30001), (30001,)),  # the second thread starts within a run
        ((4, 9), ()),
        ((17,), (1,)),
        ((1,), (1,)),
    ]
    for xs, os_ in shapes:
        x = _values(g, xs, scale, dtype)
        other = _values(g, os_, scale, dtype) if os_ else torch.tensor(0.37)
        got = FQN.binary(op, x, other, rf, sf, lo, hi)
        assert got is not None and got.shape == x.shape
        assert_bits_equal(got, fq(OPS[op](x, other)), inputs={"x": x, "other": other})
    x = _values(g, (5, 3001), scale, dtype)
    for c in (0.1767766952966369, -1 / 3, 1e-40, 3e38, 1e39, -100.0, 7, -(2**23)):
        got = FQN.binary(op, x, c, rf, sf, lo, hi)
        assert_bits_equal(got, fq(OPS[op](x, c)), inputs={"x": x, "c": torch.tensor(c)})


@needs_cc
def test_what_the_pass_does_not_take_is_refused():
    """None (nothing computed) for a broadcast that is not over leading dims, one that would
    grow ``x``, other dtypes, strided or gradient-tracking operands, numbers that are not their
    own float32 value, and code bounds beyond the rounding's; torch's op serves them."""
    _, (rf, sf, lo, hi) = _point(0.05, DType.INT8)
    x = torch.randn(6, 4, 5)
    refused = [
        torch.randn(4, 1),  # repeats each value along the last dim: not over leading dims
        torch.randn(2, 6, 4, 5),  # the result would be larger than x
        torch.randn(6, 4, 5, dtype=torch.float64),
        torch.randn(5, 4).t(),
        torch.randn(6, 4, 5, requires_grad=True),
        2**24 + 1,
        True,
        torch.tensor(2),  # int64 (a 0-dim float32 tensor is taken)
    ]
    for other in refused:
        assert FQN.binary("add", x, other, rf, sf, lo, hi) is None, other
    assert FQN.binary("mul", x.double(), 2.0, rf, sf, lo, hi) is None
    assert FQN.binary("mul", x.transpose(0, 1), 2.0, rf, sf, lo, hi) is None
    assert FQN.binary("mul", x, 2.0, rf, sf, lo, 1 + (1 << 16)) is None
    assert FQN.binary("mul", x, torch.tensor(2.0), rf, sf, lo, hi) is not None
    assert FQN.binary("add", torch.empty(0, 3), torch.empty(3), rf, sf, lo, hi).shape == (0, 3)
