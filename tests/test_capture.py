"""Op capture: stable names from module paths, call indices per op type, control flow,
model-level patterns as one op, and ops quantlab does not model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.capture import CaptureMode, ModuleTracker, _tracked_call_impl, model_constants
from quantlab.op_kinds import OpCategory, classify
from quantlab.ops import inverse_sigmoid
from quantlab.simulate import Mode, Simulator


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.act = nn.ReLU6()

    def forward(self, x):
        return x + self.act(self.conv(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)

    def forward(self, x, loops: int = 1):
        x = self.stem(x)
        for _ in range(loops):
            for b in self.blocks:
                x = b(x)
        y = x.mean((2, 3))
        y = torch.sigmoid(self.head(y))
        return inverse_sigmoid(y) * 2 + torch.sign(y)


def capture(model, *args, **kwargs):
    """(captured calls, output) of ``model(*args, **kwargs)``; each call runs as written."""
    calls = []

    def handler(call):
        calls.append(call)
        return call.result if call.result is not None else call.run()

    tracker = ModuleTracker(model)
    with torch.no_grad(), tracker, CaptureMode(tracker, handler, constants=model_constants(model)):
        out = model(*args, **kwargs)
    return calls, out


def test_names_module_paths_and_call_indices():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    calls, out = capture(net, x)
    names = [c.name for c in calls]
    assert names == [
        "stem:conv2d#0",
        "blocks.0.conv:conv2d#0",
        "blocks.0.act:relu6#0",
        "blocks.0:add#0",
        "blocks.1.conv:conv2d#0",
        "blocks.1.act:relu6#0",
        "blocks.1:add#0",
        ":mean#0",
        "head:linear#0",
        ":sigmoid#0",
        ":inverse_sigmoid#0",
        ":mul#0",
        ":sign#0",
        ":add#0",
    ]
    # inverse_sigmoid is one op: no log/clamp/div from inside it
    assert not any(c.op_type in ("log", "clamp", "div") for c in calls)
    assert torch.equal(out, net(x))
    by_name = {c.name: c for c in calls}
    assert by_name[":sign#0"].category is None  # not modelled: recorded, runs in float
    assert by_name["head:linear#0"].category is OpCategory.GEMM


def test_control_flow_repeats_get_new_call_indices():
    torch.manual_seed(0)
    net = Net().eval()
    calls, _ = capture(net, torch.randn(1, 3, 8, 8), 3)
    convs = [c.name for c in calls if c.name.startswith("blocks.0.conv:")]
    assert convs == ["blocks.0.conv:conv2d#0", "blocks.0.conv:conv2d#1", "blocks.0.conv:conv2d#2"]
    names = [c.name for c in calls]
    assert len(names) == len(set(names))


def test_classify_covers_the_op_list():
    x = torch.randn(2, 3)
    cases = {
        F.conv1d: "conv1d",
        F.conv2d: "conv2d",
        F.linear: "linear",
        torch.matmul: "matmul",
        torch.bmm: "matmul",
        torch.Tensor.__matmul__: "matmul",
        torch.add: "add",
        torch.Tensor.__radd__: "add",
        torch.Tensor.__rsub__: "sub",
        torch.mul: "mul",
        torch.Tensor.__truediv__: "div",
        torch.sum: "sum",
        torch.mean: "mean",
        torch.cat: "cat",
        torch.stack: "stack",
        torch.reshape: "reshape",
        torch.permute: "permute",
        torch.Tensor.__getitem__: "getitem",
        F.relu: "relu",
        torch.clamp: "clamp",
        F.max_pool2d: "max_pool2d",
        F.avg_pool2d: "avg_pool2d",
        F.interpolate: "interpolate",
        F.grid_sample: "grid_sample",
        torch.sigmoid: "sigmoid",
        torch.tanh: "tanh",
        torch.exp: "exp",
        torch.log: "log",
        torch.sqrt: "sqrt",
        torch.rsqrt: "rsqrt",
        torch.reciprocal: "reciprocal",
        torch.sin: "sin",
        torch.cos: "cos",
        F.softmax: "softmax",
        F.layer_norm: "layer_norm",
        F.gelu: "gelu",
        F.silu: "silu",
        inverse_sigmoid: "inverse_sigmoid",
    }
    for fn, op_type in cases.items():
        got = classify(fn, (x,), {})
        assert got is not None and got[0] == op_type and got[1] is not None, (fn, got)
    assert classify(F.hardtanh, (x, 0.0, 6.0), {}) == ("relu6", OpCategory.REQUANT)
    assert classify(F.relu6, (x,), {}) == ("relu6", OpCategory.REQUANT)  # as nn.ReLU6
    assert classify(torch.Tensor.size, (x,), {}) is None


def test_classify_remembers_kinds_by_function_but_reads_hardtanh_bounds_every_call():
    x = torch.randn(2, 3)
    for _ in range(2):  # the second round answers from the remembered kinds
        assert classify(torch.sigmoid, (x,), {}) == ("sigmoid", OpCategory.LUT)
        assert classify(torch.Tensor.size, (x,), {}) is None
        assert classify(torch.lgamma, (x,), {}) == ("lgamma", None)
        assert classify(F.hardtanh, (x, 0.0, 6.0), {}) == ("relu6", OpCategory.REQUANT)
        assert classify(F.hardtanh, (x, -1.0, 1.0), {}) == ("clamp", OpCategory.REQUANT)
        assert classify(F.hardtanh, (x,), {"min_val": 0.0, "max_val": 6.0})[0] == "relu6"


class Hooked(nn.Module):
    """A module whose own pre-hook computes (as weight parametrizations do)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lin.register_forward_pre_hook(lambda m, args: (torch.tanh(args[0]),))

    def forward(self, x):
        return self.lin(x) * 2


class Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        y = self.inner(x)
        if y.sum() > -1e30:
            raise RuntimeError("planted")
        return y


def test_module_paths_cover_own_hooks_and_are_popped_when_a_call_raises():
    plain_call = nn.Module.__dict__["_call_impl"]
    calls, out = capture(Hooked().eval(), torch.randn(2, 4))
    # the module's own pre-hook runs inside its call: its op takes the module's path
    assert [c.name for c in calls] == ["lin:tanh#0", "lin:linear#0", ":mul#0"]
    assert nn.Module.__dict__["_call_impl"] is plain_call

    net = Raises().eval()
    tracker = ModuleTracker(net)
    seen = []
    x = torch.randn(2, 4)  # made outside the run: a tensor made inside it is a constant
    try:
        with torch.no_grad(), tracker, CaptureMode(tracker, lambda c: seen.append(c) or c.run()):
            net(x)
    except RuntimeError as e:
        assert "planted" in str(e)
    else:
        raise AssertionError("the planted error did not propagate")
    assert [c.name for c in seen] == ["inner:linear#0", ":sum#0"]
    assert tracker.stack == [""]  # the raising call's path was popped
    assert nn.Module.__dict__["_call_impl"] is plain_call
    assert torch.equal(net.inner(torch.ones(1, 4)), net.inner.forward(torch.ones(1, 4)))


def test_nested_trackers_each_keep_their_model_paths():
    outer_net = Net().eval()
    inner_paths = []
    outer = ModuleTracker(outer_net)
    inner = ModuleTracker(outer_net.blocks[0])

    def handler(call):
        inner_paths.append(inner.current)
        return call.result if call.result is not None else call.run()

    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad(), outer, inner, CaptureMode(outer, handler) as mode:
        outer_net(x)
    names = [k for k in mode.counts]
    assert ("blocks.0.conv", "conv2d") in names and ("stem", "conv2d") in names
    # the inner tracker names blocks.0 as its root ("") and its children by its own paths;
    # modules it did not hold are named by type under its current path
    assert inner_paths == [
        "Net.Conv2d",
        "conv",
        "act",
        "",
        "Net.Block.Conv2d",
        "Net.Block.ReLU6",
        "Net.Block",
        "Net",  # mean
        "Net.Linear",
        *["Net"] * 5,  # sigmoid, inverse_sigmoid, mul, sign, add
    ]
    assert outer.stack == [""] and inner.stack == [""]
    assert nn.Module.__dict__["_call_impl"] is not _tracked_call_impl


class _FromParameters(nn.Module):
    """Rows split from a packed parameter feed two linears; a parameter-only sigmoid makes a
    gate (a constant of the model); an activation op on the parameter's rows is still an op."""

    def __init__(self):
        super().__init__()
        self.packed = nn.Parameter(torch.randn(8, 4))
        self.gate = nn.Parameter(torch.randn(4))

    def forward(self, x):
        w_a, w_b = self.packed.split([4, 4])
        y = F.linear(x, w_a) + F.linear(x, w_b) * torch.sigmoid(self.gate)
        return y + w_a.sum(0)  # the sum reads a parameter view alone: a constant too


