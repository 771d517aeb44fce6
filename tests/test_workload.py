"""The model, data and starting qconfig an experiment gets from its config: input shapes inferred
from the data, a model that cannot run on the data, and qconfig files that match no op."""

from __future__ import annotations

import sys

import pytest
import torch
from user_package import PACKAGE, image_folder, write_package

from quantlab import qconfig
from quantlab.data.schema import DataConfig
from quantlab.models.schema import ModelConfig
from quantlab.platforms import load_platform
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.qconfig_presets import QConfigChoice, QConfigPreset
from quantlab.workload import load_workload, start_spec


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    root = tmp_path_factory.mktemp("userpkg")
    write_package(root)
    sys.path.insert(0, str(root))
    yield PACKAGE
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.startswith(PACKAGE)]:
        del sys.modules[name]


def _model(pkg, fn="build", **kw) -> ModelConfig:
    return ModelConfig(name="custom", target=f"{pkg}.nets:{fn}", **kw)


def test_input_shape_comes_from_the_image_data(pkg, tmp_path):
    folder = image_folder(tmp_path / "imgs", ("coffee.png", "chelsea.png", "camera.png"))
    data = DataConfig(name="images", path=str(folder), num_calib=2, num_eval=1, size=[24, 40])
    bundle, ds = load_workload(_model(pkg), data)
    assert bundle.input_shapes == ((3, 24, 40),)
    assert ds.eval_ids == ["coffee.png"] and ds.calib_ids == ["camera.png", "chelsea.png"]
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in bundle.module.modules())


def test_synthetic_data_needs_a_declared_shape(pkg):
    with pytest.raises(ValueError, match="data=synthetic needs the input shape of model custom:"):
        load_workload(_model(pkg), DataConfig(name="synthetic", num_calib=1, num_eval=1))
    bundle, ds = load_workload(
        _model(pkg, input_shape=[3, 12, 12]), DataConfig(name="synthetic", num_calib=2, num_eval=2)
    )
    assert ds.calib[0][0].shape == (1, 3, 12, 12) and bundle.task.name == "top1_agreement"


def test_a_model_of_two_inputs_declares_both_shapes_for_synthetic_data(pkg):
    """``model.input_shape=[[6], [3]]``: one shape per input, so a model of two inputs runs on
    data=synthetic (before, the field took one input's shape only)."""
    from quantlab.simulate import Mode, Simulator

    data = DataConfig(name="synthetic", num_calib=2, num_eval=1)
    bundle, ds = load_workload(_model(pkg, "two_inputs", input_shape=[[6], [3]]), data)
    assert bundle.input_shapes == ((6,), (3,))
    assert [tuple(t.shape) for t in ds.calib[0]] == [(1, 6), (1, 3)]
    sim = Simulator(bundle.module, "j6m")
    sim.calibrate(ds.calib, progress=False)
    z, total = sim.run(*ds.eval[0], mode=Mode.FIXED)
    assert z.shape == (1, 4) and total.shape == (1,)
    one_list = r"shape \[1, 6\]: TypeError: .*model.input_shape takes one list per input"
    with pytest.raises(ValueError, match=one_list):
        load_workload(_model(pkg, "two_inputs", input_shape=[6]), data)


def test_a_custom_models_integer_inputs_take_ids_below_their_tables(pkg):
    """``model.input_dtype=[int64, int64, int64]``: ids below the embedding's 50 rows, places
    below the indexed table's 12, the mask (indexing nothing) ones; before, a custom model took
    float inputs only, which an embedding refuses."""
    from quantlab.simulate import Mode, Simulator

    model = _model(pkg, "tokens", input_shape=[[7], [7], [7]], input_dtype=["int64"] * 3)
    data = DataConfig(name="synthetic", num_calib=3, num_eval=2)
    bundle, ds = load_workload(model, data)
    ids, places, mask = (torch.cat([b[i] for b in ds.calib]) for i in range(3))
    assert ids.dtype == places.dtype == mask.dtype == torch.int64
    assert 0 <= int(ids.min()) and int(ids.max()) < 50 and len(set(ids.flatten().tolist())) > 5
    assert 0 <= int(places.min()) and int(places.max()) < 12
    assert bool((mask == 1).all()) and bundle.task.name == "top1_agreement"
    sim = Simulator(bundle.module, "j6m")
    sim.calibrate(ds.calib, progress=False)
    assert sim.run(*ds.eval[0], mode=Mode.FIXED).shape == (1, 3)
    floats = _model(pkg, "tokens", input_shape=[[7], [7], [7]])
    with pytest.raises(ValueError, match="fails on inputs of shape .*indices"):
        load_workload(floats, data)


