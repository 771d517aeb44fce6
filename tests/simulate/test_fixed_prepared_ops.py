"""Steady FIXED runs follow prepared calls for the ops with a fixed kernel other than GEMMs and
layout ops (steady_prepare.prepare_fixed_op): adds, multiplies (of two tensors and by a
constant), subtractions, LUT activations, softmax, LayerNorm and reductions give the bits of
the full path and of a fresh Simulator on random and adversarial inputs, symmetric and with
zero points, in captured runs and in a program (a concatenation, whose inputs come as one list
argument, keeps the full path); a changed constant, an input arriving at another dtype and a
kernel that declines a later call each give the full path's bits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from bits import assert_bits_equal
from torch import nn
from torch.nn import functional as F

from quantlab.calibration.kinds import ObserverKind
from quantlab.numerics.dtypes import DType
from quantlab.platforms import PlatformConfig, TensorDivRule, load_platform
from quantlab.qconfig import ActivationSymmetry, OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator, fixed_ops


class OpsNet(nn.Module):
    """Two Linears feeding one op of each kind the prepared form covers."""

    scale = 0.75

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.o = nn.Linear(32, 4)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        h = a + b
        h = h * b
        h = h - a
        h = h * self.scale
        h = F.gelu(h)
        h = self.norm(h)
        p = torch.softmax(h, -1)
        c = torch.cat([p, a], -1)
        return self.o(c) + c.sum(-1, keepdim=True)


KINDS = {"add", "mul", "sub", "gelu", "layer_norm", "softmax", "sum"}


def _model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        return OpsNet().eval()


def _sim(m, calib, platform="j6m", **kw) -> Simulator:
    sim = Simulator(m, platform, steady_programs=False, **kw)
    sim.calibrate(calib, progress=False)
    return sim


def _inputs(g, shape=(2, 6, 16)) -> list[torch.Tensor]:
    """Random inputs at several magnitudes and adversarial ones: zeros, a constant, values far
    beyond the calibrated range, ties at half a step."""
    xs = [torch.randn(shape, generator=g) * s for s in (0.05, 1.0, 4.0)]
    xs += [torch.zeros(shape), torch.full(shape, 0.5), torch.randn(shape, generator=g) * 1e4]
    xs.append(torch.round(torch.randn(shape, generator=g) * 64) / 128)
    return xs


def _preparing_run(sim, inputs: tuple, monkeypatch) -> set:
    """One FIXED run of ``sim`` on ``inputs`` (it prepares the calls); the op types whose
    fixed kernel computed them in it (the others ran in float)."""
    kernel_ran = set()
    real = fixed_ops.run_fixed

    def recorded(sim_, call, *a, **k):
        res = real(sim_, call, *a, **k)
        if res is not None:
            kernel_ran.add(call.op_type)
        return res

    with monkeypatch.context() as m:
        m.setattr(fixed_ops, "run_fixed", recorded)
        sim.run(*inputs, mode=Mode.FIXED)
    return kernel_ran


def _kinds(names) -> set:
    return {n.split(":")[1].split("#")[0] for n in names}


ZERO_POINTS = QConfigSpec(
    global_=OpQConfig(
        activation_symmetry=ActivationSymmetry.ASYMMETRIC, observer=ObserverKind.MINMAX
    )
)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("spec", [None, ZERO_POINTS], ids=["symmetric", "zero points"])
def test_fixed_ops_follow_prepared_calls_with_the_same_bits(platform, spec, hit_names, monkeypatch):
    g = torch.Generator().manual_seed(12)
    m = _model()
    calib = [(torch.randn(2, 6, 16, generator=g),) for _ in range(2)]
    kw = {} if spec is None else {"qconfig": spec}
    sim = _sim(m, calib, platform, **kw)
    kernel_ran = _preparing_run(sim, calib[0], monkeypatch)
    # (a profile may compute some in float: onnxruntime's normalisations, for one)
    assert kernel_ran >= KINDS - {"layer_norm"}, kernel_ran
    fresh = _sim(m, calib, platform, **kw)
    for x in _inputs(g):
        hit_names.clear()
        got = sim.run(x, mode=Mode.FIXED)
        assert_bits_equal(got, sim.trace(x, mode=Mode.FIXED).result)
        assert_bits_equal(got, fresh.trace(x, mode=Mode.FIXED).result)
        assert _kinds(hit_names) >= kernel_ran & KINDS, hit_names
    program = Simulator(m, platform, **kw)
    program.calibrate(calib, progress=False)
    prog = program.program(_inputs(g)[1], mode=Mode.FIXED)
    # the first Linears (their input is quantized there) and the concatenation (a LayerNorm
    # a profile computes in float follows its prepared call too)
    assert prog.counts["dispatched"] == 3
    for x in _inputs(g):
        assert_bits_equal(prog(x), sim.run(x, mode=Mode.FIXED))
    assert prog.fallbacks == 0


def test_a_changed_constant_or_input_dtype_is_followed(hit_names):
    """A multiply's constant operand is read from each call (the prepared call follows, with
    the bits of the new constant), and so is an input of another shape; an input that arrives
    at another dtype (its producer raised to int16) sends the call through the full path."""
    g = torch.Generator().manual_seed(13)
    m = _model()
    calib = [(torch.randn(2, 6, 16, generator=g),) for _ in range(2)]
    sim = _sim(m, calib)
    x = _inputs(g)[1]
    for _ in range(2):
        before = sim.run(x, mode=Mode.FIXED)
    assert "mul#1" in {n.split(":")[1] for n in hit_names}
    OpsNet.scale = -1.5
    try:
        hit_names.clear()
        got = sim.run(x, mode=Mode.FIXED)
        assert "mul#1" in {n.split(":")[1] for n in hit_names}
        assert_bits_equal(got, sim.trace(x, mode=Mode.FIXED).result)
        assert not torch.equal(got, before)
    finally:
        OpsNet.scale = 0.75
    longer = torch.randn(3, 9, 16, generator=g)  # another shape: each kernel sees its own
    for _ in range(2):
        hit_names.clear()
        got = sim.run(longer, mode=Mode.FIXED)
        assert {"add", "mul", "softmax", "layer_norm"} <= _kinds(hit_names)
        assert_bits_equal(got, sim.trace(longer, mode=Mode.FIXED).result)
        assert_bits_equal(got, _sim(m, calib).run(longer, mode=Mode.FIXED))
    spec = QConfigSpec(by_name={"b:linear#0": OpQConfig(output_dtype=DType.INT16)})
    sim.set_qconfig(spec)
    for i in range(2):
        hit_names.clear()
        got = sim.run(x, mode=Mode.FIXED)
        # b now arrives as int16: the full path, which prepares the add anew for the next run
        assert ("add#0" in {n.split(":")[1] for n in hit_names}) is (i == 1)
        assert_bits_equal(got, sim.trace(x, mode=Mode.FIXED).result)
        assert_bits_equal(got, _sim(m, calib, qconfig=spec).run(x, mode=Mode.FIXED))


class NormNet(nn.Module):
    """A Linear and a LayerNorm whose output is the model's."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.lin(x))


