"""Model inputs: those that arrive already quantized (an image source delivering pixel codes),
and the copies a run hands a model that writes into its inputs.

A deployed image model takes integer codes at a fixed scale, not floats it calibrates a scale
for. ``InputQuant`` declares that for one positional input; the Simulator then marks that input
as carrying (dtype, scale, codes) before the model runs, in fake and fixed modes alike, so the
first op takes the codes as they are (no calibrated input scale, no re-rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from quantlab.numerics.dtypes import DType
from quantlab.simulate.qtensor import QInfo, QTable


@dataclass(frozen=True)
class InputQuant:
    """A model input whose float32 values are ``codes * scale`` exactly, codes integers of
    ``dtype`` (symmetric, zero point 0); e.g. uint8 pixels p as int8 codes p - 128 at scale 1."""

    dtype: DType = DType.INT8
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not DType.parse(self.dtype).is_int:
            raise ValueError(f"InputQuant.dtype must be an integer dtype, got {self.dtype}")
        if not self.scale > 0:
            raise ValueError(f"InputQuant.scale must be > 0, got {self.scale}")


InputQuants = Sequence["InputQuant | None"]


def declared_input_quant(model: object) -> tuple[InputQuant | None, ...]:
    """What ``model`` declares about its positional inputs (its ``input_quant`` attribute, set
    by ``quantlab.models.input_path``); () when it declares nothing."""
    value = getattr(model, "input_quant", ())
    return tuple(value or ())


def mark_quantized_inputs(qt: QTable, inputs: tuple, specs: InputQuants) -> None:
    """Record each declared input's codes in the run's side table ``qt``. ValueError naming
    the input when its values are not integer codes of the declared dtype times the scale."""
    for i, (x, spec) in enumerate(zip(inputs, specs)):
        if spec is None:
            continue
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise ValueError(
                f"model input {i} is declared quantized ({spec}) but is not a float tensor"
            )
        dt = DType.parse(spec.dtype)
        scale = torch.tensor(spec.scale, dtype=torch.float32)
        codes = torch.round(x.detach() / scale)
        if not torch.equal(codes * scale, x.detach()) or (
            codes.numel() and (codes.min() < dt.qmin or codes.max() > dt.qmax)
        ):
            raise ValueError(
                f"model input {i} must hold {dt.name} codes in [{dt.qmin}, {dt.qmax}] times scale "
                f"{spec.scale} exactly (declared InputQuant); got values in "
                f"[{x.min().item():g}, {x.max().item():g}] or non-integer codes"
            )
        qt.set(x, QInfo(dt, scale, codes.to(dt.torch_dtype)))


def input_versions(inputs: tuple) -> list[int]:
    """The version counter of every tensor in ``inputs`` (nested tuples, lists, dicts): an
    in-place write into a tensor, or into a view of it, advances its counter."""
    return [t._version for t in tree_flatten(inputs)[0] if isinstance(t, Tensor)]


def copy_inputs(inputs: tuple) -> tuple:
    """``inputs`` with every tensor (in nested tuples, lists, dicts) replaced by a copy."""
    return tree_map(lambda t: t.clone() if isinstance(t, Tensor) else t, inputs)
