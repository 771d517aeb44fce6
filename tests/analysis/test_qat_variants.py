"""compare_variants with a deployed input: the fixed run of a variant trained on the task's own
input is the deployed form of the fine-tuned model at its (learned) scales."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from quantlab.analysis.qat import DeployedInput, FineTuning, QatTask, Variant, compare_variants
from quantlab.models.tasks import OutputSQNR
from quantlab.qconfig import QConfigSpec
from quantlab.simulate import ScaleTraining


def _task(deployed: DeployedInput | None = None) -> QatTask:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(8, 4, generator=g),)]
    train = [(torch.randn(8, 4, generator=g),) for _ in range(2)]
    evals = [(torch.randn(8, 4, generator=g),) for _ in range(2)]
    with torch.no_grad():
        targets = [model(*b) for b in train]
        refs = [model(*b) for b in evals]
    metrics = (OutputSQNR(),)
    return QatTask(
        "toy", model, QConfigSpec(), calib, train, targets, F.mse_loss, evals, refs, metrics,
        "float", "float", deployed,
    )  # fmt: skip


@pytest.mark.parametrize("scales", list(ScaleTraining), ids=lambda s: s.name)
def test_a_deployed_form_equal_to_the_model_reproduces_its_fixed_run(scales):
    plain = _task()
    same = DeployedInput("copy", copy.deepcopy, plain.train, plain.eval)
    ft = FineTuning(3, 3e-2, scales)
    a, _ = compare_variants(plain, "j6m", ft, [Variant.QAT], progress=False)
    b, _ = compare_variants(_task(same), "j6m", ft, [Variant.QAT], progress=False)
    fa, fb = (t[(t["mode"] == "FIXED") & (t.metric == "output_sqnr_db")] for t in (a, b))
    assert fb.input.item() == "copy" and fa.input.item() == "float"
    assert fa.value.item() == fb.value.item()  # learned scales travel to the deployed form
    gap = b[(b.metric == "gap_sqnr_db") & (b["mode"] == "FAKE")]
    assert gap.input.item() == "copy vs float"
