"""Deployment form: BatchNorm folded into the feeding conv, Dropout removed, outputs unchanged."""

import pytest
import torch
from torch import nn

from quantlab.models import build_model, example_inputs
from quantlab.models.fold import conv_bn_pairs, fold_conv_bn, to_deployment_form
from quantlab.models.schema import ModelConfig


class HandWritten(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(4)
        self.b = nn.Conv2d(4, 4, 1)
        self.bn_b = nn.BatchNorm2d(4)  # its input also feeds the residual: must not fold
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = torch.relu(self.bn_a(self.a(x)))
        y = self.b(h)
        return self.drop(self.bn_b(y) + y)


def _randomize_bn(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    for bn in m.modules():
        if isinstance(bn, nn.BatchNorm2d):
            n = bn.num_features
            bn.running_mean.copy_(torch.randn(n, generator=g))
            bn.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            bn.weight.data.copy_(torch.randn(n, generator=g))
            bn.bias.data.copy_(torch.randn(n, generator=g))


def test_pairs_fold_and_shared_outputs_stay():
    m = HandWritten().eval()
    _randomize_bn(m)
    x = torch.randn(2, 3, 8, 8)
    assert conv_bn_pairs(m, (x,)) == [("a", "bn_a")]
    with torch.no_grad():
        ref = m(x)
    to_deployment_form(m, (x,))
    assert isinstance(m.bn_a, nn.Identity) and isinstance(m.bn_b, nn.BatchNorm2d)
    assert isinstance(m.drop, nn.Identity) and m.a.bias is not None
    assert not any(sub.training for sub in m.modules())  # replacements are in eval mode too
    with torch.no_grad():
        assert torch.allclose(m(x), ref, rtol=1e-5, atol=1e-5)


class TwoHeads(nn.Module):
    """A detector-style output: a dict of a tuple of float maps and integer top-k indices."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        h = self.bn(self.a(x))
        score = h.mean((2, 3))
        return {"maps": (h, h.sigmoid()), "top": score.topk(2, -1).indices, "score": score}


def test_models_with_nested_and_integer_outputs_fold():
    m = TwoHeads().eval()
    _randomize_bn(m)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        ref = m(x)
    to_deployment_form(m, (x,))
    assert isinstance(m.bn, nn.Identity)
    with torch.no_grad():
        out = m(x)
    for a, b in zip((*out["maps"], out["score"]), (*ref["maps"], ref["score"])):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)


class BatchNormRelu(nn.BatchNorm2d):
    """timm's BatchNormAct2d pattern: a BatchNorm2d subclass whose forward adds an activation."""

    def forward(self, x):
        return torch.relu(super().forward(x))


def test_a_batchnorm_subclass_with_its_own_forward_stays_and_the_simulator_fuses_it():
    """Replacing it by nn.Identity would drop its activation; it is kept, and the Simulator fuses
    its batch_norm call into the conv before it, so fixed mode still sees one GEMM."""
    import quantlab

    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), BatchNormRelu(8), nn.Conv2d(8, 4, 1)
    )
    _randomize_bn(m)
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        ref = m.eval()(x)
    to_deployment_form(m, (x,))
    assert isinstance(m[1], BatchNormRelu)
    with torch.no_grad():
        assert torch.equal(m(x), ref)
    sim = quantlab.Simulator(m, platform="j6m")
    sim.calibrate([(x,)], progress=False)
    sim.run(x, mode="fixed")
    ops = sim.ops.set_index("op_type")
    assert ops.loc["batch_norm", "fused_into"] == ops.loc["conv2d", "name"].iloc[0]
    assert ops.loc["relu", "output_dtype"] == "INT8"


def test_a_fold_that_changes_a_later_output_is_refused(monkeypatch):
    """The check compares every float output, not only the first: a pair forced on a conv
    whose output also feeds the second output is refused, naming that output."""
    from quantlab.models import fold

    class Shared(TwoHeads):
        def forward(self, x):
            y = self.a(x)
            return self.bn(y).sum(), y.sum()

    m = Shared().eval()
    _randomize_bn(m)
    x = torch.randn(2, 3, 8, 8)
    assert conv_bn_pairs(m, (x,)) == []  # the search itself keeps this BatchNorm
    found = fold._pairs_and_output
    monkeypatch.setattr(fold, "_pairs_and_output", lambda *a: ([("a", "bn")], found(*a)[1]))
    with pytest.raises(RuntimeError, match="float output 1"):
        to_deployment_form(m, (x,))


def test_fold_formula_matches_batchnorm_in_float64():
    conv, bn = nn.Conv2d(2, 3, 3).double(), nn.BatchNorm2d(3).double().eval()
    _randomize_bn(bn, 1)
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    with torch.no_grad():
        ref = bn(conv(x))
        fold_conv_bn(conv, bn)
        assert torch.allclose(conv(x), ref, rtol=1e-12, atol=1e-12)


def test_a_batchnorm_without_affine_parameters_folds_and_one_without_statistics_stays():
    """BatchNorm2d(affine=False) (kornia's HardNet) folds as g = 1, beta = 0 (its None weight
    made the fold raise); one without running statistics normalizes by each batch's, so it is
    no constant map and stays."""
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, affine=False), nn.ReLU(),
        nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4, track_running_stats=False),
    ).eval()  # fmt: skip
    g = torch.Generator().manual_seed(2)
    m[1].running_mean.copy_(torch.randn(4, generator=g))
    m[1].running_var.copy_(torch.rand(4, generator=g) + 0.5)
    x = torch.randn(2, 1, 9, 9)
    with torch.no_grad():
        want = m(x)
        to_deployment_form(m, (x,))
        got = m(x)
    assert isinstance(m[1], nn.Identity) and isinstance(m[4], nn.BatchNorm2d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_lite0"])
def test_real_cnns_have_no_batchnorm_or_dropout_and_same_logits(bundles, name):
    folded = bundles(name).module
    kinds = {type(m).__name__ for m in folded.modules()}
    assert not kinds & {"BatchNorm2d", "Dropout"}
    assert not any(m.training for m in folded.modules())
    plain = build_model(ModelConfig(name=name, fold_batchnorm=False)).module
    assert any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    x = example_inputs(name, seed=3)
    with torch.no_grad():
        a, b = folded(*x), plain(*x)
    assert (a - b).abs().max() < 1e-4 * b.abs().max()
