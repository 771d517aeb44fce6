"""Model registry: toy models and real trained models loaded offline from installed packages.

from quantlab.models import build_model
bundle = build_model("mobilenet_v2")      # bundle.module (eval), bundle.task, bundle.metrics
"""

from quantlab.models.packages import MissingPackageError
from quantlab.models.registry import (
    MODEL_NAMES,
    ModelBundle,
    build_model,
    example_inputs,
    input_format,
)
from quantlab.models.tasks import TaskMetric
from quantlab.models.uvdoc import unwarp

__all__ = [
    "MODEL_NAMES",
    "MissingPackageError",
    "ModelBundle",
    "TaskMetric",
    "build_model",
    "example_inputs",
    "input_format",
    "unwarp",
]
