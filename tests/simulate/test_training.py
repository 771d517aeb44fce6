"""Training through fake quantization: forward bits unchanged, gradients everywhere, deployed
segment tables equal fixed mode, hybrid mode = fixed on LUT ops and fake elsewhere."""

from __future__ import annotations

import json
import math

import pytest
import torch
from bits import assert_bits_equal
from cpu_pins import pinned_path
from pinned_fake_mode import GOLDEN, fake_mode_digests, small_net
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.op_kinds import OpCategory
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import FakeOps, Mode, Simulator
from quantlab.simulate.fixed_lut import DEPLOYED_CATEGORIES

LUT_TYPES = ("sigmoid", "tanh", "exp", "sin", "cos", "inverse_sigmoid", "softmax")


def test_fake_mode_and_training_forward_bits_equal_the_pinned_fake_mode():
    """FAKE runs and training forwards give the digests written by the code before training
    existed (every op's output; the model output)."""
    golden = json.loads(pinned_path(GOLDEN).read_text())
    got = fake_mode_digests(train=True)
    for name, want in golden.items():
        train = got[name].pop("__train_output__")
        assert got[name] == want, name
        assert train == want["__output__"], name


@pytest.mark.parametrize("fake_ops", [FakeOps.QAT, FakeOps.DEPLOYED])
def test_train_forward_bits_equal_the_no_gradient_run(fake_ops):
    for sim, x in (_lut_sim(fake_ops), _small(fake_ops)):
        y = sim.train_forward(*x)
        assert y.requires_grad
        assert_bits_equal(y.detach(), sim.run(*x, mode=Mode.FAKE))


