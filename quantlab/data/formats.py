"""Which image format a dataset applies for a model (the model, or for a user's model the data
config, decides it)."""

from __future__ import annotations

from quantlab.data.schema import DataConfig
from quantlab.models.formats import ChannelOrder, ImageFormat
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
    cfg = cfg or DataConfig()
    shapes = model.shapes
    if shapes is None and model.partial_shapes is not None:
        shapes = _completed(model.partial_shapes, cfg, model.name)
    return config_format(cfg, shapes, data_name, model.name)


def _completed(partial, cfg: DataConfig, model: str):
    """A graph's one image input (C, H, W), C static and H or W dynamic (a fully static one
    is the model's ``shapes``), with its dynamic height / width from ``data.size`` (a static
    one must agree with it); None where the graph's inputs are not one such image
    (``config_format`` then says what is needed)."""
    if len(partial) != 1 or len(partial[0]) != 3 or partial[0][0] not in (1, 3):
        return None
    c, h, w = partial[0]
    if cfg.size is None:
        raise ValueError(
            f"data.size is needed: model {model} takes images of {c} channel(s) with a "
            f"dynamic size [{c}, {h or '?'}, {w or '?'}]; set data.size=[height,width]"
        )
    for name, have, want in (("height", h, cfg.size[0]), ("width", w, cfg.size[1])):
        if have is not None and have != want:
            raise ValueError(
                f"data.size={list(cfg.size)} but model {model} takes a {name} of {have} "
                f"(its input [{c}, {h or '?'}, {w or '?'}]); make them agree"
            )
    return ((c, int(cfg.size[0]), int(cfg.size[1])),)


def config_format(
    cfg: DataConfig, shapes: tuple[tuple[int, ...], ...] | None, data_name: str, model: str
) -> ImageFormat:
    """The ImageFormat ``cfg`` describes for a model taking inputs of ``shapes`` (None: unknown)."""
    from quantlab.models.formats import Resize

    if shapes is not None and (len(shapes) != 1 or not _color_or_gray(shapes[0])):
        shown = ", ".join(str(list(s)) for s in shapes)
        raise ValueError(
            f"data '{data_name}' gives one image input (3, H, W), or (1, H, W) in grayscale, per "
            f"item, but model {model} takes inputs of shape {shown} (without the batch "
            f"dimension); use data=tensors"
        )
    channels = _channels(cfg, shapes, model)
    n = channels.count
    for name in ("mean", "std"):
        v = getattr(cfg, name)
        if v is not None and len(v) != n:
            raise ValueError(
                f"data.{name}={list(v)}, but model {model} takes {n} channel(s) "
                f"({channels.name}): give one value per channel"
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
        tuple(cfg.mean) if cfg.mean is not None else (0.0,) * n,
        tuple(cfg.std) if cfg.std is not None else (1.0,) * n,
        channels=channels,
    )


def _color_or_gray(shape: tuple[int, ...]) -> bool:
    return is_image_shape(shape) or (len(shape) == 3 and shape[0] == 1)


def _channels(cfg: DataConfig, shapes, model: str) -> ChannelOrder:
    """``data.channel_order``, or GRAY for a model that takes one channel (the default RGB
    then means the images' own colours, made luma); a colour order for a grayscale model, or
    GRAY for a colour one, raises ValueError."""
    order = cfg.channel_order
    if shapes is None:
        return order
    if shapes[0][0] == 1:
        if order is ChannelOrder.BGR:
            raise ValueError(
                f"data.channel_order=BGR, but model {model} takes one channel: use "
                "data.channel_order=GRAY (or leave it unset)"
            )
        return ChannelOrder.GRAY
    if order is ChannelOrder.GRAY:
        raise ValueError(
            f"data.channel_order=GRAY makes one luma channel, but model {model} takes 3 "
            "(use RGB or BGR)"
        )
    return order
