"""Steady FAKE runs follow prepared calls (quantlab.simulate.steady): every change that can
move a bit (qconfig, per-op modes, calibration, weights and biases edited in place or
replaced, mode, platform, FAKE-op choice) gives the bits of a fresh Simulator."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from bits import assert_bits_equal
from torch import nn
from torch.nn import functional as F

from quantlab.numerics.dtypes import DType
from quantlab.qconfig import EmbeddingIndex, OpQConfig, QConfigSpec
from quantlab.simulate import FakeOps, Mode, OpMode, Simulator, steady
from quantlab.simulate.profiles import platform_config


class ToyNet(nn.Module):
    """Conv(+bias) -> relu6 (fused), conv, residual add, conv (no bias), sigmoid, cat, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 1)
        self.c = nn.Conv2d(8, 8, 1, bias=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = F.relu6(self.a(x))
        h = self.c(h + self.b(h))
        p = h.mean((2, 3))
        return self.head(torch.cat([p, torch.sigmoid(p)], dim=1))


def _setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = ToyNet().eval()
    calib = [(torch.randn(2, 3, 6, 6, generator=g),) for _ in range(2)]
    more = [(torch.randn(2, 3, 6, 6, generator=g) * 3,)]
    return m, calib, more, torch.randn(2, 3, 6, 6, generator=g)


def _fresh(m, calib, x, mode=Mode.FAKE, platform="j6m", **kw):
    sim = Simulator(m, platform, **kw)
    sim.calibrate(calib, progress=False)
    return sim.run(x, mode=mode)


def _steady(m, calib, x, platform="j6m"):
    """A calibrated Simulator after two FAKE runs (its calls prepared)."""
    sim = Simulator(m, platform)
    sim.calibrate(calib, progress=False)
    for _ in range(2):
        sim.run(x, mode=Mode.FAKE)
    return sim


@pytest.fixture
def hits(monkeypatch):
    """How many calls followed their prepared form (a list of one count)."""
    n = [0]
    real = steady.prepared_value

    def counted(*a):
        got = real(*a)
        n[0] += got is not None
        return got

    monkeypatch.setattr(steady, "prepared_value", counted)
    return n


def test_steady_runs_follow_prepared_calls_with_the_same_bits(hits):
    m, calib, _, x = _setup()
    sim = Simulator(m, "j6m")
    sim.calibrate(calib, progress=False)
    first = sim.run(x, mode=Mode.FAKE)
    assert hits[0] == 0
    again = sim.run(x, mode=Mode.FAKE)
    assert hits[0] >= 4  # convs b and c, the add, the cat at least
    assert_bits_equal(again, first)
    assert_bits_equal(again, _fresh(m, calib, x))
    # the op table of a prepared run equals the full path's
    table = sim.ops
    fresh = Simulator(m, "j6m")
    fresh.calibrate(calib, progress=False)
    fresh.run(x, mode=Mode.FAKE)
    assert table.drop(columns=["input_shapes"]).equals(fresh.ops.drop(columns=["input_shapes"]))
    assert list(table["input_shapes"]) == list(fresh.ops["input_shapes"])


def test_a_trace_or_per_op_mode_run_takes_the_full_path_with_the_same_bits(hits):
    m, calib, _, x = _setup()
    sim = Simulator(m, "j6m")
    sim.calibrate(calib, progress=False)
    y = sim.run(x, mode=Mode.FAKE)
    sim.run(x, mode=Mode.FAKE)
    n = hits[0]
    assert_bits_equal(sim.trace(x, mode=Mode.FAKE).result, y)
    name = "b:conv2d#0"
    over = sim.run(x, mode=Mode.FAKE, op_modes={name: OpMode(Mode.FLOAT)})
    assert hits[0] == n  # nothing prepared was used
    ref = Simulator(m, "j6m")
    ref.calibrate(calib, progress=False)
    assert_bits_equal(over, ref.run(x, mode=Mode.FAKE, op_modes={name: OpMode(Mode.FLOAT)}))
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), y)


