"""The QAT softmax (``composite.qat_softmax``, the vendor's SegmentLUTSoftmax as QAT computes
it): its C pass per row gives its torch passes' bits on random and adversarial rows (saturated
differences, equal rows, one value far above the rest, NaN, rows of one value and of the
longest length it takes), in the build the CPU loads, the baseline build and the AVX2 code
alone; the torch passes serve every other dim and rounding. The Simulator's FAKE softmax is
checked against torch's own fake quant in ``tests/simulate/test_fake_softmax.py``."""

from __future__ import annotations

import pytest
import torch
from native_builds import BUILDS, use_build

from quantlab.numerics.dtypes import DType
from quantlab.numerics.fake_quant_plan import fake_quant_fn
from quantlab.numerics.lut import composite, softmax_native
from quantlab.numerics.quantize import Divide, fake_quant
from quantlab.numerics.rounding import Round
from tests.bits import assert_bits_equal

needs_cc = pytest.mark.skipif(
    softmax_native.KERNELS.lib() is None, reason="no C compiler to build the kernels"
)


def _torch_passes(monkeypatch, *args, **kw) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setattr(softmax_native, "qat_rows", lambda *a, **k: None)
        return composite.qat_softmax(*args, **kw)


def _rows(g, shape, s_in: float, dtype: DType = DType.INT16) -> list[torch.Tensor]:
    """Fake-quantized rows at several spreads, and adversarial ones."""
    n = shape[-1]
    out = [
        fake_quant(torch.randn(shape, generator=g) * k * s_in, s_in, dtype)
        for k in (3.0, 300.0, 9000.0, 40000.0)
    ]
    out.append(torch.full(shape, dtype.qmin * s_in))
    spike = torch.zeros(shape)
    spike[..., n // 2] = dtype.qmax * s_in
    out.append(spike)
    alt = torch.tensor([dtype.qmin, dtype.qmax] * n)[:n].to(torch.float32) * s_in
    out.append(fake_quant(alt.expand(shape).contiguous(), s_in, dtype))
    nan = out[0].clone()
    nan.view(-1, n)[0, n - 1] = float("nan")
    out.append(nan)
    return out


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("n", [1, 7, 128, 301])
def test_the_native_pass_gives_the_torch_passes_bits(build, dtype, n, monkeypatch):
    use_build(build, softmax_native.KERNELS, monkeypatch)
    g = torch.Generator().manual_seed(n)
    for s_in in (8 / 32767, 0.05, 1.7):
        for x in _rows(g, (3, 5, n), s_in, dtype):
            fast = composite.qat_softmax(x, -1, s_in)
            assert_bits_equal(fast, _torch_passes(monkeypatch, x, -1, s_in))
            assert bool(torch.isnan(fast).any()) == bool(torch.isnan(x).any())


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("out_dtype", [DType.INT8, DType.INT16])
def test_the_fused_output_fake_quant_gives_the_torch_passes_bits(build, out_dtype, monkeypatch):
    """``out_quant`` applied in the C pass's last loop equals it applied to the torch passes'
    product: output scales that resolve the values, that saturate them (1e-3 x 127 < 1) and
    that round most to 0; the HALF_UP form by the scale runs after the pass."""
    use_build(build, softmax_native.KERNELS, monkeypatch)
    g = torch.Generator().manual_seed(3)
    s_in = 0.05
    for s_out in (1.0 / out_dtype.qmax, 1e-3, 0.37):
        for rounding, divide in (
            (Round.HALF_EVEN, Divide.BY_RECIPROCAL),
            (Round.HALF_UP, Divide.BY_SCALE),
        ):
            fq = fake_quant_fn(torch.tensor(s_out), out_dtype, rounding, divide)
            for x in _rows(g, (4, 130), s_in):
                fast = composite.qat_softmax(x, -1, s_in, out_quant=fq)
                want = fq(_torch_passes(monkeypatch, x, -1, s_in))
                assert_bits_equal(fast, want)
                assert_bits_equal(_torch_passes(monkeypatch, x, -1, s_in, out_quant=fq), want)


@needs_cc
@pytest.mark.parametrize("build", BUILDS)
def test_infinite_rows_give_the_torch_passes_bits(build, monkeypatch):
    """A row whose maximum is +inf or -inf (x - max is NaN there) is NaN in both forms; a -inf
    below a finite maximum saturates its difference as any value far below it."""
    use_build(build, softmax_native.KERNELS, monkeypatch)
    s_in, inf = 0.05, float("inf")
    x = fake_quant(
        torch.randn(5, 37, generator=torch.Generator().manual_seed(4)), s_in, DType.INT16
    )
    x[0, 3] = inf
    x[1] = -inf
    x[2, 5] = -inf
    x[3, :] = inf
    fast = composite.qat_softmax(x, -1, s_in)
    assert_bits_equal(fast, _torch_passes(monkeypatch, x, -1, s_in))
    assert torch.isnan(fast[[0, 1, 3]]).all() and torch.isfinite(fast[[2, 4]]).all()


@needs_cc
def test_the_longest_rows_sum_exactly_and_longer_ones_are_refused(monkeypatch):
    """Rows of QAT_SOFTMAX_MAX_ROW values of exp(0) = 1 each: the largest sum, exact in both
    forms."""
    n = composite.QAT_SOFTMAX_MAX_ROW
    g = torch.Generator().manual_seed(1)
    for x in (torch.zeros(2, n), fake_quant(torch.randn(2, n, generator=g), 1e-3, DType.INT16)):
        assert_bits_equal(
            composite.qat_softmax(x, -1, 1e-3), _torch_passes(monkeypatch, x, -1, 1e-3)
        )
    with pytest.raises(ValueError, match="at most 16384"):
        composite.qat_softmax(torch.zeros(1, n + 1), -1, 1e-3)


def test_other_dims_and_tie_rules_take_the_torch_passes():
    """Over another dim, the torch passes give the last-axis bits of the moved tensor; with
    HALF_UP by the scale (``bpu_round``), its fake quants."""
    g = torch.Generator().manual_seed(2)
    s_in = 0.01
    x = fake_quant(torch.randn(4, 33, 6, generator=g) * 3, s_in, DType.INT16)
    moved = composite.qat_softmax(x.transpose(1, 2).contiguous(), -1, s_in)
    assert_bits_equal(composite.qat_softmax(x, 1, s_in), moved.transpose(1, 2))
    up = composite.qat_softmax(x, -1, s_in, Round.HALF_UP, Divide.BY_SCALE)
    even = composite.qat_softmax(x, -1, s_in)
    assert (up - even).abs().max() < 1e-3 and torch.isfinite(up).all()


def test_the_exp_values_are_torchs_exp_fake_quantized_per_code():
    s_in = 8 / 32767
    values = composite.qat_softmax_exp_values(
        s_in, composite.SOFTMAX_EXP_SCALE, Round.HALF_EVEN, Divide.BY_RECIPROCAL
    )
    k = torch.arange(0, 1024, dtype=torch.float32)  # a multiple of the vector width
    d = torch.fake_quantize_per_tensor_affine(-k * s_in, s_in, 0, -32768, 32767)
    se = torch.tensor(composite.SOFTMAX_EXP_SCALE, dtype=torch.float32).item()
    want = torch.fake_quantize_per_tensor_affine(torch.exp(d), se, 0, -32768, 32767)
    assert_bits_equal(values[:1024], want)
    assert values.numel() == 32769 and float(values[0]) == pytest.approx(1.0, abs=se)


def test_an_exp_scale_too_fine_for_an_exact_row_sum_is_refused():
    """Below 2**-15 the exp values' unit is too fine for a row of 16384 to sum exactly."""
    half_even, by_reciprocal = Round.HALF_EVEN, Divide.BY_RECIPROCAL
    with pytest.raises(ValueError, match="exp_scale 1e-06"):
        composite.qat_softmax_exp_values(0.01, 1e-6, half_even, by_reciprocal)
    assert composite.qat_softmax_exp_values(0.01, 2.0**-15, half_even, by_reciprocal).numel()


@needs_cc
@pytest.mark.parametrize("s_in", [3.4028234663852886e38 / 32767.5, 3.4028234663852886e38 / 127.5])
def test_a_scale_whose_lowest_code_overflows_float32(s_in, monkeypatch):
    """Scores calibrated over an additive mask of float32's lowest value: -32768 codes of the
    input scale overflow float32 to -inf, so the torch passes take that difference as the
    lowest code (as the C pass does) and give its bits: each row's maximum takes the weight
    and the masked values (float32's lowest, -inf) none."""
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(5))
    x[:, 5:] = torch.finfo(torch.float32).min
    x[1, 2] = float("-inf")
    x[2, :5] = 0.0
    fast = composite.qat_softmax(x, -1, s_in)
    slow = _torch_passes(monkeypatch, x, -1, s_in)
    assert_bits_equal(fast, slow)
    assert bool((slow[:, 5:] == 0).all()) and bool((slow[1, 2] == 0).all())
    assert float((slow[2, :5] - slow[2, 0]).abs().max()) == 0.0 and float(slow[2, 0]) > 0.19
