"""FAKE softmax on J6 is the vendor's QAT SegmentLUTSoftmax: x - max(x), exp, the row sum and
the reciprocal each fake-quantized at FIXED's intermediate int16 scales (``lut_softmax``), then
the product's output fake quant. The reference below builds it from torch's own fake-quant
kernel, step by step. The runtime profiles keep fq_out(softmax(x))."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.composite import (
    QAT_SOFTMAX_MAX_ROW,
    RECIPROCAL_CLIP_CODES_INT16,
    SOFTMAX_EXP_SCALE,
    SOFTMAX_RECIP_SCALE,
)
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

NAME = ":softmax#0"


class _Softmax(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.softmax(x, self.dim)


class _Attention(nn.Module):
    """Scores from a linear layer, softmax over the keys, weighted sum."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)

    def forward(self, x):
        a = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) * 2.0, dim=-1)
        return a @ x


def _f32(v: float) -> float:
    return torch.tensor(v, dtype=torch.float32).item()


def _fq(v, scale, dtype=DType.INT16):
    """torch's QAT fake quant (HALF_EVEN, by the float32 reciprocal of the scale)."""
    return torch.fake_quantize_per_tensor_affine(v, _f32(float(scale)), 0, dtype.qmin, dtype.qmax)


def _segment_lut_softmax(xq, dim, s_in, sum_scale):
    """The plugin's QAT softmax before its output fake quant, from torch's fake quant alone."""
    d = _fq(xq - xq.amax(dim, keepdim=True), s_in)
    e = _fq(torch.exp(d), SOFTMAX_EXP_SCALE)
    s = _fq(e.sum(dim, keepdim=True), sum_scale)
    floor = RECIPROCAL_CLIP_CODES_INT16 * _f32(sum_scale)
    return e * _fq(torch.reciprocal(s.clamp_min(floor)), SOFTMAX_RECIP_SCALE)


def _simulator(platform, dim, dtype, calib):
    rule = OpQConfig(input_dtype=dtype, output_dtype=dtype)
    sim = Simulator(_Softmax(dim), platform, QConfigSpec(by_type={"softmax": rule}))
    sim.calibrate([(c,) for c in calib], progress=False)
    return sim


def _scales(sim, dtype):
    rq = sim.qconfig_of(NAME)
    return (float(sim.act_scale(NAME, k, dtype, rq)) for k in ("in0", "out"))


def _sum_scale(sim):
    """The row sum's int16 scale, calibrated at ``<op>/sum`` with the op's observer (the
    plugin's SegmentLUTSoftmax quantizes its sum with an int16 qconfig of its own)."""
    from quantlab.simulate.fixed_softmax import inner_point_rq

    rq = inner_point_rq(sim.qconfig_of(NAME))
    return float(sim.act_scale(NAME, "sum", DType.INT16, rq))


def _rows(g, dim):
    """Random scores, and rows that reach every step's edge: all equal, one far above the
    rest (x - max below -32768 codes, which saturates), ties, one huge negative value."""
    x = torch.randn(3, 6, 40, generator=g) * 3.0
    x[0, 0] = 0.0
    x[0, 1] = torch.linspace(-40.0, 0.0, 40)
    x[0, 2, :5] = 30.0
    x[0, 3] = torch.tensor([1.0, -1.0] * 20)
    x[0, 4, 7] = -1e6
    return x if dim in (-1, 2) else x.transpose(1, 2).contiguous()


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("dim", [-1, 1])
def test_fake_mode_is_the_plugins_segment_lut_softmax(dtype, dim):
    """Bit for bit with torch's fake quant step by step; with int16 codes it differs from the
    exact softmax fake-quantized (the intermediate fake quants move codes), as QAT does."""
    g = torch.Generator().manual_seed(11)
    sim = _simulator("j6m", dim, dtype, [torch.randn(3, 6, 40, generator=g) * 3.0])
    s_in, s_out = _scales(sim, dtype)
    x = _rows(g, dim)
    got = sim.run(x, mode=Mode.FAKE)
    xq = _fq(x, s_in, dtype)
    want = _segment_lut_softmax(xq, dim, s_in, _sum_scale(sim))
    assert_bits_equal(got, _fq(want, s_out, dtype))
    exact = _fq(torch.softmax(xq, dim), s_out, dtype)
    if dtype is DType.INT16:
        assert not torch.equal(got, exact)
        # what QAT now sees includes the intermediate quantization FIXED has: FIXED is
        # nearer to it than to the exact softmax fake-quantized (the rest is table error)
        fixed = sim.run(x, mode=Mode.FIXED)
        assert (fixed - got).abs().mean() < (fixed - exact).abs().mean()


def test_fake_mode_keeps_the_saturated_difference_that_fixed_mode_has():
    """x - max(x) is held in int16 codes of the input's scale, so a row spanning more than
    that range floors its smallest probabilities at exp(-32768 s_in) / sum: FIXED and FAKE
    alike, where the exact softmax gives those entries 0."""
    sim = _simulator("j6m", -1, DType.INT16, [torch.linspace(-8.0, 8.0, 64).reshape(1, 64)])
    s_in, s_out = _scales(sim, DType.INT16)
    x = torch.full((1, 64), -8.0)
    x[0, 0] = 8.0
    fake, fixed = sim.run(x, mode=Mode.FAKE), sim.run(x, mode=Mode.FIXED)
    assert (_fq(torch.softmax(_fq(x, s_in), -1), s_out)[0, 1:] == 0).all()  # exp(-16): 0
    floor = torch.exp(torch.tensor(-32768 * s_in))  # exp(-8) / (1 + 63 exp(-8)) = 3.2e-4
    assert float(floor) / s_out > 10
    for y in (fake, fixed):
        assert (y[0, 1:] == y[0, 1]).all()
        assert float(y[0, 1]) == pytest.approx(float(floor / (1 + 63 * floor)), rel=0.1)


