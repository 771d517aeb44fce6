"""highlow_split experiment on a tiny config: per-layer formats, model-level schemes, cost."""

import pytest

from experiments.highlow_split import HighlowSplitExp, run
from quantlab.experiment import RunContext
from quantlab.numerics.dtypes import DType
from quantlab.platforms import PlatformConfig


def test_tiny_run_columns_and_ordering(tmp_path):
    exp = HighlowSplitExp(
        models=["small_cnn"],
        ks=[7],
        layer_in_dtypes=[DType.INT8],
        num_calib=1,
        num_eval=2,
        top_k=1,
    )
    res = run(exp, RunContext(PlatformConfig(), None, None, 0, tmp_path))
    t = res.table
    for col in ("model", "layer", "format", "sqnr_db", "max_err_lsb", "mean_err_lsb", "macs"):
        assert col in t.columns
    assert set(t["format"]) == {"int8", "split_k7_wide", "split_k7_separate", "int16"}
    piv = t.pivot_table(index="layer", columns="format", values="sqnr_db")
    assert (piv["split_k7_wide"] > piv["int8"] + 10).all()  # split recovers > 10 dB per layer
    m = res.tables["model_level"]
    assert list(m["scheme"]) == ["int8", "split_topk", "split_all", "int16"]
    cost = dict(zip(m["scheme"], m["cost_int8_mac_eq"]))
    assert cost["int8"] < cost["split_topk"] <= cost["split_all"]
    wb = dict(zip(m["scheme"], m["weight_bytes"]))
    assert wb["split_all"] == wb["int16"] == 2 * wb["int8"]
    assert {"top1_agreement", "kl_nats", "task_error"} <= set(m.columns)
    assert res.findings
    # the model-level task errors carry their intervals and counts; the split's claim says
    # whether the int8 and split-top-k intervals separate
    errors = next(f for f in res.findings if "weights in each format" in f)
    assert errors.count("95% CI") == 4, errors
    removes = next(f for f in res.findings if "most weight-sensitive layers removes" in f)
    assert "the two intervals" in removes


def test_bad_k_and_scheme():
    with pytest.raises(ValueError, match="weight_split k=9"):
        HighlowSplitExp(ks=[9])
    with pytest.raises(ValueError, match="exp.schemes"):
        HighlowSplitExp(schemes=["int4"])


def test_float16_platform_uses_float16_layer_outputs(tmp_path):
    from quantlab.platforms import load_platform

    exp = HighlowSplitExp(
        models=["small_cnn"],
        ks=[7],
        layer_in_dtypes=[DType.INT8],
        schemes=["int8"],
        num_eval=1,
        num_calib=1,
    )
    res = run(exp, RunContext(load_platform("j6p"), None, None, 0, tmp_path))
    assert set(res.table["out_dtype"]) == {"FLOAT16"}
    piv = res.table.pivot_table(index="layer", columns="format", values="sqnr_db")
    assert (piv["split_k7_wide"] > piv["int8"]).all()


def test_fixed_mode_table_columns_and_split_gain(tmp_path):
    exp = HighlowSplitExp(
        models=["small_cnn"],
        ks=[7],
        layer_in_dtypes=[DType.INT8],
        schemes=["int8"],
        num_calib=1,
        num_eval=1,
        top_k=1,
        fixed_models=["small_cnn"],
        fixed_num_calib=1,
        fixed_num_eval=2,
    )
    platform = PlatformConfig(global_dtype=DType.INT16, gemm_input_dtype=DType.INT16)
    res = run(exp, RunContext(platform, None, None, 0, tmp_path))
    f = res.tables["model_fixed"]
    for col in (
        "model",
        "scheme",
        "combine",
        "layers_split",
        "top1_agreement",
        "kl_nats",
        "sqnr_db",
        "cost_int8_mac_eq",
        "cost_rel_int8",
        "weight_bytes",
        "extra_int8_macs",
    ):
        assert col in f.columns
    assert list(f["scheme"]) == ["int8"] + ["split_topk", "split_all"] * 2
    assert list(f["combine"]) == ["-"] + ["WIDE_ACCUMULATOR"] * 2 + ["SEPARATE_REQUANT"] * 2
    sq = f.set_index(["scheme", "combine"])["sqnr_db"]
    assert sq["split_all", "WIDE_ACCUMULATOR"] > sq["int8", "-"]
    assert sq["split_all", "SEPARATE_REQUANT"] > sq["int8", "-"]
    assert (f.loc[f["scheme"] != "int8", "cost_rel_int8"] > 1).all()
    assert any("through the simulator" in s for s in res.findings)


