"""Steady FIXED runs follow prepared GEMM calls (quantlab.simulate.steady, fixed_gemm.GemmRun):
the bits of the full path on random and adversarial inputs on every platform profile, and
every change that can move a bit (qconfig, calibration, weights and biases edited in place or
replaced, platform, input shape, an upstream scale, a module setting, zero points) gives the
bits of a fresh Simulator."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from torch import nn
from torch.nn import functional as F

from quantlab.calibration.kinds import ObserverKind
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import ActivationSymmetry, OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.profiles import platform_config

PLATFORMS = ["j6e", "j6m", "j6h", "j6p", "onnxruntime", "tflite", "litert_xnnpack"]


class GemmNet(nn.Module):
    """Conv -> relu6 (fused), 1x1 conv (bias), depthwise conv, 1x1 conv (no bias) -> clamp
    (fused), residual add, mean, Linear, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 16, 1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.c = nn.Conv2d(16, 8, 1, bias=False)
        self.fc = nn.Linear(8, 12)
        self.head = nn.Linear(12, 4)

    def forward(self, x):
        h = F.relu6(self.a(x))
        y = torch.clamp(self.c(self.dw(self.b(h))), -2.0, 3.0)
        p = (h + y).mean((2, 3))
        return self.head(self.fc(p))


def _setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = GemmNet().eval()
    calib = [(torch.randn(2, 3, 10, 10, generator=g),) for _ in range(2)]
    return m, calib, g


def _sim(m, calib, platform="j6m", **kw) -> Simulator:
    sim = Simulator(m, platform, steady_programs=False, **kw)
    sim.calibrate(calib, progress=False)
    return sim


def _fresh(m, calib, x, platform="j6m", **kw):
    return _sim(m, calib, platform, **kw).run(x, mode=Mode.FIXED)


def _inputs(g, shape=(2, 3, 10, 10)) -> list[torch.Tensor]:
    """Random inputs at several magnitudes, and adversarial ones: zeros, a constant, values far
    beyond the calibrated range (every code saturated), ties at half a step."""
    xs = [torch.randn(shape, generator=g) * s for s in (0.05, 1.0, 4.0)]
    xs.append(torch.zeros(shape))
    xs.append(torch.full(shape, 0.5))
    xs.append(torch.randn(shape, generator=g) * 1e4)
    xs.append(torch.round(torch.randn(shape, generator=g) * 64) / 128)
    return xs


GEMMS = ["b:conv2d#0", "dw:conv2d#0", "c:conv2d#0", "fc:linear#0"]


def test_steady_fixed_runs_follow_prepared_gemms_with_the_same_bits(hit_names):
    m, calib, g = _setup()
    sim = _sim(m, calib)
    x = _inputs(g)[1]
    first = sim.run(x, mode=Mode.FIXED)
    assert hit_names == []
    again = sim.run(x, mode=Mode.FIXED)
    # every GEMM whose input arrived quantized (not the first conv, whose input is quantized
    # there) and whose output is codes (not the classifier's high-precision output), and the
    # other ops with a fixed kernel (the residual add, the mean)
    assert hit_names == GEMMS[:3] + [":add#0", ":mean#0"] + GEMMS[3:]
    assert {n for (n, mode) in sim._prepared if mode is Mode.FIXED} == set(hit_names)
    assert_bits_equal(again, first)
    assert_bits_equal(again, _fresh(m, calib, x))
    assert_bits_equal(sim.trace(x, mode=Mode.FIXED).result, first)  # the full path


@pytest.mark.parametrize("platform", PLATFORMS)
def test_prepared_gemms_give_the_full_paths_bits_on_every_platform(platform, hit_names):
    m, calib, g = _setup(1)
    sim = _sim(m, calib, platform)
    sim.run(calib[0][0], mode=Mode.FIXED)  # prepares
    for x in _inputs(g):
        got = sim.run(x, mode=Mode.FIXED)
        assert_bits_equal(got, sim.trace(x, mode=Mode.FIXED).result)
    # the GEMMs' prepared form ran, except where every GEMM leaves float16 (J6H/J6P's
    # defaults); there the add and the mean, computed in float and cast, follow theirs
    gemms = set(hit_names) & set(GEMMS)
    assert bool(gemms) is (platform not in ("j6h", "j6p"))
    assert {":add#0", ":mean#0"} <= set(hit_names)
    assert_bits_equal(got, _fresh(m, calib, x, platform))