class LutNet(nn.Module):
    """Linear layers around int16 LUT ops: sigmoid, tanh, exp, sin/cos over several periods,
    inverse_sigmoid and softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.c = nn.Linear(6, 3)

    def forward(self, x):
        from quantlab.ops import inverse_sigmoid

        h = self.a(x)
        s = torch.sigmoid(h)
        t = torch.tanh(h) + torch.exp(-h.abs())
        w = 6.0 * h
        p = torch.sin(w) + torch.cos(w)
        q = inverse_sigmoid(s) + torch.softmax(self.b(t), -1)
        return self.c(p + q)


def _lut_sim(fake_ops=FakeOps.QAT, spec=None, seed=0):
    torch.manual_seed(seed)
    m = LutNet()
    g = torch.Generator().manual_seed(seed)
    calib = [(torch.randn(16, 6, generator=g) * 2,) for _ in range(2)]
    i16 = OpQConfig(input_dtype=DType.INT16, output_dtype=DType.INT16)
    spec = spec or QConfigSpec(by_type={t: i16 for t in LUT_TYPES})
    sim = Simulator(m, "j6m", spec, fake_ops=fake_ops)
    sim.calibrate(calib, progress=False)
    return sim, (torch.randn(16, 6, generator=g) * 2,)


def _isolated(sim, x, a: Mode, b: Mode):
    """Traces of run a and of run b fed, op by op, the inputs run a gave each op."""
    ta = sim.trace(*x, mode=a)
    return ta, sim.trace(*x, mode=b, _isolate=ta)


def _lut_ops(sim) -> list[str]:
    return [n for n, i in sim._info.items() if i.category in DEPLOYED_CATEGORIES]


def test_deployed_lut_ops_equal_fixed_mode():
    sim, x = _lut_sim(FakeOps.DEPLOYED)
    fake, fixed = _isolated(sim, x, Mode.FAKE, Mode.FIXED)
    luts = _lut_ops(sim)
    assert {sim._info[n].op_type for n in luts} >= set(LUT_TYPES)
    for n in luts:
        assert_bits_equal(fake.outputs[n], fixed.outputs[n])
    # the wide sin/cos input is period-reduced (else the QAT-form sin would differ from it)
    plain, _ = _isolated(_lut_sim(FakeOps.QAT)[0], x, Mode.FAKE, Mode.FIXED)
    sin = next(n for n in luts if sim._info[n].op_type == "sin")
    assert not torch.equal(plain.outputs[sin], fixed.outputs[sin])


def test_hybrid_is_fixed_on_lut_ops_and_fake_elsewhere():
    sim, x = _lut_sim(FakeOps.QAT)
    hybrid, fixed = _isolated(sim, x, Mode.HYBRID, Mode.FIXED)
    _, fake = _isolated(sim, x, Mode.HYBRID, Mode.FAKE)
    luts = set(_lut_ops(sim))
    assert luts
    for n in hybrid.order:
        want = fixed if n in luts else fake
        out = hybrid.outputs[n]
        if isinstance(out, torch.Tensor):
            assert_bits_equal(out, want.outputs[n])
    differs = [n for n in luts if not torch.equal(hybrid.outputs[n], fake.outputs[n])]
    assert differs  # the LUT ops do compute something else than fake mode here


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.HYBRID])
@pytest.mark.parametrize("fake_ops", [FakeOps.QAT, FakeOps.DEPLOYED])
def test_gradients_reach_every_parameter(mode, fake_ops):
    for sim, x in (_lut_sim(fake_ops), _small(fake_ops)):
        y = sim.train_forward(*x, mode=mode)
        y.square().sum().backward()
        for name, p in sim.model.named_parameters():
            assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
            assert float(p.grad.abs().sum()) > 0, name


def _small(fake_ops):
    m, calib, x = small_net()
    sim = Simulator(m, "j6m", fake_ops=fake_ops)
    sim.calibrate(calib, progress=False)
    return sim, x


def test_deployed_lut_gradient_is_the_table_slope():
    """d out / d in of a deployed sigmoid equals its table's slope (numerics.lut.segment_slope)
    times out_scale / in_scale, element by element."""
    from quantlab.numerics.lut import build_lut, default_spec
    from quantlab.numerics.lut.slope import segment_slope

    sim, _ = _lut_sim(FakeOps.DEPLOYED)
    x = (torch.linspace(-4, 4, 301).reshape(-1, 1) * torch.ones(1, 6)).requires_grad_(True)
    sig = next(n for n, i in sim._info.items() if i.op_type == "sigmoid")
    seen = {}

    def keep(call):
        if call.call.name == sig:
            seen["in"], seen["out"] = call.call.args[0], call.output

    sim.trace(x.detach(), mode=Mode.FAKE, on_call=keep)
    hin = seen["in"].detach().clone().requires_grad_(True)  # the sigmoid's fake-quant input
    rq = sim.qconfig_of(sig)
    s_in = sim.act_scale(sig, "in0", DType.INT16, rq)
    s_out = sim.act_scale(sig, "out", DType.INT16, rq)
    lut = build_lut(
        "sigmoid",
        DType.INT16,
        float(s_in),
        DType.INT16,
        float(s_out),
        default_spec("sigmoid"),
        sim.platform.lut_format(),
        sim.observed_range(sig, "in0"),
    )
    from quantlab.simulate.straight_through import through

    codes = torch.round(hin.detach() / s_in).to(torch.int16)
    want = segment_slope(lut, codes) * (float(s_out) / float(s_in))
    value = lut.evaluate(codes).float() * s_out
    y = through(hin, value, want.float())
    y.sum().backward()
    assert_bits_equal(hin.grad, want.float())
    assert_bits_equal(value, seen["out"])  # the run's deployed values are this table's


@pytest.mark.parametrize("func", ["sigmoid", "tanh", "exp"])
@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_segment_slope_integrates_to_the_table(func, dtype):
    """Summed over codes, the slope reproduces the table's rise between any two codes to within
    a few output codes (output rounding, index truncation) plus the slope changes crossed."""
    from quantlab.numerics.lut import J6_FORMAT, build_lut, default_spec
    from quantlab.numerics.lut.slope import segment_slope

    lo, hi = -6.0, 6.0
    amax = max(abs(lo), abs(hi))
    s_in = amax / (dtype.qmax + 0.5)
    out_amax = {"sigmoid": 1.0, "tanh": 1.0, "exp": math.exp(6)}[func]
    s_out = out_amax / (DType.INT16.qmax + 0.5)
    lut = build_lut(func, dtype, s_in, DType.INT16, s_out, default_spec(func), J6_FORMAT, (lo, hi))
    first, last = max(round(lo / s_in), dtype.qmin), min(round(hi / s_in), dtype.qmax)
    c = torch.arange(first, last + 1, dtype=torch.int64)
    y = lut.evaluate(c.to(dtype.torch_dtype)).double()
    slope = segment_slope(lut, c)
    assert slope.dtype == torch.float64 and bool(torch.isfinite(slope).all())
    rise = torch.cumsum(slope[:-1], 0)  # sum of slopes from the first code to each next one
    step = (y[1:] - y[0]) - rise
    jump = slope.diff().abs().cumsum(0).clamp_min(0)  # slope changes crossed so far
    assert bool((step.abs() <= 4 + jump).all()), float((step.abs() - jump).max())


def test_learned_scales_get_gradients_and_move_fixed_mode():
    sim, x = _small(FakeOps.QAT)
    before = sim.run(*x, mode=Mode.FIXED)
    scales = sim.learn_scales(*x)
    assert scales and all(s.dim() == 0 for s in scales)
    opt = torch.optim.SGD(sim.trainable_parameters(), lr=1e-3)
    loss = sim.train_step(x, lambda y: y.square().mean(), opt)
    assert math.isfinite(loss)
    assert all(s.grad is not None for s in scales)
    assert not torch.equal(before, sim.run(*x, mode=Mode.FIXED))


def test_learned_scales_are_the_scales_of_later_runs():
    """A learned scale starts at its calibrated value and, once changed, every later run
    (fixed, fake and training) quantizes at it, not at the cached calibrated scale."""
    sim, x = _small(FakeOps.QAT)
    before = {m: sim.run(*x, mode=m) for m in (Mode.FIXED, Mode.FAKE)}
    scales = sim.learn_scales(*x)
    for m, want in before.items():
        assert_bits_equal(sim.run(*x, mode=m), want)
    with torch.no_grad():
        for s in scales:
            s.mul_(2.0)
    for m, old in before.items():
        assert not torch.equal(sim.run(*x, mode=m), old), m
    assert_bits_equal(sim.train_forward(*x).detach(), sim.run(*x, mode=Mode.FAKE))


def test_train_step_lowers_a_distillation_loss():
    sim, x = _small(FakeOps.DEPLOYED)
    with torch.no_grad():
        ref = sim.model(*x) + 0.1
    opt = torch.optim.Adam(sim.model.parameters(), lr=1e-3)
    losses = [sim.train_step(x, lambda y: (y - ref).square().mean(), opt) for _ in range(10)]
    assert losses[-1] < losses[0]


def test_train_forward_refuses_fixed_mode_and_uncalibrated():
    sim, x = _lut_sim()
    with pytest.raises(ValueError, match="FAKE or HYBRID"):
        sim.train_forward(*x, mode=Mode.FIXED)
    with pytest.raises(ValueError, match="calibrate"):
        Simulator(LutNet()).train_forward(*x)
    with pytest.raises(ValueError, match="FakeOps"):
        Simulator(LutNet(), fake_ops="deployed")


class SoftmaxHead(nn.Module):
    """Linear, then softmax; records the gradient that reaches the softmax's input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.seen: list = []

    def forward(self, x):
        h = self.a(x)
        if h.requires_grad:
            self.seen[:] = [h]
            h.register_hook(lambda g: self.seen.append(g))
        return torch.softmax(h, -1)


