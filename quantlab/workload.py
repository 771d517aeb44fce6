"""What an experiment that takes a model gets from its config: the model, its data and the
qconfig it starts from.

``load_workload(model, data)`` builds a registry model or the user's own (``model=custom``,
``model=onnx``; quantlab.models.user) and loads the data for it. A user's model without a
declared input shape takes the shape of the first calibration batch, which also serves for
BatchNorm folding; a model that cannot run on the data fails with the data named.
``start_spec(choice, platform, ...)`` turns the ``qconfig`` group into a ``QConfigSpec``; a
file's rules must each match an op of the model (``quantlab.qconfig.check_matches``).
``listed_or_chosen(ctx, names, ...)``: the models of an experiment with a list of its own,
or the one the command chose instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from quantlab.data import Dataset, load_data
from quantlab.data.schema import DataConfig
from quantlab.models.input_path import InputFormat, deploy_workload
from quantlab.models.inputs import ModelInputs, random_inputs
from quantlab.models.registry import ModelBundle, build_model
from quantlab.models.schema import USER_MODELS, ModelConfig
from quantlab.platforms import PlatformConfig
from quantlab.qconfig import OpContext, QConfigSpec, check_matches
from quantlab.qconfig_presets import QConfigChoice, QConfigPreset, preset_spec


def _data_words(cfg: DataConfig) -> str:
    return f"data={cfg.name}" + (f" ({cfg.path})" if cfg.path else "")


def _probe(bundle: ModelBundle, data: Dataset, cfg: DataConfig) -> None:
    """Run the float model on the first calibration and evaluation batch; a failure names the
    data. Where the batches hold the items of a graph that fixes its batch
    (``bundle.fixed_batch``), a smaller last batch is refused here, naming the field."""
    from quantlab.models.user import ModelInputError, run_example

    for split, batch in (("calibration", data.calib[0]), ("evaluation", data.eval[0])):
        try:
            run_example(bundle.module, bundle.name, batch)
        except ModelInputError as err:
            raise ValueError(f"{err} (the first {split} batch of {_data_words(cfg)})") from None
    size = batch_items(data.calib[0])
    if bundle.fixed_batch != size:  # any batch size, or a converted graph that takes others
        return
    for split, field, group in (
        ("calibration", "num_calib", data.calib),
        ("evaluation", "num_eval", data.eval),
    ):
        for i, batch in enumerate(group):
            if batch_items(batch) != size:
                raise ValueError(
                    f"data.{field}: {split} batch {i} of {_data_words(cfg)} holds "
                    f"{batch_items(batch)} items, and the model's graph fixes its batch at "
                    f"{size}: every batch must hold {size} (with image data, set "
                    f"data.{field} to a multiple of data.batch_size={cfg.batch_size})"
                )


def load_workload(
    model: ModelConfig, data: DataConfig, seed: int = 0, platform: Any = None
) -> tuple[ModelBundle, Dataset]:
    """The model ``model`` describes (eval, deployment form) and ``data`` loaded for it.

    With ``model.input_format`` other than FLOAT_NORMALIZED, the deployed image input path
    (``quantlab.models.input_path.deploy_workload``; the NV12 arithmetic from ``platform``, a
    PlatformConfig, default: the profile defaults); a user's model is first built on the data
    as ``data`` preprocesses it (its BatchNorm folded, its shape inferred there)."""
    if model.name not in USER_MODELS:
        bundle = build_model(model, seed)
        if model.input_format is not InputFormat.FLOAT_NORMALIZED:
            return deploy_workload(bundle, data, model.input_format, platform or PlatformConfig())
        dataset = load_data(data, bundle)
        if data.name == "tensors":
            _probe(bundle, dataset, data)
        return bundle, dataset
    from quantlab.models.user import (
        ModelInputError,
        declared_integers,
        declared_shapes,
        partial_shapes,
        user_model_name,
    )

    shapes = declared_shapes(model)
    if shapes is not None and model.declares_integers():
        # a custom model's integer inputs take values below its tables' rows: built first
        bundle = build_model(model, seed)
        dataset = load_data(data, bundle)
    else:
        inputs = ModelInputs(
            user_model_name(model),
            None,
            shapes,
            random_inputs(shapes, declared_integers(model)) if shapes is not None else None,
            registry=False,
            partial_shapes=partial_shapes(model) if shapes is None else None,
        )
        dataset = load_data(data, inputs)
        try:
            bundle = build_model(model, seed, example=dataset.calib[0])
        except ModelInputError as err:
            raise ValueError(
                f"{err} (the first calibration batch of {_data_words(data)})"
            ) from None
    _probe(bundle, dataset, data)
    if model.input_format is not InputFormat.FLOAT_NORMALIZED:
        return deploy_workload(bundle, data, model.input_format, platform or PlatformConfig())
    return bundle, dataset


def listed_or_chosen(
    ctx: Any,
    names: list[str],
    num_calib: int = DataConfig.num_calib,
    num_eval: int = DataConfig.num_eval,
) -> Iterator[tuple[str, ModelBundle, Dataset]]:
    """(name, bundle, dataset) of each model an experiment with a list of its own runs: the
    model the command chose (``ctx.model_chosen``: ``model=...``, your own included) alone, on
    ``ctx.data``; otherwise each registry model of ``names`` on its own data at these counts."""
    seed = ctx.seed or 0
    if ctx.model_chosen:
        bundle, data = load_workload(ctx.model, ctx.data, seed, ctx.platform)
        yield bundle.name, bundle, data
        return
    for name in names:
        bundle = build_model(name, seed)
        own = DataConfig(name=bundle.default_data, num_calib=num_calib, num_eval=num_eval)
        yield name, bundle, load_data(own, name)


def batches_per_run(bundle: ModelBundle, data: Dataset, wanted: int) -> int:
    """How many evaluation batches to merge into one run: ``wanted``, or exactly one run's worth
    where the model runs one batch size only (an ONNX graph that fixes its batch,
    ``bundle.fixed_batch``: it takes no other, smaller or larger)."""
    fixed = _fixed_per_run(bundle, data.eval[0])
    return wanted if fixed is None else fixed


def batch_items(batch: tuple) -> int:
    """The items of a batch of model inputs: its first input's first dimension (1 for a
    scalar or a non-tensor first input)."""
    first = batch[0]
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1


def _fixed_per_run(bundle: ModelBundle, batch: tuple) -> int | None:
    """Batches like ``batch`` that make one run of a graph that fixes its batch (None: any)."""
    if bundle.fixed_batch is None:
        return None
    return max(1, bundle.fixed_batch // batch_items(batch))


def model_runs(bundle: ModelBundle, batches: list[tuple], merge: bool = True) -> list[tuple]:
    """``batches`` as the runs an analysis makes (``merge``: fewer, larger runs, by
    ``sensitivity.merge_batches``): merged into one, or into runs of the batch the model's
    graph fixes (``bundle.fixed_batch``); unchanged without ``merge``."""
    from quantlab.analysis.sensitivity import merge_batches

    if not merge:
        return list(batches)
    return merge_batches(batches, _fixed_per_run(bundle, batches[0]))


def merge_items(batches: list[tuple], n: int, pad_token_rows: bool = False) -> tuple:
    """The first ``n`` batches (at least one) as one batch: tensors concatenated on dim 0, any
    other argument taken from the first. ``pad_token_rows``: integer 2-d tensors of different
    lengths (token ids, attention masks) are padded with 0 at the end of dim 1 first."""
    items = batches[: max(1, n)]
    out = []
    for i in range(len(items[0])):
        parts = [b[i] for b in items]
        if not isinstance(parts[0], torch.Tensor):
            out.append(parts[0])
            continue
        if pad_token_rows and not parts[0].is_floating_point() and parts[0].dim() == 2:
            t = max(p.shape[1] for p in parts)
            parts = [torch.nn.functional.pad(p, (0, t - p.shape[1])) for p in parts]
        out.append(torch.cat(parts))
    return tuple(out)


def model_ops(module: Any, platform: Any, batch: tuple) -> list[OpContext]:
    """The ops one float run of ``module`` on ``batch`` captures (name, type, module path)."""
    from quantlab.simulate import Mode, Simulator

    sim = Simulator(module, platform)
    sim.run(*batch, mode=Mode.FLOAT)
    ops = sim.ops
    return [OpContext(n, t, m) for n, t, m in zip(ops["name"], ops["op_type"], ops["module"])]


def start_spec(
    choice: QConfigChoice | None, platform: Any, module: Any, batch: tuple
) -> QConfigSpec:
    """The ``QConfigSpec`` the ``qconfig`` group selects on ``platform`` (None: the platform
    template); a file's rules are checked against the ops of ``module`` run on ``batch``."""
    if choice is None:
        return QConfigSpec()
    spec = preset_spec(choice, platform)
    if choice.preset is QConfigPreset.FILE:
        check_matches(spec, model_ops(module, platform, batch), f"qconfig file {choice.path}")
    return spec


def qconfig_words(choice: QConfigChoice | None) -> str:
    """``qconfig=<preset>`` (with the file) for notes and findings."""
    if choice is None or choice.preset is QConfigPreset.DEFAULT:
        return "qconfig=default (the platform template)"
    if choice.preset is QConfigPreset.FILE:
        return f"qconfig=file ({choice.path})"
    return f"qconfig={choice.preset.value}"