@pytest.mark.parametrize(
    "spec",
    [
        QConfigSpec(by_type={"conv2d": OpQConfig(output_dtype=DType.INT16)}),
        QConfigSpec(by_type={"conv2d": OpQConfig(weight_dtype=DType.INT16)}),
        QConfigSpec(
            global_=OpQConfig(
                activation_symmetry=ActivationSymmetry.ASYMMETRIC, observer=ObserverKind.MINMAX
            )
        ),
    ],
    ids=["int16 activations", "int16 weights", "zero points"],
)
@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_int16_and_zero_point_gemms_are_prepared_with_the_same_bits(spec, platform, hit_names):
    m, calib, g = _setup(2)
    sim = _sim(m, calib, platform, qconfig=spec)
    sim.run(calib[0][0], mode=Mode.FIXED)
    for x in _inputs(g):
        assert_bits_equal(sim.run(x, mode=Mode.FIXED), sim.trace(x, mode=Mode.FIXED).result)
    assert hit_names


def _changed(change, hit_names, fresh: str | None = "j6m", more=(), **fresh_kw):
    """A steady j6m simulator whose GEMMs are prepared, then ``change(sim, model, x)``
    (returning the input to run, or None for x): the next two FIXED runs must give the bits of
    the same simulator's full path (a trace) and, with ``fresh`` (a platform), of a fresh
    simulator on it calibrated on the same batches and ``more`` (``fresh_kw``: its other
    arguments). A change of the weights moves the fresh simulator's calibration: None."""
    m, calib, g = _setup(3)
    sim = _sim(m, calib)
    x = _inputs(g)[1]
    for _ in range(2):
        sim.run(x, mode=Mode.FIXED)
    assert hit_names
    y = change(sim, m, x)
    y = x if y is None else y
    got = sim.run(y, mode=Mode.FIXED)
    want = sim.trace(y, mode=Mode.FIXED).result
    assert_bits_equal(got, want)
    assert_bits_equal(sim.run(y, mode=Mode.FIXED), want)
    if fresh is not None:
        assert_bits_equal(got, _fresh(m, calib + list(more), y, fresh, **fresh_kw))


def test_a_qconfig_change_is_followed(hit_names):
    spec = QConfigSpec(by_type={"conv2d": OpQConfig(output_dtype=DType.INT16)})
    _changed(lambda sim, m, x: sim.set_qconfig(spec), hit_names, qconfig=spec)


def test_recalibration_is_followed(hit_names):
    g = torch.Generator().manual_seed(9)
    more = [(torch.randn(2, 3, 10, 10, generator=g) * 5,)]
    _changed(lambda sim, m, x: sim.calibrate(more, False), hit_names, more=more)


@pytest.mark.parametrize("what", ["weight", "bias", "depthwise weight"])
def test_a_weight_or_bias_edited_in_place_is_followed(what, hit_names):
    def edit(sim, m, x):
        with torch.no_grad():
            if what == "weight":
                m.b.weight.mul_(1.5)
            elif what == "bias":
                m.fc.bias.add_(0.25)
            else:
                m.dw.weight.neg_()

    _changed(edit, hit_names, fresh=None)


@pytest.mark.parametrize("what", ["weight", "bias", "dilation"])
def test_a_replaced_weight_bias_or_setting_is_followed(what, hit_names):
    def replace(sim, m, x):
        if what == "weight":
            m.c.weight = nn.Parameter(m.c.weight.detach() * -0.5)
        elif what == "bias":
            m.b.bias = nn.Parameter(m.b.bias.detach() + 1.0)
        else:  # the same output shape, other taps
            m.dw.dilation, m.dw.padding = (2, 2), (2, 2)

    _changed(replace, hit_names, fresh=None)


def test_another_input_shape_is_followed(hit_names):
    g = torch.Generator().manual_seed(4)
    _changed(lambda sim, m, x: torch.randn(3, 3, 7, 9, generator=g), hit_names)


def test_an_upstream_scale_change_is_followed(hit_names):
    """Only the first conv's output dtype changes: every later GEMM's input arrives at another
    scale object with the same dtype, and their own qconfig is unchanged."""
    spec = QConfigSpec(by_name={"a:conv2d#0": OpQConfig(output_dtype=DType.INT16)})
    _changed(lambda sim, m, x: sim.set_qconfig(spec), hit_names, qconfig=spec)


