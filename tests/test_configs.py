"""Every option of every config group composes into typed dataclasses; bad values fail clearly."""

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, HydraException

from quantlab.config import CONFIG_DIR, compose
from quantlab.data.schema import DataConfig
from quantlab.models.schema import ModelConfig
from quantlab.numerics.dtypes import DType
from quantlab.platforms import PLATFORM_NAMES, PlatformConfig, load_platform


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


REQUIRED = {  # options that need a value the user gives (a file, a factory)
    ("model", "custom"): ["model.target=my_pkg.nets:build"],
    ("model", "onnx"): ["model.path=model.onnx"],
    ("data", "images"): ["data.path=images"],
    ("data", "tensors"): ["data.path=inputs.pt"],
    ("qconfig", "file"): ["qconfig.path=qconfig.yaml"],
}


def test_platform_yaml_files_match_names():
    assert set(_options("platform")) == set(PLATFORM_NAMES)


@pytest.mark.parametrize("name", _options("platform"))
def test_every_platform_composes(name):
    p = load_platform(name)
    assert isinstance(p, PlatformConfig)
    assert p.name == name


@pytest.mark.parametrize("name", _options("model"))
def test_every_model_option_composes(name):
    cfg = compose([f"model={name}", *REQUIRED.get(("model", name), [])])
    assert isinstance(cfg.model, ModelConfig)
    assert cfg.model.name == name


@pytest.mark.parametrize("name", _options("data"))
def test_every_data_option_composes(name):
    cfg = compose([f"data={name}", *REQUIRED.get(("data", name), [])])
    assert isinstance(cfg.data, DataConfig)
    assert cfg.data.name == name


@pytest.mark.parametrize("name", _options("qconfig"))
def test_every_qconfig_option_composes(name):
    from quantlab.qconfig_presets import QConfigChoice

    cfg = compose([f"qconfig={name}", *REQUIRED.get(("qconfig", name), [])])
    assert isinstance(cfg.qconfig, QConfigChoice)
    assert cfg.qconfig.preset.value == name


@pytest.mark.parametrize(("group", "name"), sorted(REQUIRED))
def test_options_without_their_required_value_name_the_field(group, name):
    field = REQUIRED[(group, name)][0].split("=")[0]
    with pytest.raises(ValueError, match=f"{field} is required with {group}={name}"):
        compose([f"{group}={name}"])


@pytest.mark.parametrize("name", _options("exp"))
def test_every_experiment_composes_to_its_schema(name):
    from quantlab.experiment import lookup

    cfg = compose([f"+exp={name}"])
    entry = lookup(type(cfg.exp))
    assert entry.name == name


def test_platform_templates_follow_the_vendor_recipes():
    for name in ("j6e", "j6m", "j6b"):
        p = load_platform(name)
        assert p.global_dtype is DType.INT8 and p.sensitive_dtype is DType.INT16
    for name in ("j6h", "j6p"):
        p = load_platform(name)
        assert p.global_dtype is DType.FLOAT16 and p.gemm_input_dtype is DType.INT8
    assert load_platform("j6m").max_int16_gemm_operands == 1


def test_input_shape_composes_for_one_input_or_per_input():
    """``model.input_shape`` from the command line: one list is one input's shape, a list of
    lists one shape per input; anything else names the field. ``model.input_dtype`` names one
    dtype per input, for a custom model only."""
    one = compose(["model=custom", "model.target=pkg.nets:build", "model.input_shape=[3,8,8]"])
    assert one.model.input_shapes() == ((3, 8, 8),)
    two = compose(["model=onnx", "model.path=m.onnx", "model.input_shape=[[128],[128]]"])
    assert two.model.input_shapes() == ((128,), (128,))
    with pytest.raises(ValueError, match=r"model.input_shape must list .*got \[\[3, 8\], 2\]"):
        compose(["model=onnx", "model.path=m.onnx", "model.input_shape=[[3,8],2]"])
    ids = compose(["model=custom", "model.target=pkg.nets:build", "model.input_shape=[[8],[8]]",
                   "model.input_dtype=[int64,int32]"])  # fmt: skip
    assert ids.model.input_dtypes() == ("int64", "int32") and ids.model.declares_integers()
    with pytest.raises(ValueError, match="model.input_dtype is only read with model=custom"):
        compose(["model=onnx", "model.path=m.onnx", "model.input_dtype=int64"])


def test_misspelt_platform_lists_allowed_options():
    with pytest.raises(ConfigCompositionException) as e:
        compose(["platform=j6x"])
    msg = str(e.value) + str(e.value.__cause__ or "")
    assert "j6x" in msg


def test_misspelt_enum_names_allowed_values():
    with pytest.raises(HydraException) as e:
        compose(["platform.requant_round=HALF_DOWN"])
    text = str(e.value) + repr(e.value.__cause__)
    assert "HALF_EVEN" in text and "HALF_UP" in text


def test_unknown_key_is_rejected():
    with pytest.raises(HydraException) as e:
        compose(["platform.acum_bits=3"])
    assert "acum_bits" in str(e.value) + repr(e.value.__cause__)


def test_invalid_value_fails_in_post_init_naming_field():
    with pytest.raises(ValueError, match="platform.requant_mult_bits"):
        compose(["platform.requant_mult_bits=12"])
    with pytest.raises(ValueError, match="no float16 in TAE/VAE"):
        compose(["platform=j6m", "platform.global_dtype=FLOAT16"])


def test_cli_without_experiment_lists_experiments(tmp_path):
    # as the README runs it: from the user's folder, with the default run folder
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    )
    procs = [  # both at once: each is mostly the interpreter's start-up
        subprocess.Popen(
            [sys.executable, "-m", "quantlab", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in ([], ["-m"])
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "+exp=" in out


def test_cli_misspelt_platform_names_allowed_values(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-m", "quantlab", "platform=j6x", f"hydra.run.dir={tmp_path}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "j6m" in out.stderr and "j6p" in out.stderr