def test_gradients_flow_through_the_qat_softmax():
    """Training's forward gives FAKE's bits, and the gradient of the float softmax."""
    g = torch.Generator().manual_seed(12)
    sim = _simulator("j6m", -1, DType.INT16, [torch.randn(4, 32, generator=g)])
    x = torch.randn(4, 32, generator=g)
    want = sim.run(x, mode=Mode.FAKE)
    xg = x.clone().requires_grad_()
    out = sim.train_forward(xg)
    assert_bits_equal(out.detach(), want)
    (out * torch.arange(32.0)).sum().backward()
    s_in, _ = _scales(sim, DType.INT16)
    ref = _fq(x, s_in).requires_grad_()
    (torch.softmax(ref, -1) * torch.arange(32.0)).sum().backward()
    torch.testing.assert_close(xg.grad, ref.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.HYBRID])
def test_steady_runs_and_programs_keep_the_bits(monkeypatch, mode):
    """The QAT softmax kept as a prepared call (steady runs) and in a traced program gives
    the bits of a simulator that captures every run."""
    build_in_first_run(monkeypatch)
    rule = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)
    spec = QConfigSpec(by_type={"softmax": rule})
    g = torch.Generator().manual_seed(13)
    calib = [(torch.randn(2, 10, 8, generator=g),) for _ in range(2)]
    xs = [torch.randn(2, 10, 8, generator=g) * s for s in (0.5, 1.0, 2.0)]
    sims = []
    for steady in (True, False):
        torch.manual_seed(0)
        sim = Simulator(_Attention().eval(), "j6m", spec, steady_programs=steady)
        sim.calibrate(calib, progress=False)
        sims.append(sim)
    fast, captured = sims
    for x in xs * 3:
        assert_bits_equal(fast.run(x, mode=mode), captured.run(x, mode=mode))
    state = fast.steady_programs.status((xs[0],), mode)
    assert state.program is not None and state.program.fallbacks == 0


def test_the_runtime_profiles_fake_softmax_is_the_exact_softmax_fake_quantized():
    """Where FIXED is not the J6 composite (onnxruntime's QLinearSoftmax), FAKE stays
    fq_out(softmax(fq_in(x)))."""
    g = torch.Generator().manual_seed(14)
    sim = _simulator("onnxruntime", -1, DType.INT8, [torch.randn(4, 32, generator=g)])
    x = torch.randn(4, 32, generator=g)
    rq = sim.qconfig_of(NAME)

    def fq(v, key):
        s, zp = (
            sim.act_scale(NAME, key, DType.INT8, rq),
            sim.act_zero_point(NAME, key, DType.INT8, rq),
        )
        return torch.fake_quantize_per_tensor_affine(v, float(s), zp, -128, 127)

    assert_bits_equal(sim.run(x, mode=Mode.FAKE), fq(torch.softmax(fq(x, "in0"), -1), "out"))


def test_rows_longer_than_the_exact_sum_takes_keep_the_float_softmax():
    """Past QAT_SOFTMAX_MAX_ROW values the row sum is no longer exact in double: FAKE falls
    back to fq_out(softmax(fq_in(x)))."""
    g = torch.Generator().manual_seed(15)
    n = QAT_SOFTMAX_MAX_ROW + 1
    sim = _simulator("j6m", -1, DType.INT16, [torch.randn(1, n, generator=g)])
    s_in, s_out = _scales(sim, DType.INT16)
    x = torch.randn(1, n, generator=g)
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), _fq(torch.softmax(_fq(x, s_in), -1), s_out))


def test_the_row_sum_takes_a_calibrated_int16_scale():
    """The row sum's scale is calibrated (the plugin's ``sum`` FloatFunctional has an int16
    qconfig): peaky rows of 6,625 values (a text recognizer's characters, one dominant) sum
    near 1 and keep their resolution, so FAKE and FIXED agree and stay near float, where the
    scale that cannot saturate, n * 2/65535, left such a sum 6 codes (FAKE then clipped it at
    the QAT reciprocal's 32 codes: a fifth of each probability). Rows flat enough that their
    sums need a scale above 1/32 can still fall below those 32 codes: warned of, naming the op."""
    import warnings

    g = torch.Generator().manual_seed(16)

    def rows(n, peak):
        x = torch.randn(2, n, generator=g)
        x[:, 0] += peak
        return x

    sim = _simulator("j6m", -1, DType.INT16, [rows(6625, 12.0) for _ in range(2)])
    assert _sum_scale(sim) < 32 * SOFTMAX_EXP_SCALE  # n * 2/65535 would be 0.2
    x = rows(6625, 12.0)
    fake, fixed = sim.run(x, mode=Mode.FAKE), sim.run(x, mode=Mode.FIXED)
    assert abs(float(fake.sum() / fixed.sum()) - 1) < 0.01
    assert float(fixed.sum()) > 0.9 * len(x)  # each row sums to 1 less what its int16
    # output grid drops (the thousands of probabilities below half an LSB): not a fifth
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        flat = _simulator("j6m", -1, DType.INT16, [torch.zeros(2, 2048)])
        flat.run(torch.zeros(2, 2048), mode=Mode.FIXED)
    words = [str(w.message) for w in seen if "softmax :softmax#0: its row sum" in str(w.message)]
    assert words and "fewer than 32 codes" in words[0]
