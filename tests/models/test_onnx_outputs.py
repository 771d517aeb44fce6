"""A batch-1 ONNX graph that drops its batch axis on the way out gets it back
(quantlab.models.onnx_outputs.restore_batch_axis): each run is one evaluation item for the task
metrics and their intervals, where an (L, L) output counted L items per run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quantlab.models.registry import build_model
from quantlab.models.schema import ModelConfig

pytest.importorskip("onnxruntime")


class _PairScores(nn.Module):
    """(L, L) scores of one item's tokens (the batch squeezed, as chython's reaction mapper
    returns its attention) and a batched (1, L) output."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)[0]
        return torch.softmax(h @ h.T, -1), x.sum(-1)


def test_a_squeezed_output_of_a_batch_one_graph_gets_its_batch_axis_back(tmp_path):
    from quantlab.analysis.confidence import estimate_metrics

    torch.manual_seed(0)
    path = tmp_path / "pairs.onnx"
    torch.onnx.export(_PairScores().eval(), (torch.randn(1, 6, 8),), str(path), dynamo=False)
    b = build_model(ModelConfig(name="onnx", path=str(path)))
    assert b.fixed_batch == 1
    items = [torch.randn(1, 6, 8) for _ in range(3)]
    with torch.no_grad():
        outs = [b.module(x) for x in items]
    for x, (scores, sums) in zip(items, outs, strict=True):
        assert scores.shape == (1, 6, 6) and sums.shape == (1, 6)  # the second one untouched
        want = b.reference(x)
        assert [tuple(w.shape) for w in want] == [(1, 6, 6), (1, 6)]
        for g, w in zip((scores, sums), want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
    tests = [tuple(o + 1e-3 * torch.randn_like(o) for o in out) for out in outs]
    estimates = estimate_metrics(b.metrics, outs, tests)
    assert {e.n for e in estimates.values()} == {3}  # 3 runs, 3 items (it counted 18 rows)
    # the reference runs a merged batch in slices of the graph's batch, joined on the axis
    merged = b.reference(torch.cat(items))
    assert [tuple(m.shape) for m in merged] == [(3, 6, 6), (3, 6)]
