"""Traced programs (quantlab.simulate.program): the bits of ``Simulator.run`` in FAKE, HYBRID
and FIXED mode on many inputs and models, every guard sending a changed simulator or model back
to the captured run, and a clear refusal for models torch.fx cannot trace."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from pinned_fake_mode import cases, small_net
from torch import nn
from torch.nn import functional as F

from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import FakeOps, Mode, Simulator
from quantlab.simulate.profiles import platform_config
from quantlab.simulate.program import ProgramError


class LayoutNet(nn.Module):
    """Unfolded BatchNorm (its input-rank check reads dim()), a module used twice, shape
    arithmetic, view/flatten/transpose, an in-place add, chunk unpacking, a float op that is
    not modelled (sort), a tuple output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.shared = nn.Conv2d(8, 8, 1)
        self.head = nn.Linear(8 * 4, 6)

    def forward(self, x):
        h = F.relu6(self.bn(self.conv(x)))
        h = self.shared(self.shared(h))
        n, c = h.shape[0], h.size(1)
        h = h.reshape(n, c, -1).transpose(1, 2)
        h = h.contiguous()
        h += 0.25
        a, b = h.chunk(2, dim=1)
        s = torch.sort(a - b, dim=-1).values
        p = s.mean(1)
        y = self.head(torch.cat([p, p.flip(-1), p * 2, torch.sigmoid(p)], dim=1))
        return y, torch.tanh(p)


def _seeded(cls, seed: int = 0) -> nn.Module:
    """``cls()`` in eval mode, initialised under ``seed`` without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls().eval()


def _layout_net(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    m = _seeded(LayoutNet, seed)
    with torch.no_grad():
        m.bn.running_mean.copy_(torch.rand(8, generator=g) * 0.2 - 0.1)
        m.bn.running_var.copy_(torch.rand(8, generator=g) * 1.5 + 0.5)
    calib = [(torch.randn(2, 3, 6, 6, generator=g),) for _ in range(2)]
    return m, calib


def _inputs(shape, n: int, seed: int) -> list[torch.Tensor]:
    """Random inputs at several magnitudes, and adversarial ones: zeros, a constant, values far
    beyond the calibrated range, ties at half a step."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(shape, generator=g) * s for s in (0.1, 1.0, 3.0, 30.0)[:n]]
    xs.append(torch.zeros(shape))
    xs.append(torch.full(shape, 0.5))
    xs.append(torch.randn(shape, generator=g) * 1e4)
    xs.append(torch.round(torch.randn(shape, generator=g) * 64) / 128)
    return xs


def _calibrated(m, calib, platform="j6m", **kw) -> Simulator:
    sim = Simulator(m, platform, **kw)
    sim.calibrate(calib, progress=False)
    return sim


MODES = [Mode.FAKE, Mode.HYBRID, Mode.FIXED]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("platform", ["j6m", "j6h", "onnxruntime"])
@pytest.mark.parametrize("fake_ops", list(FakeOps))
def test_a_program_gives_the_captured_runs_bits(platform, fake_ops, mode, request):
    if fake_ops is FakeOps.DEPLOYED:  # these GEMMs on torch's int8 product, the others on float
        request.getfixturevalue("int8_product_fast")
    m, calib = _layout_net()
    sim = _calibrated(m, calib, platform, fake_ops=fake_ops, steady_programs=False)
    x0 = calib[0][0]
    prog = sim.program(x0, mode=mode)
    assert prog.mode is mode
    assert prog.counts["prepared"] + prog.counts["fused"] + prog.counts["dispatched"] > 10
    if mode is Mode.HYBRID:  # FAKE and FIXED runs prepare calls, HYBRID runs none
        assert prog.counts["prepared"] == 0
    fresh = _calibrated(m, calib, platform, fake_ops=fake_ops)  # never built a program
    for x in _inputs(x0.shape, 4, 1):
        got = prog(x)
        for want in (sim.run(x, mode=mode), fresh.run(x, mode=mode)):
            assert_bits_equal(got[0], want[0])
            assert_bits_equal(got[1], want[1])
    assert prog.fallbacks == 0


