"""masked_fill on a quantized tensor as the J6 plugin computes it (qtensor.py's
``_qtensor_masked_fill``): the output keeps the input's dtype and scale, and the fill value is
quantized at that scale, saturating. So an attention score masked with -1e4 (or -inf) reads as
the scores' lowest code before the softmax, and the softmax's input scale is the scores' own
(not one stretched to -1e4). On the runtime profiles masked_fill runs in float, as before.
An additive mask of huge values (-1e4, float32's lowest) runs in every mode."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from program_switch import build_in_first_run
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import dequantize, quantize
from quantlab.numerics.rounding import Round
from quantlab.op_kinds import OpCategory, classify
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator, same_grid

SCORES = "m:div#0"  # the scores, scaled
FILL = "m:masked_fill#0"


class _Masked(nn.Module):
    """Attention scores of two projections, masked, then a softmax."""

    def __init__(self, fill: float, in_place: bool = False, both: bool = False) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)
        self.fill, self.in_place, self.both = fill, in_place, both

    def forward(self, x, mask):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 4
        if self.in_place:
            scores.masked_fill_(mask, self.fill)
        else:
            scores = scores.masked_fill(mask, self.fill)
        probs = scores.softmax(-1)
        return (scores, probs) if self.both else probs


class _Wrapped(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.m = inner

    def forward(self, x, mask):
        return self.m(x, mask)


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, 16, generator=g)
    mask = torch.zeros(2, 8, 8, dtype=torch.bool)
    mask[0, :, 6:] = True
    mask[1, :, 3:] = True
    return x, mask


def _sim(fill: float, platform: str = "j6m", dtype: DType | None = None, **kw) -> Simulator:
    torch.manual_seed(0)
    spec = None if dtype is None else QConfigSpec(global_=OpQConfig(output_dtype=dtype))
    inner = _Masked(fill, kw.pop("in_place", False), kw.pop("both", False))
    sim = Simulator(_Wrapped(inner).eval(), platform, spec, **kw)
    sim.calibrate([_inputs(1), _inputs(2)], progress=False)
    return sim


def test_masked_fill_is_a_pass_through_op_in_every_spelling():
    x = torch.randn(3)
    m = x > 0
    for fn in (torch.masked_fill, torch.Tensor.masked_fill, torch.Tensor.masked_fill_):
        assert classify(fn, (x, m, 0.5), {}) == ("masked_fill", OpCategory.PASS_THROUGH)


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
@pytest.mark.parametrize("fill", [-1e4, float("-inf"), -0.3, 2.5])
@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_the_fill_takes_the_input_grid(mode, fill, dtype):
    """masked_fill's output is the scores' quantized values with the masked ones replaced by
    the fill quantized at the scores' scale (saturating), bit for bit in FAKE and FIXED; the
    softmax takes it as it arrives, at the scores' dtype and scale."""
    sim = _sim(fill, dtype=dtype)
    x, mask = _inputs(3)
    arrived = {}

    def seen(obs):
        arrived[obs.call.name] = obs.incoming

    trace = sim.trace(x, mask, mode=mode, on_call=seen)
    info = trace.qinfo[SCORES]
    s = info.scale
    code = quantize(torch.tensor(fill), s, dtype, sim.platform.fake_round)
    if fill < -100:
        assert int(code) == -(2 ** (dtype.bits - 1))
    want = trace.outputs[SCORES].masked_fill(mask, float(dequantize(code, s)))
    assert_bits_equal(trace.outputs[FILL], want)
    (fill_info,) = trace.qinfo[FILL]
    assert fill_info.dtype is dtype and float(fill_info.scale) == float(s)
    (softmax_in,) = arrived["m:softmax#0"]
    assert softmax_in is not None and float(softmax_in.scale) == float(s)


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_a_masked_key_keeps_weight_on_j6(dtype):
    """The J6 effect the model shows: -1e4 saturates to the scores' lowest code, -max|score|
    at int8 and int16 alike, so a masked key keeps weight after the softmax where the float
    run masks it whole; the unmasked keys keep the scores' resolution (before, the softmax
    stretched its own input scale to -1e4 and they all read alike)."""
    x, mask = _inputs(3)
    out = _sim(-1e4, dtype=dtype).run(x, mask, mode=Mode.FIXED)
    ref = _sim(-1e4).run(x, mask, mode=Mode.FLOAT)
    assert float(ref[mask].abs().max()) == 0.0
    assert float(out[mask].min()) > 1e-2
    assert len(set(out[~mask].tolist())) > 8


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_in_place_and_out_of_place_agree(mode):
    x, mask = _inputs(4)
    a = _sim(-1e4).run(x, mask, mode=mode)
    b = _sim(-1e4, in_place=True).run(x, mask, mode=mode)
    assert_bits_equal(a, b)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_steady_runs_keep_the_bits(monkeypatch, mode):
    """As prepared calls and in a traced program, the fill stays snapped."""
    build_in_first_run(monkeypatch)
    fast = _sim(-1e4, steady_programs=True, both=True)
    captured = _sim(-1e4, steady_programs=False, both=True)
    xs = [_inputs(5), _inputs(6)]
    for x, mask in xs * 3:
        out, want = fast.run(x, mask, mode=mode), captured.run(x, mask, mode=mode)
        for a, b in zip(out, want, strict=True):
            assert_bits_equal(a, b)
        masked = out[0][mask]  # the lowest code of the scores' grid, not -1e4
        assert float(masked.min()) == float(masked.max()) > -100
    state = fast.steady_programs.status(xs[0], mode)
    assert state.program is not None and state.program.fallbacks == 0


