"""The data registry: name -> loader ``(DataConfig, model name | None) -> Dataset``."""

from __future__ import annotations

import importlib

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
}

DATA_NAMES: tuple[str, ...] = tuple(_LOADERS)


def load_data(cfg: DataConfig | str, model: str | None = None) -> Dataset:
    """Load dataset ``cfg`` (a name or a DataConfig) preprocessed for registry model ``model``
    (None: the dataset's own default format). Unknown names raise ValueError listing DATA_NAMES;
    a dataset that cannot feed the model raises ValueError naming the datasets that can."""
    if isinstance(cfg, str):
        cfg = DataConfig(name=cfg)
    if cfg.name not in _LOADERS:
        raise ValueError(f"data.name must be one of {', '.join(DATA_NAMES)}; got {cfg.name!r}")
    if model is not None and not isinstance(model, str):
        model = model.name  # a ModelConfig or ModelBundle
    return importlib.import_module(_LOADERS[cfg.name]).load(cfg, model)
