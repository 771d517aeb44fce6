"""The qconfig YAML file (save / load round trip, errors naming the file and entry), rules that
match no op of the model, and the presets of the ``qconfig`` group."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quantlab import qconfig
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import Strategy
from quantlab.platforms import load_platform
from quantlab.qconfig import ObserverKind, OpContext, OpQConfig, QConfigSpec, check_matches
from quantlab.qconfig_presets import QConfigChoice, QConfigPreset, preset_spec
from quantlab.simulate import Mode, Simulator


def _full_spec() -> QConfigSpec:
    return QConfigSpec(
        global_=OpQConfig(output_dtype=DType.INT16, observer=ObserverKind.MINMAX),
        by_type={
            "conv2d": OpQConfig(input_dtype=DType.INT8, weight_dtype=DType.INT8, weight_split=7),
            "sigmoid": OpQConfig(lut_strategy=Strategy.EVENLY),
        },
        by_module={"backbone.stage*": OpQConfig(observer="PERCENTILE", percentile=99.9)},
        by_name={
            "head.cls:conv2d#0": OpQConfig(weight_dtype=DType.INT16, high_precision_output=False),
            ":mean#0": OpQConfig(output_dtype=DType.FLOAT16),
            "dec:inverse_sigmoid#2": OpQConfig(
                observer=ObserverKind.FIXED, fixed_scale=1 / 3, output_dtype=DType.INT16
            ),
        },
        use_platform_template=False,
    )


def test_save_load_round_trip(tmp_path):
    spec = _full_spec()
    path = qconfig.save(spec, tmp_path / "q.yaml", header="made by a test\nsecond line")
    text = path.read_text()
    assert text.startswith("# made by a test\n# second line\n")
    assert "by_name:" in text and "PERCENTILE" in text and "EVENLY" in text
    back = qconfig.load(path)
    assert back == spec
    assert back.by_name["dec:inverse_sigmoid#2"].fixed_scale == 1 / 3  # exact float
    assert qconfig.load(qconfig.save(back, tmp_path / "again.yaml")) == spec


@pytest.mark.parametrize("kind", list(ObserverKind))
def test_every_observer_kind_round_trips_by_name(tmp_path, kind):
    spec = QConfigSpec(global_=OpQConfig(observer=kind))
    assert f"observer: {kind.name}" in qconfig.save(spec, tmp_path / "q.yaml").read_text()
    assert qconfig.load(tmp_path / "q.yaml").global_.observer is kind


def test_empty_file_is_the_platform_template(tmp_path):
    (tmp_path / "q.yaml").write_text("# nothing set\n")
    assert qconfig.load(tmp_path / "q.yaml") == QConfigSpec()


BAD_FILES = {
    "global: [1, 2": "is not valid YAML",
    "by_op: {}": "unknown key.*by_op.*allowed: use_platform_template, global, by_type",
    "by_name: {'a:conv2d#0': {out_dtype: INT8}}": r"by_name\['a:conv2d#0'\]: unknown field.*"
    "out_dtype.*allowed: input_dtype",
    "by_type: {conv2d: {weight_dtype: INT4}}": r"by_type\['conv2d'\].*unknown dtype 'INT4'.*"
    "allowed: INT8, INT16",
    "global: {observer: BEST}": "global.*observer='BEST' is not allowed; allowed: MINMAX",
    "global: {lut_strategy: SMOOTH}": "lut_strategy='SMOOTH' is not allowed; allowed: EVENLY",
    "global: {weight_split: '7'}": r"global.weight_split must be an integer 0..8, got '7'",
    "global: {weight_split: 9}": "weight_split k=9 is not allowed",
    "global: {fixed_scale: -1.0}": "fixed_scale must be > 0",
    "global: {high_precision_output: 1}": "high_precision_output must be true or false",
    "use_platform_template: maybe": "use_platform_template must be true or false",
    "by_module: [a, b]": "by_module must map names to entries",
    "by_name: {x: 3}": r"by_name\['x'\] must be a mapping of fields",
    "- a\n- b": "the top level must be a mapping",
}


@pytest.mark.parametrize("text", list(BAD_FILES))
def test_bad_file_names_the_file_the_entry_and_allowed_values(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=BAD_FILES[text]) as e:
        qconfig.load(path)
    assert str(path) in str(e.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"qconfig file {tmp_path / 'no.yaml'} does not exist"):
        qconfig.load(tmp_path / "no.yaml")
    with pytest.raises(ValueError, match="is a folder, not a file"):
        qconfig.load(tmp_path)


OPS = [
    OpContext("backbone.conv1:conv2d#0", "conv2d", "backbone.conv1"),
    OpContext("backbone.conv2:conv2d#0", "conv2d", "backbone.conv2"),
    OpContext("backbone.act:relu#0", "relu", "backbone.act"),
    OpContext("head:linear#0", "linear", "head"),
]


def test_rules_that_match_ops_pass():
    spec = QConfigSpec(
        by_type={"conv2d": OpQConfig()},
        by_module={"backbone.*": OpQConfig(), "head": OpQConfig()},
        by_name={"head:linear#0": OpQConfig()},
    )
    check_matches(spec, OPS)


def test_unmatched_name_glob_and_type_list_the_nearest_ops():
    spec = QConfigSpec(
        by_type={"conv": OpQConfig()},
        by_module={"backbone.layer9.*": OpQConfig()},
        by_name={"backbone.conv3:conv2d#0": OpQConfig()},
    )
    with pytest.raises(ValueError) as e:
        check_matches(spec, OPS, "qconfig file q.yaml")
    msg = str(e.value)
    assert msg.startswith("qconfig file q.yaml: 3 rule(s) match no op of the model")
    assert (
        "by_name 'backbone.conv3:conv2d#0' is no op of the model; nearest op names: "
        "backbone.conv2:conv2d#0, backbone.conv1:conv2d#0" in msg
    )
    assert "by_module 'backbone.layer9.*' matches no op's module path; nearest op names: " in msg
    assert (
        "by_type 'conv' is no op type of the model (its op types: conv2d, linear, relu); "
        "nearest op names: backbone.conv1:conv2d#0, backbone.conv2:conv2d#0" in msg
    )


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))
        return torch.matmul(self.fc(y)[:, :, None], y[:, None, :]).sum(2)


def _resolved(platform_name: str, preset: QConfigPreset) -> dict:
    platform = load_platform(platform_name)
    spec = preset_spec(QConfigChoice(preset), platform)
    torch.manual_seed(0)
    sim = Simulator(Block().eval(), platform, spec)
    x = torch.randn(2, 3, 8, 8)
    sim.calibrate([(x,)])
    assert torch.isfinite(sim.run(x, mode=Mode.FIXED)).all()  # the platform accepts it
    return {n.split(":")[1].split("#")[0]: sim.qconfig_of(n) for n in sim.ops["name"]}


def test_int16_preset_raises_every_op_as_far_as_the_platform_allows():
    j6m = _resolved("j6m", QConfigPreset.INT16)  # int16 x int16 GEMM not available
    assert j6m["mean"].output_dtype is DType.INT16
    assert j6m["conv2d"].input_dtype is DType.INT16 and j6m["conv2d"].weight_dtype is DType.INT8
    assert j6m["matmul"].input_dtype is DType.INT8
    ort = _resolved("onnxruntime", QConfigPreset.INT16)  # two int16 operands allowed
    assert ort["conv2d"].input_dtype is DType.INT16 and ort["conv2d"].weight_dtype is DType.INT16
    assert ort["matmul"].input_dtype is DType.INT16


def test_float16_preset_on_j6p_and_refused_on_j6m():
    j6p = _resolved("j6p", QConfigPreset.FLOAT16)
    assert j6p["mean"].output_dtype is DType.FLOAT16
    assert j6p["linear"].input_dtype is DType.INT8 and j6p["linear"].weight_dtype is DType.INT8
    with pytest.raises(ValueError, match="qconfig=float16 needs float16, which is not available "
                       "on j6m"):  # fmt: skip
        preset_spec(QConfigChoice(QConfigPreset.FLOAT16), load_platform("j6m"))


def test_default_preset_is_the_template_and_path_only_with_file(tmp_path):
    assert preset_spec(QConfigChoice(), load_platform("j6m")) == QConfigSpec()
    with pytest.raises(ValueError, match="qconfig.path is only read with qconfig=file"):
        QConfigChoice(QConfigPreset.INT16, path="q.yaml")
    spec = _full_spec()
    qconfig.save(spec, tmp_path / "q.yaml")
    choice = QConfigChoice(QConfigPreset.FILE, str(tmp_path / "q.yaml"))
    assert preset_spec(choice, load_platform("j6m")) == spec
