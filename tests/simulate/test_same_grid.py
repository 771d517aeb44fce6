"""Float ops that keep their input's grid (eval dropout, zero constant pad, zero masked_fill):
quantizing their output again at the same grid returns the recorded codes instead of
recomputing them, and every op's output is bit for bit what the full quantization gives, in
FIXED and FAKE mode, with and without zero points, under observers whose scales differ between
producer and consumer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

import quantlab.simulate.same_grid as same_grid
from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.modes import OpMode


class PadDropNet(nn.Module):
    """Convolutions behind zero pads (as EfficientNet-Lite's 'same' padding), an eval dropout
    before a matmul, pads the shortcut must not take (value 0.5, -0.0) and a reflect pad (a
    pass-through op, which moves the codes itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3)
        self.c2 = nn.Conv2d(8, 8, 3, groups=8)
        self.c3 = nn.Conv2d(8, 8, 3)
        self.c4 = nn.Conv2d(8, 8, 3)
        self.c5 = nn.Conv2d(8, 8, 3)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        y = F.relu6(self.c1(x))
        y = self.c2(F.pad(y, (1, 1, 1, 1)))
        y = self.c3(F.pad(y, (0, 1, 0, 1), value=0.0))
        z = self.c4(F.pad(y, (1, 1, 1, 1), value=0.5))
        z = z + self.c5(F.pad(y, (1, 1, 1, 1), mode="reflect"))
        z = self.c5(F.pad(z, (1, 1, 1, 1), value=-0.0))
        h = self.drop(z.mean((2, 3)))
        return self.head(h) @ self.drop(self.head.weight)


def _net():
    g = torch.Generator().manual_seed(4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        m = PadDropNet().eval()
    calib = [(torch.randn(2, 3, 12, 12, generator=g),) for _ in range(2)]
    return m, calib, (torch.randn(2, 3, 12, 12, generator=g),)


def _traces(platform, spec, mode, monkeypatch):
    m, calib, x = _net()
    sim = Simulator(m, platform, qconfig=spec)
    sim.calibrate(calib, progress=False)
    sim.run(*x, mode=mode)
    hits = []
    real = same_grid.codes_on_grid

    def spy(*a):
        hits.append(real(*a))
        return hits[-1]

    monkeypatch.setattr(same_grid, "codes_on_grid", spy)
    fast = sim.trace(*x, mode=mode)
    monkeypatch.setattr(same_grid, "codes_on_grid", lambda *a: None)
    full = sim.trace(*x, mode=mode)
    return fast, full, hits


SPECS = {
    "minmax": QConfigSpec(global_=OpQConfig(observer="MINMAX")),
    "percentile": QConfigSpec(global_=OpQConfig(observer="PERCENTILE")),
    # the padded convolutions' and the head's inputs on grids of their own: no shortcut
    "other_scales": QConfigSpec(
        global_=OpQConfig(observer="MINMAX"),
        by_module={m: OpQConfig(observer="FIXED", clip_range=(-5.0, 5.0)) for m in ("c2", "head")},
    ),
    "asymmetric": QConfigSpec(
        global_=OpQConfig(observer="MINMAX", activation_symmetry="ASYMMETRIC"),
        by_type={"conv2d": OpQConfig(high_precision_output=False)},
    ),
}


def _leaves(info) -> list:
    return info if isinstance(info, list) else [info]


@pytest.mark.parametrize("mode", [Mode.FIXED, Mode.FAKE])
@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
@pytest.mark.parametrize("spec", list(SPECS))
def test_same_grid_shortcut_gives_the_bits_of_full_quantization(platform, spec, mode, monkeypatch):
    fast, full, hits = _traces(platform, SPECS[spec], mode, monkeypatch)
    assert fast.order == full.order
    for name in full.order:
        a, b = fast.outputs[name], full.outputs[name]
        if isinstance(b, torch.Tensor):
            assert_bits_equal(a, b)
        qa, qb = fast.qinfo.get(name), full.qinfo.get(name)
        for ia, ib in zip(_leaves(qa), _leaves(qb), strict=True):  # a list: a pass-through op's
            if ib is not None and ib.codes is not None:
                assert_bits_equal(ia.codes, ib.codes)
    assert_bits_equal(fast.result, full.result)
    taken = sum(h is not None for h in hits)
    if spec == "minmax":  # producer and consumer scales agree: the eval dropout (the pads are
        assert taken >= 1  # pass-through ops, which keep the grid themselves)
    if spec == "other_scales":
        assert taken == 0 and hits  # recorded, asked, refused: the scales differ


def test_pads_with_other_values_or_modes_and_training_dropout_are_not_recorded():
    from quantlab.capture import OpCall
    from quantlab.numerics.dtypes import DType
    from quantlab.simulate.qtensor import QInfo, QTable

    x = torch.tensor([[1.0, -2.0]]) * 0.5
    codes = torch.tensor([[2, -4]], dtype=torch.int8)
    qt = QTable()
    qt.set(x, QInfo(DType.INT8, torch.tensor(0.25), codes))

    def recorded(op_type, func, args, kwargs, out) -> bool:
        call = OpCall("op", op_type, None, "", 0, func, args, kwargs)
        return same_grid.grid_of(call, out, qt, fixed=True) is not None

    assert recorded("pad", F.pad, (x, (1, 1)), {}, F.pad(x, (1, 1)))
    assert recorded("pad", F.pad, (x, (1, 1)), {"value": 0}, F.pad(x, (1, 1)))
    assert not recorded("pad", F.pad, (x, (1, 1)), {"value": 0.5}, F.pad(x, (1, 1), value=0.5))
    assert not recorded("pad", F.pad, (x, (1, 1)), {"value": -0.0}, F.pad(x, (1, 1), value=-0.0))
    assert not recorded("pad", F.pad, (x, (1, 1), "replicate"), {}, F.pad(x, (1, 1), "replicate"))
    assert recorded("dropout", F.dropout, (x, 0.2, False), {}, x)
    assert not recorded("dropout", F.dropout, (x, 0.2), {"training": True, "inplace": True}, x)
    assert not recorded("mul_", torch.Tensor.mul_, (x, 1.0), {}, x)
    # a recorded pad carries the padded codes, the zero point in the new places
    out = F.pad(x, (1, 2))
    got = same_grid.grid_of(OpCall("p", "pad", None, "", 0, F.pad, (x, (1, 2)), {}), out, qt, True)
    assert got.codes.tolist() == [[0, 2, -4, 0, 0]]
    # masked_fill of a bool mask with the value 0: the codes filled with the zero point
    fill = torch.Tensor.masked_fill
    rows = torch.tensor([[False, True]])
    for value, kept in ((0.0, True), (0, True), (-0.0, False), (0.5, False), (False, False)):
        out = x.masked_fill(rows, value)
        assert recorded("masked_fill", fill, (x, rows, value), {}, out) is kept, value
    assert not recorded("masked_fill", fill, (x, rows.float(), 0.0), {}, x.clone())
    qt.set(x, QInfo(DType.INT8, torch.tensor(0.25), codes, zero_point=3))
    call = OpCall("m", "masked_fill", None, "", 0, fill, (x, rows, 0.0), {})
    got = same_grid.grid_of(call, x.masked_fill(rows, 0.0), qt, True)
    assert got.codes.tolist() == [[2, 3]] and got.zero_point == 3


class HeadsNet(nn.Module):
    """Attention-style layout ops between GEMMs: view, transpose, permute, chunk, indexing,
    flatten, expand, contiguous, reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 6)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(b, t, 2, 8).transpose(1, 2)
        k = k.reshape(b, t, 2, 8).permute(0, 2, 3, 1)
        v = v.view(b, t, 2, 8).transpose(1, 2).contiguous()
        att = torch.softmax(q @ k, dim=-1)
        ctx = (att @ v).transpose(1, 2).flatten(2)
        first = ctx[:, :1].expand(b, t, 16)
        return self.out(ctx + first)


@pytest.mark.parametrize("platform", ["j6m", "onnxruntime"])
def test_layout_ops_carry_codes_with_the_bits_of_requantizing(platform, monkeypatch):
    """In FIXED mode a layout op applies itself to the codes too: the next op takes them
    instead of recovering them from the values (no quantize call), with the same bits."""
    import quantlab.simulate.qtensor as qtensor

    g = torch.Generator().manual_seed(2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        m = HeadsNet().eval()
    x = torch.randn(2, 5, 16, generator=g)
    sim = Simulator(m, platform)
    sim.calibrate([(torch.randn(2, 5, 16, generator=g),)], progress=False)
    sim.run(x, mode=Mode.FIXED)
    recovered = []
    real = qtensor.quantize
    monkeypatch.setattr(qtensor, "quantize", lambda *a, **k: recovered.append(1) or real(*a, **k))
    fast = sim.trace(x, mode=Mode.FIXED)
    assert not recovered
    monkeypatch.setattr(same_grid, "LAYOUT_OPS", frozenset())
    full = sim.trace(x, mode=Mode.FIXED)
    assert recovered  # without layout codes the GEMMs after the layout ops recover them
    carried = 0
    for name in full.order:
        a, b = fast.outputs[name], full.outputs[name]
        qa = fast.qinfo.get(name)
        if isinstance(a, torch.Tensor):
            assert_bits_equal(a.contiguous(), b.contiguous())
        if isinstance(qa, list):  # a layout op's leaves: codes of its values
            for leaf, info in zip(a if isinstance(a, tuple) else (a,), qa):
                assert info.codes is not None
                assert_bits_equal(info.codes, real(leaf, info.scale, info.dtype))
                carried += 1
    assert carried >= 10
    assert_bits_equal(fast.result, full.result)


class MutatedNet(nn.Module):
    """An eval dropout's output changed in place by float ops before a GEMM reads it."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.a, self.b, self.how = nn.Linear(6, 6), nn.Linear(6, 3), how
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        if self.how == "out_on_codes":  # out= over a quantized op's own output
            h = self.a(x)
            torch.neg(h, out=h)
            return self.b(h)
        h = self.drop(self.a(x))
        if self.how == "setitem":
            h[:, 0] = 0.123
        elif self.how == "out":  # written through out=: new values in the same tensor
            torch.neg(h, out=h)
        elif self.how == "index_fill_":
            h.index_fill_(1, torch.tensor([0, 2]), 0.37)
        else:  # on J6 a modelled op (its fill snapped to the grid), in place
            h.masked_fill_(h > 0.2, 0.37)
        return self.b(h)


@pytest.mark.parametrize("how", ["setitem", "index_fill_", "masked_fill_", "out", "out_on_codes"])
@pytest.mark.parametrize("mode", [Mode.FIXED, Mode.FAKE])
def test_a_grid_is_forgotten_when_a_float_op_changes_the_tensor(how, mode, monkeypatch):
    g = torch.Generator().manual_seed(6)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(6)
        m = MutatedNet(how).eval()
    x = torch.randn(4, 6, generator=g)
    sim = Simulator(m, "j6m", qconfig=SPECS["minmax"])
    sim.calibrate([(torch.randn(4, 6, generator=g),)], progress=False)
    fast = sim.run(x, mode=mode)
    monkeypatch.setattr(same_grid, "codes_on_grid", lambda *a: None)
    assert_bits_equal(fast, sim.run(x, mode=mode))


class DropThenLinear(nn.Module):
    """An eval dropout, a cast to the dtype the tensor has, and an in-place op quantlab does
    not model (floor_: the input tensor itself, new values) before linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.c = nn.Linear(6, 3)

    def forward(self, x):
        y = self.b(F.dropout(self.a(x), 0.2, self.training).float())
        return self.c(y.mul(4.0).floor_())


@pytest.mark.parametrize("raised", [False, True])
def test_an_op_returning_its_input_passes_its_producers_dtype_to_the_ops_table(raised):
    """The ops table (and so model check) gives an eval dropout and a same-dtype cast the dtype
    of the tensor they return, and their consumer that input dtype (not FLOAT32, which would
    claim a Quantize the deployed model does not have); an in-place op that writes new values
    into its input stays float."""
    spec = QConfigSpec(
        by_name={"a:linear#0": OpQConfig(output_dtype=DType.INT16)} if raised else {}
    )
    sim = Simulator(DropThenLinear().eval(), "j6m", spec)
    x = torch.randn(4, 6)
    sim.calibrate([(x,)], progress=False)
    sim.run(x, mode=Mode.FIXED)
    dt = dict(zip(sim.ops["name"], sim.ops["input_dtype"]))
    want = "INT16" if raised else "INT8"
    assert dt[":dropout#0"] == want and dt[":float#0"] == want and dt["b:linear#0"] == want
    assert dt["c:linear#0"] == "FLOAT32"  # floor_ wrote new values into its input
    # a run that replays the ops (sensitivity's) and a new qconfig keep what was learnt
    trace = sim.trace(x, mode=Mode.FAKE)
    sim.run(x, mode=Mode.FIXED, op_modes={"b:linear#0": OpMode(Mode.FIXED)}, replay=trace)
    sim.set_qconfig(sim.spec)
    assert dict(zip(sim.ops["name"], sim.ops["input_dtype"]))["b:linear#0"] == want
