"""ONNX LSTM, GRU and RNN nodes converted to torch's layers (``quantlab.models.onnx_recurrent``): a
torch model exported to ONNX comes back with its own weights (ONNX's gate order undone), runs
as onnxruntime runs the file, and is simulated through its linear layers and gates; the nodes
it cannot convert are named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quantlab.models.registry import build_model
from quantlab.models.schema import ModelConfig

pytest.importorskip("onnxruntime")


class _Recurrent(nn.Module):
    """A CRNN-style head: a bidirectional LSTM over the time axis, a GRU, a bidirectional relu
    RNN and a tanh RNN, then logits."""

    def __init__(self, batch_first: bool = False) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.lstm = nn.LSTM(6, 5, bidirectional=True, batch_first=batch_first)
        self.gru = nn.GRU(10, 4, batch_first=batch_first)
        self.relu_rnn = nn.RNN(
            4, 4, nonlinearity="relu", bidirectional=True, batch_first=batch_first
        )
        self.tanh_rnn = nn.RNN(8, 3, batch_first=batch_first)
        self.head = nn.Linear(3, 3)

    def forward(self, x):  # (T, B, 6), or (B, T, 6) batch first
        y, _ = self.lstm(x)
        z, h = self.gru(y)
        r, _ = self.relu_rnn(z)
        t, _ = self.tanh_rnn(r)
        return self.head(t), h


def _export(model: nn.Module, x, path) -> None:
    torch.onnx.export(model.eval(), (x,), str(path), opset_version=17, dynamo=False)


@pytest.mark.parametrize("batch_first", [False, True], ids=["time_first", "batch_first"])
def test_an_exported_lstm_and_gru_come_back_with_their_weights(tmp_path, batch_first):
    torch.manual_seed(0)
    model = _Recurrent(batch_first)
    x = torch.randn(1, 7, 6) if batch_first else torch.randn(7, 1, 6)
    path = tmp_path / "rnn.onnx"
    _export(model, x, path)
    b = build_model(ModelConfig(name="onnx", path=str(path)))  # checks against onnxruntime
    layers = [m for m in b.module.modules() if isinstance(m, nn.RNNBase)]
    theirs_all = [model.lstm, model.gru, model.relu_rnn, model.tanh_rnn]
    assert [type(m) for m in layers] == [type(m) for m in theirs_all]
    for ours, theirs in zip(layers, theirs_all, strict=True):
        assert ours.bidirectional == theirs.bidirectional  # torch exports layout 0
        assert getattr(ours, "nonlinearity", None) == getattr(theirs, "nonlinearity", None)
        for name, p in theirs.named_parameters():
            assert torch.equal(getattr(ours, name), p), name  # gate order undone exactly
    with torch.no_grad():
        got, want = b.module(x), model(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.reshape(w.shape), w, rtol=0, atol=1e-6)


def test_converted_recurrent_layers_are_simulated_through_their_gates(tmp_path):
    from quantlab.simulate import Mode, Simulator

    torch.manual_seed(0)
    path = tmp_path / "rnn.onnx"
    _export(_Recurrent(), torch.randn(5, 1, 6), path)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    sim = Simulator(b.module, "j6m")
    sim.calibrate([(torch.randn(5, 1, 6),) for _ in range(2)], progress=False)
    x = torch.randn(5, 1, 6)
    runs = {m: sim.run(x, mode=m)[0].flatten() for m in (Mode.FLOAT, Mode.FAKE, Mode.FIXED)}
    types = set(sim.ops.op_type)
    assert {"linear", "sigmoid", "tanh", "mul", "relu"} <= types
    assert not {"lstm", "gru", "rnn_relu", "rnn_tanh"} & types
    cos = torch.nn.functional.cosine_similarity(runs[Mode.FIXED], runs[Mode.FLOAT], 0)
    assert 0.95 < cos < 1  # int8 through the steps: near, not equal
    gap = runs[Mode.FIXED] - runs[Mode.FAKE]
    assert runs[Mode.FAKE].square().sum() > 1000 * gap.square().sum()  # fake vs fixed > 30 dB


def _single_node(tmp_path, op: str, **attrs):
    """A one-node ONNX LSTM / GRU (opset 14) with random weights and its given attributes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    g = torch.Generator().manual_seed(0)
    w = numpy_helper.from_array(torch.randn(dirs, gates * 3, 2, generator=g).numpy(), "W")
    r = numpy_helper.from_array(torch.randn(dirs, gates * 3, 3, generator=g).numpy(), "R")
    node = helper.make_node(op, ["X", "W", "R"], ["Y"], hidden_size=3, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 1, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [w, r],
    )  # fmt: skip
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), path)
    return path