def test_qconfig_calibration_and_mode_changes_give_fresh_bits():
    m, calib, more, x = _setup()
    sim = _steady(m, calib, x)
    spec = QConfigSpec(by_type={"conv2d": OpQConfig(output_dtype=DType.INT16)})
    sim.set_qconfig(spec)
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), _fresh(m, calib, x, qconfig=spec))
    sim.set_qconfig(QConfigSpec())
    sim.run(x, mode=Mode.FAKE)
    sim.calibrate(more, progress=False)  # statistics grow: new scales
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), _fresh(m, calib + more, x))
    fixed = sim.run(x, mode=Mode.FIXED)
    assert_bits_equal(fixed, _fresh(m, calib + more, x, mode=Mode.FIXED))
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), _fresh(m, calib + more, x))
    hybrid = sim.run(x, mode=Mode.HYBRID)
    assert_bits_equal(hybrid, _fresh(m, calib + more, x, mode=Mode.HYBRID))
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), _fresh(m, calib + more, x))
    other = Simulator(m, "j6m")
    other.calibrate(more, progress=False)
    sim.share_calibration(other)
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), _fresh(m, more, x))


@pytest.mark.parametrize("bias_float", [True, False])
def test_weight_and_bias_edits_give_fresh_bits(bias_float):
    """Against a fresh Simulator with the same calibration (the edits would move new
    calibration statistics); FAKE adds the bias itself or the value of its int32 codes."""
    m, calib, _, x = _setup()
    platform = dataclasses.replace(platform_config("j6m"), bias_float=bias_float)
    sim = _steady(m, calib, x, platform)

    def fresh():
        other = Simulator(m, platform)
        other.share_calibration(sim)
        return other.run(x, mode=Mode.FAKE)

    for edit in (m.a.weight, m.b.weight, m.c.weight, m.head.weight, m.b.bias, m.head.bias):
        with torch.no_grad():
            edit.mul_(-1.5)  # in place: a new _version
        assert_bits_equal(sim.run(x, mode=Mode.FAKE), fresh())
    m.b.weight = nn.Parameter(m.b.weight.detach() * -1.0)  # replaced
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), fresh())
    m.head.bias = nn.Parameter(m.head.bias.detach() + 1.0)
    y = sim.run(x, mode=Mode.FAKE)
    assert_bits_equal(y, fresh())
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), y)


def test_fake_ops_and_platform_changes_give_fresh_bits():
    m, calib, _, x = _setup()
    sim = _steady(m, calib, x)
    sim.fake_ops = FakeOps.DEPLOYED
    want = _fresh(m, calib, x, fake_ops=FakeOps.DEPLOYED)
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), want)
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), want)
    sim.fake_ops = FakeOps.QAT
    plain = _fresh(m, calib, x)
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), plain)
    j6e = Simulator(m, "j6e")
    sim.platform = j6e.platform
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), _fresh(m, calib, x, platform="j6e"))


