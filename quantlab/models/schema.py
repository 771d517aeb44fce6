"""Schema of the ``model`` config group."""

from __future__ import annotations

from collections.abc import Sequence
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
    # each input's shape without the batch dimension: [3, 224, 224] for one input, one list per
    # input for several ([[128], [128]]: token ids and their mask); None: inferred (ONNX graph,
    # image data's size, tensor file). Read through input_shapes()
    input_shape: Any = None
    # custom: each input's dtype, float32 (the default), int64 or int32 (token ids, a mask): one
    # name for one input, one per input as input_shape lists them; an ONNX graph declares its
    # own. Read through input_dtypes()
    input_dtype: Any = None
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
        shapes = self.input_shapes()  # a malformed model.input_shape fails here, naming it
        if self.input_dtype is not None and self.name != "custom":
            raise ValueError(
                f"model.input_dtype is only read with model=custom, got model={self.name} (an "
                "ONNX graph declares its inputs' types)"
            )
        dtypes = self.input_dtypes()
        if shapes is not None and dtypes is not None and len(shapes) != len(dtypes):
            raise ValueError(
                f"model.input_dtype names {len(dtypes)} dtype(s) for the {len(shapes)} input "
                "shape(s) of model.input_shape: give one per input"
            )

    def input_shapes(self) -> tuple[tuple[int, ...], ...] | None:
        """``input_shape`` as one shape per input (None: not given). One list of sizes is one
        input's shape; a list of lists, one shape per input."""
        value = self.input_shape
        if value is None:
            return None
        nested = _is_sequence(value) and bool(value) and all(_is_sequence(v) for v in value)
        shapes = [list(v) for v in value] if nested else [value]
        if not all(_is_sequence(s) and s and all(_is_size(d) for d in s) for s in shapes):
            raise ValueError(
                "model.input_shape must list positive sizes without the batch dimension, for "
                "one input ([3, 224, 224]) or per input ([[3, 224, 224], [1, 224, 224]]); got "
                f"{_plain(value)}"
            )
        return tuple(tuple(int(d) for d in s) for s in shapes)

    def input_dtypes(self) -> tuple[str, ...] | None:
        """``input_dtype`` as one name per input (None: not given, every input float32)."""
        value = self.input_dtype
        if value is None:
            return None
        names = [value] if isinstance(value, str) else list(value) if _is_sequence(value) else []
        if not names or not all(isinstance(n, str) and n in INPUT_DTYPES for n in names):
            raise ValueError(
                f"model.input_dtype must name one of {', '.join(INPUT_DTYPES)} for each input "
                f"([int64, int64]: token ids and a mask); got {_plain(value)}"
            )
        return tuple(names)

    def declares_integers(self) -> bool:
        """Whether ``input_dtype`` makes any input an integer one."""
        return any(n != "float32" for n in self.input_dtypes() or ())


INPUT_DTYPES = ("float32", "int64", "int32")
"""``model.input_dtype`` values: what a custom model's inputs hold."""


def _is_sequence(value: Any) -> bool:
    return not isinstance(value, (str, bytes)) and isinstance(value, Sequence)


def _is_size(value: Any) -> bool:
    """A positive int (not a bool, not a float)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _plain(value: Any) -> Any:
    """``value`` with OmegaConf lists as plain lists, for messages."""
    return [_plain(v) for v in value] if _is_sequence(value) else value


def _is_target(value: str) -> bool:
    module, sep, attr = value.partition(":")
    return bool(sep and module and attr) and all(p.isidentifier() for p in module.split("."))
