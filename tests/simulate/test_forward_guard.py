"""torch dynamo's guards over a model's forward (quantlab.simulate.forward_guard): every
Python value forward read is checked, a change to any of them is seen, the model as built
passes again once the change is undone, and a forward dynamo cannot trace as one graph is
refused by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quantlab.simulate.forward_guard import ForwardGuard, GuardError

GAIN = 2.0  # a global the model reads


def _closure_scale():
    box = [0.5]

    def scale(x):
        return x * box[0]

    return scale, box


SCALE, SCALE_BOX = _closure_scale()


class Reader(nn.Module):
    """Reads a global, a closure variable, a list attribute, a plain setting and its train flag
    (through Dropout), and branches on the input's rank."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)
        self.offsets = [1.0, -1.0]
        self.mode = "sum"

    def forward(self, x):
        h = self.drop(self.lin(x)) * GAIN
        h = SCALE(h) + self.offsets[0]
        if self.mode == "sum":
            h = h + self.offsets[1]
        return h.sum(-1) if x.dim() == 2 else h


def _undoable_changes(m: Reader):
    """(name, apply, undo) for each value forward reads. (A module replaced by one of the same
    kind and settings is no change to what forward decides: its tensors are the graph's inputs.)"""
    g = globals()
    return [
        ("global", lambda: g.update(GAIN=3.0), lambda: g.update(GAIN=2.0)),
        ("closure", lambda: SCALE_BOX.__setitem__(0, 0.25), lambda: SCALE_BOX.__setitem__(0, 0.5)),
        ("list item", lambda: m.offsets.__setitem__(0, 2.0), lambda: m.offsets.__setitem__(0, 1.0)),
        ("list length", lambda: m.offsets.append(0.0), lambda: m.offsets.pop()),
        ("setting", lambda: setattr(m, "mode", "skip"), lambda: setattr(m, "mode", "sum")),
        ("train flag", m.train, m.eval),
        ("dropout p", lambda: setattr(m.drop, "p", 0.1), lambda: setattr(m.drop, "p", 0.5)),
        ("module kind", lambda: setattr(m, "lin", nn.Identity()), None),
        ("module settings", lambda: setattr(m, "lin", nn.Linear(4, 4, bias=False)), None),
    ]


@pytest.mark.parametrize("index", range(9))
def test_every_value_forward_read_is_guarded(index):
    m = Reader().eval()
    x = (torch.randn(3, 4),)
    guard = ForwardGuard(m, x)
    assert guard.holds(x)
    assert guard.holds((torch.randn(3, 4),))  # other values, same signature
    name, apply, undo = _undoable_changes(m)[index]
    apply()
    try:
        assert not guard.holds(x), name
    finally:
        if undo is not None:
            undo()
    if undo is not None:
        assert guard.holds(x), name


@pytest.mark.parametrize(
    "other",
    [
        torch.randn(2, 4),  # shape
        torch.randn(3, 4, dtype=torch.float64),  # dtype
        torch.randn(4, 3).t(),  # strides
        torch.randn(3, 4).requires_grad_(),
    ],
)
def test_the_inputs_signature_is_guarded(other):
    m = Reader().eval()
    x = (torch.randn(3, 4),)
    guard = ForwardGuard(m, x)
    assert not guard.holds((other,))
    assert not guard.holds((x[0], x[0]))  # another number of inputs
    assert guard.holds(x)


def test_guards_of_two_models_do_not_share_or_evict_each_other():
    """Each guard has its own code object, so dynamo's per-code cache limit (8) never turns a
    later guard into one that no longer holds."""
    x = (torch.randn(3, 4),)
    models = [Reader().eval() for _ in range(12)]
    guards = [ForwardGuard(m, x) for m in models]
    assert all(g.holds(x) for g in guards)
    models[3].mode = "skip"
    assert [g.holds(x) for g in guards] == [i != 3 for i in range(12)]


class Breaks(nn.Module):
    def forward(self, x):
        torch._dynamo.graph_break()
        return x + 1


def test_a_forward_dynamo_cannot_trace_as_one_graph_is_refused():
    with pytest.raises(GuardError, match="one graph"):
        ForwardGuard(Breaks(), (torch.randn(2),))