@pytest.mark.parametrize("entry", ["its input's", "its own output's"])
def test_a_scale_entry_replaced_alone_is_followed(entry, hit_names):
    """Only one scale-cache entry changes (as a scale learned or set by hand would): conv a's
    output scale, at which conv b's input now arrives, or conv b's own output scale. Conv b's
    prepared run was made with the old one and must not be followed."""
    m, calib, g = _setup(7)
    sim = _sim(m, calib)
    x = _inputs(g)[1]
    for _ in range(2):
        sim.run(x, mode=Mode.FIXED)
    before = len(hit_names)
    name = "a:conv2d#0" if entry == "its input's" else "b:conv2d#0"
    rq = sim.qconfig_of(name)
    key = sim.act_scale_key(name, "out", rq.output_dtype, rq)
    old = sim.trace(x, mode=Mode.FIXED)
    sim._scale_cache[key] = sim._scale_cache[key] * 16
    got = sim.run(x, mode=Mode.FIXED)
    assert "b:conv2d#0" not in hit_names[before:]
    new = sim.trace(x, mode=Mode.FIXED)
    assert_bits_equal(got, new.result)
    # the new scale moved conv b's codes and the model's output
    assert not torch.equal(new.outputs["b:conv2d#0"], old.outputs["b:conv2d#0"])
    assert not torch.equal(got, old.result)


def test_a_platform_change_is_followed(hit_names):
    def to_j6e(sim, m, x):
        sim.platform = platform_config("j6e")

    _changed(to_j6e, hit_names, fresh="j6e")


def test_a_fused_clamp_change_is_followed(hit_names):
    """The clamp after conv c is fused into it: its bounds are read from the clamp call of the
    previous run, so a changed bound shows in the second run after the change."""

    class Clamped(GemmNet):
        hi = 3.0

        def forward(self, x):
            h = F.relu6(self.a(x))
            y = torch.clamp(self.c(self.dw(self.b(h))), -2.0, self.hi)
            p = (h + y).mean((2, 3))
            return self.head(self.fc(p))

    m, calib, g = _setup(5)
    w = Clamped().eval()
    w.load_state_dict(m.state_dict())
    sim = _sim(w, calib)
    x = _inputs(g)[2]
    for _ in range(2):
        before = sim.run(x, mode=Mode.FIXED)
    assert "c:conv2d#0" in hit_names
    Clamped.hi = 0.05
    try:
        sim.run(x, mode=Mode.FIXED)  # its conv still clamps at the bound of the run before
        got = sim.run(x, mode=Mode.FIXED)
        want = sim.trace(x, mode=Mode.FIXED).result  # the full path (a fresh simulator would
        # calibrate conv c's output after the new clamp)
    finally:
        Clamped.hi = 3.0
    assert_bits_equal(got, want)
    assert not torch.equal(got, before)


def test_fixed_and_fake_prepared_calls_are_kept_apart(hit_names):
    m, calib, g = _setup(6)
    sim = _sim(m, calib)
    x = _inputs(g)[1]
    fixed, fake = _fresh(m, calib, x), _sim(m, calib).run(x, mode=Mode.FAKE)
    for _ in range(3):  # alternating modes: each follows its own prepared calls
        assert_bits_equal(sim.run(x, mode=Mode.FIXED), fixed)
        assert_bits_equal(sim.run(x, mode=Mode.FAKE), fake)
    assert {mode for (_, mode) in sim._prepared} == {Mode.FAKE, Mode.FIXED}
    assert hit_names.count("b:conv2d#0") == 4  # twice per mode after its first run


