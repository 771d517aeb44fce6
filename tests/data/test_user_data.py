"""The user's own data: ``data=images`` (a folder of real scikit-image images) and
``data=tensors`` (.pt and .npz files), their splits and preprocessing, and every bad input's
message (naming the file)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from user_package import image_folder

from quantlab.data import load_data
from quantlab.data.images import read_image
from quantlab.data.schema import DataConfig
from quantlab.models.formats import ChannelOrder, Resize
from quantlab.models.inputs import ModelInputs

USER_MODEL = ModelInputs("user_net", None, ((3, 16, 24),), None, registry=False)
NO_SHAPE = ModelInputs("user_net", None, None, None, registry=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("images"))


def _images(folder, **kw) -> DataConfig:
    return DataConfig(name="images", path=str(folder), **kw)


def test_images_split_in_name_order_with_the_models_shape(folder):
    d = load_data(_images(folder, num_calib=3, num_eval=4, batch_size=2), USER_MODEL)
    names = sorted(p.name for p in folder.iterdir())
    assert d.calib_ids == names[:3] and d.eval_ids == names[3:7]
    assert [b[0].shape[0] for b in d.calib] == [2, 1] and len(d.eval) == 2
    assert d.eval[0][0].shape == (2, 3, 16, 24)  # the model's (H, W), STRETCH
    # defaults: pixels in [0, 1], RGB
    x = d.calib[0][0][0]
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0


def test_images_normalisation_and_channel_order(folder):
    cfg = _images(folder, num_calib=1, num_eval=1, size=[20, 30], mean=[0.1, 0.2, 0.3])
    cfg.std, cfg.channel_order, cfg.resize = [0.5, 0.25, 2.0], ChannelOrder.BGR, Resize.STRETCH
    d = load_data(cfg, NO_SHAPE)
    first = sorted(folder.iterdir())[0]
    img = torch.nn.functional.interpolate(
        read_image(first)[None], size=(20, 30), mode="bilinear", antialias=True
    ).flip(1)
    want = (img - torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1)) / torch.tensor(
        [0.5, 0.25, 2.0]
    ).view(1, 3, 1, 1)
    assert torch.allclose(d.calib[0][0], want, atol=1e-6)


def test_images_keep_size_for_a_model_that_takes_any_size(folder):
    cfg = _images(folder, num_calib=1, num_eval=1)
    cfg.resize = Resize.KEEP
    d = load_data(cfg, NO_SHAPE)
    first = sorted(folder.iterdir())[0]
    assert d.calib[0][0].shape[2:] == read_image(first).shape[1:]


def test_registry_image_model_keeps_its_own_format(folder):
    d = load_data(_images(folder, num_calib=1, num_eval=1), "mobilenet_v2")
    assert d.calib[0][0].shape == (1, 3, 224, 224)
    with pytest.raises(ValueError, match="model 'mobilenet_v2' takes 224x224 images.*leave them"):
        load_data(_images(folder, num_calib=1, num_eval=1, size=[64, 64]), "mobilenet_v2")


def test_bad_image_folders_are_named(tmp_path, folder):
    (tmp_path / "empty").mkdir()
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "notes.txt").write_text("no images")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    (tmp_path / "broken" / "b.png").write_bytes(b"not an image")
    cases = {
        str(tmp_path / "none"): "folder .*none does not exist",
        str(tmp_path / "text" / "notes.txt"): ".*notes.txt is a file; data=images reads a folder",
        str(tmp_path / "empty"): "folder .*empty holds no image file .*it is empty",
        str(
            tmp_path / "text"
        ): "folder .*text holds no image file.*1 other entries, e.g. notes.txt",
        str(tmp_path / "broken"): "cannot read image .*broken/a.png",
    }
    for path, message in cases.items():
        cfg = DataConfig(name="images", path=path, num_calib=1, num_eval=1, size=[8, 8])
        with pytest.raises(ValueError, match=f"data.path: {message}"):
            load_data(cfg, NO_SHAPE)
    n = len(list(folder.iterdir()))
    with pytest.raises(ValueError, match=f"holds {n} images and data.num_calib=8 takes them all"):
        load_data(_images(folder, num_calib=8, num_eval=2), USER_MODEL)
    with pytest.raises(ValueError, match="data.size is needed: model user_net does not declare"):
        load_data(_images(folder, num_calib=1, num_eval=1), NO_SHAPE)
    keep = _images(folder, num_calib=3, num_eval=1, batch_size=3)
    keep.resize = Resize.KEEP
    with pytest.raises(ValueError, match="differ in size after preprocessing"):
        load_data(keep, NO_SHAPE)
    tokens = ModelInputs("token_net", None, ((16,),), None, registry=False)
    with pytest.raises(ValueError, match=r"model token_net takes inputs of shape \[16\]"):
        load_data(_images(folder, num_calib=1, num_eval=1), tokens)
    with pytest.raises(ValueError, match="data.path is required with data=images"):
        DataConfig(name="images")


# ------------------------------------------------------------------------------ tensors
def _tensors(path, **kw) -> DataConfig:
    return DataConfig(name="tensors", path=str(path), **kw)


def test_pt_list_is_split_in_order_and_batched(tmp_path):
    items = [(torch.full((1, 3, 16, 24), float(i)),) for i in range(6)]
    torch.save(items, tmp_path / "x.pt")
    d = load_data(_tensors(tmp_path / "x.pt", num_calib=2, num_eval=3, batch_size=2), USER_MODEL)
    assert [float(b[0][0, 0, 0, 0]) for b in d.calib] == [0.0]
    assert d.calib[0][0].shape[0] == 2
    assert [b[0].shape[0] for b in d.eval] == [2, 1]
    assert float(d.eval[1][0][0, 0, 0, 0]) == 4.0 and d.labels is None
    assert d.eval_ids == ["x.pt:eval0", "x.pt:eval1", "x.pt:eval2"]


def test_pt_calib_eval_lists_with_labels_and_two_inputs(tmp_path):
    item = lambda i: (torch.randn(1, 6), torch.randn(1, 3))  # noqa: E731
    obj = {
        "calib": [item(i) for i in range(2)],
        "eval": [item(i) for i in range(3)],
        "labels": [torch.tensor([i]) for i in range(3)],
    }
    torch.save(obj, tmp_path / "x.pt")
    two = ModelInputs("two", None, ((6,), (3,)), None, registry=False)
    d = load_data(_tensors(tmp_path / "x.pt", num_calib=8, num_eval=2), two)
    assert len(d.calib) == 2 and len(d.eval) == 2
    assert [t.shape for t in d.eval[0]] == [(1, 6), (1, 3)]
    assert [int(x) for x in torch.cat(d.labels)] == [0, 1]


def test_npz_forms(tmp_path):
    x = np.random.default_rng(0).normal(size=(5, 3, 16, 24))  # float64 -> float32
    np.savez(tmp_path / "plain.npz", x)
    d = load_data(_tensors(tmp_path / "plain.npz", num_calib=2, num_eval=3), USER_MODEL)
    assert d.calib[0][0].dtype == torch.float32 and d.calib[0][0].shape == (1, 3, 16, 24)
    assert torch.equal(d.eval[0][0], torch.from_numpy(x[2:3]).float())
    np.savez(
        tmp_path / "split.npz",
        calib_0=np.zeros((2, 6)),
        calib_1=np.zeros((2, 3)),
        eval_0=np.ones((4, 6)),
        eval_1=np.ones((4, 3)),
        labels=np.arange(4),
    )
    two = ModelInputs("two", None, ((6,), (3,)), None, registry=False)
    d = load_data(_tensors(tmp_path / "split.npz", num_eval=4, batch_size=4), two)
    assert len(d.calib) == 1 and [t.shape for t in d.eval[0]] == [(4, 6), (4, 3)]
    assert d.labels[0].tolist() == [0, 1, 2, 3]


def test_bad_tensor_files_name_the_file_and_item(tmp_path):
    good = (torch.zeros(1, 3, 16, 24),)
    nan = (torch.full((1, 3, 16, 24), float("nan")),)
    inf = (torch.full((1, 3, 16, 24), float("inf")),)
    files = {
        "nan.pt": [good, nan, good],
        "inf.pt": {"calib": [good], "eval": [inf]},
        "shape.pt": [good, (torch.zeros(1, 3, 8, 8),), good],
        "arity.pt": [good, (good[0], good[0])],
        "keys.pt": {"calibration": [good]},
        "noeval.pt": {"calib": [good]},
        "emptyeval.pt": {"calib": [good], "eval": []},
        "strings.pt": ["a", "b"],
        "few.pt": [good],
        "scalar.pt": [(torch.tensor(1.0),), good],
    }
    for name, obj in files.items():
        torch.save(obj, tmp_path / name)
    np.savez(tmp_path / "names.npz", images=np.zeros((2, 3)))
    (tmp_path / "x.csv").write_text("1,2")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    cases = {
        "nan.pt": r"calib item 1, input 0 holds NaN values",
        "inf.pt": r"eval item 0, input 0 holds inf values",
        "shape.pt": r"calib item 1 has tensors of shape \[\[1, 3, 8, 8\]\], but model user_net "
        r"takes \[\['N', 3, 16, 24\]\]",
        "arity.pt": "calib item 1 has 2 tensors, item 0 has 1",
        "keys.pt": "unknown key.*calibration.*allowed: calib, eval, inputs, labels",
        "noeval.pt": "the 'eval' list is missing",
        "emptyeval.pt": "the 'eval' list of .* is empty",
        "strings.pt": r"items\[0\] must be a tensor or a tuple of tensors, got str",
        "few.pt": "holds 1 items, which leaves none to eval",
        "scalar.pt": "holds a 0-d tensor; each tensor needs a batch dimension",
        "names.npz": "unknown array.*images.*allowed: calib, eval",
        "x.csv": "must be a .pt or .pth or .npz file for data=tensors",
        "junk.pt": "cannot be read as a weights-only torch file",
        "none.pt": "file .*none.pt does not exist",
    }
    for name, message in cases.items():
        cfg = _tensors(tmp_path / name, num_calib=2, num_eval=2)
        with pytest.raises(ValueError, match=f"data.path: .*{message}") as e:
            load_data(cfg, USER_MODEL)
        assert name in str(e.value)


GRAY_MODEL = ModelInputs("gray_net", None, ((1, 16, 24),), None, registry=False)


def test_a_model_that_takes_one_channel_gets_luma_images(folder):
    """(1, H, W): each image resized, then made luma 0.299 R + 0.587 G + 0.114 B (BT.601),
    then (x - mean) / std with one value each; the default RGB order means the image's own
    colours, and GRAY says the same."""
    colour = load_data(_images(folder, num_calib=2, num_eval=1), USER_MODEL)
    for order in (ChannelOrder.RGB, ChannelOrder.GRAY):
        cfg = _images(folder, num_calib=2, num_eval=1, mean=[0.5], std=[0.25])
        cfg.channel_order = order
        gray = load_data(cfg, GRAY_MODEL)
        (x,) = gray.calib[0]
        assert x.shape == (1, 1, 16, 24)
        rgb = colour.calib[0][0]
        luma = 0.299 * rgb[:, 0:1] + 0.587 * rgb[:, 1:2] + 0.114 * rgb[:, 2:3]
        torch.testing.assert_close(x, (luma - 0.5) / 0.25, rtol=0, atol=1e-5)
        assert "GRAY" in gray.description


def test_channel_counts_that_disagree_with_the_model_are_named(folder):
    cases = [
        (GRAY_MODEL, {"channel_order": ChannelOrder.BGR}, "takes one channel"),
        (GRAY_MODEL, {"mean": [0.5, 0.5, 0.5]}, "give one value per channel"),
        (USER_MODEL, {"channel_order": ChannelOrder.GRAY}, "takes 3"),
        (USER_MODEL, {"std": [0.5]}, "give one value per channel"),
        (ModelInputs("m", None, ((2, 8, 8),), None, registry=False), {}, "(1, H, W) in gray"),
    ]
    for model, kw, words in cases:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            load_data(_images(folder, num_calib=2, num_eval=1, **kw), model)
    with pytest.raises(ValueError, match="one value per channel"):
        DataConfig(name="synthetic", mean=[0.1, 0.2])
