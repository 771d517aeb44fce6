"""The real model of ``+exp=qat`` (the ``model``/``data`` groups: MobileNetV2 on the packaged
photos, or your own) as a ``QatTask``: distilled from its float self (KL of the softmaxes for
a classifier, the MSE of every float output otherwise), trained on the input
``model.input_format`` configures and deployed on the input the chip receives (uint8 pixels
or NV12 with mean/std folded into the first conv for an image model, the float input
quantized for any other)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from quantlab.analysis.qat import DeployedInput, QatTask
from quantlab.experiment import RunContext
from quantlab.models.input_path import InputFormat


def kl_loss(y, t):
    """KL(softmax(t) || softmax(y)) over the last dim, batch mean: a classifier's distillation
    loss."""
    return F.kl_div(
        F.log_softmax(y, -1), F.log_softmax(t, -1), reduction="batchmean", log_target=True
    )


def output_mse_loss(y, t):
    """Mean squared error over every float tensor of the outputs together: the distillation loss
    of a model that is no classifier (a detector's maps, a recurrent model's outputs and
    states)."""
    from quantlab.analysis.metrics import float_leaves

    return F.mse_loss(
        torch.cat([v.reshape(-1) for v in float_leaves(y)]),
        torch.cat([v.reshape(-1) for v in float_leaves(t)]),
    )


def loss_words(loss) -> str:
    """KL or MSE: which distillation loss ``loss`` is."""
    return "KL" if loss is kl_loss else "MSE"


def cnn_task(
    ctx: RunContext, cnn_batch: int, deployed_input: InputFormat | None
) -> tuple[QatTask, InputFormat]:
    """(the model of ``ctx`` distilled from its float self on float preprocessing, the input
    it is deployed on): it trains on the input ``model.input_format`` configures, in batches
    of ``cnn_batch`` calibration items (fewer where its graph fixes its batch), and is deployed
    on ``deployed_input`` (``chip_input`` where that is None)."""
    from quantlab.models.tasks import OutputSQNR, Top1Agreement
    from quantlab.workload import batches_per_run, load_workload, merge_items, start_spec

    own, chip = InputFormat.parse(ctx.model.input_format), deployed_input
    if chip is not None and own not in (InputFormat.FLOAT_NORMALIZED, chip):
        raise ValueError(
            f"exp.deployed_input={chip.name} differs from model.input_format={own.name}: a model "
            "trained on a deployed input is deployed with it (set them equal, or "
            "model.input_format=FLOAT_NORMALIZED)"
        )
    float_cfg = dataclasses.replace(ctx.model, input_format=InputFormat.FLOAT_NORMALIZED)
    bundle, data = load_workload(float_cfg, ctx.data, ctx.seed or 0, ctx.platform)
    chip = chip if chip is not None else chip_input(own, bundle)
    spec = start_spec(ctx.qconfig, ctx.platform, bundle.module, data.calib[0])
    k = batches_per_run(bundle, data, cnn_batch)  # fewer where a graph fixes its batch

    def merged(batches: list) -> list:
        return [merge_items(batches[i : i + k], k) for i in range(0, len(batches), k)]

    train = merged(data.calib)
    with torch.no_grad():
        targets = [bundle.module(*b) for b in train]
        refs = [bundle.module(*b) for b in data.eval]
    metrics = tuple(bundle.metrics)
    if not any(m.name == OutputSQNR().name for m in metrics):
        metrics += (OutputSQNR(),)
    task = QatTask(
        bundle.name,
        bundle.module,
        spec,
        data.calib,
        train,
        targets,
        kl_loss if isinstance(bundle.task, Top1Agreement) else output_mse_loss,  # a classifier: KL
        data.eval,
        refs,
        metrics,
        "float",
        own.name,
    )
    if chip is InputFormat.FLOAT_NORMALIZED:
        return task, chip
    deployed, chip_calib = _deployed_input(bundle, data, chip, ctx)
    deployed = dataclasses.replace(deployed, train=merged(chip_calib))
    if own is chip:  # trained on the chip's input already
        return dataclasses.replace(
            task,
            model=deployed.deploy(bundle.module),
            calib=chip_calib,
            train=deployed.train,
            eval=deployed.eval,
            input=chip.name,
        ), chip
    return dataclasses.replace(task, deployed=deployed), chip


def chip_input(own: InputFormat, bundle) -> InputFormat:
    """The CNN's deployed input where ``exp.deployed_input`` is None: ``model.input_format``
    where set, else uint8 pixels for an image model with its own preprocessing, else the float
    input (a model that takes no image)."""
    if own is not InputFormat.FLOAT_NORMALIZED:
        return own
    if bundle.input_format is None:
        return InputFormat.FLOAT_NORMALIZED
    return InputFormat.UINT8_RGB


def _deployed_input(bundle, data, fmt: InputFormat, ctx: RunContext):
    """(the CNN's input as the chip receives it in format ``fmt``, its calibration batches in
    that form): uint8 pixels (or NV12) of the same photos, mean/std folded into the first conv
    (``quantlab.models.input_path``, NV12 arithmetic from the platform)."""
    from quantlab.models.input_path import (
        Border,
        YuvConversion,
        deploy_input_path,
        deploy_workload,
    )

    if bundle.input_format is None:
        raise ValueError(
            f"exp.deployed_input={fmt.name} needs an image model with its own preprocessing; "
            f"model '{bundle.name}' has none (set exp.deployed_input=FLOAT_NORMALIZED)"
        )
    _, chip = deploy_workload(bundle, ctx.data, fmt, ctx.platform, Border.MEAN_PIXEL)
    example = data.calib[0][0]  # a float-preprocessed batch: finds the first conv
    yuv = YuvConversion.of(ctx.platform)

    def deploy(model):
        image = bundle.input_format
        folded, _ = deploy_input_path(model, image, fmt, example, Border.MEAN_PIXEL, yuv)
        return folded

    return DeployedInput(fmt.name, deploy, [], chip.eval), chip.calib
