"""roll, tile, index_select, gather, repeat_interleave, tril, triu, unfold (Tensor.unfold and
F.unfold), adaptive_max_pool1d and F.pad's reflect, replicate and circular modes select, repeat
or copy values: each keeps its input's quantization
(the J6 plugin's QTensor keeps the scale through them, its wrap-ret ops), in FIXED mode with the
codes moved by the same call (tril / triu fill the zero point's value), so the next op takes
them as they arrive instead of requantizing at a scale of its own. torch.max / torch.min of
one tensor (over a dimension: values and indices) keep it too. Their ONNX forms are checked in
tests/export/test_onnx_runtime_paths.py. On J6, torch.where of a tensor and a number keeps the
tensor's quantization (the number on its grid); torch.where of two tensors and the
elementwise maximum / minimum of two tensors requantize both to their own output scale; abs
keeps its input's quantization, the lowest code's magnitude saturating."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import Tensor, nn

from quantlab.numerics.quantize import dequantize, quantize
from quantlab.op_kinds import OpCategory, classify
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator, same_grid

ORDER = torch.tensor([5, 0, 7, 7, 2])

# case -> (op type, its call on a (2, 8, 6) tensor)
CALLS = {
    "roll": ("roll", lambda y: torch.roll(y, shifts=(2, -1), dims=(1, 2))),
    "tile": ("tile", lambda y: y.tile((1, 2, 1))),
    "index_select": ("index_select", lambda y: y.index_select(1, ORDER)),
    "gather": ("gather", lambda y: torch.gather(y, 2, torch.arange(5, -1, -1).expand(2, 8, 6))),
    "repeat_interleave": ("repeat_interleave", lambda y: y.repeat_interleave(2, dim=1)),
    "tril": ("tril", lambda y: torch.tril(y, diagonal=-1)),
    "triu": ("triu", lambda y: y.triu(1)),
    "pad_reflect": ("pad", lambda y: F.pad(y, (0, 0, 2, 1), mode="reflect")),
    "pad_replicate": ("pad", lambda y: F.pad(y, (0, 0, 1, 3), mode="replicate")),
    "pad_circular": ("pad", lambda y: F.pad(y, (0, 0, 3, 2), mode="circular")),
    "channel_shuffle": ("channel_shuffle", lambda y: F.channel_shuffle(y, 4)),
    # sliding windows; F.unfold's im2col zero-padded (the padding reads the zero point's value)
    "unfold": ("unfold", lambda y: y.unfold(1, 6, 2)),
    "unfold_im2col": ("unfold", lambda y: F.unfold(y.unsqueeze(1), (10, 1), padding=(1, 0))),
    # max pooling picks input values (as max_pool2d and adaptive_max_pool2d)
    "adaptive_max_pool1d": (
        "adaptive_max_pool1d",
        lambda y: F.adaptive_max_pool1d(y.transpose(1, 2), 6),
    ),
}


class _Then(nn.Module):
    """linear -> the selecting op -> linear."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.a, self.b, self.fn = nn.Linear(6, 6), nn.Linear(6, 3), fn

    def forward(self, x):
        return self.b(self.fn(self.a(x)))


def _calibrated(model: nn.Module, platform: str, seed: int, **kw) -> Simulator:
    """``model`` (made after torch's seed 0 is set) calibrated on two (2, 8, 6) batches."""
    sim = Simulator(model.eval(), platform, **kw)
    g = torch.Generator().manual_seed(seed)
    sim.calibrate([(torch.randn(2, 8, 6, generator=g),) for _ in range(2)], progress=False)
    return sim


def _sim(op: str, platform: str, **kw) -> Simulator:
    torch.manual_seed(0)
    return _calibrated(_Then(CALLS[op][1]), platform, 1, **kw)