def test_deployed_softmax_gradient_is_the_float_softmax_gradient():
    """FakeOps.DEPLOYED: the softmax forward is the deployed one, its gradient the float
    softmax's vector-Jacobian product at the same (quantized) input."""
    torch.manual_seed(0)
    m = SoftmaxHead()
    g = torch.Generator().manual_seed(1)
    sim = Simulator(m, "j6m", fake_ops=FakeOps.DEPLOYED)
    sim.calibrate([(torch.randn(16, 6, generator=g) * 2,)], progress=False)
    x = torch.randn(16, 6, generator=g) * 2
    y = sim.train_forward(x)
    c = torch.linspace(-1.0, 1.0, y.numel()).reshape(y.shape)
    (y * c).sum().backward()
    h, grad_h = m.seen[0].detach(), m.seen[1]
    _, vjp = torch.func.vjp(lambda t: torch.softmax(t, -1), h)
    assert_bits_equal(grad_h, vjp(c)[0])
    sim.fake_ops = FakeOps.QAT
    assert not torch.equal(y.detach(), sim.run(x, mode=Mode.FAKE))  # deployed, not QAT's form


def test_categories_cover_lut_and_softmax():
    assert DEPLOYED_CATEGORIES == {OpCategory.LUT, OpCategory.SOFTMAX, OpCategory.LOG_SOFTMAX}