class WeightForms(nn.Module):
    """The same op name with another argument layout in another run: ``F.linear`` with its
    weight a Parameter (a per-channel weight) or a tensor made with the input (a second
    activation; a copy of the parameter alone would be a constant of the model, a weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.as_parameter = True
        g = torch.Generator().manual_seed(2)
        self.w = nn.Parameter(torch.randn(4, 4, generator=g) * torch.tensor([1.0, 0.1, 3.0, 0.01]))

    def forward(self, x):
        return F.linear(x, self.w if self.as_parameter else self.w.detach() + x.new_zeros(()))


_INT16_OUT = QConfigSpec(by_type={"linear": OpQConfig(output_dtype=DType.INT16)})


def _calibrated_both_ways(m, calib):
    sim = Simulator(m, "j6m", _INT16_OUT)
    for form in (True, False):
        m.as_parameter = form
        sim.calibrate(calib, progress=False)
    m.as_parameter = True
    return sim


def test_an_argument_layout_change_is_planned_anew():
    g = torch.Generator().manual_seed(1)
    m = WeightForms().eval()
    calib = [(torch.randn(3, 4, generator=g),)]
    x = torch.randn(3, 4, generator=g)
    sim = _calibrated_both_ways(m, calib)
    as_weight = sim.run(x, mode=Mode.FAKE)
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), as_weight)
    m.as_parameter = False
    y = sim.run(x, mode=Mode.FAKE)
    ref = Simulator(m, "j6m", _INT16_OUT)  # it never ran the other layout
    ref.share_calibration(sim)
    assert_bits_equal(y, ref.run(x, mode=Mode.FAKE))
    assert not torch.equal(y, as_weight)  # the two layouts do quantize differently
    m.as_parameter = True
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), as_weight)


def test_a_module_added_after_the_simulator_runs_in_eval_mode_and_keeps_its_flag():
    m, calib, _, x = _setup()
    sim = Simulator(m, "j6m")
    sim.calibrate(calib, progress=False)
    sim.run(x, mode=Mode.FAKE)
    m.head = nn.Sequential(nn.Dropout(0.9), m.head)  # training by default
    assert m.head[0].training
    a = sim.run(x, mode=Mode.FAKE)
    b = sim.run(x, mode=Mode.FAKE)
    assert_bits_equal(a, b)  # no dropout: eval mode
    assert m.head[0].training and m.head.training
    assert not m.a.training


def test_a_batch_norm_tensor_replaced_between_runs_is_folded_in_the_next_run():
    """The fused BatchNorm's tensors are read when its Conv runs (before the batch_norm call of
    the same run is seen): a buffer the module was given since the last run counts at once."""
    from pinned_fake_mode import small_net

    m, calib, x = small_net()
    sim = Simulator(m, "j6m")
    sim.calibrate(calib, progress=False)
    before = sim.run(*x, mode=Mode.FAKE)
    m.bn.running_var = m.bn.running_var * 4
    m.bn.weight = nn.Parameter(m.bn.weight.detach() * 0.5)
    first = sim.run(*x, mode=Mode.FAKE)
    assert not torch.equal(first, before)
    assert_bits_equal(first, sim.run(*x, mode=Mode.FAKE))
    assert_bits_equal(sim.run(*x, mode=Mode.FIXED), sim.run(*x, mode=Mode.FIXED))


def test_a_fixed_run_between_fake_runs_leaves_the_prepared_calls_standing(hits):
    """Routes are kept per mode: a FIXED run does not replace what FAKE calls were prepared
    from, so the next FAKE run follows them at once, with the same bits."""
    m, calib, _, x = _setup()
    sim = _steady(m, calib, x)
    n0 = hits[0]
    want = sim.run(x, mode=Mode.FAKE)
    per_run = hits[0] - n0
    assert per_run >= 4
    fixed = sim.run(x, mode=Mode.FIXED)
    n1 = hits[0]
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), want)
    assert hits[0] - n1 == per_run
    assert_bits_equal(sim.run(x, mode=Mode.FIXED), fixed)
    assert_bits_equal(fixed, _fresh(m, calib, x, mode=Mode.FIXED))


def test_a_linear_after_layer_norm_or_embedding_follows_its_prepared_call(hit_names):
    """The LayerNorm and embedding composites hand on their cached output scale itself, so the
    biased Linear after them finds the scale its bias was made with and follows its prepared
    call, with the bits of the full path."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.norm = nn.LayerNorm(16)
            self.a = nn.Linear(16, 16)
            self.b = nn.Linear(16, 16)

        def forward(self, ids):
            e = self.emb(ids)
            return self.b(self.norm(e + self.a(e))) + e  # b does not feed the output itself

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = Net().eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randint(0, 50, (2, 7), generator=g),) for _ in range(2)]
    x = torch.randint(0, 50, (2, 7), generator=g)
    sim = Simulator(m, "j6m")
    sim.calibrate(calib, progress=False)
    want = sim.run(x, mode=Mode.FAKE)
    sim.run(x, mode=Mode.FAKE)
    hit_names.clear()
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), want)
    assert {"a:linear#0", "b:linear#0", "emb:embedding#0", "norm:layer_norm#0"} <= set(hit_names)
    fresh = Simulator(m, "j6m")
    fresh.calibrate(calib, progress=False)
    assert_bits_equal(fresh.run(x, mode=Mode.FAKE), want)