class _Kinds(torch.overrides.TorchFunctionMode):
    """Every call's ``classify`` answer, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(classify(func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def test_each_is_a_pass_through_op():
    x = torch.randn(2, 8, 6)
    for case, (op, fn) in CALLS.items():
        with _Kinds() as kinds:
            fn(x)
        assert (op, OpCategory.PASS_THROUGH) in kinds.seen, case


def test_max_min_and_pad_are_classified_by_their_arguments():
    """One tensor's maximum or minimum (of all its elements, or over a dimension, with its
    indices) is a pass-through op, two tensors' the elementwise maximum / minimum, which
    requantizes both (through ``out=``: not modelled); F.pad is a pass-through op in every
    mode torch has (a constant fill is snapped to the input's grid: test_constant_pad_*)."""
    x, y = torch.randn(2, 8, 6), torch.randn(2, 8, 6)
    with _Kinds() as kinds:
        torch.max(x), x.max(1), torch.min(x, dim=2, keepdim=True), x.min()
    assert (
        kinds.seen
        == [("max", OpCategory.PASS_THROUGH), ("max", OpCategory.PASS_THROUGH)]
        + [("min", OpCategory.PASS_THROUGH)] * 2
    )
    with _Kinds() as kinds:
        (
            torch.max(x, y),
            x.min(y),
            torch.max(x, other=y),
            torch.maximum(x, y),
            y.minimum(x),
            torch.max(x, y, out=torch.empty(2, 8, 6)),
            torch.maximum(x.long(), y.long()),
            F.pad(x, (1, 1)),
            F.pad(x, (1, 1), value=2),
        )
    pair = [("maximum", OpCategory.REQUANT), ("minimum", OpCategory.REQUANT)]
    seen = [k for k in kinds.seen if k is not None and k[0] in ("maximum", "minimum", "pad")]
    pads = [("pad", OpCategory.PASS_THROUGH)] * 2
    assert seen == [*pair, pair[0], *pair] + [("maximum", None)] * 2 + pads


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("op", list(CALLS))
@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_the_output_keeps_the_input_quantization(op, mode, platform):
    """The op's output is its function of the input's quantized values, at the input's scale
    (FIXED: with the codes the same function gives), and the next linear layer takes it as it
    arrives."""
    sim = _sim(op, platform)
    op_type, fn = CALLS[op]
    x = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(3))
    arrived = {}
    trace = sim.trace(x, mode=mode, on_call=lambda o: arrived.setdefault(o.call.name, o.incoming))
    name = next(n for n in trace.order if n.split(":")[1].startswith(f"{op_type}#"))
    src = trace.qinfo["a:linear#0"]
    (info,) = trace.qinfo[name]
    assert info.dtype is src.dtype and float(info.scale) == float(src.scale)
    assert_bits_equal(trace.outputs[name], fn(trace.outputs["a:linear#0"]))
    if mode is Mode.FIXED:
        want = quantize(trace.outputs[name], info.scale, info.dtype, zero_point=info.zero_point)
        on_grid = dequantize(want, info.scale, zero_point=info.zero_point)
        assert_bits_equal(trace.outputs[name], on_grid)  # every value on the input's grid
        if op_type in same_grid.LAYOUT_OPS:  # the codes moved with the values
            assert_bits_equal(info.codes, want)
    (into_b,) = arrived["b:linear#0"]
    assert into_b is not None and float(into_b.scale) == float(src.scale)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_steady_runs_keep_the_bits(monkeypatch, mode):
    build_in_first_run(monkeypatch)
    for op in ("roll", "gather", "tril", "pad_reflect", "unfold_im2col", "adaptive_max_pool1d"):
        fast, captured = _sim(op, "j6m"), _sim(op, "j6m", steady_programs=False)
        g = torch.Generator().manual_seed(4)
        xs = [torch.randn(2, 8, 6, generator=g) for _ in range(2)]
        for x in xs * 3:
            assert_bits_equal(fast.run(x, mode=mode), captured.run(x, mode=mode))
        state = fast.steady_programs.status((xs[0],), mode)
        assert state.program is not None and state.program.fallbacks == 0