def test_a_float_program_is_refused_with_the_allowed_modes():
    m, calib = _layout_net()
    sim = _calibrated(m, calib)
    with pytest.raises(ValueError, match="mode must be FAKE, HYBRID or FIXED, got FLOAT"):
        sim.program(calib[0][0], mode=Mode.FLOAT)
    with pytest.raises(ValueError, match="unknown mode 'EXACT'; allowed: FLOAT, FAKE"):
        sim.program(calib[0][0], mode="EXACT")


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
@pytest.mark.parametrize("case", [c[0] for c in cases()])
def test_the_pinned_fake_models_run_as_programs_with_the_same_bits(case, mode):
    name, m, calib, x, spec = next(c for c in cases() if c[0] == case)
    sim = Simulator(m, "j6m", spec)
    sim.calibrate(calib, progress=False)
    prog = sim.program(*x, mode=mode)
    assert prog.counts["prepared"] > 0 or mode is Mode.FIXED
    g = torch.Generator().manual_seed(3)
    for scale in (0.5, 1.0, 4.0):
        y = tuple(
            t * scale + torch.randn(t.shape, generator=g) * 0.01 * scale
            if t.is_floating_point()
            else t
            for t in x
        )
        assert_bits_equal(prog(*y), sim.run(*y, mode=mode))
    assert prog.fallbacks == 0


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_mobilenet_v2_runs_as_a_program_with_the_same_bits(mode):
    from quantlab.models import build_model
    from quantlab.models.registry import example_inputs

    m = build_model("mobilenet_v2").module
    sim = Simulator(m, "j6m")
    sim.calibrate([example_inputs("mobilenet_v2", 1, 1)], progress=False)
    prog = sim.program(*example_inputs("mobilenet_v2", 1, 0), mode=mode)
    # every relu6 is fused and the classifier (high-precision output) is dispatched; FAKE
    # prepares every conv (the first one fake-quantizes the image at its input point), the
    # adds, pooling and flatten; FIXED the same but the first conv (its input is quantized
    # there)
    if mode is Mode.FAKE:
        assert prog.counts == {"prepared": 63, "fused": 35, "kept": 0, "dispatched": 1}
    else:
        assert prog.counts == {"prepared": 62, "fused": 35, "kept": 0, "dispatched": 2}
    for seed in (2, 3):
        x = example_inputs("mobilenet_v2", 1, seed)
        assert_bits_equal(prog(*x), sim.run(*x, mode=mode))
    assert prog.fallbacks == 0


def _built(mode: Mode = Mode.FAKE):
    """LayoutNet calibrated on j6m and its program in ``mode`` built on the first calibration
    batch: (model, simulator, that batch, program)."""
    m, calib = _layout_net()
    sim = _calibrated(m, calib)
    x = calib[0][0]
    return m, sim, x, sim.program(x, mode=mode)


def _program_of(cls, seed: int):
    """``cls()`` (a LayoutNet) calibrated on j6m on two random batches drawn under ``seed``, and
    its program built on the first: (model, simulator, that batch, program)."""
    g = torch.Generator().manual_seed(seed)
    m = _seeded(cls)
    calib = [(torch.randn(2, 3, 6, 6, generator=g),) for _ in range(2)]
    sim = _calibrated(m, calib)
    x = calib[0][0]
    return m, sim, x, sim.program(x, mode=Mode.FAKE)


def _guarded(change, expect_fallback: bool, mode: Mode = Mode.FAKE):
    """Build a program in ``mode``, apply ``change(sim, model)``, and demand the captured run's
    bits (taken after the program's call, from the same simulator) and a counted fallback where
    the traced code's own assumptions changed; else, the prepared steps back by the second
    call."""
    m, sim, x, prog = _built(mode)
    full = prog.last_prepared
    assert full == prog.counts["prepared"]
    change(sim, m)
    y = x * 1.5
    got = prog(y)
    assert prog.fallbacks == (1 if expect_fallback else 0)
    want = sim.run(y, mode=mode)
    assert_bits_equal(got[0], want[0])
    assert_bits_equal(got[1], want[1])
    if not expect_fallback:
        again = prog(y)
        assert prog.last_prepared == full  # every prepared step followed its (new) call
        assert_bits_equal(again[0], want[0])
    return sim, m, got


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_a_qconfig_change_is_followed_with_fresh_bits(mode):
    spec = QConfigSpec(by_type={"conv2d": OpQConfig(output_dtype=DType.INT16)})
    _, m, got = _guarded(lambda sim, m: sim.set_qconfig(spec), expect_fallback=False, mode=mode)
    m2, calib = _layout_net()
    fresh = _calibrated(m2, calib, qconfig=spec)
    assert_bits_equal(got[0], fresh.run(calib[0][0] * 1.5, mode=mode)[0])


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_recalibration_is_followed(mode):
    g = torch.Generator().manual_seed(9)
    batch = (torch.randn(2, 3, 6, 6, generator=g) * 5,)
    _guarded(lambda sim, m: sim.calibrate([batch], False), expect_fallback=False, mode=mode)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_a_weight_edited_in_place_is_followed(mode):
    def edit(sim, m):
        with torch.no_grad():
            m.shared.weight.mul_(1.25)

    _guarded(edit, expect_fallback=False, mode=mode)


