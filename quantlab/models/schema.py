"""Schema of the ``model`` config group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantlab.models.input_path import InputFormat

USER_MODELS = ("custom", "onnx")
"""``model.name`` values that bring the user's own model instead of a registry entry."""


@dataclass
class ModelConfig:
    """Which model to build: a key of the model registry (quantlab.models), or the user's own
    model: ``custom`` (a Python factory, ``target``) or ``onnx`` (an ONNX file, ``path``)."""

    name: str = "small_cnn"
    pretrained: bool = True  # real weights from an installed package where the model has them
    # deployment form: inference BatchNorm folded into the feeding conv, Dropout removed
    fold_batchnorm: bool = True
    # --- your own model
    target: str | None = None  # custom: "package.module:function" returning an nn.Module
    kwargs: Any = None  # custom: a mapping of keyword arguments of target
    checkpoint: str | None = None  # custom: a state dict file, read with weights_only=True
    path: str | None = None  # onnx: the .onnx file
    # one input's shape without the batch dimension, e.g. [3, 224, 224]; None: inferred (ONNX
    # graph, image data's size, tensor file)
    input_shape: list[int] | None = None
    # "package.module:function" with (ref_outputs, test_outputs, labels) -> float, the model's
    # main task metric (lists of per-batch outputs of the float and the tested run)
    metric: str | None = None
    metric_higher_is_better: bool = True
    # what an image model takes (quantlab.models.input_path.InputFormat): FLOAT_NORMALIZED (the
    # training preprocessing), or the deployed path UINT8_RGB / UINT8_BGR / NV12 (uint8 pixels as
    # int8 codes p - 128 at input scale 1, mean/std folded into the first conv); your own model's
    # mean/std, size and channel order are the image data's (data.mean, data.std, ...)
    input_format: InputFormat = InputFormat.FLOAT_NORMALIZED

    def __post_init__(self) -> None:
        self.input_format = InputFormat.parse(self.input_format, "model.input_format")
        if self.name == "custom" and not self.target:
            raise ValueError(
                "model.target is required with model=custom: 'package.module:function' that "
                "returns your nn.Module (e.g. model.target=my_pkg.nets:build_model)"
            )
        if self.name == "onnx" and not self.path:
            raise ValueError("model.path is required with model=onnx: the .onnx file to load")
        for field_name, owner in (("target", "custom"), ("checkpoint", "custom"), ("path", "onnx")):
            if getattr(self, field_name) and self.name != owner:
                raise ValueError(
                    f"model.{field_name} is only read with model={owner}, got model={self.name}"
                )
        if self.kwargs is not None:
            if not isinstance(self.kwargs, dict):
                raise ValueError(
                    f"model.kwargs must be a mapping, e.g. model.kwargs={{width: 8}}; got "
                    f"{self.kwargs!r}"
                )
            if self.name != "custom":
                raise ValueError(
                    f"model.kwargs is only read with model=custom, got model={self.name}"
                )
        for field_name in ("target", "metric"):
            value = getattr(self, field_name)
            if value is not None and not _is_target(value):
                raise ValueError(
                    f"model.{field_name}={value!r} must have the form 'package.module:function'"
                )
        if self.input_shape is not None and (
            not self.input_shape or any(int(d) < 1 for d in self.input_shape)
        ):
            raise ValueError(
                "model.input_shape must list positive sizes without the batch dimension, "
                f"e.g. [3, 224, 224]; got {list(self.input_shape)}"
            )


def _is_target(value: str) -> bool:
    module, sep, attr = value.partition(":")
    return bool(sep and module and attr) and all(p.isidentifier() for p in module.split("."))