def test_calls_on_parameters_alone_are_model_constants_not_ops():
    from quantlab.simulate.args import is_weight, plan

    torch.manual_seed(0)
    calls, _ = capture(_FromParameters().eval(), torch.randn(2, 4))
    assert [c.op_type for c in calls] == ["linear", "linear", "mul", "add", "add"]
    for c in calls[:2]:  # the split rows are the linears' weights
        assert is_weight(c.args[1]) and plan(c).weight == ("a", 1)


def test_a_cast_that_keeps_the_dtype_passes_codes_through():
    """x.to(device), x.float(), x.to(torch.float32) and x.type_as(y) of float32 tensors are
    pass-through ops (the codes follow, no requantization); a float16 cast is not modelled."""
    x = torch.randn(3)
    for call, args in (
        (torch.Tensor.to, (x, "cpu")),
        (torch.Tensor.to, (x, torch.float32)),
        (torch.Tensor.to, (x, x)),
        (torch.Tensor.float, (x,)),
        (torch.Tensor.type_as, (x, x)),
    ):
        assert classify(call, args, {})[1] is OpCategory.PASS_THROUGH
    assert classify(torch.Tensor.to, (x, torch.float16), {})[1] is None
    assert classify(torch.Tensor.to, (x,), {"dtype": torch.float16})[1] is None
    assert classify(torch.Tensor.type_as, (x, x.half()), {})[1] is None

    class Moved(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x).to(x.device) + x

    sim = Simulator(Moved(), "j6m")
    g = torch.Generator().manual_seed(3)
    sim.calibrate([(torch.randn(2, 4, generator=g),)], progress=False)
    trace = sim.trace(torch.randn(2, 4, generator=g), mode=Mode.FIXED)
    linear, moved = trace.qinfo["a:linear#0"], trace.qinfo[":to#0"][0]
    assert moved.scale is linear.scale or torch.equal(moved.scale, linear.scale)
    assert_bits_equal(trace.outputs[":to#0"], trace.outputs["a:linear#0"])


class _Rotary(nn.Module):
    """Rotary embedding (Llama's form): sin / cos tables from ``arange`` and an ``inv_freq``
    buffer, a position embedding gathered by a ``position_ids`` buffer, and a buffer an
    activation writes into before it is read."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d))
        self.register_buffer("position_ids", torch.arange(16).unsqueeze(0))
        self.register_buffer("state", torch.zeros(1, 16, d))
        self.pos = nn.Embedding(16, d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        n = x.shape[1]
        f = torch.arange(n).float()[:, None] * self.inv_freq[None]
        emb = torch.cat([f, f], -1)
        x1, x2 = x.chunk(2, -1)
        y = x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()
        y = y + self.pos(self.position_ids[:, :n])
        written = self.state.clone()
        written[:, :n] = self.proj(y)  # an activation written into a constant
        return written.sigmoid()


def test_calls_on_input_independent_tensors_are_model_constants_not_ops():
    """The tables, the gathered position embedding and the arithmetic on them make constants
    (a deployment export folds them); the ops that read the input are captured, and so is the
    op reading a constant an activation wrote into."""
    torch.manual_seed(0)
    m = _Rotary().eval()
    x = torch.randn(1, 5, 8)
    calls, out = capture(m, x)
    types = [c.op_type for c in calls]
    assert not {"cos", "sin", "embedding", "arange"} & set(types)
    # x * cos, -x2 (x2 * -1), (-x2 | x1) * sin
    assert types.count("mul") == 3 and types[-1] == "sigmoid"
    assert "linear" in types and "add" in types
    with torch.no_grad():
        assert_bits_equal(out, m(x))


def test_model_check_records_no_pattern_on_constants():
    """A mask built by item assignment on ``zeros`` (Swin's shifted-window mask) is a constant:
    no setitem or masked_fill pattern; the same assignment of an activation is recorded."""
    from quantlab.simulate.patterns import record_patterns

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            mask = torch.zeros(x.shape[1], x.shape[1])
            mask[:2, 2:] = 1.0
            mask = mask.masked_fill(mask != 0, -100.0)
            y = self.a(x)
            y[:, 0] = 0.0
            return torch.softmax(y @ y.transpose(-2, -1) + mask, -1)

    torch.manual_seed(0)
    sim = Simulator(Masked().eval(), "j6m")
    records = record_patterns(sim, (torch.randn(1, 4, 4),))
    assert [r.pattern for r in records] == ["setitem"]
