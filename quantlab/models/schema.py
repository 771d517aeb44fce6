"""Schema of the ``model`` config group."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    """Which model to build. ``name`` is a key of the model registry (quantlab.models)."""

    name: str = "small_cnn"
    pretrained: bool = True  # real weights from an installed package where the model has them
    # deployment form: inference BatchNorm folded into the feeding conv, Dropout removed
    fold_batchnorm: bool = True