@pytest.mark.parametrize("index", list(EmbeddingIndex))
def test_embedding_composite_sees_every_change(hit_names, index):
    """The embedding's prepared gather against a fresh Simulator sharing the calibration: its
    table edited in place or replaced, new ids, new calibration (with int8 ids on a 600-row
    table a CALIBRATED index scale rounds ids, so a new scale moves rows)."""
    m = nn.Sequential(nn.Embedding(600, 8), nn.Linear(8, 4)).eval()
    g = torch.Generator().manual_seed(5)
    calib = [(torch.randint(0, 300, (2, 9), generator=g),) for _ in range(2)]
    x = torch.randint(0, 600, (2, 9), generator=g)
    spec = QConfigSpec(by_type={"embedding": OpQConfig(embedding_index=index)})
    platform = dataclasses.replace(platform_config("j6m"), embedding_index_dtype=DType.INT8)
    sim = Simulator(m, platform, spec)
    sim.calibrate(calib, progress=False)
    sim.run(x, mode=Mode.FAKE)

    def check(ids):
        other = Simulator(m, platform, spec)
        other.share_calibration(sim)
        want = other.run(ids, mode=Mode.FAKE)
        for _ in range(2):
            assert_bits_equal(sim.run(ids, mode=Mode.FAKE), want)
        return want

    check(x)
    hit_names.clear()
    check(x.flip(1))
    assert "0:embedding#0" in hit_names
    with torch.no_grad():
        m[0].weight.mul_(-3.0)
    check(x)
    m[0].weight = nn.Parameter(m[0].weight.detach() * 0.25)
    before = check(x)
    sim.calibrate([(torch.full((2, 9), 599),)], progress=False)
    after = check(x)
    if index is EmbeddingIndex.CALIBRATED:
        assert not torch.equal(after, before)  # the new index scale reads other rows