class _Padded(nn.Module):
    """linear -> tanh -> F.pad(value=fill) -> linear, and the padded tensor as an output."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.a, self.b, self.fill = nn.Linear(6, 6), nn.Linear(6, 3), fill

    def forward(self, x):
        y = F.pad(torch.tanh(self.a(x)), (0, 0, 2, 1), value=self.fill)
        return self.b(y), y


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
@pytest.mark.parametrize("fill", [0.0, -0.37, 0.5, 1e4, -float("inf")])
@pytest.mark.parametrize("symmetry", ["SYMMETRIC", "ASYMMETRIC"])
def test_constant_pad_keeps_the_grid_with_its_fill_snapped(fill, mode, platform, symmetry):
    """The padded tensor keeps its input's quantization; its fill is the fill quantized on that
    grid (the rounding of the platform, saturating: 1e4 and -inf read as the extreme codes), as
    masked_fill's fill is; the next linear layer takes it as it arrives."""
    torch.manual_seed(0)
    spec = QConfigSpec(global_=OpQConfig(observer="MINMAX", activation_symmetry=symmetry))
    sim = _calibrated(_Padded(fill), platform, 1, qconfig=spec)
    x = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(3))
    arrived = {}
    trace = sim.trace(x, mode=mode, on_call=lambda o: arrived.setdefault(o.call.name, o.incoming))
    src, (info,) = trace.qinfo[":tanh#0"], trace.qinfo[":pad#0"]
    assert info.dtype is src.dtype and float(info.scale) == float(src.scale)
    assert info.zero_point == src.zero_point
    zp = src.zero_point
    rounding = sim.platform.fake_round
    code = quantize(torch.tensor(fill), src.scale, src.dtype, rounding, zero_point=zp)
    on_grid = float(dequantize(code, src.scale, zero_point=zp))
    want = F.pad(trace.outputs[":tanh#0"], (0, 0, 2, 1), value=on_grid)
    assert_bits_equal(trace.outputs[":pad#0"], want)
    (into_b,) = arrived["b:linear#0"]
    assert into_b is not None and float(into_b.scale) == float(src.scale)
    ops = sim.ops.set_index("op_type")
    assert ops.loc["pad", "category"] == "PASS_THROUGH" and not ops.loc["pad", "fixed_in_float"]


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_constant_pad_steady_runs_keep_the_bits(monkeypatch, mode):
    build_in_first_run(monkeypatch)
    for fill in (0.0, -0.37):
        sims = []
        for steady in (True, False):
            torch.manual_seed(0)
            sims.append(_calibrated(_Padded(fill), "j6m", 1, steady_programs=steady))
        g = torch.Generator().manual_seed(4)
        xs = [torch.randn(2, 8, 6, generator=g) for _ in range(2)]
        for x in xs * 3:
            for a, b in zip(sims[0].run(x, mode=mode), sims[1].run(x, mode=mode), strict=True):
                assert_bits_equal(a, b)
        state = sims[0].steady_programs.status((xs[0],), mode)
        assert state.program is not None and state.program.fallbacks == 0


