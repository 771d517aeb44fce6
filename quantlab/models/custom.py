"""``model=custom``: the user's own module from a Python factory, with an optional state dict.

``model.target=my_pkg.my_module:build_model`` names a callable that returns an ``nn.Module``; it is
called with ``model.kwargs`` under ``torch.manual_seed(seed)`` (in a forked RNG, so random
initialisation is reproducible and the caller's RNG is untouched). ``model.checkpoint`` is a
state dict file read with ``torch.load(weights_only=True)`` and loaded strictly. The module must
be importable from the working folder or ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn


def import_target(target: str, field: str) -> Any:
    """The object ``"package.module:attr"`` names; errors name ``field`` and what is missing."""
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise ValueError(
            f"{field}={target!r}: cannot import {module_name!r} ({err}); the package must be "
            "importable from the working folder or PYTHONPATH"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))
            raise ValueError(
                f"{field}={target!r}: {module_name} has no attribute {attr!r}; "
                f"it defines: {', '.join(public) or 'nothing public'}"
            )
        obj = getattr(obj, part)
    return obj


def build_custom(target: str, kwargs: Mapping[str, Any] | None, seed: int = 0) -> nn.Module:
    """``target(**kwargs)`` under a seeded, forked RNG; must return an ``nn.Module``."""
    kwargs = dict(kwargs or {})
    factory = import_target(target, "model.target")
    if not callable(factory):
        raise ValueError(f"model.target={target!r} is a {type(factory).__name__}, not callable")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            module = factory(**kwargs)
        except TypeError as err:
            raise ValueError(f"model.target={target!r} with model.kwargs={kwargs}: {err}") from err
    if not isinstance(module, nn.Module):
        raise ValueError(
            f"model.target={target!r} returned a {type(module).__name__}; it must return an "
            "nn.Module"
        )
    return module


def load_checkpoint(module: nn.Module, path: str | Path) -> None:
    """Load the state dict file ``path`` into ``module`` (strict; ``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"model.checkpoint: file {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling errors come in many types
        raise ValueError(
            f"model.checkpoint: {path} cannot be read as a weights-only torch file: {err}"
        ) from None
    if not isinstance(state, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in state.values()
    ):
        keys = list(state)[:8] if isinstance(state, Mapping) else []
        raise ValueError(
            f"model.checkpoint: {path} holds a {type(state).__name__}"
            + (f" with keys {keys}" if keys else "")
            + ", not a state dict (parameter name -> tensor, as module.state_dict() returns)"
        )
    try:
        result = module.load_state_dict(dict(state), strict=False)
    except RuntimeError as err:  # a tensor of the wrong shape
        raise ValueError(f"model.checkpoint: {path} does not fit the module: {err}") from None
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"model.checkpoint: {path} does not fit the module: missing keys "
            f"{result.missing_keys[:10]}, unexpected keys {result.unexpected_keys[:10]}"
        )
