"""Task metrics: exact values on small hand-made outputs."""

import math

import pytest
import torch

from quantlab.models.tasks import (
    BoxL1,
    EmbeddingCosine,
    FaceAccuracy,
    OutputSQNR,
    SoftmaxKL,
    TaskMetric,
    Top1Agreement,
    UnwarpPSNR,
)


def test_top1_agreement_and_kl():
    ref = [torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), torch.tensor([[0.0, 0.0, 3.0]])]
    test = [torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, 1.0]])]
    assert Top1Agreement()(ref, test) == pytest.approx(2 / 3)
    assert SoftmaxKL()(ref, ref) == 0.0
    p = torch.softmax(torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64), 0)
    q = torch.full((3,), 1 / 3, dtype=torch.float64)
    one = float((p * (p / q).log()).sum())
    kl = SoftmaxKL()([torch.tensor([[0.0, 1.0, 0.0]])], [torch.zeros(1, 3)])
    assert kl == pytest.approx(one, rel=1e-12)
    assert Top1Agreement().higher_is_better and not SoftmaxKL().higher_is_better


def test_face_accuracy_with_and_without_labels():
    ref = [torch.tensor([[0.1, 0.9], [0.8, 0.2]])]
    test = [torch.tensor([[0.6, 0.4], [0.7, 0.3]])]
    assert FaceAccuracy()(ref, test, [torch.tensor([1, 0])]) == 0.5
    assert FaceAccuracy()(ref, test) == 0.5  # float decisions as labels
    assert FaceAccuracy()(ref, ref, [torch.tensor([1, 0])]) == 1.0
    with pytest.raises(ValueError, match="labels hold 3 samples, outputs 2"):
        FaceAccuracy()(ref, test, [torch.tensor([1, 0, 1])])


def test_embedding_cosine_box_l1_sqnr():
    a = [torch.tensor([[1.0, 0.0], [0.0, 2.0]])]
    b = [torch.tensor([[1.0, 1.0], [0.0, -1.0]])]
    assert EmbeddingCosine()(a, b) == pytest.approx((1 / math.sqrt(2) - 1) / 2)
    assert BoxL1()(a, b) == pytest.approx(4 / 4)
    assert OutputSQNR()(a, a) == math.inf
    assert OutputSQNR()(a, b) == pytest.approx(10 * math.log10(5 / 10))


def test_unwarp_psnr():
    img = [torch.rand(1, 3, 20, 16, generator=torch.Generator().manual_seed(0))]
    g = torch.stack(
        torch.meshgrid(torch.linspace(-1, 1, 31), torch.linspace(-1, 1, 45), indexing="xy")
    )
    grid = [g[None]]
    assert UnwarpPSNR()(grid, grid, img) == math.inf
    shifted = [grid[0] + 0.05]
    assert 5 < UnwarpPSNR()(grid, shifted, img) < 40
    with pytest.raises(ValueError, match="needs labels"):
        UnwarpPSNR()(grid, shifted)


def test_metrics_reject_empty_outputs_and_base_is_abstract():
    with pytest.raises(ValueError, match="at least one output batch"):
        Top1Agreement()([], [])
    with pytest.raises(TypeError):
        TaskMetric("x", True)