def test_a_kernel_that_declines_a_later_call_gives_the_float_fallback(hit_names, monkeypatch):
    """Where the fixed kernel declines a call after the op was prepared, the prepared call
    computes what the full path computes then: the float function and its output's
    quantization."""
    g = torch.Generator().manual_seed(14)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(14)
        m = NormNet().eval()
    calib = [(torch.randn(2, 6, 16, generator=g),) for _ in range(2)]
    sim = _sim(m, calib)
    x = _inputs(g)[1]
    for _ in range(2):
        kernel = sim.run(x, mode=Mode.FIXED)
    real = fixed_ops.run_fixed

    def declines_norm(sim_, call, *a, **k):
        return None if call.op_type == "layer_norm" else real(sim_, call, *a, **k)

    monkeypatch.setattr(fixed_ops, "run_fixed", declines_norm)
    hit_names.clear()
    got = sim.run(x, mode=Mode.FIXED)
    assert "layer_norm" in _kinds(hit_names)
    assert_bits_equal(got, sim.trace(x, mode=Mode.FIXED).result)  # the full path, declining
    assert not torch.equal(got, kernel)  # the float LayerNorm's codes are not the kernel's


class MaskNet(nn.Module):
    """Ops whose input ``k`` comes as a float tensor with no quantization (a mask passed in as
    floats), quantized at each op's input point: a subtraction from a constant, a product with
    a Linear's output, a sum."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, k):
        h = self.lin(x) + (1.0 - k) * -4.0
        return (h * k).sum(1) * k.sum(1)


def _masks(g, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x, k) pairs: random inputs with 0/1 masks, an all-ones and an all-zeros mask, and a
    mask of fractions (not on any grid)."""
    out = []
    for i, x in enumerate(_inputs(g, (2, 6, 16))[:n]):
        k = (torch.rand(2, 6, 1, generator=g) > 0.3).float().expand(2, 6, 16).contiguous()
        out.append((x, [k, torch.ones_like(k), torch.zeros_like(k), k * 0.37][i % 4]))
    return out


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("spec", [None, ZERO_POINTS], ids=["symmetric", "zero points"])
def test_inputs_quantized_at_the_ops_point_follow_prepared_calls(platform, spec, hit_names):
    """A fixed op whose float input is quantized at its own input point follows its prepared
    call, which quantizes that input as the full path does (``quantize_act``): the bits of the
    captured run and of a fresh Simulator, in captured runs and in a program that dispatches
    only the first Linear; after recalibration (new input scales) the calls follow with the
    new scales' bits."""
    g = torch.Generator().manual_seed(15)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(15)
        m = MaskNet().eval()
    calib = [pair for pair in _masks(g, 2)]
    kw = {} if spec is None else {"qconfig": spec}
    sim = _sim(m, calib, platform, **kw)
    sim.run(*calib[0], mode=Mode.FIXED)  # prepares
    fresh = _sim(m, calib, platform, **kw)
    for x, k in _masks(g, 7):
        hit_names.clear()
        got = sim.run(x, k, mode=Mode.FIXED)
        assert {"sub", "mul", "sum"} <= _kinds(hit_names), hit_names
        assert_bits_equal(got, sim.trace(x, k, mode=Mode.FIXED).result)
        assert_bits_equal(got, fresh.run(x, k, mode=Mode.FIXED))
    program = Simulator(m, platform, **kw)
    program.calibrate(calib, progress=False)
    prog = program.program(*calib[1], mode=Mode.FIXED)
    assert prog.counts["dispatched"] == 1  # the Linear: a GEMM quantizes its input there
    for x, k in _masks(g, 7):
        assert_bits_equal(prog(x, k), sim.run(x, k, mode=Mode.FIXED))
        assert prog.last_prepared == prog.counts["prepared"]
    wider = [(x * 3, k * 2) for x, k in calib]  # new input scales for every point
    for s in (sim, fresh):
        s.calibrate(wider, progress=False)
    for x, k in _masks(g, 4):
        for _ in range(2):
            hit_names.clear()
            got = sim.run(x, k, mode=Mode.FIXED)
        assert {"sub", "mul", "sum"} <= _kinds(hit_names), hit_names
        assert_bits_equal(got, fresh.run(x, k, mode=Mode.FIXED))
    assert prog.fallbacks == 0