class LayoutNet(nn.Module):
    """Attention-shaped layout ops between quantized ops: view, transpose, contiguous,
    permute, reshape, flatten and unsqueeze around two Linears and a matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16)
        self.o = nn.Linear(16, 8)

    def forward(self, x):  # x: (B, T, 16)
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 4).transpose(1, 2)
        k = self.k(x).view(b, t, 4, 4).permute(0, 2, 3, 1)
        ctx = (q @ k).softmax(-1) @ q  # (B, 4, T, 4)
        h = ctx.transpose(1, 2).contiguous().reshape(b, t, 16)
        return self.o(h.flatten(0, 1).unsqueeze(0))  # the last Linear's output stays float


_LAYOUT_OPS = {"view", "transpose", "permute", "contiguous", "reshape", "flatten", "unsqueeze"}


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("asymmetric", [False, True], ids=["symmetric", "zero points"])
def test_layout_ops_follow_prepared_calls_and_move_their_codes(
    platform, asymmetric, hit_names, monkeypatch
):
    """In a steady FIXED run every layout op follows its prepared call: the function on the
    values and the same function on the codes (as the full path moves them), so its output
    carries codes; the bits of the full path and of a fresh Simulator on random and
    adversarial inputs, in captured runs and in a program."""
    from quantlab.simulate import steady

    g = torch.Generator().manual_seed(4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        m = LayoutNet().eval()
    calib = [(torch.randn(2, 6, 16, generator=g),) for _ in range(2)]
    spec = None
    if asymmetric:
        sym = OpQConfig(
            activation_symmetry=ActivationSymmetry.ASYMMETRIC, observer=ObserverKind.MINMAX
        )
        spec = QConfigSpec(global_=sym)
    kw = {} if spec is None else {"qconfig": spec}
    sim = _sim(m, calib, platform, **kw)
    coded = {}
    real = steady.compute

    def compute(prep, name, *a):
        out, info = real(prep, name, *a)
        if prep.layout:
            coded[name] = info.codes is not None and info.codes.shape == out.shape
        return out, info

    monkeypatch.setattr(steady, "compute", compute)
    sim.run(calib[0][0], mode=Mode.FIXED)  # prepares
    for x in _inputs(g, (2, 6, 16)):
        hit_names.clear()
        got = sim.run(x, mode=Mode.FIXED)
        assert_bits_equal(got, sim.trace(x, mode=Mode.FIXED).result)
        assert_bits_equal(got, _fresh(m, calib, x, platform, **kw))
        layout = {n for n in hit_names if n.split(":")[1].split("#")[0] in _LAYOUT_OPS}
        assert {n.split(":")[1].split("#")[0] for n in layout} == _LAYOUT_OPS, hit_names
        assert coded and all(coded.values()), coded
    program = Simulator(m, platform, **kw)
    program.calibrate(calib, progress=False)
    x = _inputs(g, (2, 6, 16))[1]
    prog = program.program(x, mode=Mode.FIXED)
    assert prog.counts["prepared"] >= len(layout)
    for x in _inputs(g, (2, 6, 16)):
        assert_bits_equal(prog(x), sim.run(x, mode=Mode.FIXED))
    assert prog.fallbacks == 0


class CrossNet(nn.Module):
    """Cross attention: x (B, T, 8) attends over y (B, S, 8); both matmuls take two
    activations, and the first one's second operand changes shape with S alone."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Linear(8, 8)
        self.r = nn.Linear(8, 8)
        self.o = nn.Linear(8, 4)

    def forward(self, x, y):
        a, b = self.p(x), self.r(y)
        s = a @ b.transpose(1, 2)  # (B, T, S)
        return self.o(s.softmax(-1) @ b)


_MATMULS = ["matmul#0", "matmul#1"]
SPECS = pytest.mark.parametrize(  # int8, int16 activations, zero points
    "spec",
    [
        None,
        QConfigSpec(global_=OpQConfig(output_dtype=DType.INT16)),
        QConfigSpec(
            global_=OpQConfig(
                activation_symmetry=ActivationSymmetry.ASYMMETRIC, observer=ObserverKind.MINMAX
            )
        ),
    ],
    ids=["int8", "int16 activations", "zero points"],
)


def _cross(platform, spec=None):
    g = torch.Generator().manual_seed(6)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(6)
        m = CrossNet().eval()
    calib = [(torch.randn(2, 5, 8, generator=g), torch.randn(2, 7, 8, generator=g)) for _ in "ab"]
    kw = {} if spec is None else {"qconfig": spec}
    return m, calib, g, kw


@pytest.mark.parametrize("net", ["cross", "dropout"])
@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@SPECS
def test_matmuls_of_two_activations_follow_prepared_runs(platform, spec, net, hit_names):
    """A matmul of two activations follows its prepared GemmRun in a steady FIXED run: the bits
    of the full path and of a fresh Simulator on random and adversarial inputs, in captured runs
    and in a program. With ``DropNet`` the second matmul's first operand comes through an eval
    dropout as a float tensor on the matmul's input grid: its run takes the grid's codes, and
    the program dispatches only the dropout more than CrossNet's."""
    m, calib, g, kw = (_cross if net == "cross" else _drop_net)(platform, spec)
    sim = _sim(m, calib, platform, **kw)
    sim.run(*calib[0], mode=Mode.FIXED)  # prepares
    xs, ys = _inputs(g, (2, 5, 8)), _inputs(g, (2, 7, 8))
    # onnxruntime has no int16 QLinearMatMul: those matmuls run in float (fixed_gemm_float),
    # with no integer run to prepare
    int16 = spec is not None and spec.global_.output_dtype is DType.INT16
    integer = not (platform == "onnxruntime" and int16)
    for x, y in zip(xs, ys[::-1]):
        hit_names.clear()
        got = sim.run(x, y, mode=Mode.FIXED)
        assert_bits_equal(got, sim.trace(x, y, mode=Mode.FIXED).result)
        assert_bits_equal(got, _fresh_two(m, calib, x, y, platform, **kw))
        hit = {n.split(":")[1] for n in hit_names}
        assert hit >= set(_MATMULS) if integer else not hit & set(_MATMULS), hit_names
    program = Simulator(m, platform, **kw)
    program.calibrate(calib, progress=False)
    prog = program.program(xs[1], ys[1], mode=Mode.FIXED)
    if net == "dropout":  # the eval dropout, a float op quantlab does not model, is kept
        cross = _sim(_cross(platform, spec)[0], calib, platform, **kw)
        counts = cross.program(xs[1], ys[1], mode=Mode.FIXED).counts
        assert prog.counts == {**counts, "kept": 1}
    for x, y in zip(xs, ys):
        assert_bits_equal(prog(x, y), sim.run(x, y, mode=Mode.FIXED))
    assert prog.fallbacks == 0