class _Extremes(nn.Module):
    """linear -> the maximum over a dimension (values and indices) and the minimum of all
    elements -> linear, and the indices as an output."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        y = self.a(x)
        hi, where = torch.max(y, dim=1)
        return self.b(hi) * y.min(), where


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_max_over_a_dimension_keeps_the_grid_and_gives_torchs_indices(mode, platform):
    """The values keep the input's quantization and the next linear layer takes them as they
    arrive; the indices are torch's on the quantized values (the first among equal codes),
    an int64 tensor with no quantization; steady runs and a program give the same bits."""
    torch.manual_seed(0)
    model = _Extremes().eval()
    g = torch.Generator().manual_seed(1)
    sim = Simulator(model, platform, steady_programs=False)
    sim.calibrate([(torch.randn(2, 8, 6, generator=g),) for _ in range(2)], progress=False)
    x = torch.randn(2, 8, 6, generator=g) * 0.05  # few codes: many equal values per column
    arrived = {}
    trace = sim.trace(x, mode=mode, on_call=lambda o: arrived.setdefault(o.call.name, o.incoming))
    src = trace.qinfo["a:linear#0"]
    values, indices = trace.qinfo[":max#0"]
    assert values.dtype is src.dtype and float(values.scale) == float(src.scale)
    assert indices is None
    want = torch.max(trace.outputs["a:linear#0"], dim=1)
    got = trace.outputs[":max#0"]
    assert_bits_equal(got[0], want.values)
    assert_bits_equal(got[1], want.indices)
    ties = (trace.outputs["a:linear#0"] == want.values[:, None]).sum(1) > 1
    assert ties.any()  # the first index among equal values is what is checked
    (into_b,) = arrived["b:linear#0"]
    assert into_b is not None and float(into_b.scale) == float(src.scale)
    assert trace.qinfo[":min#0"][0].scale is src.scale
    steady = Simulator(model, platform)
    steady.share_calibration(sim)
    prog = steady.program(x, mode=mode)
    for scale in (0.05, 1.0, 3.0):
        x2 = torch.randn(2, 8, 6, generator=g) * scale
        for a, b in zip(prog(x2), sim.run(x2, mode=mode), strict=True):
            assert_bits_equal(a, b)
    assert prog.fallbacks == 0


def test_where_is_classified_by_its_operands():
    """torch.where of two float tensors requantizes both to its output (as cat); of one float
    tensor and one number it keeps the tensor's quantization (as masked_fill); any other
    where is not modelled."""
    x, y, m = torch.randn(2, 8, 6), torch.randn(2, 8, 6), torch.rand(2, 8, 6) > 0.5
    with _Kinds() as kinds:
        torch.where(m, x, y), torch.where(m[:1], x, y[:, :1]), torch.where(m, x, 0.0)
        torch.where(m, -1e4, y), torch.where(m, x, torch.tensor(2.0))
        torch.where(condition=m, input=x, other=y)
    assert [k for k in kinds.seen if k[0] == "where"] == [("where", OpCategory.REQUANT)] * 2 + [
        ("where", OpCategory.PASS_THROUGH)
    ] * 3 + [("where", OpCategory.REQUANT)]
    with _Kinds() as kinds:
        x.where(m, y), torch.where(m, 1.0, 2.0), torch.where(m, x.long(), 3)
        torch.where(m, x, y, out=torch.empty(2, 8, 6))
        torch.where(m, x, torch.ones(1, requires_grad=True)[0]), torch.where(m)
    assert [k for k in kinds.seen if k[0] == "where"] == [("where", None)] * 6


class _Selects(nn.Module):
    """Two linear layers, then torch.where of both (by their comparison), the result's
    negative part replaced by a number, and a number where a mask from the input holds; a
    linear layer after."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        both = torch.where(a > b, a, b)
        floor = torch.where(both > 0, both, -1e4)
        return self.c(torch.where(x[..., :1] > 1.0, 0.25, floor))


def _selects(platform: str, **kw) -> Simulator:
    torch.manual_seed(0)
    return _calibrated(_Selects(), platform, 5, **kw)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_where_selects_on_the_grids_it_keeps_or_requantizes_to(mode):
    """On J6: where of two tensors takes each element from its operand requantized to the
    where's own output scale (FAKE: the fake quant of the float select; FIXED: the operand's
    codes requantized, within half an output step of its value); a number beside one tensor
    is quantized on that tensor's grid (-1e4 saturates to the lowest code) and the output
    keeps that grid; the next linear layer takes the result as it arrives."""
    sim = _selects("j6m")
    x = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(6)) * 1.5
    arrived = {}
    trace = sim.trace(x, mode=mode, on_call=lambda o: arrived.setdefault(o.call.name, o.incoming))
    out = trace.outputs
    a, b = out["a:linear#0"], out["b:linear#0"]
    grid = trace.qinfo[":where#0"]  # requantized: its own QInfo
    s, dt = grid.scale, grid.dtype
    selected = torch.where(a > b, a, b)
    if mode is Mode.FAKE:
        fq = dequantize(quantize(selected, s, dt, sim.platform.fake_round), s)
        assert_bits_equal(out[":where#0"], fq)
    else:
        inside = selected.abs() <= float(s) * dt.qmax
        assert inside.float().mean() > 0.9
        err = (out[":where#0"] - selected).abs()[inside]
        assert (err <= float(s) / 2 * (1 + 1e-6)).all()

    def snapped(number: float) -> Tensor:
        return dequantize(quantize(torch.tensor(number), s, dt, sim.platform.fake_round), s)

    assert float(snapped(-1e4)) == dt.qmin * float(s)
    both = out[":where#0"]
    floor = torch.where(both > 0, both, snapped(-1e4))
    for name, want in (
        (":where#1", floor),
        (":where#2", torch.where(x[..., :1] > 1.0, snapped(0.25), floor)),
    ):
        (info,) = trace.qinfo[name]
        assert info.dtype is dt and float(info.scale) == float(s)  # kept, not requantized
        assert_bits_equal(out[name], want)
    (into_c,) = arrived["c:linear#0"]
    assert float(into_c.scale) == float(s)
    with torch.no_grad():
        model_bits = sim.model(x)
    assert_bits_equal(sim.run(x, mode=Mode.FLOAT), model_bits)


