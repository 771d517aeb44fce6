"""The deployed image input path: uint8 pixels (or NV12) in, mean/std folded into the first conv.

A trained image model takes floats ``(p / 255 - mean) / std``. The deployed model takes what
the image source delivers (seed 002 s.6.3 and s.8.3; seed 004 on pyramid / resizer inputs):
uint8 pixels p in 0..255, fed as int8 codes ``q = p - 128`` at a fixed input scale of 1 (the
uint8 zero point 128), with ``(data - mean) / std`` folded into the first convolution:

    x_c = a_c q_c + d_c,  a_c = 1 / (255 std_c),  d_c = (128 / 255 - mean_c) / std_c
    W'[o, c] = W[o, c] a_c,  b'[o] = b[o] + sum_{c, k} W[o, c, k] d_c

exactly the float model in the image interior (float64, stored float32). The conv's zero
padding (x = 0) is the pixel 255 mean_c, not a code, so the padding moves to the input: the
deployed input carries the conv's border as codes (``Border``), and the folded conv pads
nothing. An NV12 source is converted on the chip to the model's channel order first
(``quantlab.numerics.yuv`` with the platform's assumed ``image_yuv_*`` fields).

``deploy_input_path(model, image_format, path, example)`` returns the deployed model (a copy;
its ``input_quant`` attribute tells the Simulator the input is int8 codes at scale 1) and
``path.codes(images)`` makes its inputs from RGB images in [0, 1].
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from quantlab.models.formats import ChannelOrder, ImageFormat
from quantlab.numerics.dtypes import DType
from quantlab.numerics.rounding import Round
from quantlab.numerics.yuv import YuvMatrix, YuvRange, nv12_to_rgb, rgb_to_nv12
from quantlab.simulate.model_inputs import InputQuant

INPUT_ZERO_POINT = 128
"""uint8 pixel p enters as the int8 code p - 128 (scale 1)."""

PIXEL_INPUT = InputQuant(DType.INT8, 1.0)
"""What the deployed first conv receives: int8 codes at a fixed scale of 1 pixel level."""


class InputFormat(enum.Enum):
    """What an image model takes.

    FLOAT_NORMALIZED: float ``(p / 255 - mean) / std`` as trained; the first op calibrates its
        own input scale (the lab's float preprocessing).
    UINT8_RGB / UINT8_BGR: uint8 pixels in that channel order, as int8 codes p - 128 at scale 1,
        mean/std folded into the first conv (its input channels reordered when the order differs
        from the model's).
    NV12: the source delivers NV12 (e.g. the pyramid); the chip converts it to the model's
        channel order, then as UINT8_*.
    """

    FLOAT_NORMALIZED = "float_normalized"
    UINT8_RGB = "uint8_rgb"
    UINT8_BGR = "uint8_bgr"
    NV12 = "nv12"

    @classmethod
    def parse(cls, value: InputFormat | str, field: str = "input_format") -> InputFormat:
        if isinstance(value, cls):
            return value
        for m in cls:
            if value in (m.name, m.value):
                return m
        allowed = ", ".join(m.name for m in cls)
        raise ValueError(f"{field}: unknown input format {value!r}; allowed: {allowed}")


class Border(enum.Enum):
    """The first conv's padding, moved to the deployed input.

    MEAN_PIXEL: each channel's border is the code nearest 255 mean_c - 128 (half to even), the
        pixel whose normalised value is 0: the float model's zero padding up to that rounding.
    ZERO_CODE: every border code is 0 (pixel 128): what a fold that keeps the conv's own zero
        padding computes.
    """

    MEAN_PIXEL = "mean_pixel"
    ZERO_CODE = "zero_code"


@dataclass(frozen=True)
class YuvConversion:
    """The NV12 <-> RGB arithmetic (``quantlab.numerics.yuv``); from the platform's assumed
    ``image_yuv_matrix``, ``image_yuv_range``, ``image_yuv_round``."""

    matrix: YuvMatrix = YuvMatrix.BT601
    range: YuvRange = YuvRange.FULL
    rounding: Round = Round.HALF_UP

    @classmethod
    def of(cls, platform) -> YuvConversion:
        return cls(platform.image_yuv_matrix, platform.image_yuv_range, platform.image_yuv_round)


@dataclass(frozen=True)
class InputPath:
    """How a deployed image model receives images: ``format``, the model's float preprocessing
    ``image`` (size, mean/std, channel order), the first conv's ``pad`` (left, right, top,
    bottom) moved to the input with ``border``, and the NV12 conversion ``yuv``."""

    format: InputFormat
    image: ImageFormat
    pad: tuple[int, int, int, int] = (0, 0, 0, 0)
    border: Border = Border.MEAN_PIXEL
    yuv: YuvConversion = YuvConversion()

    def __post_init__(self) -> None:
        if self.format is InputFormat.FLOAT_NORMALIZED:
            raise ValueError(
                "InputPath describes a deployed uint8 / NV12 input, not FLOAT_NORMALIZED"
            )

    @property
    def channels(self) -> ChannelOrder:
        """Channel order of the deployed input (NV12 converts to the model's own order)."""
        if self.format is InputFormat.UINT8_RGB:
            return ChannelOrder.RGB
        if self.format is InputFormat.UINT8_BGR:
            return ChannelOrder.BGR
        return self.image.channels

    def pixels(self, images: Tensor) -> Tensor:
        """RGB images (B, 3, H, W) float in [0, 1], already at the model's size -> the uint8
        pixels the first conv sees, in ``channels`` order: round(255 x) (half to even, clamped;
        the image source's own quantization), through NV12 and back for NV12."""
        rgb = torch.round(images.to(torch.float32).clamp(0, 1) * 255).to(torch.uint8)
        if self.format is InputFormat.NV12:
            y, uv = rgb_to_nv12(rgb, self.yuv.matrix, self.yuv.range, self.yuv.rounding)
            rgb = nv12_to_rgb(y, uv, self.yuv.matrix, self.yuv.range, self.yuv.rounding)
        return rgb.flip(1) if self.channels is ChannelOrder.BGR else rgb

    def border_codes(self) -> tuple[int, int, int]:
        """Per deployed channel, the int8 code of the border (``Border``); Python ``round``:
        half to even."""
        if self.border is Border.ZERO_CODE:
            return (0, 0, 0)
        mean = self.image.mean  # model channel order
        if self.channels is not self.image.channels:
            mean = tuple(reversed(mean))
        return tuple(min(127, max(-128, round(255.0 * m - INPUT_ZERO_POINT))) for m in mean)

    def codes(self, images: Tensor) -> Tensor:
        """The deployed model's input: float32 int8 codes p - 128 (scale 1), with the border
        ``pad`` filled by ``border_codes()``; (B, 3, H + top + bottom, W + left + right)."""
        q = self.pixels(images).to(torch.float32) - INPUT_ZERO_POINT
        left, right, top, bottom = self.pad
        if not any(self.pad):
            return q.contiguous()
        b, c, h, w = q.shape
        out = torch.empty(b, c, h + top + bottom, w + left + right, dtype=torch.float32)
        out[:] = torch.tensor(self.border_codes(), dtype=torch.float32).view(1, 3, 1, 1)
        out[:, :, top : top + h, left : left + w] = q
        return out


def _channel_perm(path: InputPath) -> list[int]:
    """deployed channel j -> model channel."""
    return [2, 1, 0] if path.channels is not path.image.channels else [0, 1, 2]


def first_conv(model: nn.Module, example: Tensor) -> tuple[str, nn.Conv2d]:
    """(name, module) of the Conv2d that takes the model's image input as it is, found by one
    float run on ``example``; ValueError when the input reaches no Conv2d directly."""
    names = {id(m): n for n, m in model.named_modules()}
    hits: list = []

    def pre(mod, args):
        if not hits and args and args[0] is example and isinstance(mod, nn.Conv2d):
            hits.append(mod)

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in handles:
            h.remove()
    if not hits:
        raise ValueError(
            "the deployed input path folds mean/std into the first convolution, but this model's "
            "image input does not go straight into an nn.Conv2d; use input_format=FLOAT_NORMALIZED"
        )
    return names[id(hits[0])], hits[0]


def conv_padding(conv: nn.Conv2d) -> tuple[int, int, int, int]:
    """(left, right, top, bottom) zero padding a Conv2d applies to its input (its own padding
    plus a ``static_padding`` ZeroPad2d, as TF-style 'same' convs carry); ValueError otherwise."""
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise ValueError(
            f"first conv padding {conv.padding!r} / {conv.padding_mode!r}: only explicit zero "
            "padding can move to the deployed input"
        )
    ph, pw = conv.padding
    pad = [pw, pw, ph, ph]
    extra = getattr(conv, "static_padding", None)
    if isinstance(extra, nn.ZeroPad2d):
        pad = [p + e for p, e in zip(pad, extra.padding)]
    elif extra is not None and not isinstance(extra, nn.Identity):
        raise ValueError(f"first conv static_padding {type(extra).__name__} is not zero padding")
    return tuple(int(p) for p in pad)


def fold_normalization(conv: nn.Conv2d, path: InputPath) -> nn.Conv2d:
    """A Conv2d without padding that computes ``conv`` on the normalised image from the int8
    codes p - 128 in the deployed channel order (float64, stored float32; see module doc)."""
    if conv.groups != 1 or conv.in_channels != 3:
        raise ValueError(
            f"the first conv must take 3 channels with groups=1 to fold mean/std, got "
            f"in_channels={conv.in_channels}, groups={conv.groups}"
        )
    mean = torch.tensor(path.image.mean, dtype=torch.float64)
    std = torch.tensor(path.image.std, dtype=torch.float64)
    a = 1.0 / (255.0 * std)
    d = (INPUT_ZERO_POINT / 255.0 - mean) / std
    w = conv.weight.detach().to(torch.float64)
    b = (
        conv.bias.detach().to(torch.float64)
        if conv.bias is not None
        else torch.zeros(w.shape[0], dtype=torch.float64)
    )
    b_new = b + (w * d.view(1, 3, 1, 1)).sum(dim=(1, 2, 3))
    w_new = (w * a.view(1, 3, 1, 1))[:, _channel_perm(path)]
    out = nn.Conv2d(
        3,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=0,
        dilation=conv.dilation,
        bias=True,
    )
    with torch.no_grad():
        out.weight.copy_(w_new.to(torch.float32))
        out.bias.copy_(b_new.to(torch.float32))
    return out.eval()


def deploy_input_path(
    model: nn.Module,
    image: ImageFormat,
    fmt: InputFormat | str,
    example: Tensor,
    border: Border = Border.MEAN_PIXEL,
    yuv: YuvConversion = YuvConversion(),
) -> tuple[nn.Module, InputPath]:
    """(deployed model, its ``InputPath``) for input format ``fmt``: a copy of ``model`` whose
    first conv (found on the float ``example`` (B, 3, H, W)) is ``fold_normalization`` of it,
    declaring ``input_quant = (PIXEL_INPUT,)``; feed it ``path.codes(images)``. ``model`` is
    not changed."""
    fmt = InputFormat.parse(fmt)
    if fmt is InputFormat.FLOAT_NORMALIZED:
        raise ValueError(
            "deploy_input_path needs a uint8 or NV12 input format, got FLOAT_NORMALIZED"
        )
    name, conv = first_conv(model, example)
    path = InputPath(fmt, image, conv_padding(conv), border, yuv)
    if not name:  # the model is the conv
        deployed = fold_normalization(conv, path)
    else:
        deployed = copy.deepcopy(model)
        parent_name, _, attr = name.rpartition(".")
        parent = deployed.get_submodule(parent_name) if parent_name else deployed
        setattr(parent, attr, fold_normalization(conv, path))
    deployed.input_quant = (PIXEL_INPUT,)
    return deployed.eval(), path


def unit_format(image: ImageFormat) -> ImageFormat:
    """``image`` without normalisation and in RGB: resized pixels in [0, 1] (what
    ``InputPath.codes`` takes)."""
    return dataclasses.replace(
        image, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), channels=ChannelOrder.RGB
    )


def deploy_workload(
    bundle, data_cfg, fmt: InputFormat | str, platform, border: Border = Border.MEAN_PIXEL
):
    """(bundle, dataset) of image model ``bundle`` under input format ``fmt``: the dataset
    ``data_cfg`` loaded as resized RGB pixels and turned into the deployed codes, the bundle's
    module the deployed model (``deploy_input_path``; NV12 arithmetic from ``platform``).
    FLOAT_NORMALIZED loads the data as the model was trained. A registry model brings its own
    image format; the user's own model (one (3, H, W) input) takes the one its image data
    describes (``data.mean``, ``data.std``, ``data.channel_order``, ``data.resize``: what
    FLOAT_NORMALIZED feeds it). ValueError for a model without an image input, or data that
    holds no images."""
    from quantlab.data import load_data
    from quantlab.models.inputs import smooth_images

    fmt = InputFormat.parse(fmt, "model.input_format")
    if fmt is InputFormat.FLOAT_NORMALIZED:
        return bundle, load_data(data_cfg, bundle)
    if bundle.input_format is None:
        if bundle.registry:
            raise ValueError(
                f"model.input_format={fmt.name} needs an image model with its own preprocessing; "
                f"model '{bundle.name}' has none (use input_format=FLOAT_NORMALIZED)"
            )
        bundle, data_cfg = _user_image_format(bundle, data_cfg, fmt)
    unit = unit_format(bundle.input_format)

    def unit_inputs(batch: int = 1, seed: int = 0) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        if not bundle.registry:
            return (smooth_images(gen, batch, unit.height, unit.width),)
        from quantlab.models.registry import example_inputs as registry_inputs

        return registry_inputs(bundle.name, batch, seed, image_format=unit)

    # random data (data=synthetic): the same images as the float model's, unnormalised
    inputs = dataclasses.replace(bundle.inputs(), input_format=unit, example_inputs=unit_inputs)
    raw = load_data(data_cfg, inputs)
    example = bundle.input_format.apply(raw.calib[0][0])
    module, path = deploy_input_path(
        bundle.module, bundle.input_format, fmt, example, border, YuvConversion.of(platform)
    )

    def convert(batches: list) -> list:
        return [(path.codes(b[0]), *b[1:]) for b in batches]

    data = dataclasses.replace(raw, calib=convert(raw.calib), eval=convert(raw.eval))
    shape = tuple(data.calib[0][0].shape[1:])

    def example_inputs(batch: int = 1, seed: int = 0) -> tuple[Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        return (path.codes(smooth_images(gen, batch, unit.height, unit.width)),)

    deployed = dataclasses.replace(
        bundle, module=module, input_shapes=(shape,), example_inputs=example_inputs
    )
    return deployed, data


PIXEL_DATA = ("photos", "faces", "page", "images", "synthetic")
"""Datasets a user's model can take through a deployed input path: images in [0, 1] (synthetic:
smooth random images), from which the uint8 pixels are made."""


def _user_image_format(bundle, data_cfg, fmt: InputFormat):
    """(bundle with the image format its data describes, data config without it): a user's
    model has no preprocessing of its own, so ``data_cfg``'s size, mean, std, channel order and
    resize are what it was trained on; the deployed path loads the same images unnormalised."""
    from quantlab.data.formats import config_format
    from quantlab.models.inputs import is_image_shape

    shapes = bundle.input_shapes
    if shapes is None or len(shapes) != 1 or not is_image_shape(tuple(shapes[0])):
        shown = "unknown" if shapes is None else ", ".join(str(list(s)) for s in shapes)
        raise ValueError(
            f"model.input_format={fmt.name} needs a model with one (3, H, W) image input; "
            f"model {bundle.name} takes inputs of shape {shown} (without the batch dimension)"
        )
    if data_cfg.name not in PIXEL_DATA:
        raise ValueError(
            f"model.input_format={fmt.name} makes the model's input from uint8 pixels, so it "
            f"needs images; data={data_cfg.name} holds none (use data="
            + " / ".join(PIXEL_DATA)
            + ")"
        )
    # synthetic data feeds a user's model its smooth images in [0, 1] as they are (it reads no
    # data.mean / std / channel_order), so its deployed path folds nothing but the pixel scale
    described = data_cfg if data_cfg.name != "synthetic" else type(data_cfg)(name="synthetic")
    image = config_format(described, shapes, data_cfg.name, bundle.name)
    unset = dataclasses.replace(data_cfg, size=None, mean=None, std=None)
    return dataclasses.replace(bundle, input_format=image), unset