def _fresh_two(m, calib, x, y, platform, **kw):
    return _sim(m, calib, platform, **kw).run(x, y, mode=Mode.FIXED)


def test_a_second_operand_of_another_shape_or_scale_is_followed(hit_names):
    """The prepared run of ``a @ b.T`` was planned for b's shape and scale object: b of another
    length (x unchanged), then b's producer's output scale replaced alone, each send the call
    through the full path, with its bits."""
    m, calib, g, kw = _cross("j6m")
    sim = _sim(m, calib)
    x, y = _inputs(g, (2, 5, 8))[1], _inputs(g, (2, 7, 8))[1]
    for _ in range(2):
        sim.run(x, y, mode=Mode.FIXED)
    assert "matmul#0" in {n.split(":")[1] for n in hit_names}
    longer = torch.randn(2, 9, 8, generator=g)
    hit_names.clear()
    got = sim.run(x, longer, mode=Mode.FIXED)
    assert "matmul#0" not in {n.split(":")[1] for n in hit_names}  # b's shape: not as planned
    assert_bits_equal(got, sim.trace(x, longer, mode=Mode.FIXED).result)
    assert_bits_equal(got, _fresh_two(m, calib, x, longer, "j6m"))
    for _ in range(2):
        sim.run(x, y, mode=Mode.FIXED)
    name = "r:linear#0"  # b's producer: only its output scale changes
    rq = sim.qconfig_of(name)
    key = sim.act_scale_key(name, "out", rq.output_dtype, rq)
    _scaled_entry_takes_the_full_path(sim, (x, y), key, 16, "matmul#0", hit_names)


def _scaled_entry_takes_the_full_path(sim, inputs, key, factor, op, hit_names) -> None:
    """Multiply the scale-cache entry ``key`` by ``factor``: the next FIXED run of ``inputs``
    does not follow ``op``'s prepared call, gives the full path's (a trace's) bits, and they
    differ from the bits before the change."""
    old = sim.trace(*inputs, mode=Mode.FIXED)
    sim._scale_cache[key] = sim._scale_cache[key] * factor
    hit_names.clear()
    got = sim.run(*inputs, mode=Mode.FIXED)
    assert op not in {n.split(":")[1] for n in hit_names}
    assert_bits_equal(got, sim.trace(*inputs, mode=Mode.FIXED).result)
    assert not torch.equal(got, old.result)


class DropNet(CrossNet):
    """CrossNet with an eval-mode dropout between the softmax and the second matmul (as in
    attention): that matmul's first operand comes as a float tensor on its input's grid."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x, y):
        a, b = self.p(x), self.r(y)
        s = a @ b.transpose(1, 2)
        return self.o(self.drop(s.softmax(-1)) @ b)


def _drop_net(platform, spec=None):
    m, calib, g, kw = _cross(platform, spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(6)
        m = DropNet().eval()
    return m, calib, g, kw


def test_a_changed_input_point_scale_sends_the_on_grid_matmul_through_the_full_path(hit_names):
    """The on-grid matmul's prepared run rests on its input point's scale entry: replacing
    that entry alone (its input is no longer on the point's grid) sends the call through the
    full path, which quantizes the input there, with its bits."""
    m, calib, g, kw = _drop_net("j6m")
    sim = _sim(m, calib)
    x, y = _inputs(g, (2, 5, 8))[1], _inputs(g, (2, 7, 8))[1]
    for _ in range(2):
        sim.run(x, y, mode=Mode.FIXED)
    assert "matmul#1" in {n.split(":")[1] for n in hit_names}
    name = ":matmul#1"
    rq = sim.qconfig_of(name)
    key = sim.act_scale_key(name, "in0", DType.INT8, rq)
    # the input quantized at the coarser scale
    _scaled_entry_takes_the_full_path(sim, (x, y), key, 4, "matmul#1", hit_names)
