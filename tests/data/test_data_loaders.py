"""Data registry: every dataset loads offline, fixed disjoint splits, model-specific formats."""

import math

import pytest
import torch

from quantlab.config import CONFIG_DIR
from quantlab.data import DATA_NAMES, load_data
from quantlab.data.schema import DataConfig
from quantlab.data.stereo import pair
from quantlab.models import MODEL_NAMES, formats
from quantlab.models.schema import USER_MODELS


def test_yaml_options_match_registries():
    assert {p.stem for p in (CONFIG_DIR / "data").glob("*.yaml")} == set(DATA_NAMES)
    models = {p.stem for p in (CONFIG_DIR / "model").glob("*.yaml")}
    assert models == set(MODEL_NAMES) | set(USER_MODELS)


@pytest.mark.parametrize("name", ["photos", "faces", "page", "sentences"])
def test_splits_are_fixed_and_disjoint(name):
    n = 4 if name == "photos" else 1000  # photos: the pools are checked whole below
    cfg = DataConfig(name=name, num_calib=n, num_eval=n)
    a, b = load_data(cfg), load_data(cfg)
    base = {i.split(":")[0] for i in a.calib_ids}
    assert base.isdisjoint({i.split(":")[0] for i in a.eval_ids})
    assert a.calib_ids == b.calib_ids and a.eval_ids == b.eval_ids
    for x, y in zip(a.eval, b.eval):
        assert all(torch.equal(u, v) for u, v in zip(x, y))


def test_photos_split_sizes_and_formats():
    d = load_data(DataConfig(name="photos", num_calib=3, num_eval=5, batch_size=2), "mobilenet_v2")
    assert d.calib_ids == ["astronaut", "rocket", "flower"]
    assert d.eval_ids[:2] == ["coffee", "chelsea"] and len(d.eval_ids) == 5
    assert [len(b[0]) for b in d.eval] == [2, 2, 1]
    x = torch.cat([b[0] for b in d.calib])
    assert x.shape == (3, 3, 224, 224) and x.min() < -1.5 and x.max() > 2.0  # ImageNet mean/std
    lite = load_data(DataConfig(name="photos", num_calib=2, num_eval=2), "efficientnet_lite0")
    y = torch.cat([b[0] for b in lite.eval])
    assert y.min() >= -1 - 1e-6 and y.max() <= 1 + 1e-6
    from quantlab.data.photos import CALIB_PHOTOS, EVAL_PHOTOS, pool

    calib, evals = pool(CALIB_PHOTOS), pool(EVAL_PHOTOS)
    assert len(calib) == 16 and len(evals) == 24 and "coffee:flip" in evals
    assert set(CALIB_PHOTOS).isdisjoint(EVAL_PHOTOS)


def test_faces_are_balanced_8bit_crops_with_labels():
    d = load_data(DataConfig(name="faces", num_calib=20, num_eval=180, batch_size=50), "mtcnn_rnet")
    labels = torch.cat(d.labels)
    assert labels.shape == (180,) and int(labels.sum()) == 90
    assert [len(b[0]) for b in d.eval] == [50, 50, 50, 30]
    assert d.eval[0][0].shape[1:] == (3, 24, 24)
    raw = load_data(DataConfig(name="faces", num_calib=4, num_eval=4), "small_cnn")
    assert raw.calib[0][0].shape == (1, 3, 32, 32)
    from quantlab.data.faces import crops

    images, lab = crops()
    codes = images * 255
    assert torch.equal(codes, codes.round()) and lab[:4].tolist() == [1, 0, 1, 0]


def test_stereo_ground_truth_warps_right_onto_left():
    left, right, disp = pair()
    assert left.shape == right.shape == (3, 500, 741)
    valid = torch.isfinite(disp)
    assert int(valid.sum()) == 343274
    assert 7.0 < disp[valid].min() < 7.5 and 59.5 < disp[valid].max() < 60.0
    h, w = disp.shape
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    src_x = (xs - torch.nan_to_num(disp)).round().long().clamp(0, w - 1)
    warped = right[:, ys, src_x]
    m = valid & (xs - torch.nan_to_num(disp) >= 0)
    err_warp = (warped - left).abs().mean(0)[m].mean()
    err_none = (right - left).abs().mean(0)[m].mean()
    assert err_warp < 0.5 * err_none, (float(err_warp), float(err_none))
    d = load_data("stereo")
    assert len(d.eval[0]) == 2 and d.labels[0].shape == (500, 741)
    views = load_data("stereo", model="bev_warp")
    assert views.eval_ids == ["left", "right"] and views.eval[0][0].shape == (1, 3, 500, 741)
    assert views.labels is None


def test_page_gives_uvdoc_inputs_and_full_resolution_labels():
    d = load_data(DataConfig(name="page", num_calib=2, num_eval=1), "uvdoc")
    assert d.calib_ids == ["sideways", "skimage_page"] and d.eval_ids == ["G38J5"]
    assert d.eval[0][0].shape == (1, 3, 712, 488)
    assert d.labels[0].shape == (1, 3, 1401, 1067)
    assert 0 <= d.labels[0].min() and d.labels[0].max() <= 1


def test_sentences_are_tokenized_pairs():
    d = load_data(DataConfig(name="sentences", num_calib=8, num_eval=16, batch_size=2), "minilm")
    assert len(d.eval) == 8 and torch.cat(d.labels).tolist() == [1, 0] * 8
    ids, mask = d.eval[0]
    assert ids.shape == mask.shape and ids.shape[0] == 4 and ids.dtype == torch.int64
    for row, m in zip(ids, mask):
        n = int(m.sum())
        assert row[0] == 101 and row[n - 1] == 102 and (row[n:] == 0).all()


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_synthetic_inputs_fit_every_model(model):
    cfg = DataConfig(name="synthetic", num_calib=3, num_eval=2, batch_size=2, seed=5)
    a, b = load_data(cfg, model), load_data(cfg, model)
    assert len(a.calib) == math.ceil(3 / 2) and len(a.eval) == 1
    assert all(torch.equal(u, v) for u, v in zip(a.calib[0], b.calib[0]))
    assert not torch.equal(a.calib[0][0], a.eval[0][0])
    assert all(t.shape[0] == 2 for t in a.calib[0])


def test_bad_requests_fail_with_the_allowed_values():
    with pytest.raises(ValueError, match="data.name must be one of photos, faces"):
        load_data("imagenet")
    with pytest.raises(ValueError, match="does not take images"):
        load_data("photos", model="minilm")
    with pytest.raises(ValueError, match="for model 'minilm'"):
        load_data("sentences", model="mobilenet_v2")
    with pytest.raises(ValueError, match="data.batch_size must be >= 1"):
        DataConfig(name="photos", batch_size=0)


def test_image_format_crop_and_stretch():
    img = torch.rand(3, 300, 400)
    assert formats.IMAGENET.apply(img).shape == (1, 3, 224, 224)
    assert formats.MTCNN_48.apply(img[None]).shape == (1, 3, 48, 48)
    assert torch.equal(formats.UNIT.apply(img)[0], img)