def test_model_that_cannot_run_on_the_tensors_names_the_file(pkg, tmp_path):
    torch.save([(torch.randn(1, 5),), (torch.randn(1, 5),)], tmp_path / "x.pt")
    data = DataConfig(name="tensors", path=str(tmp_path / "x.pt"), num_calib=1, num_eval=1)
    with pytest.raises(ValueError, match=r"model custom:.*fails on inputs of shape \[1, 5\]: .*"
                       r"\(the first calibration batch of data=tensors \(.*x.pt\)\)"):  # fmt: skip
        load_workload(_model(pkg), data)
    with pytest.raises(
        ValueError, match=r"model small_cnn fails on inputs of shape \[1, 5\].*x.pt"
    ):
        load_workload(ModelConfig(name="small_cnn", pretrained=False), data)


def test_qconfig_file_rules_must_match_the_models_ops(pkg, tmp_path):
    bundle, ds = load_workload(
        _model(pkg, input_shape=[3, 8, 8]), DataConfig(name="synthetic", num_calib=1, num_eval=1)
    )
    j6m = load_platform("j6m")
    good = QConfigSpec(by_module={"conv*": OpQConfig(output_dtype="INT16")})
    qconfig.save(good, tmp_path / "good.yaml")
    choice = QConfigChoice(QConfigPreset.FILE, str(tmp_path / "good.yaml"))
    assert start_spec(choice, j6m, bundle.module, ds.calib[0]) == good
    bad = QConfigSpec(by_name={"conv3:conv2d#0": OpQConfig()}, by_type={"sigmoid": OpQConfig()})
    qconfig.save(bad, tmp_path / "bad.yaml")
    choice = QConfigChoice(QConfigPreset.FILE, str(tmp_path / "bad.yaml"))
    with pytest.raises(ValueError) as e:
        start_spec(choice, j6m, bundle.module, ds.calib[0])
    msg = str(e.value)
    assert f"qconfig file {tmp_path / 'bad.yaml'}: 2 rule(s) match no op of the model" in msg
    assert "by_name 'conv3:conv2d#0' is no op of the model; nearest op names: conv" in msg
    assert "by_type 'sigmoid' is no op type of the model (its op types: " in msg
    assert start_spec(None, j6m, bundle.module, ds.calib[0]) == QConfigSpec()


def test_a_graph_of_one_channel_and_a_dynamic_width_takes_luma_images_at_data_size(tmp_path):
    """An ONNX text-line model (1, 32, width) with a dynamic width (ddddocr's recognizer) took
    the default 3 channels, so data.mean=[0.5] was refused as 'takes 3 channel(s)'; the graph's
    static channels and height now count, the width comes from data.size, and a data.size
    that contradicts the static height, or none at all, is named."""
    pytest.importorskip("onnxruntime")

    class Line(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)

        def forward(self, x):
            return self.conv(x).mean((1, 2))

    path = tmp_path / "line.onnx"
    torch.onnx.export(Line().eval(), (torch.randn(1, 1, 32, 64),), str(path), dynamo=False,
                      input_names=["x"], dynamic_axes={"x": {3: "width"}})  # fmt: skip
    folder = image_folder(tmp_path / "imgs", ("coffee.png", "camera.png"))
    model = ModelConfig(name="onnx", path=str(path))

    def data(**kw) -> DataConfig:
        return DataConfig(name="images", path=str(folder), num_calib=1, num_eval=1, **kw)

    bundle, ds = load_workload(model, data(size=[32, 96], mean=[0.5], std=[0.5]))
    assert ds.calib[0][0].shape == (1, 1, 32, 96) and bundle.input_shapes == ((1, 32, 96),)
    with pytest.raises(ValueError, match=r"data.size is needed: .* 1 channel\(s\) with a dynamic "
                       r"size \[1, 32, \?\]"):  # fmt: skip
        load_workload(model, data(mean=[0.5], std=[0.5]))
    with pytest.raises(ValueError, match=r"data.size=\[48, 96\] but model .* takes a height of 32"):
        load_workload(model, data(size=[48, 96]))