def test_a_chosen_model_runs_alone_with_the_simulator_study_on_its_data(tmp_path):
    """model=... (here the registry's small_cnn on data=synthetic at 1 calibration and 3
    evaluation items) replaces exp.models and exp.fixed_models: every study runs that model on
    that data."""
    from quantlab.data.schema import DataConfig
    from quantlab.models.schema import ModelConfig

    exp = HighlowSplitExp(
        models=["mobilenet_v2", "minilm"],  # not run: the command chose a model
        ks=[7],
        layer_in_dtypes=[DType.INT8],
        schemes=["int8"],
        top_k=1,
        fixed_models=["mobilenet_v2"],
    )
    data = DataConfig(name="synthetic", num_calib=1, num_eval=3)
    ctx = RunContext(PlatformConfig(), ModelConfig(name="small_cnn"), data, 0, tmp_path)
    ctx.model_chosen = True
    res = run(exp, ctx)
    assert set(res.table.model) == {"small_cnn"}
    f = res.tables["model_fixed"]
    assert set(f.model) == {"small_cnn"} and len(f) == 5
    assert (f.top1_agreement_n == 3).all()


def test_a_model_without_conv_or_linear_modules_is_refused_by_name(tmp_path, monkeypatch):
    """A model whose GEMMs are recurrent cells only has nothing the split study covers: refused
    naming the model (it stopped at a KeyError of an empty table)."""
    from types import SimpleNamespace

    from torch import nn

    import quantlab.workload as workload

    audio = SimpleNamespace(module=nn.Sequential(nn.LSTM(4, 4), nn.GRU(4, 4)))
    monkeypatch.setattr(workload, "listed_or_chosen", lambda *a: iter([("audio", audio, None)]))
    with pytest.raises(
        ValueError, match="model audio has no nn.Conv1d, nn.Conv2d or nn.Linear module"
    ):
        run(HighlowSplitExp(), RunContext(PlatformConfig(), None, None, 0, tmp_path))


def test_a_model_judged_by_its_outputs_gets_a_task_error_and_a_drawable_pareto_plot():
    """A user's model without a classifier output (silero-vad's) has output cosine, not KL or
    an embedding's cosine: its task error is 1 - output cosine (it was NaN, and the log-scaled
    Pareto plot of NaN stopped the report); a panel with no positive value stays linear."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from quantlab.analysis.highlow_words import task_error
    from quantlab.report import Plot, PlotKind
    from quantlab.report.plots import draw

    df = pd.DataFrame({"output_cosine": [0.99, 0.999], "scheme": ["int8", "int16"]})
    assert list(task_error(df).round(6)) == [0.01, 0.001]
    rows = pd.DataFrame(
        {"cost": [1.0, 2.0, 1.0, 2.0], "err": [0.01, 0.001, None, None], "m": ["a", "a", "b", "b"]}
    )
    plot = Plot("pareto", "cost", "err", "cost", "error", kind=PlotKind.SCATTER, facet="m",
                logy=True)  # fmt: skip
    fig = draw(plot, rows)
    assert [ax.get_yscale() for ax in fig.axes[:2]] == ["log", "linear"]
    plt.close(fig)
