"""The data registry: name -> loader ``(DataConfig, ModelInputs | None) -> Dataset``."""

from __future__ import annotations

import importlib
from typing import Any

from quantlab.data.dataset import Dataset
from quantlab.data.schema import DataConfig

_LOADERS: dict[str, str] = {
    "photos": "quantlab.data.photos",
    "faces": "quantlab.data.faces",
    "stereo": "quantlab.data.stereo",
    "page": "quantlab.data.page",
    "sentences": "quantlab.data.sentences",
    "digits": "quantlab.data.digits",
    "synthetic": "quantlab.data.synthetic",
    "images": "quantlab.data.folder",
    "tensors": "quantlab.data.tensor_file",
}

DATA_NAMES: tuple[str, ...] = tuple(_LOADERS)


def load_data(cfg: DataConfig | str, model: Any = None) -> Dataset:
    """Load dataset ``cfg`` (a name or a DataConfig) preprocessed for ``model``: a registry name,
    a ModelConfig of the registry, a ModelBundle or a ModelInputs (None: the dataset's own
    default format). Unknown names raise ValueError listing DATA_NAMES; a dataset that cannot
    feed the model raises ValueError naming the datasets that can."""
    from quantlab.models.registry import model_inputs
    from quantlab.models.schema import ModelConfig

    if isinstance(cfg, str):
        cfg = DataConfig(name=cfg)
    if cfg.name not in _LOADERS:
        raise ValueError(f"data.name must be one of {', '.join(DATA_NAMES)}; got {cfg.name!r}")
    if isinstance(model, ModelConfig):
        model = model.name
    inputs = None if model is None else model_inputs(model)
    return importlib.import_module(_LOADERS[cfg.name]).load(cfg, inputs)