@pytest.mark.parametrize("fake_ops", list(FakeOps))
def test_pass_through_ops_follow_their_prepared_call_with_the_same_bits(hit_names, fake_ops):
    """Layout ops (view, transpose, reshape, contiguous, flatten) on a quantized tensor follow
    their prepared call: the function on the same arguments, the output on its input's grid. A
    pass-through op on a float input, or one with several outputs (chunk), takes the full path."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 1)
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            x = x.transpose(2, 3)  # a float model input: quantized by the conv, not here
            h = self.conv(x)
            n, c, hh, ww = h.shape
            t = h.view(n, c, hh * ww).transpose(1, 2).contiguous()
            a, b = t.chunk(2, dim=1)
            u = (a + b).reshape(n, -1, c).flatten(0, 1)
            # a deployed sigmoid reads its input's codes by the scale the layout ops handed on
            return self.head(u), torch.sigmoid(u.view(n, -1))

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = Net().eval()
    g = torch.Generator().manual_seed(2)
    calib = [(torch.randn(2, 3, 4, 6, generator=g),) for _ in range(2)]
    x = torch.randn(2, 3, 4, 6, generator=g) * 2
    sim = Simulator(m, "j6m", fake_ops=fake_ops)
    sim.calibrate(calib, progress=False)
    want = sim.run(x, mode=Mode.FAKE)
    sim.run(x, mode=Mode.FAKE)
    hit_names.clear()
    got = sim.run(x, mode=Mode.FAKE)
    assert_bits_equal(got[0], want[0])
    assert_bits_equal(got[1], want[1])
    layout = {n.split(":")[1].split("#")[0] for n in hit_names}
    assert {"view", "contiguous", "reshape", "flatten"} <= layout
    assert ":transpose#1" in hit_names and ":transpose#0" not in hit_names  # the float one
    assert not any("chunk" in n for n in hit_names)
    fresh = Simulator(m, "j6m", fake_ops=fake_ops)
    fresh.calibrate(calib, progress=False)
    for y in (x, x * 0.01, x * 10.0):
        a, b = sim.run(y, mode=Mode.FAKE), fresh.trace(y, mode=Mode.FAKE).result
        assert_bits_equal(a[0], b[0])
        assert_bits_equal(a[1], b[1])


def test_an_op_with_a_python_number_operand_follows_its_prepared_call(hit_names):
    """``scores * scaling`` (attention's scaling, a Python float) and ``x + 1.0`` follow their
    prepared calls with the bits of the full path; the number is read from each call, so a
    changed number gives the full path's bits for it too."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.scaling = 0.125

        def forward(self, x):
            h = self.a(x)
            return torch.softmax(h * self.scaling, dim=-1) + 1.0, 2.0 * h

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = Net().eval()
    g = torch.Generator().manual_seed(3)
    calib = [(torch.randn(4, 8, generator=g),) for _ in range(2)]
    x = torch.randn(4, 8, generator=g) * 2
    sim = Simulator(m, "j6m")
    sim.calibrate(calib, progress=False)
    want = sim.run(x, mode=Mode.FAKE)
    sim.run(x, mode=Mode.FAKE)
    hit_names.clear()
    got = sim.run(x, mode=Mode.FAKE)
    for a, b in zip(got, want):
        assert_bits_equal(a, b)
    ops = {n.split(":")[1] for n in hit_names}
    assert {"mul#0", "add#0", "mul#1"} <= ops, hit_names
    fresh = Simulator(m, "j6m")
    fresh.calibrate(calib, progress=False)
    for a, b in zip(got, fresh.run(x, mode=Mode.FAKE)):
        assert_bits_equal(a, b)
    m.scaling = 0.5  # the same calibration, a new number: a trace takes the full path
    hit_names.clear()
    got = sim.run(x, mode=Mode.FAKE)
    assert "mul#0" in {n.split(":")[1] for n in hit_names}
    for a, b in zip(got, sim.trace(x, mode=Mode.FAKE).result):
        assert_bits_equal(a, b)
    assert not torch.equal(got[0], want[0])


class NormNet(nn.Module):
    """Conv -> GroupNorm -> InstanceNorm (affine) -> Linear -> LayerNorm: the normalisation
    composites between prepared ops."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.fc = nn.Linear(8 * 4 * 4, 16)
        self.ln = nn.LayerNorm(16)
        with torch.no_grad():
            for p in (self.gn.weight, self.inorm.weight, self.ln.weight):
                p.uniform_(0.5, 1.5)
            for p in (self.gn.bias, self.inorm.bias, self.ln.bias):
                p.uniform_(-0.3, 0.3)

    def forward(self, x):
        h = self.inorm(self.gn(self.conv(x)))
        return self.ln(self.fc(h.flatten(1)))


_NORMS = {"gn:group_norm#0", "inorm:instance_norm#0", "ln:layer_norm#0"}


def _norm_setup():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = NormNet().eval()
    g = torch.Generator().manual_seed(4)
    calib = [(torch.randn(2, 3, 4, 4, generator=g),) for _ in range(2)]
    more = [(torch.randn(2, 3, 4, 4, generator=g) * 3,)]
    return m, calib, more, torch.randn(2, 3, 4, 4, generator=g) * 2


def test_normalisation_composites_follow_their_prepared_call(hit_names):
    """LayerNorm, GroupNorm and InstanceNorm composites, resolved once, give the full path's
    bits in steady runs and in the traced program."""
    m, calib, _, x = _norm_setup()
    sim = _steady(m, calib, x)
    hit_names.clear()
    got = sim.run(x, mode=Mode.FAKE)
    assert _NORMS <= set(hit_names)
    assert_bits_equal(got, _fresh(m, calib, x))
    assert_bits_equal(got, sim.trace(x, mode=Mode.FAKE).result)
    for y in (x * 0.1, x * 5.0):  # other inputs: saturating steps
        assert_bits_equal(sim.run(y, mode=Mode.FAKE), sim.trace(y, mode=Mode.FAKE).result)
    program = sim.program(x, mode=Mode.FAKE)
    assert _NORMS <= {step.name for step in program._steps}  # its prepared steps
    for y in (x, x * 5.0):
        assert_bits_equal(program(y), sim.trace(y, mode=Mode.FAKE).result)
    assert program.fallbacks == 0 and program.last_prepared == program.counts["prepared"]


def test_normalisation_composites_see_every_change(hit_names):
    """Against the full path with the same calibration: gamma and beta edited in place or
    replaced, eps and the group count changed, new calibration, another output dtype, another
    platform; each gives the bits of a fresh Simulator sharing the calibration, in the
    captured run and in the traced program."""
    m, calib, more, x = _norm_setup()
    sim = _steady(m, calib, x)
    program = sim.program(x, mode=Mode.FAKE)

    def check():
        other = Simulator(m, sim.platform, sim.spec)
        other.share_calibration(sim)
        want = other.run(x, mode=Mode.FAKE)
        for _ in range(2):  # the full path, then the prepared call it made
            assert_bits_equal(program(x), want)
            assert_bits_equal(sim.run(x, mode=Mode.FAKE), want)

    for p in (m.gn.weight, m.inorm.bias, m.ln.weight, m.ln.bias):
        with torch.no_grad():
            p.mul_(-1.5)
        check()
    m.ln.weight = nn.Parameter(m.ln.weight.detach() * 0.5)
    check()
    m.ln.eps = 1e-2
    check()
    m.inorm.eps = 0.5
    check()
    sim.calibrate(more, progress=False)
    check()
    sim.set_qconfig(QConfigSpec(by_type={"layer_norm": OpQConfig(output_dtype=DType.INT16)}))
    check()
    sim.platform = Simulator(m, "j6e").platform
    check()
    hit_names.clear()
    sim.run(x, mode=Mode.FAKE)
    assert _NORMS <= set(hit_names)


class GridNet(nn.Module):
    """Convolutions behind zero pads (EfficientNet-Lite's 'same' padding) and a Linear and a
    matmul behind eval dropouts: inputs that arrive as float tensors on their point's grid."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3)
        self.c2 = nn.Conv2d(8, 8, 3, groups=8)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(8, 8)
        self.pad_value = 0.0

    def forward(self, x):
        y = F.relu6(self.c1(x))
        y = self.c2(F.pad(y, (1, 1, 1, 1), value=self.pad_value))
        h = self.head(self.drop(y.mean((2, 3))))
        scores = self.drop(h.unsqueeze(-1) * h.unsqueeze(-2))
        return torch.sigmoid(scores @ self.drop(h.unsqueeze(-1)))  # both behind a dropout


_ON_GRID = {"c2:conv2d#0", "head:linear#0", ":matmul#0"}


def test_inputs_on_their_point_grid_follow_the_prepared_call(hit_names):
    """A zero pad or an eval dropout in front of an op leaves its input on the op's input grid:
    the op follows its prepared call (the input taken as it comes) with the full path's bits,
    also behind a pad of 0.5 (a pass-through op, which snaps its fill onto the grid); when
    the point's scales change, the call takes the full path."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        m = GridNet().eval()
    g = torch.Generator().manual_seed(5)
    calib = [(torch.randn(2, 3, 10, 10, generator=g),) for _ in range(2)]
    more = [(torch.randn(2, 3, 10, 10, generator=g) * 4,)]
    xs = [torch.randn(2, 3, 10, 10, generator=g) * s for s in (1.0, 3.0)]
    sim = _steady(m, calib, xs[0])
    for x in xs:
        hit_names.clear()
        got = sim.run(x, mode=Mode.FAKE)
        assert _ON_GRID <= set(hit_names), hit_names
        assert_bits_equal(got, sim.trace(x, mode=Mode.FAKE).result)
        assert_bits_equal(got, _fresh(m, calib, x))
    program = sim.program(xs[0], mode=Mode.FAKE)
    for x in xs:
        assert_bits_equal(program(x), sim.run(x, mode=Mode.FAKE))
    assert program.fallbacks == 0

    m.pad_value = 0.5  # a pass-through pad snaps its fill onto the grid: still on it
    x = xs[1]
    hit_names.clear()
    got = sim.run(x, mode=Mode.FAKE)
    assert "c2:conv2d#0" in hit_names
    # the full path with the same calibration (a fresh one would observe the 0.5 borders)
    assert_bits_equal(got, sim.trace(x, mode=Mode.FAKE).result)
    m.pad_value = 0.0
    sim.run(x, mode=Mode.FAKE)

    # the input point's scale-cache entry is what the OnGrid input rests on: a replaced entry
    # sends the call through the full path (which prepares it anew)
    # (the linear's, behind a dropout; the padded tensor arrives quantized, as it is)
    key = ("fake_point", "head:linear#0", "in0", DType.INT8, None)
    assert any(k == key for k, _ in sim._prepared["head:linear#0", Mode.FAKE].deps)
    sim._scale_cache[key] = tuple(list(sim._scale_cache[key]))  # equal, another object
    hit_names.clear()
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), sim.trace(x, mode=Mode.FAKE).result)
    assert "head:linear#0" not in hit_names

    sim.calibrate(more, progress=False)  # new scales at every point
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), _fresh(m, calib + more, x))
    hit_names.clear()
    assert_bits_equal(sim.run(x, mode=Mode.FAKE), _fresh(m, calib + more, x))
    assert _ON_GRID <= set(hit_names), hit_names


class SideNet(nn.Module):
    """Ops whose second operand is a float tensor no modelled op made (integer ids cast to
    float, as a sentence model casts its attention mask): the dispatch fake-quantizes it at the
    op's input point on every call. ``quantized``: that operand is ``relu(x)`` instead, which
    arrives quantized at the relu's output point."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.quantized = False

    def forward(self, x, ids):
        r, cast = torch.relu(x), ids.to(torch.float32)
        side = r if self.quantized else cast
        h = self.a(x)
        shifted = (1.0 - side) * 0.25
        return (h * side + shifted).sum(1) / side.sum(1) + r.sum()


_SIDE = {":sub#0", ":mul#1", ":sum#1"}


def test_inputs_quantized_at_their_point_follow_the_prepared_call(hit_names):
    """A float operand with no quantization of its own is fake-quantized at the op's input
    point: the op follows its prepared call (``QuantizeHere``: that point's function applied
    to the operand) with the full path's and a fresh simulator's bits, in captured runs and in
    a program, on new values each run; when the operand arrives quantized (by a modelled op,
    so the full path takes it as it comes), or the point's scale-cache entry is replaced, the
    call takes the full path."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(6)
        m = SideNet().eval()
    g = torch.Generator().manual_seed(6)

    def batch(scale):
        return torch.randn(4, 8, generator=g) * scale, torch.randint(-40, 40, (4, 8), generator=g)

    calib = [batch(1.0) for _ in range(2)]
    xs = [batch(s) for s in (1.0, 2.0, 0.5)]
    sim = Simulator(m, "j6m")
    sim.calibrate(calib, progress=False)
    for _ in range(2):
        sim.run(*xs[0], mode=Mode.FAKE)
    names = {n for n in sim._order if ":" + n.split(":")[1] in _SIDE}
    assert {":" + n.split(":")[1] for n in names} == _SIDE, sim._order
    for n in names:
        kinds = [type(d) for d in sim._prepared[n, Mode.FAKE].in_dtypes]
        assert steady.QuantizeHere in kinds, (n, kinds)
    for x in xs:
        hit_names.clear()
        got = sim.run(*x, mode=Mode.FAKE)
        assert names <= set(hit_names), hit_names
        assert_bits_equal(got, sim.trace(*x, mode=Mode.FAKE).result)
        assert_bits_equal(got, _fresh_two(m, calib, x))
    program = sim.program(*xs[0], mode=Mode.FAKE)
    for x in xs:
        assert_bits_equal(program(*x), sim.run(*x, mode=Mode.FAKE))
    assert program.fallbacks == 0 and program.last_prepared >= len(names)

    # the point's scale-cache entry is what QuantizeHere rests on: a replaced entry (equal,
    # another object) sends the call through the full path
    name = next(n for n in names if n.endswith("mul#1"))
    key = ("fake_point", name, "in1", DType.INT8, None)
    assert any(k == key for k, _ in sim._prepared[name, Mode.FAKE].deps)
    sim._scale_cache[key] = tuple(list(sim._scale_cache[key]))
    hit_names.clear()
    assert_bits_equal(sim.run(*xs[1], mode=Mode.FAKE), sim.trace(*xs[1], mode=Mode.FAKE).result)
    assert name not in hit_names

    m.quantized = True  # the operand now arrives quantized at the relu's point: used as is
    x = xs[1]
    hit_names.clear()
    got = sim.run(*x, mode=Mode.FAKE)
    assert not names & set(hit_names), hit_names
    assert_bits_equal(got, sim.trace(*x, mode=Mode.FAKE).result)
    m.quantized = False
    assert_bits_equal(sim.run(*x, mode=Mode.FAKE), _fresh_two(m, calib, x))


def _fresh_two(m, calib, x):
    sim = Simulator(m, "j6m")
    sim.calibrate(calib, progress=False)
    return sim.run(*x, mode=Mode.FAKE)
