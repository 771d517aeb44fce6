"""What a dataset needs to know to feed a model, without building the model.

Registry models describe their inputs in their registry entry; the user's own models
(``model=custom``, ``model=onnx``) declare an input shape or have it inferred from the data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.models.formats import ImageFormat
from quantlab.models.onnx_inputs import IntegerInput

InputsFn = Callable[[int, int], tuple[Tensor, ...]]  # (batch, seed) -> random model inputs


@dataclass(frozen=True)
class ModelInputs:
    """``name`` (for messages), the model's own image preprocessing ``input_format`` (None: not
    an image model, or a user model whose format comes from the data config), each input's
    ``shapes`` without the batch dimension (None: unknown), a maker of seeded random inputs,
    whether it is a ``registry`` model (False: the user's own) and, where ``shapes`` is unknown,
    what is known of them (``partial_shapes``: an ONNX graph's, None for a dynamic dim)."""

    name: str
    input_format: ImageFormat | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None
    example_inputs: InputsFn | None = None
    registry: bool = True
    partial_shapes: tuple[tuple[int | None, ...], ...] | None = None


def smooth_images(gen: torch.Generator, batch: int, height: int, width: int) -> Tensor:
    """Seeded smooth random RGB images in [0, 1]: (batch, 3, height, width) float32, made by
    bilinear upsampling of uniform noise on a grid 8x coarser (at least 2x2)."""
    import math

    import torch.nn.functional as F

    h, w = max(2, math.ceil(height / 8)), max(2, math.ceil(width / 8))
    coarse = torch.rand(batch, 3, h, w, generator=gen)
    return F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=True)


def is_image_shape(shape: tuple[int, ...]) -> bool:
    """A (3, H, W) input: what image datasets produce."""
    return len(shape) == 3 and shape[0] == 3


def random_inputs(
    shapes: tuple[tuple[int, ...], ...], integers: tuple[IntegerInput | None, ...] | None = None
) -> InputsFn:
    """Seeded random inputs of ``shapes``: smooth images in [0, 1] for (3, H, W) inputs, standard
    normal values otherwise; float32 with a leading batch dimension. An input with an
    ``IntegerInput`` in ``integers`` (an ONNX graph's token ids or mask) takes its values."""

    def make(batch: int = 1, seed: int = 0) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        out = []
        for i, s in enumerate(shapes):
            integer = integers[i] if integers is not None and i < len(integers) else None
            if integer is not None:
                out.append(integer.make(gen, (batch, *s)))
            elif is_image_shape(s):
                out.append(smooth_images(gen, batch, s[1], s[2]))
            else:
                out.append(torch.randn(batch, *s, generator=gen))
        return tuple(out)

    return make


def batch_shapes(batch: tuple) -> tuple[tuple[int, ...], ...]:
    """Each tensor's shape in ``batch`` without its batch dimension."""
    return tuple(tuple(t.shape[1:]) for t in batch if isinstance(t, Tensor))