@pytest.mark.parametrize("platform", ["onnxruntime", "tflite", "litert_xnnpack"])
def test_runtime_profiles_run_masked_fill_in_float(platform):
    """The fill is the value itself (masked_fill is listed in their float_fallback_ops)."""
    fill = -7.123
    sim = _sim(fill, platform)
    assert not sim.supported("masked_fill", OpCategory.PASS_THROUGH)
    x, mask = _inputs(3)
    trace = sim.trace(x, mask, mode=Mode.FIXED)
    assert set(trace.outputs[FILL][mask].tolist()) == {float(torch.tensor(fill))}
    assert trace.qinfo[FILL] is None


@pytest.mark.parametrize("in_place", [False, True])
def test_training_through_the_snapped_fill(in_place):
    """QAT (train_forward in FAKE mode): the fill is snapped there too, and the gradient
    reaches the projections through the unmasked scores only, finite."""
    sim = _sim(-1e4, in_place=in_place, both=True)
    x, mask = _inputs(7)
    scores, probs = sim.train_forward(x, mask, mode=Mode.FAKE)
    masked = scores.detach()[mask]
    assert float(masked.min()) == float(masked.max()) > -100
    (probs[..., 0].sum() + scores.masked_fill(mask, 0).sum()).backward()
    grads = [p.grad for p in sim.model.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_a_zero_fill_in_float_keeps_its_input_grid_on_a_runtime_profile(mode, monkeypatch):
    """On onnxruntime masked_fill runs in float (a float fallback), and a fill of 0 still
    records its input's grid (``same_grid.grid_of``: 0 is the zero point's value), as for a
    float op quantlab does not model."""
    sim = _sim(0.0, "onnxruntime")
    grids = []
    real = same_grid.grid_of

    def spy(call, *a):
        grids.append((call.op_type, real(call, *a)))
        return grids[-1][1]

    monkeypatch.setattr(same_grid, "grid_of", spy)
    sim.run(*_inputs(3), mode=mode)
    kept = [g for op, g in grids if op == "masked_fill"]
    assert kept and all(g is not None and g.dtype.is_int for g in kept)


class _AddMasked(nn.Module):
    """Scores plus an additive mask (1 - mask) * fill, then a softmax (BERT's form)."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)
        self.fill = fill

    def forward(self, x, keep):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 4
        return (scores + (1.0 - keep[:, None, :]) * self.fill).softmax(-1)


@pytest.mark.parametrize("fill", [-1e4, float(torch.finfo(torch.float32).min)])
@pytest.mark.parametrize("platform", ["j6m", "tflite"])
def test_an_additive_mask_of_huge_values_runs_in_every_mode(platform, fill):
    """The add's output scale covers the mask, so one code of the softmax's input spans more
    than exp's [-12, 0]: fixed mode's exp table covers that one code and fake mode's
    lowest code overflows float32 at float32's lowest value; both run, NaN-free, and agree
    where the platform's add keeps the mask (J6; TFLite's float32 output multiplier
    overflows at that scale and drops it, as TFLite does)."""
    torch.manual_seed(0)
    sim = Simulator(_AddMasked(fill).eval(), platform)
    x = torch.randn(2, 8, 16)
    keep = torch.ones(2, 8)
    keep[:, 6:] = 0
    sim.calibrate([(x, keep)], progress=False)
    fake, fixed = (sim.run(x, keep, mode=m) for m in (Mode.FAKE, Mode.FIXED))
    assert not bool(torch.isnan(fake).any() or torch.isnan(fixed).any())
    if platform == "j6m":
        assert float((fake - fixed).abs().max()) < 0.01
        assert float(fixed[..., 6:].abs().max()) == 0.0


def test_a_per_channel_input_is_refused_by_name():
    """The plugin's masked_fill takes a per-tensor scale; a per-channel one is refused with
    the op's name."""
    from types import SimpleNamespace

    from quantlab.simulate.qtensor import QInfo

    call = SimpleNamespace(name="m:masked_fill#0", args=(None, None, -1e4), kwargs={})
    src = QInfo(DType.INT8, torch.tensor([0.1, 0.2]), zero_point=0)
    with pytest.raises(ValueError, match="m:masked_fill#0.*per channel"):
        same_grid.snap_fill(call, torch.zeros(2), src, Round.HALF_EVEN)