@pytest.mark.parametrize(
    "op, attrs, words",
    [
        ("LSTM", {"direction": "reverse"}, "direction=reverse"),
        ("LSTM", {"clip": 3.0}, "clip"),
        ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]}, "activations"),
        ("LSTM", {"layout": 1}, "layout=1"),
        ("GRU", {}, "linear_before_reset=0"),
        ("RNN", {"activations": ["Sigmoid"]}, "activations"),
        ("RNN", {"direction": "bidirectional", "activations": ["Tanh", "Relu"]}, "activations"),
    ],
)
def test_recurrent_nodes_that_torch_layers_do_not_compute_are_named(tmp_path, op, attrs, words):
    path = _single_node(tmp_path, op, **attrs)
    with pytest.raises(ValueError, match=f"cannot convert.*{op} node with {words}"):
        build_model(ModelConfig(name="onnx", path=str(path)))


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("GRU", {"linear_before_reset": 1}),
        ("RNN", {"activations": ["Relu", "Relu"]}),
    ],
    ids=["gru_reset_after_projection", "relu_rnn"],
)
def test_a_single_bidirectional_node_matches_onnxruntime(tmp_path, op, attrs):
    """A hand-made node (no bias, no initial state, one output): converted, and equal to
    onnxruntime's run to rounding (``build_model`` checks it)."""
    path = _single_node(tmp_path, op, direction="bidirectional", **attrs)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    x = torch.randn(4, 1, 2)
    with torch.no_grad():
        got = b.module(x)
    want = b.reference(x)
    torch.testing.assert_close(got.reshape(want.shape), torch.as_tensor(want), rtol=0, atol=1e-6)


class _SplitHead(nn.Module):
    def forward(self, x):
        boxes, scores = x.split([4, 2], dim=-1)
        return scores.sigmoid(), boxes, scores  # one Split node's parts, out of order


def test_graph_outputs_from_a_node_with_several_outputs_are_the_values_they_name(tmp_path):
    """onnx2torch returns a multi-output node's whole result for its outputs (a Split's parts,
    an LSTM's states); the converted module returns each graph output as named, in order."""
    x = torch.randn(2, 5, 6)
    path = tmp_path / "split.onnx"
    _export(_SplitHead(), x, path)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    with torch.no_grad():
        got = b.module(x)
    want = _SplitHead()(x)
    assert len(got) == 3
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


class _Stateful(nn.Module):
    """A streaming LSTM step: the states come in and go out (a voice detector's loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 3)

    def forward(self, x, h, c):
        y, (h, c) = self.lstm(x, (h, c))
        return y, h, c


def test_an_lstm_takes_and_returns_its_states(tmp_path):
    torch.manual_seed(0)
    model = _Stateful().eval()
    args = (torch.randn(6, 1, 4), torch.randn(1, 1, 3), torch.randn(1, 1, 3))
    path = tmp_path / "step.onnx"
    torch.onnx.export(model, args, str(path), opset_version=17, dynamo=False)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    with torch.no_grad():
        got, want = b.module(*args), model(*args)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.reshape(w.shape), w, rtol=0, atol=1e-6)


def test_a_graph_with_state_inputs_runs_its_items_unmerged(tmp_path):
    """A streaming LSTM whose time axis is the dynamic first axis and whose states are (1, 1,
    H): the states have no batch axis to merge along (silero-vad's graph; merged, the analyses
    stopped at "Expected hidden[0] size (1, 1, 3), got [3, 1, 3]"), so the graph runs the
    items as they come: one run each."""
    from quantlab.workload import model_runs

    model = _Stateful().eval()
    args = (torch.randn(6, 1, 4), torch.randn(1, 1, 3), torch.randn(1, 1, 3))
    path = tmp_path / "stream.onnx"
    torch.onnx.export(model, args, str(path), opset_version=17, dynamo=False,
                      input_names=["x", "h", "c"], dynamic_axes={"x": {0: "time"}})  # fmt: skip
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    assert b.fixed_batch == 1
    g = torch.Generator().manual_seed(2)
    batches = [tuple(torch.randn(a.shape, generator=g) for a in args) for _ in range(3)]
    runs = model_runs(b, batches)
    assert len(runs) == 3
    with torch.no_grad():
        for run in runs:
            got, want = b.module(*run), model(*run)
            for o, w in zip(got, want, strict=True):
                torch.testing.assert_close(o.reshape(w.shape), w, rtol=0, atol=1e-6)
