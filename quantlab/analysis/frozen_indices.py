"""Discontinuous index ops frozen at a baseline run's indices (sensitivity runs).

A tiny perturbation that flips a topk/sort/argmax index would dominate an output comparison;
``FrozenIndices`` records the indices of one run and answers later runs with them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

_INDEX_FUNCS = {"topk", "sort", "argsort", "argmax", "argmin", "max", "min"}


class FrozenIndices(TorchFunctionMode):
    """Record the indices of index-producing ops in one run and reuse them in later runs.

    ``record()`` stores, per call in execution order, the input and the indices that topk/sort/
    argsort/argmax/argmin/max(dim)/min(dim) returned. ``replay()`` answers a later call with the
    recorded indices (and the values of the current input gathered at them): the recorded call
    of the same function and input shape, at or after the last match, whose recorded input is
    nearest the current one (exactly equal for calls upstream of a perturbation; calls skipped by
    a replayed trace are thereby passed over), provided max |recorded - current| is at most
    ``MATCH_TOLERANCE`` x max |recorded| (a perturbed input, not an unrelated tensor). Calls
    without a dim (global max) are untouched. The mode sits below the simulator's capture mode,
    so the tolerance also keeps the simulator's own arithmetic from being matched.
    """

    MATCH_TOLERANCE = 0.25

    def __init__(self) -> None:
        super().__init__()
        self.recorded: list[tuple[str, tuple, Tensor, Tensor]] = []
        self.recording = True
        self.pos = 0

    def record(self) -> FrozenIndices:
        self.recorded, self.recording, self.pos = [], True, 0
        return self

    def replay(self) -> FrozenIndices:
        self.recording, self.pos = False, 0
        return self

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        out = func(*args, **kwargs)
        if name not in _INDEX_FUNCS or not args or not isinstance(args[0], Tensor):
            return out
        idx = _indices_of(name, out)
        if idx is None:
            return out
        x = args[0]
        sig = (name, tuple(x.shape))
        if self.recording:
            self.recorded.append((name, sig[1], x.detach().clone(), idx))
            return out
        best, best_d = None, math.inf
        for j in range(self.pos, len(self.recorded)):
            rname, rshape, rx, ridx = self.recorded[j]
            if (rname, rshape) != sig or ridx.shape != idx.shape:
                continue
            d = float((rx.to(torch.float64) - x.detach().to(torch.float64)).abs().max())
            if d < best_d:
                best, best_d = j, d
            if d == 0:
                break
        if best is None:
            return out
        scale = float(self.recorded[best][2].abs().max()) if self.recorded[best][2].numel() else 0
        if best_d > self.MATCH_TOLERANCE * scale:
            return out
        self.pos = best + 1
        ridx = self.recorded[best][3]
        if name in ("argmax", "argmin", "argsort"):
            return ridx
        dim = _dim_of(name, args, kwargs)
        values = x.gather(dim, ridx if ridx.ndim == x.ndim else ridx.unsqueeze(dim))
        if ridx.ndim != x.ndim:
            values = values.squeeze(dim)
        return type(out)((values, ridx))


def _indices_of(name: str, out: Any) -> Tensor | None:
    if name in ("argmax", "argmin", "argsort"):
        return out if isinstance(out, Tensor) else None
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Tensor):
        return out[1]
    return None


def _dim_of(name: str, args: tuple, kwargs: dict) -> int:
    if "dim" in kwargs:
        return int(kwargs["dim"])
    if name == "topk":
        return int(args[2]) if len(args) > 2 else -1
    if name == "sort":
        return int(args[1]) if len(args) > 1 else -1
    return int(args[1])
