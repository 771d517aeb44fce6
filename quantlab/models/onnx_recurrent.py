"""onnx2torch converters for ONNX's LSTM, GRU and RNN nodes: torch's ``nn.LSTM`` / ``nn.GRU`` /
``nn.RNN`` with the node's weights, so that an ONNX recurrent model (a CRNN text recognizer, a
voice detector) is converted and simulated as one written in torch
(``quantlab.recurrent_parts`` splits the layer into its linear layers, gates and products).

ONNX keeps one direction's weights as W (4H, 3H or H, I) and R (.., H), biases B = [Wb, Rb] and
its gates in the order i, o, f, c (LSTM) or z, r, h (GRU); torch orders them i, f, g, o and r, z,
n (an RNN has one block).
X is (T, B, I), the outputs Y (T, D, B, H) and Y_h, Y_c (D, B, H), D = 2 for a bidirectional
node (``layout`` 0, the one onnxruntime runs and torch exports).

Converted: directions forward and bidirectional, the default activations (an RNN's Tanh, or Relu
in every direction: ``nn.RNN``'s ``nonlinearity``), no ``clip``, no
``input_forget``, no peepholes, no ``sequence_lens`` (every sequence of the batch runs its full
length), layout 0, and for GRU ``linear_before_reset`` = 1 (the reset gate applied after the hidden
projection: torch's GRU, and what torch exports). Any other node raises NotImplementedError
naming the attribute, which ``onnx_import`` reports as the model that cannot be converted.
Float results match onnxruntime's to rounding, not bit for bit (each sums its products in its
own order).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from quantlab.models.onnx_nodes import add_missing, attribute_text, refuse

# ONNX gate blocks in torch's order: LSTM i, f, c, o from i, o, f, c; GRU r, z, h from z, r, h
_LSTM_ORDER = (0, 2, 3, 1)
_GRU_ORDER = (1, 0, 2)
_ORDERS = {"LSTM": _LSTM_ORDER, "GRU": _GRU_ORDER, "RNN": (0,)}
_LAYERS = {"LSTM": nn.LSTM, "GRU": nn.GRU, "RNN": nn.RNN}
_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}
_RNN_ACTIVATIONS = ("tanh", "relu")  # nn.RNN's nonlinearity, the same in every direction
VERSIONS = (7, 14, 22)


class OnnxRecurrent(nn.Module):
    """An ONNX LSTM / GRU / RNN node as torch's layer: ``forward(x, initial_h, initial_c)`` returns
    the node's outputs (Y, Y_h[, Y_c]), as many as the node names."""

    def __init__(self, layer: nn.LSTM | nn.GRU | nn.RNN, outputs: int) -> None:
        super().__init__()
        self.layer = layer
        self.outputs = outputs

    def forward(self, x: Tensor, initial_h: Tensor | None = None, initial_c: Tensor | None = None):
        lstm = isinstance(self.layer, nn.LSTM)
        h0, c0 = initial_h, initial_c
        states = h0
        if lstm and (h0 is not None or c0 is not None):
            like = h0 if h0 is not None else c0
            states = tuple(torch.zeros_like(like) if t is None else t for t in (h0, c0))
        y, last = self.layer(x, states)
        h_n, c_n = last if lstm else (last, None)
        d = 2 if self.layer.bidirectional else 1
        y = y.reshape(*y.shape[:2], d, -1).permute(0, 2, 1, 3)  # (T, B, D * H) -> (T, D, B, H)
        out = (y, h_n, c_n)[: self.outputs]
        return out[0] if self.outputs == 1 else out


def _check(node, kind: str) -> None:
    a = node.attributes
    direction = attribute_text(a.get("direction"), "forward")
    if direction not in ("forward", "bidirectional"):
        refuse(node, f"direction={direction} (torch has no reverse-only layer)")
    acts = a.get("activations")
    names = None if acts is None else [attribute_text(v).lower() for v in acts]
    if names is not None and kind == "RNN":
        if not names or names[0] not in _RNN_ACTIVATIONS or len(set(names)) > 1:
            refuse(node, f"activations={names}")
    elif names is not None:  # one list per direction
        default = [n.lower() for n in _DEFAULT_ACTIVATIONS[kind]]
        per = len(names) // len(default)
        if not names or len(names) % len(default) or names != default * per:
            refuse(node, f"activations={names}")
    if a.get("clip") is not None:
        refuse(node, "clip")
    if a.get("input_forget", 0):
        refuse(node, "input_forget=1")
    if a.get("layout", 0):
        refuse(node, "layout=1 (onnxruntime, the reference, runs layout 0 only)")
    if kind == "GRU" and not a.get("linear_before_reset", 0):
        refuse(node, "linear_before_reset=0 (torch's GRU resets after the hidden projection)")
    inputs = node.input_values
    if len(inputs) > 4 and inputs[4]:
        refuse(node, "sequence_lens")
    if kind == "LSTM" and len(inputs) > 7 and inputs[7]:
        refuse(node, "peepholes")


def _blocks(t: Tensor, order: tuple[int, ...]) -> Tensor:
    """Rows of ``t`` (gates x H, ...) in torch's gate order."""
    parts = t.chunk(len(order), 0)
    return torch.cat([parts[i] for i in order], 0)


def convert_recurrent(node, graph):
    """onnx2torch converter of an LSTM, GRU or RNN node (see the module docstring)."""
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult

    kind = node.operation_type
    _check(node, kind)
    inputs = node.input_values
    for name, what in ((inputs[1], "W"), (inputs[2], "R")):
        if name not in graph.initializers:
            refuse(node, f"a computed {what} (weights must be initializers)")
    w = graph.initializers[inputs[1]].to_torch().float()
    r = graph.initializers[inputs[2]].to_torch().float()
    b = None
    if len(inputs) > 3 and inputs[3]:
        if inputs[3] not in graph.initializers:
            refuse(node, "a computed B")
        b = graph.initializers[inputs[3]].to_torch().float()
    dirs, gates_h, input_size = w.shape
    hidden = int(node.attributes.get("hidden_size", r.shape[-1]))
    order = _ORDERS[kind]
    if gates_h != len(order) * hidden:
        refuse(node, f"W of {gates_h} rows for hidden_size={hidden}")
    options = {}
    if kind == "RNN":
        acts = node.attributes.get("activations")
        options["nonlinearity"] = attribute_text(acts[0]).lower() if acts else "tanh"
    layer = _LAYERS[kind](
        input_size, hidden, bias=b is not None, bidirectional=dirs == 2, **options
    )
    with torch.no_grad():
        for d in range(dirs):
            suffix = "_l0" + ("_reverse" if d else "")
            getattr(layer, "weight_ih" + suffix).copy_(_blocks(w[d], order))
            getattr(layer, "weight_hh" + suffix).copy_(_blocks(r[d], order))
            if b is not None:
                wb, rb = b[d].chunk(2)
                getattr(layer, "bias_ih" + suffix).copy_(_blocks(wb, order))
                getattr(layer, "bias_hh" + suffix).copy_(_blocks(rb, order))
    state_inputs = list(inputs[5:7] if kind == "LSTM" else inputs[5:6])
    mapping = OnnxMapping(inputs=(inputs[0], *state_inputs), outputs=node.output_values)
    module = OnnxRecurrent(layer, len(node.output_values))
    return OperationConverterResult(torch_module=module, onnx_mapping=mapping)


def register() -> None:
    """Add the LSTM, GRU and RNN converters to onnx2torch's registry (versions it has none
    for)."""
    for kind in _LAYERS:
        add_missing(kind, VERSIONS, convert_recurrent)
