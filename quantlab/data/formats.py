"""Which image format a dataset applies for a model (the model registry decides it)."""

from __future__ import annotations

from quantlab.models.formats import ImageFormat
from quantlab.models.registry import input_format


def image_format(data_name: str, model: str | None, default: ImageFormat) -> ImageFormat:
    """The model's image input format, or ``default`` when no model is given.

    A model whose inputs are not images (token ids, feature tensors) raises ValueError naming the
    datasets that do fit it.
    """
    if model is None:
        return default
    fmt = input_format(model)
    if fmt is None:
        raise ValueError(
            f"data '{data_name}' holds images, but model '{model}' does not take images; "
            f"use data=synthetic (any model) or data=sentences (minilm)"
        )
    return fmt