def test_fixed_and_float_runs_between_program_calls_keep_the_bits():
    m, sim, x, prog = _built()
    for y in _inputs(x.shape, 2, 5):
        sim.run(y, mode=Mode.FIXED)
        sim.run(y, mode=Mode.FLOAT)
        got = prog(y)
        want = sim.run(y, mode=Mode.FAKE)
        assert_bits_equal(got[0], want[0])
        assert_bits_equal(prog(y)[0], want[0])
        assert prog.last_prepared == prog.counts["prepared"]
    assert prog.fallbacks == 0


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
@pytest.mark.parametrize("what", ["parameter", "buffer"])
def test_a_replaced_parameter_or_buffer_falls_back(what, mode):
    def replace(sim, m):
        if what == "parameter":
            m.head.weight = nn.Parameter(m.head.weight.detach() * 0.5)
        else:
            m.bn.running_var = m.bn.running_var * 2

    _guarded(replace, expect_fallback=True, mode=mode)


def test_a_replaced_module_falls_back_to_what_the_captured_run_does():
    m, sim, x, prog = _built()
    m.bn = nn.BatchNorm2d(8).eval()  # the simulator has no op of this new module
    with pytest.raises(ValueError) as captured:
        sim.run(x, mode=Mode.FAKE)
    with pytest.raises(ValueError) as programmed:
        prog(x)
    assert str(programmed.value) == str(captured.value)
    assert prog.fallbacks == 1


def test_a_forward_hook_added_after_building_runs_through_the_captured_run():
    seen = []

    def hook(sim, m):
        m.head.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))

    _guarded(hook, expect_fallback=True)
    assert seen  # the hook ran: the captured run called the module


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
@pytest.mark.parametrize("change", ["platform", "fake_ops", "shape", "stride"])
def test_platform_fake_ops_and_input_layout_changes_give_the_captured_runs_bits(change, mode):
    m, sim, x, prog = _built(mode)
    y = x * 0.75
    if change == "platform":
        sim.platform = platform_config("j6e")
    elif change == "fake_ops":
        sim.fake_ops = FakeOps.DEPLOYED
    elif change == "shape":
        y = torch.randn(3, 3, 6, 6)
    else:
        y = y.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    got = prog(y)
    # the traced code assumed the input layout; the simulator's settings are checked per step
    assert prog.fallbacks == (1 if change in ("shape", "stride") else 0)
    assert_bits_equal(got[0], sim.run(y, mode=mode)[0])


def test_building_leaves_the_model_and_train_flags_as_they_were():
    m, calib = _layout_net()
    m.train()
    sim = _calibrated(m, calib)
    before = dict(m.__dict__)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    prog = sim.program(calib[0][0], mode=Mode.FAKE)
    prog(calib[1][0])
    assert all(mod.training for mod in m.modules())
    assert m.__dict__.keys() == before.keys()
    for k, v in m.state_dict().items():
        assert_bits_equal(v, state[k])


