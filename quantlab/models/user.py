"""The user's own model as a ``ModelBundle``: ``model=custom`` (a Python factory) or
``model=onnx`` (an ONNX file).

Input shapes: ``model.input_shape`` when given (one shape, or one per input), else the ONNX
graph's static shapes, else the shapes of the example batch (in an experiment: the first
calibration batch of the data). Integer inputs: an ONNX graph's own (``onnx_inputs``), a custom
model's from ``model.input_dtype`` (``custom_inputs``). The module is put in eval mode and into
deployment form (BatchNorm folded, Dropout removed) with the example batch, as the registry
models are.

Task metrics: ``model.metric`` first when given; then, for an output that is one (B, C) tensor
with C >= 2 (classifier-shaped) whose rows are not unit vectors (an embedding's, judged by
cosine) or are probabilities (a softmax's, however confident), top-1 agreement with float and KL
of the softmax; for every output, output SQNR and per-item output cosine against float.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from quantlab.models.fold import to_deployment_form
from quantlab.models.inputs import random_inputs
from quantlab.models.onnx_inputs import IntegerInput
from quantlab.models.registry import ModelBundle
from quantlab.models.schema import ModelConfig
from quantlab.models.tasks import (
    CustomMetric,
    OutputCosine,
    OutputSQNR,
    ProbabilityKL,
    SoftmaxKL,
    TaskMetric,
    Top1Agreement,
)


class ModelInputError(ValueError):
    """The model cannot run on the inputs it was given (shapes, count, dtype)."""


def user_model_name(cfg: ModelConfig) -> str:
    """``custom:<target>``, or the ONNX file's stem; a stem that names no model (``model``,
    ``model_quantized``: most exporters' file names) after its folder's name
    (``standard_v3_3/model``)."""
    if cfg.name == "custom":
        return f"custom:{cfg.target}"
    path = Path(cfg.path)
    if path.stem.lower().startswith("model") and path.parent.name:
        return f"{path.parent.name}/{path.stem}"
    return path.stem


def declared_shapes(cfg: ModelConfig) -> tuple[tuple[int, ...], ...] | None:
    """``model.input_shape``, else the ONNX graph's shapes when fully static; else None.
    ValueError naming the input where an ONNX graph's input is not batch-first."""
    if cfg.name == "onnx":
        from quantlab.models.onnx_import import refuse_unbatched

        refuse_unbatched(cfg.path)
    if cfg.input_shape is not None:
        return cfg.input_shapes()
    if cfg.name == "onnx":
        from quantlab.models.onnx_import import static_shapes

        graph = static_shapes(cfg.path)
        if all(None not in g for g in graph):
            return tuple(tuple(g) for g in graph)
    return None


def declared_integers(cfg: ModelConfig) -> tuple[IntegerInput | None, ...] | None:
    """An ONNX graph's integer inputs (token ids, masks: ``onnx_inputs.integer_inputs``), None
    where it has none or for another model."""
    if cfg.name != "onnx":
        return None
    from quantlab.models.onnx_inputs import integer_inputs

    found = integer_inputs(cfg.path)
    return found if any(i is not None for i in found) else None


def _integer_inputs(
    cfg: ModelConfig, module: nn.Module, shapes: tuple[tuple[int, ...], ...]
) -> tuple[IntegerInput | None, ...] | None:
    """The integer inputs an ONNX graph declares, or those ``model.input_dtype`` declares for a
    custom model (their tables found in ``module``: ``custom_inputs``)."""
    if cfg.name == "onnx":
        return declared_integers(cfg)
    dtypes = cfg.input_dtypes()
    if dtypes is not None and len(dtypes) != len(shapes):
        raise ValueError(
            f"model.input_dtype names {len(dtypes)} dtype(s), but the model takes "
            f"{len(shapes)} input(s) of shape {', '.join(str(list(s)) for s in shapes)}"
        )
    from quantlab.models.custom_inputs import custom_integers

    return custom_integers(module, shapes, dtypes)


def partial_shapes(cfg: ModelConfig) -> tuple[tuple[int | None, ...], ...] | None:
    """An ONNX graph's input shapes without the batch dimension, None where a dim is dynamic
    (the channels of a text-line model of any width: (1, 64, None)); None for other models."""
    if cfg.name != "onnx" or cfg.input_shape is not None:
        return None
    from quantlab.models.onnx_import import static_shapes

    return tuple(tuple(g) for g in static_shapes(cfg.path))


def custom_metric(cfg: ModelConfig) -> CustomMetric:
    """The task metric ``model.metric`` names (direction: ``model.metric_higher_is_better``)."""
    from quantlab.models.custom import import_target

    fn = import_target(cfg.metric, "model.metric")
    if not callable(fn):
        raise ValueError(f"model.metric={cfg.metric!r} is a {type(fn).__name__}, not callable")
    return CustomMetric(
        name=getattr(fn, "__name__", cfg.metric.rpartition(":")[2]),
        higher_is_better=cfg.metric_higher_is_better,
        fn=fn,
        target=cfg.metric,
    )


UNIT_ROW_TOLERANCE = 1e-3  # |norm - 1| of every row of an L2-normalized embedding


