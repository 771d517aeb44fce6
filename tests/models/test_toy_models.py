"""Toy models: build through the registry, run, seeded weights, the behaviours they exist for."""

import pytest
import torch

from quantlab.models import MODEL_NAMES, build_model, example_inputs
from quantlab.models.schema import ModelConfig
from quantlab.models.toy import ControlFlow
from quantlab.models.toy_attention import (
    DetrDecoder,
    frequencies,
    nerf_encoding,
    nerf_frequencies,
    rotary,
    sine_embedding,
)
from quantlab.ops import inverse_sigmoid

TOYS = [
    "small_cnn",
    "conv_only",
    "control_flow",
    "transformer_block",
    "detr_decoder",
    "posenc",
    "bev_warp",
]

EXPECTED_OUT = {
    "small_cnn": (2, 10),
    "conv_only": (2, 4, 16, 16),
    "control_flow": (2, 10),
    "transformer_block": (2, 16, 32),
    "detr_decoder": (2, 16, 4),
    "posenc": (2, 64, 32),
    "bev_warp": (2, 8, 64, 64),
}


@pytest.mark.parametrize("name", TOYS)
def test_toy_builds_and_runs(name):
    bundle = build_model(name)
    assert bundle.name == name and not bundle.module.training
    x = example_inputs(name, batch=2)
    with torch.no_grad():
        y = bundle.module(*x)
    assert tuple(y.shape) == EXPECTED_OUT[name]
    assert torch.isfinite(y).all()
    assert bundle.task is not None and bundle.metrics[0] is bundle.task
    perfect = {"top1_agreement": 1.0, "output_sqnr_db": float("inf"), "box_l1": 0.0}
    assert bundle.task([y], [y]) == perfect[bundle.task.name]


def test_seed_gives_same_weights_and_keeps_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("small_cnn", seed=3).module.state_dict()
    after = torch.rand(1)
    assert torch.equal(before, after), "build_model must not consume the caller's RNG"
    b = build_model(ModelConfig(name="small_cnn", pretrained=False), seed=3).module.state_dict()
    c = build_model("small_cnn", seed=4).module.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_unknown_model_lists_names():
    with pytest.raises(ValueError, match="model.name must be one of") as e:
        build_model("resnet9000")
    for n in MODEL_NAMES:
        assert n in str(e.value)


def test_control_flow_depends_on_data():
    m = build_model("control_flow").module
    assert isinstance(m, ControlFlow)
    lo, hi = torch.full((1, 3, 8, 8), 0.1), torch.full((1, 3, 8, 8), 0.6)
    assert m.steps(lo) != m.steps(hi)
    with torch.no_grad():
        assert torch.isfinite(m(lo)).all() and torch.isfinite(m(hi)).all()


def test_detr_decoder_refines_with_inverse_sigmoid_and_stays_in_unit_box():
    m = build_model("detr_decoder").module
    q, ref = example_inputs("detr_decoder", batch=2)
    calls = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.append(func)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Spy():
        y = m(q, ref)
    assert calls.count(inverse_sigmoid) == 6
    assert ((y > 0) & (y < 1)).all()
    plain = DetrDecoder(use_inverse_sigmoid=False)
    plain.load_state_dict(m.state_dict())
    with torch.no_grad():
        y2 = plain.eval()(q, ref)
    # without clamping active the two formulations agree closely (same weights)
    assert (y - y2).abs().max() < 1e-4


def test_posenc_angles_are_wide():
    (coords,) = example_inputs("posenc")
    assert coords[..., 0].max() > 1500  # raw pixel coordinates of a 1920-wide image
    s = sine_embedding(coords, frequencies(8, 16))
    assert s.shape[-1] == 32 and s.abs().max() <= 1
    n = nerf_encoding(coords / 1920 * 2 - 1, nerf_frequencies(8))
    assert n.shape[-1] == 32
    x = torch.randn(1, 5, 8)
    r = rotary(x, torch.arange(5.0)[None] * 300, frequencies(4, 8))
    assert torch.allclose(r.norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # rotations keep norms


def test_bev_grid_spans_the_wide_image():
    m = build_model("bev_warp").module
    g = m.grid(64, 1024)
    assert g.shape == (1, 64, 64, 2)
    assert g[..., 0].min() <= -0.99 and g[..., 0].max() >= 0.99
    assert ((g[..., 1] > -1) & (g[..., 1] < 1)).all()
