"""roll, tile, index_select, gather, repeat_interleave, tril and triu select or repeat values:
each keeps its input's quantization (the J6 plugin's QTensor keeps the scale through them, its
wrap-ret ops), in FIXED mode with the codes moved by the same call (tril / triu fill the zero
point's value), so the next op takes them as they arrive instead of requantizing at a scale of
its own. Their ONNX forms are checked in tests/export/test_onnx_runtime_paths.py."""

from __future__ import annotations

import pytest
import torch
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics.quantize import quantize
from quantlab.op_kinds import OpCategory, classify
from quantlab.simulate import Mode, Simulator, steady_programs

ORDER = torch.tensor([5, 0, 7, 7, 2])

# op type -> its call on a (2, 8, 6) tensor
CALLS = {
    "roll": lambda y: torch.roll(y, shifts=(2, -1), dims=(1, 2)),
    "tile": lambda y: y.tile((1, 2, 1)),
    "index_select": lambda y: y.index_select(1, ORDER),
    "gather": lambda y: torch.gather(y, 2, torch.arange(5, -1, -1).expand(2, 8, 6)),
    "repeat_interleave": lambda y: y.repeat_interleave(2, dim=1),
    "tril": lambda y: torch.tril(y, diagonal=-1),
    "triu": lambda y: y.triu(1),
}


class _Then(nn.Module):
    """linear -> the selecting op -> linear."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.a, self.b, self.fn = nn.Linear(6, 6), nn.Linear(6, 3), fn

    def forward(self, x):
        return self.b(self.fn(self.a(x)))


def _sim(op: str, platform: str, **kw) -> Simulator:
    torch.manual_seed(0)
    sim = Simulator(_Then(CALLS[op]).eval(), platform, **kw)
    g = torch.Generator().manual_seed(1)
    sim.calibrate([(torch.randn(2, 8, 6, generator=g),) for _ in range(2)], progress=False)
    return sim


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
    for op in CALLS:
        with _Kinds() as kinds:
            CALLS[op](x)
        assert (op, OpCategory.PASS_THROUGH) in kinds.seen, op


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("op", list(CALLS))
@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_the_output_keeps_the_input_quantization(op, mode, platform):
    """The op's output is its function of the input's quantized values, at the input's scale
    (FIXED: with the codes the same function gives), and the next linear layer takes it as it
    arrives."""
    sim = _sim(op, platform)
    x = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(3))
    arrived = {}
    trace = sim.trace(x, mode=mode, on_call=lambda o: arrived.setdefault(o.call.name, o.incoming))
    name = next(n for n in trace.order if n.split(":")[1].startswith(f"{op}#"))
    src = trace.qinfo["a:linear#0"]
    (info,) = trace.qinfo[name]
    assert info.dtype is src.dtype and float(info.scale) == float(src.scale)
    assert_bits_equal(trace.outputs[name], CALLS[op](trace.outputs["a:linear#0"]))
    if mode is Mode.FIXED:
        want = quantize(trace.outputs[name], info.scale, info.dtype, zero_point=info.zero_point)
        if op not in ("tril", "triu"):  # moved with the values (same_grid.LAYOUT_OPS)
            assert_bits_equal(info.codes, want)
    (into_b,) = arrived["b:linear#0"]
    assert into_b is not None and float(into_b.scale) == float(src.scale)


@pytest.mark.parametrize("mode", [Mode.FAKE, Mode.FIXED])
def test_steady_runs_keep_the_bits(monkeypatch, mode):
    monkeypatch.setattr(steady_programs, "PROGRAM_AFTER_S", 0.0)
    for op in ("roll", "gather", "tril"):
        fast, captured = _sim(op, "j6m"), _sim(op, "j6m", steady_programs=False)
        g = torch.Generator().manual_seed(4)
        xs = [torch.randn(2, 8, 6, generator=g) for _ in range(2)]
        for x in xs * 3:
            assert_bits_equal(fast.run(x, mode=mode), captured.run(x, mode=mode))
        state = fast.steady_programs.status((xs[0],), mode)
        assert state.program is not None and state.program.fallbacks == 0
