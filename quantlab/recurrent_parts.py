"""nn.LSTMCell, nn.GRUCell, nn.RNNCell and nn.LSTM, nn.GRU, nn.RNN as torch's own CPU steps
(ATen's ``LSTMCell``, ``GRUCell``, ``SimpleCell`` and its layers of them), the parts op capture
sees instead of one call (``quantlab.decompositions``): the input and hidden projections
(linear layers), the gates' adds, sigmoid / tanh / relu, products and sums. ``RECURRENT`` maps
each call torch makes to its parts for the call's (args, kwargs), or None for a call that stays
whole (packed sequences, projections, dropout between layers in training)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

_CELL_PARAMS = ("input", "hx", "w_ih", "w_hh", "b_ih", "b_hh")


def _lstm_step(ig, hx, w_hh, b_hh):
    """One LSTM step on its input projection ``ig`` (ATen's LSTMCell on CPU)."""
    h, c = hx
    gates = F.linear(h, w_hh, b_hh) + ig
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * c + i * g
    return o * torch.tanh(cy), cy


def _gru_step(ig, h, w_hh, b_hh):
    """One GRU step on its input projection ``ig`` (ATen's GRUCell on CPU). torch adds the
    reset and update gates' parts in place into strided views of the hidden projection and
    takes their sigmoids there, row by row; one add of both gates and a sigmoid of each half
    (a strided view) takes the same rows, so the same float bits."""
    hg = F.linear(h, w_hh, b_hh)
    n = hg.shape[1] // 3
    gates = hg[:, : 2 * n] + ig[:, : 2 * n]
    reset, update = torch.sigmoid(gates[:, :n]), torch.sigmoid(gates[:, n:])
    new = torch.tanh(ig[:, 2 * n :] + hg[:, 2 * n :] * reset)
    return (h - new) * update + new


def _simple_step(activation: Callable) -> Callable:
    """One tanh / relu RNN step on its input projection (ATen's SimpleCell)."""
    return lambda ig, h, w_hh, b_hh: activation(F.linear(h, w_hh, b_hh) + ig)


def _cell_arguments(args: tuple, kwargs: dict) -> dict | None:
    """A cell call's arguments by name, or None for a call torch itself would refuse (it then
    runs whole and raises its own message): a batch of inputs (2-d) is what the modules pass."""
    p = dict(zip(_CELL_PARAMS, args)) | kwargs
    if len(args) > len(_CELL_PARAMS) or not set(p) <= set(_CELL_PARAMS) or len(p) < 4:
        return None
    if getattr(p.get("input"), "ndim", None) != 2:
        return None
    return {k: p.get(k) for k in _CELL_PARAMS}


def _cell_parts(step: Callable, lstm: bool = False) -> Callable:
    """The parts of one cell call: its input projection, then ``step``."""

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        p = _cell_arguments(args, kwargs)
        if p is None or (lstm and not _pair(p["hx"])):
            return None

        def parts():
            ig = F.linear(p["input"], p["w_ih"], p["b_ih"])
            return step(ig, p["hx"], p["w_hh"], p["b_hh"])

        return parts

    return split


def _pair(hx) -> bool:
    return isinstance(hx, (list, tuple)) and len(hx) == 2


def _initial_states(hx, lstm: bool) -> list:
    """Each layer's and direction's initial state (LSTM: (h, c) pairs) from the call's stacked
    ones. All-zero states (what the modules make in their forward when given none: constants,
    which the op capture would see sliced as ops and a torch.fx trace would not) are sliced
    outside the capture, so a steady program's trace and the capture see the same ops."""
    stacked = list(hx) if lstm else [hx]
    with torch._C.DisableTorchFunction():
        zeros = all(isinstance(t, Tensor) and not bool(t.any()) for t in stacked)
        rows = [t.unbind(0) for t in stacked] if zeros else None
    if rows is None:  # states the model computed or was given: sliced as ops
        rows = [t.unbind(0) for t in stacked]
    return list(zip(*rows)) if lstm else list(rows[0])


def _sequence_parts(step: Callable, lstm: bool = False) -> Callable:
    """The parts of an ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` call (``torch.lstm``, ``gru``,
    ``rnn_tanh``, ``rnn_relu`` on a padded batch): ATen's CPU layers, layer by layer and
    direction by direction, each the input projection of the whole sequence (one linear
    layer), its steps (``step``, backwards for the reverse direction), their outputs stacked
    (and the two directions' concatenated); the final states stacked. None for a packed
    sequence, projections (``proj_size``), dropout between layers in training, or a call
    torch would refuse."""

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        if kwargs or len(args) != 9 or not isinstance(args[2], (list, tuple)):
            return None  # a packed sequence's overload, or not torch's call
        x, hx, params, biases, layers, dropout, train, bidirectional, batch_first = args
        dirs, per = 2 if bidirectional else 1, 4 if biases else 2
        if (
            getattr(x, "ndim", None) != 3
            or len(params) != layers * dirs * per  # projections (w_hr) among them
            or (train and dropout and layers > 1)
            or (lstm and not _pair(hx))
        ):
            return None

        def parts():
            seq = x.transpose(0, 1) if batch_first else x
            starts = _initial_states(hx, lstm)
            finals = []
            for layer in range(layers):
                outs = []
                for d in range(dirs):
                    k = layer * dirs + d
                    w_ih, w_hh, *b = params[k * per : (k + 1) * per]
                    b_ih, b_hh = b if b else (None, None)
                    steps = F.linear(seq, w_ih, b_ih).unbind(0)
                    h, ys = starts[k], []
                    for ig in steps if d == 0 else steps[::-1]:
                        h = step(ig, h, w_hh, b_hh)
                        ys.append(h[0] if lstm else h)
                    outs.append(torch.stack(ys if d == 0 else ys[::-1], 0))
                    finals.append(h)
                seq = outs[0] if dirs == 1 else torch.cat(outs, outs[0].dim() - 1)
            out = seq.transpose(0, 1) if batch_first else seq
            if lstm:
                return out, torch.stack([f[0] for f in finals]), torch.stack([f[1] for f in finals])
            return out, torch.stack(finals)

        return parts

    return split


# what nn.LSTMCell, nn.GRUCell, nn.RNNCell and nn.LSTM, nn.GRU, nn.RNN call, and their parts
RECURRENT = {
    torch.lstm_cell: _cell_parts(_lstm_step, lstm=True),
    torch.gru_cell: _cell_parts(_gru_step),
    torch.rnn_tanh_cell: _cell_parts(_simple_step(torch.tanh)),
    torch.rnn_relu_cell: _cell_parts(_simple_step(torch.relu)),
    torch.lstm: _sequence_parts(_lstm_step, lstm=True),
    torch.gru: _sequence_parts(_gru_step),
    torch.rnn_tanh: _sequence_parts(_simple_step(torch.tanh)),
    torch.rnn_relu: _sequence_parts(_simple_step(torch.relu)),
}
