"""A model chosen on the command line (``model=...``) reaches an experiment that runs it, and an
experiment that does not take one refuses it with a message naming those that do."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from quantlab.__main__ import model_choice, run
from quantlab.config import CONFIG_DIR
from quantlab.experiment import registered

USER_MODEL = ["model=custom", "model.target=my_pkg.nets:build"]


def _cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def test_model_choice_reads_the_command_lines_model_override():
    assert model_choice(["+exp=calibration", "model=mobilenet_v2"])
    assert model_choice(["+model=custom", "model.target=a:b"])
    assert not model_choice(["+exp=calibration", "model.kwargs={a: 1}", "exp.models=[minilm]"])
    assert not model_choice(["+exp=lut_error", "platform=j6m"])


def test_experiments_that_take_a_model():
    takers = {name for name, e in registered().items() if e.takes_model}
    assert takers == {
        "calibration",
        "consistency",
        "highlow_split",
        "input_path",
        "mixed_precision",
        "model_check",
        "onnx_fidelity",
        "qat",
        "recipe",
        "sensitivity",
    }


@pytest.mark.parametrize(
    "exp, words",
    [
        ("norm_attention", "it runs the models of exp.models (now ['digits_layernorm'"),
        ("sincos_period", "it builds the models it studies itself"),
        ("lut_error", "it builds the models it studies itself"),
    ],
)
def test_an_experiment_without_a_model_refuses_your_model(exp, words, tmp_path):
    with pytest.raises(ValueError) as err:
        run(_cfg([f"+exp={exp}", *USER_MODEL]), tmp_path, "cmd")
    msg = str(err.value)
    assert msg.startswith(f"model=custom: +exp={exp} does not take a model (")
    assert words in msg
    assert msg.endswith(
        "The experiments that run the model you choose: calibration, consistency, "
        "highlow_split, input_path, mixed_precision, model_check, onnx_fidelity, qat, recipe, "
        "sensitivity"
    )
    assert not any(tmp_path.iterdir())  # refused before any work


def test_a_registry_model_refused_only_when_the_command_chose_it(tmp_path):
    cfg = _cfg(["+exp=norm_attention", "model=mobilenet_v2"])
    with pytest.raises(ValueError, match="model=mobilenet_v2: \\+exp=norm_attention does not"):
        run(cfg, tmp_path, "cmd", model_chosen=True)