class PythonMethods(nn.Module):
    """Tensor methods written in Python hand their arguments on in another form than the call
    wrote them (``t.split([2, 6], 1)`` reaches the capture as ``Tensor.split(t, [2, 6],
    dim=1)``; ``t.norm(dim=1)`` with its defaults), and a reflected operator (``2 * t``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        a, b = y.split([2, 6], 1)
        c, d = torch.split(y, 4, 1)
        return a.sum(1) + 2 * b.mean(1) + y.norm(dim=1) - (c * d).mean(1)


class ItemAssignment(nn.Module):
    """Item assignment into an op's output, into a slice of a sigmoid's output (a detection
    head's box decoding) and into a tensor the forward creates: each write changes values that
    carried their quantization, which the run must then forget."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.head = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        t = self.conv(x)
        t[:, 0] = t[:, 1] * 2
        y = torch.sigmoid(t)
        y[..., 0:2] = y[..., 0:2] * 2 - 0.5
        cache = torch.zeros(x.shape[0], 4, x.shape[2], x.shape[3])
        cache[:, 1:3] = t[:, :2]
        return self.head(y) + cache


class InPlaceOperators(nn.Module):
    """In-place operators on a tensor another name still holds (a residual block's
    ``out += identity``): each writes the tensor, and the other name sees every write."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.skip = nn.Conv2d(3, 6, 1)
        self.head = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        t = self.conv(x)
        kept = t
        t += self.skip(x)
        t *= 0.5
        t -= 0.125
        t /= 1.5
        return self.head(F.relu(kept))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "net",
    [PythonMethods, ItemAssignment, InPlaceOperators],
    ids=["rebound", "setitem", "in_place_operators"],
)
def test_python_level_calls_and_writes_give_the_captured_runs_bits(net, mode):
    m = _seeded(net)
    g = torch.Generator().manual_seed(4)
    sim = _calibrated(m, [(torch.randn(2, 3, 6, 6, generator=g),)], steady_programs=False)
    x0 = torch.randn(2, 3, 6, 6, generator=g)
    prog = sim.program(x0, mode=mode)
    for x in _inputs(x0.shape, 4, 5):
        assert_bits_equal(prog(x), sim.run(x, mode=mode))
    assert prog.fallbacks == 0


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        if y.sum() > 0:  # a decision on the values: not a program
            return y * 2
        return y


def test_data_dependent_control_flow_is_refused_with_the_reason():
    m = DataDependent().eval()
    sim = _calibrated(m, [(torch.randn(1, 3, 4, 4),)])
    with pytest.raises(ProgramError, match="torch.fx cannot trace DataDependent"):
        sim.program(torch.randn(1, 3, 4, 4), mode=Mode.FAKE)


class _ListOutputs(nn.Module):
    """Returns a list and a dict (onnx2torch's graphs of several outputs return lists)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        a, b = torch.split(self.conv(x), [1, 3], dim=1)
        return [torch.relu(a), {"b": torch.sigmoid(b), "pair": (a, b)}]


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_a_model_returning_lists_and_dicts_runs_as_a_program(mode):
    """The traced graph's run hands its output over as plain lists and dicts, as the model
    returns them (torch.fx's immutable containers made every list-returning model's program
    differ from its run by type)."""
    m = _ListOutputs().eval()
    xs = [torch.randn(1, 3, 5, 5, generator=torch.Generator().manual_seed(s)) for s in (0, 1)]
    sim = _calibrated(m, [(x,) for x in xs])
    prog = sim.program(xs[0], mode=mode)
    for x in xs:
        got, want = prog(x), sim.run(x, mode=mode)
        assert type(got) is list and type(got[1]) is dict and type(got[1]["pair"]) is tuple
        assert_bits_equal(got[0], want[0])
        assert_bits_equal(got[1]["b"], want[1]["b"])
    assert prog.fallbacks == 0


def test_hooks_and_a_missing_calibration_are_refused():
    m, calib = _small()
    with pytest.raises(ProgramError, match="calibrate"):
        Simulator(m, "j6m").program(*calib[0], mode=Mode.FAKE)
    h = m.conv.register_forward_pre_hook(lambda mod, inp: None)
    try:
        with pytest.raises(ProgramError, match="module conv has forward hooks"):
            _calibrated(m, calib).program(*calib[0], mode=Mode.FAKE)
    finally:
        h.remove()


def _small():
    m, calib, _ = small_net()
    return m, calib


class SelfChanging(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.conv(x)


def test_a_forward_that_changes_its_own_tensors_is_refused():
    m = SelfChanging().eval()
    sim = _calibrated(m, [(torch.randn(1, 3, 4, 4),)])
    with pytest.raises(ProgramError, match="changes its own tensors"):
        sim.program(torch.randn(1, 3, 4, 4), mode=Mode.FAKE)


@pytest.mark.parametrize("setting", ["stride", "eps", "root"])
def test_a_changed_module_setting_falls_back(setting):
    """The traced code took the modules' plain settings as constants: a changed one (a stride,
    an eps, a flag on the model itself) sends the call to the captured run."""

    class Scaled(LayoutNet):
        def __init__(self) -> None:
            super().__init__()
            self.gain = 1.0

        def forward(self, x):
            y, t = super().forward(x)
            return y * self.gain, t

    m, sim, x, prog = _program_of(Scaled, 4)
    if setting == "stride":
        m.shared.stride = (1, 1)  # as before, but a new value: still the same program
        same = prog(x)
        assert prog.fallbacks == 0
        assert_bits_equal(same[0], sim.run(x, mode=Mode.FAKE)[0])
        m.shared.padding = (1, 1)
    elif setting == "eps":
        m.bn.eps = 0.5
    else:
        m.gain = 3.0
    got = prog(x)
    assert prog.fallbacks == 1
    want = sim.run(x, mode=Mode.FAKE)
    assert_bits_equal(got[0], want[0])
    assert_bits_equal(got[1], want[1])


class Reflected(nn.Module):
    """Python operators with the tensor on the right: the capture sees ``x.mul(2)`` for
    ``2 * x`` and ``x.__rsub__(1.0)`` for ``1.0 - x``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        h = self.conv(x)
        a = 2 * h
        b = 1.0 - h
        c = 3.0 / (h.abs() + 1.0)
        d = 0.5 + torch.sigmoid(h)
        return a * b + c - d


def test_reflected_operators_run_with_the_captured_order_of_operands():
    g = torch.Generator().manual_seed(6)
    m = _seeded(Reflected)
    calib = [(torch.randn(2, 3, 5, 5, generator=g),) for _ in range(2)]
    sim = _calibrated(m, calib)
    prog = sim.program(calib[0][0], mode=Mode.FAKE)
    assert prog.counts["prepared"] + prog.counts["dispatched"] >= 9
    for x in _inputs((2, 3, 5, 5), 4, 7):
        assert_bits_equal(prog(x), sim.run(x, mode=Mode.FAKE))
    assert prog.fallbacks == 0


@pytest.mark.parametrize(
    ("platform", "mode"), [("j6m", Mode.FAKE), ("j6p", Mode.FAKE), ("j6m", Mode.FIXED)]
)
@pytest.mark.parametrize(
    "name", ["small_cnn", "transformer_block", "digits_sima", "mtcnn_rnet", "bev_warp"]
)
def test_registry_models_run_as_programs_with_the_same_bits_or_are_refused(name, platform, mode):
    """Every model either gives the captured run's bits as a program or is refused with the
    reason (control_flow decides on values: refused by torch.fx). bev_warp's sampling grid is
    built from its buffers and ``arange`` alone, a constant of the model that the traced graph
    computes as the model does."""
    from quantlab.models.registry import build_model, example_inputs

    sim = Simulator(build_model(name).module, platform)
    sim.calibrate([example_inputs(name, 2, 1)], progress=False)
    prog = sim.program(*example_inputs(name, 2, 0), mode=mode)
    for seed in (2, 3):
        x = example_inputs(name, 2, seed)
        got, want = prog(*x), sim.run(*x, mode=mode)
        assert_bits_equal(got, want)
    assert prog.fallbacks == 0


def test_value_dependent_control_flow_in_a_registry_model_is_refused():
    from quantlab.models.registry import build_model, example_inputs

    sim = Simulator(build_model("control_flow").module, "j6m")
    sim.calibrate([example_inputs("control_flow", 2, 1)], progress=False)
    with pytest.raises(ProgramError, match="torch.fx cannot trace ControlFlow"):
        sim.program(*example_inputs("control_flow", 2, 0), mode=Mode.FAKE)


def mask_helper(mask, scale):
    """Library-style code a trace cannot enter: it branches on isinstance(..., torch.Tensor)
    (a bool mask: no float op, nothing captured inside)."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        return mask[:, None, :]
    raise TypeError("mask must be a tensor")


def quantized_helper(x):
    return torch.sigmoid(x)


class MaskedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, mask):
        return self.proj(x) * mask_helper(mask, 2.0)  # a leaf is named as a global


class HelperNet(MaskedNet):
    def forward(self, x, mask):
        return self.proj(quantized_helper(x))


def test_leaf_functions_are_called_as_they_are():
    g = torch.Generator().manual_seed(8)
    m = _seeded(MaskedNet)

    def batch():
        return torch.randn(2, 5, 8, generator=g), torch.rand(2, 8, generator=g) > 0.3

    sim = _calibrated(m, [batch(), batch()])
    x = batch()
    with pytest.raises(ProgramError, match="mask must be a tensor"):
        sim.program(*x, mode=Mode.FAKE)
    prog = sim.program(*x, leaves=[mask_helper], mode=Mode.FAKE)
    for _ in range(4):
        y = batch()
        assert_bits_equal(prog(*y), sim.run(*y, mode=Mode.FAKE))
    m.trace_leaves = (mask_helper,)  # the model may declare its own
    assert_bits_equal(sim.program(*x, mode=Mode.FAKE)(*x), sim.run(*x, mode=Mode.FAKE))


def test_a_leaf_that_computes_modelled_ops_is_refused():
    m = HelperNet().eval()
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(2, 5, 8, generator=g), torch.ones(2, 8, dtype=torch.bool))
    sim = _calibrated(m, [x])
    with pytest.raises(ProgramError, match="leaf function quantized_helper computes captured"):
        sim.program(*x, leaves=[quantized_helper], mode=Mode.FAKE)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_minilm_runs_as_a_program_with_its_mask_builder_as_a_leaf(mode):
    from quantlab.models import build_model

    m = build_model("minilm").module
    g = torch.Generator().manual_seed(10)

    def tokens():
        ids = torch.randint(1000, 30000, (2, 16), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 11:] = 0  # padding in the second sentence
        return ids, mask

    sim = Simulator(m, "j6m")
    sim.calibrate([tokens()], progress=False)
    prog = sim.program(*tokens(), mode=mode)
    assert prog.counts["prepared"] >= 36  # every Linear at least
    for _ in range(2):
        x = tokens()
        assert_bits_equal(prog(*x), sim.run(*x, mode=mode))
    assert prog.fallbacks == 0


class LayoutLut(nn.Module):
    """Layout ops between a conv and segment-LUT ops: a deployed LUT reads its input's codes by
    the scale the layout ops handed on."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 1)

    def forward(self, x):
        h = self.conv(x)
        n, c = h.shape[:2]
        t = h.view(n, c, -1).transpose(1, 2).contiguous()
        return torch.sigmoid(t.reshape(n, -1)), torch.tanh(t.flatten(1))


@pytest.mark.parametrize("fake_ops", list(FakeOps))
def test_layout_ops_before_deployed_luts_keep_the_bits(fake_ops):
    g = torch.Generator().manual_seed(12)
    m = _seeded(LayoutLut)
    calib = [(torch.randn(2, 3, 4, 4, generator=g),) for _ in range(2)]
    sim = _calibrated(m, calib, fake_ops=fake_ops)
    prog = sim.program(calib[0][0], mode=Mode.FAKE)
    assert prog.counts["prepared"] >= 5  # the five layout ops (and the QAT LUTs)
    for x in _inputs((2, 3, 4, 4), 4, 13):
        got, want = prog(x), sim.run(x, mode=Mode.FAKE)
        assert_bits_equal(got[0], want[0])
        assert_bits_equal(got[1], want[1])
        assert prog.last_prepared == prog.counts["prepared"]


OFFSET = 0.25  # a global ReadingNet's forward reads


def _closure_gain():
    box = [1.5]
    return (lambda y: y * box[0]), box


GAIN, GAIN_BOX = _closure_gain()


class ReadingNet(LayoutNet):
    """LayoutNet reading Python values no module setting holds: a global, a closure variable
    and a list attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.shifts = [0.5]

    def forward(self, x):
        y, t = super().forward(x)
        return GAIN(y) + OFFSET + self.shifts[0], t


@pytest.mark.parametrize("change", ["global", "closure", "list attribute", "train flag"])
def test_a_changed_python_value_forward_reads_falls_back(change):
    """torch dynamo's guards over forward see what the traced code took as constant and no
    module setting holds; the call then gives the captured run's bits."""
    m, sim, x, prog = _program_of(ReadingNet, 12)
    assert prog.guard is not None and prog.unguarded is None
    assert_bits_equal(prog(x * 0.5)[0], sim.run(x * 0.5, mode=Mode.FAKE)[0])
    assert prog.fallbacks == 0
    glob = globals()
    apply, undo = {  # (change, undo)
        "global": (lambda: glob.update(OFFSET=-3.0), lambda: glob.update(OFFSET=0.25)),
        "closure": (lambda: GAIN_BOX.__setitem__(0, 4.0), lambda: GAIN_BOX.__setitem__(0, 1.5)),
        "list attribute": (
            lambda: m.shifts.__setitem__(0, 2.0),
            lambda: m.shifts.__setitem__(0, 0.5),
        ),
        "train flag": (m.train, m.eval),
    }[change]
    apply()
    try:
        got = prog(x * 0.5)
        want = sim.run(x * 0.5, mode=Mode.FAKE)
    finally:
        undo()
    assert prog.fallbacks == 1
    assert_bits_equal(got[0], want[0])
    assert_bits_equal(got[1], want[1])
    if change != "train flag":  # the captured run evaluates in eval mode either way
        assert not torch.equal(got[0], prog(x * 0.5)[0])
    assert prog.fallbacks == 1  # undone: the program holds again


class Unguardable(LayoutNet):
    def forward(self, x):
        torch._dynamo.graph_break()  # nothing in eager or for torch.fx; ends dynamo's graph
        return super().forward(x)


def test_a_model_dynamo_cannot_guard_runs_unguarded_with_the_reason():
    _, sim, x, prog = _program_of(Unguardable, 13)
    assert prog.guard is None
    assert "one graph" in prog.unguarded
    y = x * 2
    assert_bits_equal(prog(y)[0], sim.run(y, mode=Mode.FAKE)[0])
    assert prog.fallbacks == 0


class ViewFirst(nn.Module):
    """A pass-through op on a model input that arrives as integer codes (``InputQuant``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(12, 6)

    def forward(self, x):
        h = x.view(x.shape[0], -1)
        return self.lin(h.t().t())


def _int8_input_program(m: nn.Module, xs: list) -> tuple:
    """(simulator, FAKE program, its prepared step count) of ``m`` whose input is declared as
    int8 codes at scale 0.5, calibrated on ``xs[:2]``, built on ``xs[0]``; its first call on
    ``xs[2]`` followed every prepared step with the captured run's bits."""
    from quantlab.simulate.model_inputs import InputQuant

    sim = Simulator(m, "j6m", input_quant=(InputQuant(DType.INT8, 0.5),))
    sim.calibrate([(x,) for x in xs[:2]], progress=False)
    prog = sim.program(xs[0], mode=Mode.FAKE)
    full = prog.counts["prepared"]
    assert_bits_equal(prog(xs[2]), sim.run(xs[2], mode=Mode.FAKE))
    assert prog.last_prepared == full
    return sim, prog, full


def _redeclared(sim: Simulator, prog, m: nn.Module, xs: list, declared: tuple) -> int:
    """The input redeclared as ``declared`` (dtype, scale): the program's next call gives a
    fresh simulator's bits, the call after follows every prepared step with no fallback;
    returns how many steps the first of them followed."""
    from quantlab.simulate.model_inputs import InputQuant

    sim.input_quant = (InputQuant(*declared),)
    got = prog(xs[2])
    followed = prog.last_prepared
    fresh = Simulator(m, "j6m", input_quant=(InputQuant(*declared),))
    fresh.calibrate([(x,) for x in xs[:2]], progress=False)
    assert_bits_equal(got, fresh.run(xs[2], mode=Mode.FAKE))
    assert_bits_equal(prog(xs[2]), got)
    assert prog.last_prepared == prog.counts["prepared"]
    assert prog.fallbacks == 0
    return followed


def test_a_pass_through_whose_input_arrives_otherwise_takes_the_dispatch():
    """A prepared pass-through step checks only that its input arrives at the dtype it was
    prepared for (its simulator-side checks are made once per call): an input quantized at
    another dtype now (the declared input changed from int8 to int16 codes) sends it through
    the dispatch, with a fresh simulator's bits, and the next call follows the new call."""
    g = torch.Generator().manual_seed(4)
    m = _seeded(ViewFirst)
    xs = [torch.randint(-100, 100, (2, 3, 4), generator=g).float() * 0.5 for _ in range(3)]
    sim, prog, full = _int8_input_program(m, xs)
    # view and both transposes follow their calls by the inline pass-through check
    assert sum(getattr(s, "passes", None) is not None for s in prog._steps) == 3
    # the view's input came as int16: dispatched
    assert _redeclared(sim, prog, m, xs, (DType.INT16, 0.5)) < full


class LutAfterView(nn.Module):
    """A one-input op (a LUT) on a view of a model input that arrives as integer codes."""

    def forward(self, x):
        return torch.sigmoid(x.view(x.shape[0], -1)) * 3.0


@pytest.mark.parametrize("declared", [(DType.INT16, 0.5), (DType.INT8, 0.5 / 64)])
def test_a_one_input_op_whose_input_arrives_otherwise_takes_the_dispatch(declared):
    """A prepared one-input step checks inline what ``steady.arrived_info`` and
    ``arguments_hold`` would: an input at another dtype sends it through the dispatch; one at
    another scale (which the sigmoid's FAKE form does not read) keeps it; either way with a
    fresh simulator's bits, and the next call follows the new call."""
    g = torch.Generator().manual_seed(5)
    m = LutAfterView()
    # -0.5, 0 and 0.5: int8 codes at scale 0.5 and at 0.5 / 64 alike
    xs = [torch.randint(-1, 2, (2, 3, 4), generator=g).float() * 0.5 for _ in range(3)]
    sim, prog, full = _int8_input_program(m, xs)
    assert [s.full.op_type for s in prog._steps if s.one is not None] == ["sigmoid"]
    followed = _redeclared(sim, prog, m, xs, declared)
    # int16 codes: the sigmoid and the view before it dispatched
    assert followed == (full - 2 if declared[0] is DType.INT16 else full)


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 5)

    def forward(self, x):
        return torch.sigmoid(self.b(torch.sigmoid(self.a(x))))