def test_runtime_profiles_run_where_in_float():
    """onnxruntime's Where between Dequantize and Quantize is not modelled: its profiles list
    where among their float fallbacks, as masked_fill."""
    sim = _selects("onnxruntime")
    ops = sim.ops.set_index("name")
    for name in (":where#0", ":where#1", ":where#2"):
        assert ops.loc[name, "fixed_kernel"] == "float (not supported on this platform)"


class _Pairs(nn.Module):
    """The elementwise maximum and minimum of two linear layers' outputs, then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        return self.c(torch.maximum(a, b) - torch.min(a, b * 0.5))


def _pairs(platform: str, **kw) -> Simulator:
    torch.manual_seed(0)
    return _calibrated(_Pairs(), platform, 8, **kw)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_maximum_and_minimum_requantize_both_operands(mode):
    """On J6 the elementwise maximum / minimum of two tensors takes each element from its
    operand requantized to the op's own output scale (FAKE: the fake quant of the float
    maximum; FIXED: within half an output step of it); FLOAT gives the model's bits. The
    runtime profiles run both in float."""
    sim = _pairs("j6m")
    x = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(9))
    trace = sim.trace(x, mode=mode)
    out = trace.outputs
    a, b = out["a:linear#0"], out["b:linear#0"]
    for name, want in (
        (":maximum#0", torch.maximum(a, b)),
        (":minimum#0", torch.min(a, out[":mul#0"])),
    ):
        info = trace.qinfo[name]
        s, dt = info.scale, info.dtype
        if mode is Mode.FAKE:
            assert_bits_equal(
                out[name], dequantize(quantize(want, s, dt, sim.platform.fake_round), s)
            )
        else:
            inside = want.abs() <= float(s) * dt.qmax
            assert inside.float().mean() > 0.9
            assert ((out[name] - want).abs()[inside] <= float(s) / 2 * (1 + 1e-6)).all()
    with torch.no_grad():
        model_bits = sim.model(x)
    assert_bits_equal(sim.run(x, mode=Mode.FLOAT), model_bits)
    ops = _pairs("onnxruntime").ops.set_index("name")
    for name in (":maximum#0", ":minimum#0"):
        assert ops.loc[name, "fixed_kernel"] == "float (not supported on this platform)"


class _Magnitude(nn.Module):
    """A linear layer, |x| (a function and the method), a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        y = torch.abs(self.a(x))
        return self.b(y + y.abs())


def _magnitude(platform: str, **kw) -> Simulator:
    torch.manual_seed(0)
    return _calibrated(_Magnitude(), platform, 11, **kw)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_abs_keeps_the_grid_and_saturates_the_lowest_code(mode):
    """On J6 |x| keeps its input's quantization: each value's magnitude, except the lowest
    code's (-128 at int8: 128 is no code), which saturates to the highest; inputs scaled past
    the calibrated range reach it. The runtime profiles run abs in float."""
    sim = _magnitude("j6m")
    x = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(12)) * 4
    arrived = {}
    trace = sim.trace(x, mode=mode, on_call=lambda o: arrived.setdefault(o.call.name, o.incoming))
    src = trace.qinfo["a:linear#0"]
    (info,) = trace.qinfo[":abs#0"]
    assert info.dtype is src.dtype and float(info.scale) == float(src.scale)
    a = trace.outputs["a:linear#0"]
    lowest = float(src.scale) * src.dtype.qmin
    assert (a == lowest).any()  # saturated inputs: the lowest code
    top = float(src.scale) * src.dtype.qmax
    assert_bits_equal(trace.outputs[":abs#0"], a.abs().clamp_max(top))
    (into_b,) = arrived["b:linear#0"]
    assert into_b is not None
    ops = _magnitude("onnxruntime").ops.set_index("name")
    assert ops.loc[":abs#0", "fixed_kernel"] == "float (not supported on this platform)"


