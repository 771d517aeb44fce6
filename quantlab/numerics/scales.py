"""Validation of quantization scales at every public numerics entry.

A scale is a positive, finite float32 value (per tensor) or a 1-d tensor of them (per
channel). Zero, negative, NaN or infinite scales (or a float64 value that rounds to 0 or inf
in float32) would give silent garbage codes, so they are rejected with a ValueError naming the
argument and the offending value(s).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SHOWN_BAD_VALUES = 4  # offending per-channel values quoted in an error message


def check_scale(
    scale: Tensor | float | list, name: str, dtype: torch.dtype = torch.float32
) -> Tensor:
    """``scale`` as a ``dtype`` tensor (same shape; float32 unless the arithmetic that uses it
    is float64), after checking every value is finite and > 0 in that dtype.

    Raises ValueError "``name`` must be finite and > 0 (<dtype>), got <value(s)>".
    """
    if isinstance(scale, Tensor) and scale.dtype == dtype:
        s = scale.detach()
    else:
        s = torch.as_tensor(scale, dtype=dtype).detach()
    kind = str(dtype).replace("torch.", "")
    if s.numel() == 1:
        v = float(s)
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be finite and > 0 ({kind}), got {_shown(scale, v)}")
        return s
    ok = torch.isfinite(s) & (s > 0)
    if not bool(ok.all()):
        bad = (~ok).nonzero().flatten()[:SHOWN_BAD_VALUES]
        vals = [float(s.flatten()[i]) for i in bad]
        raise ValueError(
            f"{name} must be finite and > 0 ({kind}) in every channel, got {vals} at "
            f"channel(s) {bad.tolist()}"
        )
    return s


def check_multiplier(real: Tensor | float, name: str) -> Tensor:
    """A real requantization multiplier as float64: finite and >= 0 everywhere (0 encodes an
    all-zero output); ValueError naming ``name`` and the offending values otherwise."""
    r = torch.as_tensor(real, dtype=torch.float64)
    ok = torch.isfinite(r) & (r >= 0)
    if not bool(ok.all()):
        vals = r[~ok].flatten()[:SHOWN_BAD_VALUES].tolist()
        raise ValueError(f"{name} must be finite and >= 0, got {vals}")
    return r


def _shown(original, as_float32: float) -> str:
    """The user's value, and what float32 made of it when that differs (1e-50 -> 0.0)."""
    try:
        given = float(original)
    except (TypeError, ValueError):
        return str(as_float32)
    if given == as_float32 or math.isnan(given):
        return str(given)
    return f"{given} (float32: {as_float32})"


def check_tensor_scale(scale: Tensor | float, name: str) -> Tensor:
    """One per-tensor scale as a 0-d float32 tensor (``check_scale``'s checks); ValueError naming
    ``name`` when it holds more than one value."""
    s = check_scale(scale, name)
    if s.numel() != 1:
        raise ValueError(f"{name} must be one per-tensor scale, got {s.numel()} values")
    return s.reshape(())


def check_scale_float(scale: Tensor | float, name: str) -> float:
    """One scale as a Python float (its own precision kept, no float32 rounding), after
    checking it is finite and > 0; ValueError naming ``name`` and the value otherwise."""
    try:
        v = float(scale)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{name} must be one finite value > 0, got {scale!r}") from e
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be finite and > 0, got {v}")
    return v