class DivNet(nn.Module):
    """A division of two activations: where the platform divides in float
    (``TensorDivRule.FLOAT``) it has no fixed kernel, computed in float and its output
    quantized; on J6 (RECIPROCAL_TABLE) its fixed kernel multiplies by a reciprocal table."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        return self.a(x) / (self.b(x).abs() + 0.5)


def _divides_in_float(name: str) -> PlatformConfig:
    return dataclasses.replace(load_platform(name), tensor_div_rule=TensorDivRule.FLOAT)


@pytest.mark.parametrize(
    ("platform", "kernel"),
    [
        (_divides_in_float("j6m"), False),
        ("j6h", False),  # float16 outputs
        ("onnxruntime", False),
        ("j6m", True),
    ],
    ids=["j6m-float", "j6h", "onnxruntime", "j6m-reciprocal"],
)
def test_a_division_follows_its_prepared_call(platform, kernel, hit_names, monkeypatch):
    """An op without a fixed kernel (the full path computes it in float and quantizes its
    output) follows a prepared call that does the same, and so does the reciprocal-table
    division, a kernel with a calibrated scale of its own: the bits of the captured run's full
    path and of a fresh Simulator, and a program computes it by that prepared call."""
    g = torch.Generator().manual_seed(16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(16)
        m = DivNet().eval()
    calib = [(torch.randn(2, 6, 16, generator=g),) for _ in range(2)]
    sim = _sim(m, calib, platform)
    assert ("div" in _preparing_run(sim, calib[0], monkeypatch)) is kernel
    fresh = _sim(m, calib, platform)
    for x in _inputs(g):
        hit_names.clear()
        got = sim.run(x, mode=Mode.FIXED)
        assert "div" in _kinds(hit_names), hit_names
        assert_bits_equal(got, sim.trace(x, mode=Mode.FIXED).result)
        assert_bits_equal(got, fresh.run(x, mode=Mode.FIXED))
    program = Simulator(m, platform)
    program.calibrate(calib, progress=False)
    prog = program.program(_inputs(g)[1], mode=Mode.FIXED)
    steps = {s.name: s for s in prog._steps}
    assert ":div#0" in steps
    for x in _inputs(g):
        assert_bits_equal(prog(x), sim.run(x, mode=Mode.FIXED))
        assert steps[":div#0"].prep is not None and prog.last_prepared == prog.counts["prepared"]
    assert prog.fallbacks == 0