def test_a_one_input_linear_whose_input_scale_is_another_object_takes_the_dispatch():
    """The second linear's FAKE bias was made with its input's scale object: an input whose
    QInfo holds another scale tensor (here the sigmoid's prepared output info replaced by an
    equal copy) sends it through the dispatch, which prepares it anew, with the same bits."""
    from quantlab.simulate.qtensor import QInfo

    m = _seeded(TwoLinears)
    g = torch.Generator().manual_seed(6)
    xs = [torch.randn(3, 6, generator=g) for _ in range(3)]
    sim = _calibrated(m, [(x,) for x in xs[:2]])
    prog = sim.program(xs[0], mode=Mode.FAKE)
    want = prog(xs[2])
    full = prog.last_prepared
    step = {s.name: s for s in prog._steps}
    assert step["b:linear#0"].one is not None and step["b:linear#0"].prep.x_scale is not None
    sigmoid = step[":sigmoid#0"].prep
    info = sigmoid.out_info
    sigmoid.out_info = QInfo(info.dtype, info.scale.clone(), zero_point=info.zero_point)
    assert_bits_equal(prog(xs[2]), want)
    assert prog.last_prepared == full - 1  # the second linear went through the dispatch
    assert_bits_equal(prog(xs[2]), want)
    assert prog.last_prepared == full  # prepared anew with the new scale object


