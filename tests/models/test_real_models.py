"""Real trained models: each loads offline and checks a fact on real bundled data."""

import pytest
import torch

from quantlab.data import load_data
from quantlab.data.images import photo
from quantlab.data.schema import DataConfig
from quantlab.models import build_model, example_inputs, formats
from quantlab.models.imagenet import MobileNetV2, imagenet_class_names
from quantlab.models.schema import ModelConfig
from quantlab.models.uvdoc import unwarp


def test_imagenet_class_names():
    names = imagenet_class_names()
    assert len(names) == 1000 and names[967] == "espresso"


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_lite0"])
def test_imagenet_cnn_calls_the_coffee_photo_espresso(bundles, name):
    b = bundles(name)
    x = b.input_format.apply(photo("coffee"))
    with torch.no_grad():
        logits = b.module(x)
    assert logits.shape == (1, 1000)
    assert imagenet_class_names()[int(logits.argmax())] == "espresso"
    assert torch.softmax(logits, -1).max() > 0.5


def test_mobilenet_v2_formats_and_untrained_variant(bundles):
    assert bundles("mobilenet_v2").input_format == formats.IMAGENET
    assert bundles("efficientnet_lite0").input_format == formats.SIGNED_UNIT
    cfg = ModelConfig(name="mobilenet_v2", pretrained=False, fold_batchnorm=False)
    rnd = build_model(cfg).module
    assert isinstance(rnd, MobileNetV2)
    with torch.no_grad():
        assert rnd(*example_inputs("mobilenet_v2")).shape == (1, 1000)


@pytest.mark.parametrize("name", ["mtcnn_onet", "mtcnn_rnet"])
def test_mtcnn_separates_lfw_faces_from_non_faces(bundles, name):
    b = bundles(name)
    d = load_data(DataConfig(name="faces", num_calib=20, num_eval=180, batch_size=60), name)
    with torch.no_grad():
        probs = [b.module(*x) for x in d.eval + d.calib]
    calib_labels = torch.tensor([1, 0] * 10)
    acc = b.task(probs, probs, d.labels + [calib_labels])
    assert acc >= 0.95, f"{name} face/non-face accuracy {acc:.3f} on 200 lfw_subset crops"
    assert sum(len(p) for p in probs) == 200


def test_uvdoc_predicts_a_valid_grid_and_unwarps_at_full_resolution(bundles):
    b = bundles("uvdoc")
    d = load_data("page", model="uvdoc")
    (x,) = d.eval[0]
    assert x.shape == (1, 3, 712, 488)
    with torch.no_grad():
        grid = b.module(x)
    assert grid.shape == (1, 2, 45, 31)
    assert grid.abs().max() <= 1.1
    gx, gy = grid[0, 0], grid[0, 1]
    # a page grid: x grows along columns, y grows down rows, and it covers most of the photo
    assert (gx[:, 1:] > gx[:, :-1]).float().mean() > 0.95
    assert (gy[1:, :] > gy[:-1, :]).float().mean() > 0.95
    assert gx.max() - gx.min() > 1.0 and gy.max() - gy.min() > 1.0
    full = d.labels[0]
    flat = unwarp(full, grid)
    assert flat.shape == full.shape == (1, 3, 1401, 1067)
    assert b.task([grid], [grid], d.labels) == float("inf")
    noisy = grid + 0.002 * torch.randn(grid.shape, generator=torch.Generator().manual_seed(0))
    assert 20 < b.task([grid], [noisy], d.labels) < 60


def test_unwarp_matches_py_reform(bundles):
    from quantlab.models import packages

    ref = packages.import_submodule(packages.PY_REFORM, "models.uvdoc_model", "test")
    img = torch.rand(1, 3, 70, 50, generator=torch.Generator().manual_seed(1))
    grid = torch.rand(1, 2, 45, 31, generator=torch.Generator().manual_seed(2)) * 2 - 1
    assert torch.equal(unwarp(img, grid), ref.bilinear_unwarping(img, grid, (50, 70)))


def test_minilm_paraphrases_are_closer_than_unrelated_pairs(bundles):
    b = bundles("minilm")
    d = load_data("sentences", model="minilm")
    with torch.no_grad():
        emb = [b.module(*x) for x in d.eval]
    cos = torch.tensor([float(e[0] @ e[1]) for e in emb])
    labels = torch.cat(d.labels)
    assert torch.allclose(torch.cat(emb).norm(dim=-1), torch.ones(2 * len(emb)), atol=1e-5)
    assert cos[labels == 1].min() > cos[labels == 0].max()
    assert cos[labels == 1].mean() > 0.6 and cos[labels == 0].mean().abs() < 0.2
    assert b.task(emb, emb) == pytest.approx(1.0)


def test_minilm_sees_matmul_softmax_layer_norm_gelu(bundles):
    b = bundles("minilm")
    seen = set()

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.add(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Spy():
        b.module(*example_inputs("minilm"))
    assert {"matmul", "softmax", "layer_norm", "gelu"} <= seen
    assert "scaled_dot_product_attention" not in seen


def test_minilm_on_j6m_runs_layer_norm_and_embedding_in_fixed_point(bundles):
    from quantlab.simulate import Simulator

    sim = Simulator(bundles("minilm").module, "j6m")
    sim.run(*example_inputs("minilm"), mode="float")  # discovers the ops
    ops = sim.ops
    kernels = ops[ops.op_type.isin(["layer_norm", "embedding"])].groupby("op_type").fixed_kernel
    # the word embedding; the token-type and position ones gather by buffers of the model
    # (token_type_ids, position_ids): constants of the model, which the export folds
    assert kernels.size().to_dict() == {"embedding": 1, "layer_norm": 13}
    assert set(kernels.unique()["layer_norm"]) == {"integer (mean, variance, rsqrt lut, affine)"}
    assert set(kernels.unique()["embedding"]) == {"integer (gather)"}
    assert not ops[ops.op_type == "layer_norm"].fixed_kernel.str.contains("float").any()


@pytest.mark.parametrize("name", ["efficientnet_lite0", "mtcnn_rnet", "uvdoc", "minilm"])
def test_untrained_architectures_build_and_run(name):
    b = build_model(ModelConfig(name=name, pretrained=False, fold_batchnorm=False), seed=1)
    x = (torch.rand(1, 3, 128, 96),) if name == "uvdoc" else example_inputs(name)
    with torch.no_grad():
        y = b.module(*x)
    assert torch.isfinite(y).all() and y.shape[0] == 1
