"""Whether a model's ``forward`` would still make the Python decisions it made once.

A traced program takes every Python value ``forward`` reads as a constant: a global, a closure
variable, a module setting, a list attribute, a train flag. ``ForwardGuard`` has torch dynamo
trace ``model(*inputs)`` once (one graph, static shapes, under no_grad) and keeps the guards
dynamo derived from that trace: a check of every such value it read (by identity or equality),
of each input's type, shape, strides and dtype, and of global state such as the grad mode.
Module hooks are not among them (dynamo's default, ``skip_nnmodule_hook_guards``: guarding
them nearly triples the check's time); a caller that depends on hooks checks them itself.
Nothing is compiled or run: the backend returns a function that computes nothing, and
``forward``'s ops are only traced (on fake tensors). Building takes 1 to 3 s for MobileNetV2.

``holds(inputs)`` evaluates those guards (dynamo's C++ guard tree over MobileNetV2's 150
modules: 40 to 70 us in a loop of checks alone, 0.5 to 0.7 ms right after a run of the model,
its objects out of the caches). True means dynamo, tracing ``forward`` now, would take the same
path and record the same ops in the same order; False that some value it read has changed.

Building fails (``GuardError``) where dynamo cannot trace ``forward`` as one graph (a graph
break: data-dependent control flow, an unsupported library call) or does not leave exactly one
guarded entry. Building runs ``forward``'s Python side effects once (dynamo replays them), as a
call of the model would.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn

_NAMES = itertools.count()


class GuardError(RuntimeError):
    """torch dynamo could not guard the model's forward (the reason is in the message)."""


def _call(model: nn.Module, inputs: tuple) -> None:
    model(*inputs)


class ForwardGuard:
    """Dynamo's guards over what ``model(*inputs)`` read while being traced (module docstring).

    ``holds(inputs)``: True when every guard holds now for ``model`` and ``inputs``."""

    def __init__(self, model: nn.Module, inputs: tuple) -> None:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        # a code object of its own: dynamo keeps its cache entries (and its recompile count)
        # per code object, so guards of different models never share or evict each other's
        code = _call.__code__.replace(co_name=f"quantlab_forward_guard_{next(_NAMES)}")
        self._fn = type(_call)(code, _call.__globals__, code.co_name)
        self._model = model
        traced: list[int] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
            traced.append(len(gm.graph.nodes))
            return lambda *args: ()  # the function returns None: the graph has no outputs

        try:
            compiled = torch.compile(self._fn, backend=backend, fullgraph=True, dynamic=False)
            # allow_rnn: trace nn.LSTM / nn.GRU / nn.RNN's forward (dynamo's default refuses
            # them); only the guards are kept, the graph never runs
            with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True):
                compiled(model, tuple(inputs))
        except Exception as err:
            first = f"{type(err).__name__}: {err}".splitlines()[0]
            raise GuardError(
                f"torch dynamo could not trace forward as one graph ({first})"
            ) from err
        entries = _debug_get_cache_entry_list(code)
        if len(entries) != 1 or len(traced) != 1:
            raise GuardError(
                f"torch dynamo left {len(entries)} guarded entries after {len(traced)} traces, "
                "not one"
            )
        self._guards = entries[0].guard_manager
        self.nodes = traced[0]  # nodes of the graph dynamo traced (its ops, inputs, output)

    def holds(self, inputs: tuple) -> bool:
        """Whether every guard holds for the model and ``inputs`` now (under no_grad, as built)."""
        with torch.no_grad():
            return bool(self._guards.check({"model": self._model, "inputs": tuple(inputs)}))
