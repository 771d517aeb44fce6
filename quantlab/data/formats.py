"""Which image format a dataset applies for a model (the model, or for a user's model the data
config, decides it)."""

from __future__ import annotations

from quantlab.data.schema import DataConfig
from quantlab.models.formats import ImageFormat
from quantlab.models.inputs import ModelInputs, is_image_shape


def image_format(
    data_name: str, model: ModelInputs | None, default: ImageFormat, cfg: DataConfig | None = None
) -> ImageFormat:
    """The image format for ``model``: a registry model's own input format; for a user's model,
    the one ``cfg`` describes (``data.size`` / ``resize`` / ``channel_order`` / ``mean`` /
    ``std``); without a model, ``cfg``'s when it sets one, else ``default``.

    A model whose inputs are not images raises ValueError naming what fits it; ``data.size``,
    ``mean`` or ``std`` given for a model with its own format raise ValueError.
    """
    if model is None:
        if cfg is not None and cfg.sets_image_format:
            return config_format(cfg, None, data_name, "the dataset")
        return default
    if model.input_format is not None:
        if cfg is not None and cfg.sets_image_format:
            f = model.input_format
            raise ValueError(
                f"data.size, data.mean and data.std apply to models without their own input "
                f"format; model '{model.name}' takes {f.height}x{f.width} images with mean "
                f"{f.mean} and std {f.std}: leave them unset"
            )
        return model.input_format
    if model.registry:
        raise ValueError(
            f"data '{data_name}' holds images, but model '{model.name}' does not take images; "
            f"use data=synthetic (any model), data=tensors (your own tensors) or "
            f"data=sentences (minilm)"
        )
    return config_format(cfg or DataConfig(), model.shapes, data_name, model.name)


def config_format(
    cfg: DataConfig, shapes: tuple[tuple[int, ...], ...] | None, data_name: str, model: str
) -> ImageFormat:
    """The ImageFormat ``cfg`` describes for a model taking inputs of ``shapes`` (None: unknown)."""
    from quantlab.models.formats import Resize

    if shapes is not None and (len(shapes) != 1 or not is_image_shape(shapes[0])):
        shown = ", ".join(str(list(s)) for s in shapes)
        raise ValueError(
            f"data '{data_name}' gives one image input (3, H, W) per item, but model {model} "
            f"takes inputs of shape {shown} (without the batch dimension); use data=tensors"
        )
    size = tuple(cfg.size) if cfg.size is not None else None
    if shapes is not None:
        want = tuple(shapes[0][1:])
        if size is not None and size != want:
            raise ValueError(
                f"data.size={list(size)} but model {model} takes {list(want)} (height, width); "
                "leave data.size unset or make them agree"
            )
        size = want
    if size is None and cfg.resize is not Resize.KEEP:
        raise ValueError(
            f"data.size is needed: model {model} does not declare its input size; set "
            "data.size=[height,width] (or model.input_shape=[3,height,width], or "
            "data.resize=KEEP for a model that takes any size)"
        )
    h, w = size if size is not None else (0, 0)
    return ImageFormat(
        h,
        w,
        cfg.resize,
        tuple(cfg.mean) if cfg.mean is not None else (0.0, 0.0, 0.0),
        tuple(cfg.std) if cfg.std is not None else (1.0, 1.0, 1.0),
        channels=cfg.channel_order,
    )