class Dropouts(nn.Module):
    """Eval-mode dropouts in front of modelled ops: functional (train flag from the module)
    before a matmul of two activations, an ``nn.Dropout`` before a Linear, and an in-place one
    (which the program leaves to the dispatch)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.drop = nn.Dropout(0.25)
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        w = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2), dim=-1)
        h = F.dropout(w, p=0.1, training=self.training) @ self.v(x)
        h = self.out(self.drop(h))
        return F.dropout(h, 0.5, False, True) + 1.0


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.HYBRID, Mode.FIXED])
def test_eval_dropouts_are_kept_with_the_bits_and_grids_of_the_dispatch(platform, mode):
    """An eval-mode dropout step returns its input without calling dropout and books it as the
    dispatch does: the matmul and the Linear after them still follow their prepared calls (their
    inputs arrive on their grids), and the bits are a fresh simulator's on many inputs."""
    g = torch.Generator().manual_seed(12)
    m = _seeded(Dropouts)
    calib = [(torch.randn(2, 5, 8, generator=g),) for _ in range(2)]
    sim = _calibrated(m, calib, platform)
    prog = sim.program(*calib[0], mode=mode)
    assert prog.counts["kept"] == 2  # the in-place dropout goes to the dispatch
    for x in _inputs((2, 5, 8), 4, 13):
        got = prog(x)
        if mode is not Mode.HYBRID:
            assert prog.last_prepared == prog.counts["prepared"]
        assert_bits_equal(got, sim.run(x, mode=mode))
        assert_bits_equal(got, _calibrated(m, calib, platform).run(x, mode=mode))
    assert prog.fallbacks == 0