# model -> (its calibrated Simulator's maker, the test inputs' seed and scale): the selects
# that snap a number or saturate (where, abs) or requantize two inputs (where, maximum)
SELECT_MODELS = {
    "where": (_selects, 7, 1.5),
    "pairs": (_pairs, 10, 1.5),
    "abs": (_magnitude, 13, 4),
}


@pytest.mark.parametrize("model", list(SELECT_MODELS))
@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_select_models_become_traced_programs_with_the_captured_bits(monkeypatch, mode, model):
    build_in_first_run(monkeypatch)
    make, seed, scale = SELECT_MODELS[model]
    fast, captured = make("j6m"), make("j6m", steady_programs=False)
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(2, 8, 6, generator=g) * scale for _ in range(2)]
    for x in xs * 3:
        assert_bits_equal(fast.run(x, mode=mode), captured.run(x, mode=mode))
    state = fast.steady_programs.status((xs[0],), mode)
    assert state.program is not None and state.program.fallbacks == 0


class _Ordered(nn.Module):
    """linear -> top-k, sort, k-th value, median and running maximum over dim 1 -> linear on
    each value output; the indices as outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        y = self.a(x)
        top, where = y.topk(3, dim=1)
        ordered = torch.sort(y, dim=1, descending=True).values
        kth = y.kthvalue(2, dim=1).values
        med = y.median(dim=1).values
        run = torch.cummax(y, dim=1).values
        summed = self.b(top).sum() + self.b(ordered).sum() + self.b(kth).sum()
        return summed + self.b(med).sum() + self.b(run).sum() + torch.msort(y).amax(), where


ORDERED = ("topk", "sort", "kthvalue", "median", "cummax", "msort")


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_orderings_keep_the_grid_and_give_torchs_values(mode):
    """top-k, sort, msort, k-th value, median and cummax pick input values: their values keep
    the input's quantization (the next linear takes them as they arrive), their int64 indices
    none; they equal torch's op on the quantized input; steady programs give the same bits."""
    torch.manual_seed(0)
    model = _Ordered().eval()
    g = torch.Generator().manual_seed(2)
    sim = Simulator(model, "j6m", steady_programs=False)
    sim.calibrate([(torch.randn(2, 8, 6, generator=g),) for _ in range(2)], progress=False)
    x = torch.randn(2, 8, 6, generator=g)
    arrived = {}
    trace = sim.trace(x, mode=mode, on_call=lambda o: arrived.setdefault(o.call.name, o.incoming))
    ops = sim.ops.set_index("op_type")
    assert (ops.loc[list(ORDERED), "category"] == "PASS_THROUGH").all()
    src, y = trace.qinfo["a:linear#0"], trace.outputs["a:linear#0"]
    for op, fn in (
        ("topk", lambda y: y.topk(3, dim=1)),
        ("sort", lambda y: torch.sort(y, dim=1, descending=True)),
        ("kthvalue", lambda y: y.kthvalue(2, dim=1)),
        ("median", lambda y: y.median(dim=1)),
        ("cummax", lambda y: torch.cummax(y, dim=1)),
    ):
        values, indices = trace.qinfo[f":{op}#0"]
        assert values.scale is src.scale and values.dtype is src.dtype and indices is None
        assert_bits_equal(trace.outputs[f":{op}#0"][0], fn(y)[0])
    for name, incoming in arrived.items():
        if name.startswith("b:linear"):
            assert incoming[0] is not None and incoming[0].scale is src.scale
    steady = Simulator(model, "j6m")
    steady.share_calibration(sim)
    prog = steady.program(x, mode=mode)
    for scale in (0.5, 2.0):
        x2 = torch.randn(2, 8, 6, generator=g) * scale
        for a, b in zip(prog(x2), sim.run(x2, mode=mode), strict=True):
            assert_bits_equal(a, b)
    assert prog.fallbacks == 0