def default_metrics(output: object) -> tuple[TaskMetric, ...]:
    """Top-1 agreement and KL for a classifier-shaped output (one float (B, C) tensor, C >= 2,
    not an embedding: not every row's L2 norm within UNIT_ROW_TOLERANCE of 1, or the rows are
    probabilities: a confident softmax's rows are near one-hot, of norm 1 too), then output
    SQNR and output cosine for any output (first, for an embedding). The KL is of the softmax
    of logits, of the rows themselves where they are probabilities (``ProbabilityKL``), and
    none where every value lies in [0, 1] but the rows are no distributions (independent
    sigmoid scores: CREPE's pitch bins)."""
    classifier = (
        isinstance(output, Tensor)
        and output.is_floating_point()
        and output.dim() == 2
        and output.shape[1] >= 2
        and (not _unit_rows(output) or _probability_rows(output))
    )
    common = (OutputSQNR(), OutputCosine())
    if not classifier:
        return common
    if _probability_rows(output):
        return (Top1Agreement(), ProbabilityKL(), *common)
    if bool(((output >= 0) & (output <= 1)).all()):
        return (Top1Agreement(), *common)
    return (Top1Agreement(), SoftmaxKL(), *common)


def _probability_rows(output: Tensor) -> bool:
    """Whether every row of ``output`` (B, C) is a probability distribution: no negative value,
    a sum within UNIT_ROW_TOLERANCE of 1."""
    rows = output.detach().to(torch.float64)
    return bool((rows >= 0).all() and ((rows.sum(1) - 1).abs() <= UNIT_ROW_TOLERANCE).all())


def _unit_rows(output: Tensor) -> bool:
    """Whether every row of ``output`` (B, C) has an L2 norm within UNIT_ROW_TOLERANCE of 1."""
    norms = torch.linalg.vector_norm(output.detach().to(torch.float64), dim=1)
    return bool(((norms - 1).abs() <= UNIT_ROW_TOLERANCE).all())


def run_example(module: nn.Module, name: str, example: tuple) -> object:
    """``module(*example)`` without gradients; a failure names the input shapes, and how to
    declare more than one where forward takes another number of inputs."""
    try:
        with torch.no_grad():
            return module(*example)
    except Exception as err:  # a user module can raise anything on wrong inputs
        shapes = ", ".join(
            str(list(t.shape)) if isinstance(t, Tensor) else type(t).__name__ for t in example
        )
        hint = ""
        if not _takes(module, len(example)):
            hint = (
                f"; forward does not take {len(example)} input(s): model.input_shape takes one "
                "list per input, e.g. [[3, 224, 224], [1, 224, 224]]"
            )
        raise ModelInputError(
            f"model {name} fails on inputs of shape {shapes}: {type(err).__name__}: {err}{hint}"
        ) from None


def _takes(module: nn.Module, count: int) -> bool:
    """Whether ``module.forward`` accepts ``count`` positional inputs (True where its signature
    cannot be read)."""
    import inspect

    try:
        inspect.signature(module.forward).bind(*range(count))
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin forward)
        return True
    return True


def build_user_model(
    cfg: ModelConfig, seed: int = 0, example: tuple[Tensor, ...] | None = None
) -> ModelBundle:
    """Build ``model=custom`` or ``model=onnx`` (module docstring) in eval, deployment form."""
    name = user_model_name(cfg)
    shapes = declared_shapes(cfg)
    if shapes is None and example is not None:
        shapes = tuple(tuple(t.shape[1:]) for t in example)
    if shapes is None and cfg.name == "custom":
        raise ValueError(
            f"model {name} does not declare its input shape: set model.input_shape=[C,H,W] "
            "(without the batch dimension; [[C,H,W], [N]] for two inputs) or give data whose "
            "shape it takes"
        )
    reference, reference_name, fixed_batch, probe_inputs = None, "", None, ()
    if cfg.name == "onnx":
        from quantlab.models.onnx_import import load_onnx

        converted = load_onnx(cfg.path, None if shapes is None else [list(s) for s in shapes])
        module, reference, reference_name = converted.module, converted.reference, "onnxruntime"
        shapes, fixed_batch = converted.input_shapes, converted.fixed_batch
        probe_inputs = converted.probe_inputs
    else:
        from quantlab.models.custom import build_custom, load_checkpoint

        module = build_custom(cfg.target, cfg.kwargs, seed)
        if cfg.checkpoint:
            load_checkpoint(module, cfg.checkpoint)
    module.eval()
    make = random_inputs(shapes, _integer_inputs(cfg, module, shapes))
    probe = example if example is not None else (probe_inputs or make(1, 0))
    output = run_example(module, name, probe)
    if cfg.fold_batchnorm:
        to_deployment_form(module, probe)
    metrics = default_metrics(output)
    if cfg.metric is not None:
        metrics = (custom_metric(cfg), *metrics)
    kind = "ONNX graph" if cfg.name == "onnx" else "Python module"
    return ModelBundle(
        name=name,
        module=module,
        task=metrics[0],
        description=f"your {kind} {cfg.path or cfg.target}, input shape(s) "
        + ", ".join(str(list(s)) for s in shapes),
        metrics=metrics,
        input_format=None,
        default_data="synthetic",
        example_inputs=make,
        registry=False,
        input_shapes=shapes,
        reference=reference,
        reference_name=reference_name,
        fixed_batch=fixed_batch,
    )
