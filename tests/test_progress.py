"""Progress bars (tqdm) go to stderr for long work; ``progress=false`` silences them."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import torch
from torch import nn

from quantlab.analysis.sensitivity import sensitivity
from quantlab.simulate import Simulator


def _sim_and_batches():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid()).eval()
    return Simulator(model, "j6m"), [(torch.randn(2, 4),), (torch.randn(2, 4),)]


def test_calibration_and_sensitivity_bars_on_stderr_only_when_asked(capfd):
    sim, batches = _sim_and_batches()
    sim.calibrate(batches)
    out, err = capfd.readouterr()
    assert out == "" and "calibrate" in err and "2/2" in err
    sim.calibrate(batches, progress=False)
    sensitivity(sim, batches[:1], kinds=["fixed"], progress=False)
    assert capfd.readouterr() == ("", "")
    sensitivity(sim, batches[:1], kinds=["fixed"])
    out, err = capfd.readouterr()
    assert out == "" and "sensitivity fixed" in err


def test_command_line_switch_reaches_the_experiment(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    import quantlab.__main__ as entry
    from quantlab.config import CONFIG_DIR
    from quantlab.experiment import ExperimentResult

    seen = []

    def probe(exp, ctx):
        seen.append(ctx.progress)
        return ExperimentResult(table=pd.DataFrame({"x": [1]}), title="probe")

    monkeypatch.setattr(entry, "lookup", lambda schema: SimpleNamespace(fn=probe))
    for flag in ("true", "false"):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=["+exp=lut_error", f"progress={flag}"])
        entry.run(cfg, tmp_path / flag, "python -m quantlab +exp=lut_error")
    assert seen == [True, False]