def test_an_eval_dropout_step_leaves_every_other_call_to_the_dispatch():
    """The kept step answers only ``F.dropout(x, p, training=False)`` with 0 <= p <= 1 on a
    plain tensor, not fused into a GEMM; training, in place, p out of range or not a number,
    a tensor subclass, unknown arguments and a fused op go to the dispatch."""
    from quantlab.simulate import program_steps as P

    class Full:
        name, run = "d", P.ProgramRun()

        def __init__(self):
            self.seen, self.kept = [], []
            self.sim = self
            self._fused_into = {}

        def dispatch(self, args, kwargs):
            self.seen.append((args, kwargs))
            return "dispatched"

        def _kept_input(self, x, st, name):
            self.kept.append((x, name))

    full = Full()
    step = P._EvalDropout(full, 0)
    x = torch.randn(3)
    assert step(x, 0.1, False) is x and step(x, p=1, training=False, inplace=False) is x
    assert step(input=x, p=0.0, training=0) is x
    assert full.kept == [(x, "d")] * 3 and not full.seen
    others = [
        ((x,), {}),  # F.dropout's training default is True
        ((x, 0.1, True), {}),
        ((x, 0.1, False, True), {}),
        ((x,), {"p": 1.5, "training": False}),
        ((x,), {"p": -0.1, "training": False}),
        ((x,), {"p": torch.tensor(0.1), "training": False}),
        ((nn.Parameter(x),), {"training": False}),
        ((x,), {"training": False, "generator": None}),
    ]
    for args, kwargs in others:
        assert step(*args, **kwargs) == "dispatched"
    full._fused_into = {"d": "conv"}
    assert step(x, 0.1, False) == "dispatched"
    assert len(full.seen) == len(others) + 1 and len(full.kept) == 3
