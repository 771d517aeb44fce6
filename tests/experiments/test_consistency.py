"""The consistency experiment on a tiny toy run: columns, both views, findings and plots."""

from __future__ import annotations

import math

import pytest

from experiments.consistency import ConsistencyExp, consistency
from quantlab.data.schema import DataConfig
from quantlab.experiment import RunContext
from quantlab.models.schema import ModelConfig
from quantlab.platforms import PlatformConfig
from quantlab.report import write_report


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    ctx = RunContext(
        PlatformConfig(name="j6m"),
        ModelConfig(name="transformer_block", pretrained=False),
        DataConfig(name="synthetic", num_calib=2, num_eval=2),
        0,
        tmp_path_factory.mktemp("consistency"),
    )
    return consistency(ConsistencyExp(max_eval_items=2), ctx), ctx


def test_table_columns_and_views(result):
    res, _ = result
    t = res.table
    for col in (
        "view",
        "depth",
        "name",
        "op_type",
        "sqnr_db",
        "cosine",
        "max_abs",
        "err_lsb",
        "saturated",
        "out_dtype",
    ):
        assert col in t.columns
    assert set(t.view) == {"ISOLATED", "ACCUMULATED"}
    iso, acc = t[t.view == "ISOLATED"], t[t.view == "ACCUMULATED"]
    assert list(iso.name) == list(acc.name) and len(iso) >= 20
    assert (iso.depth.to_numpy() == range(len(iso))).all()
    # pass-through ops never add error of their own
    assert (iso[iso.op_type.isin(["reshape", "permute"])].max_abs == 0).all()
    assert iso.sqnr_db.min() < math.inf  # some op really differs between fake and fixed


def test_findings_tables_and_report(result, tmp_path):
    res, _ = result
    assert res.findings and "SQNR" in res.findings[0]
    assert {"model_output", "by_op_type", "worst_ops", "op_support", "along_depth"} <= set(
        res.tables
    )
    assert res.tables["by_op_type"].ops.sum() == len(res.table) // 2
    out = res.tables["model_output"]
    assert list(out.compared) == ["FAKE", "FIXED", "FIXED", "HYBRID", "FIXED"]
    # each output SQNR with its 95% interval over the run's items
    differ = out[out.max_abs > 0]
    assert len(differ) and (differ.sqnr_db_n >= 2).all()
    assert (differ.sqnr_db_ci_low <= differ.sqnr_db).all()
    assert (differ.sqnr_db <= differ.sqnr_db_ci_high).all()
    (vs_float,) = [f for f in res.findings if f.startswith("Against float")]
    assert vs_float.count("dB (95% CI") == 2 and "the intervals" in vs_float
    (at_output,) = [f for f in res.findings if f.startswith("At the model output")]
    assert "dB (95% CI" in at_output
    split = res.tables["export_gap_split"].set_index("gap")
    assert list(split.index) == ["export gap (all)", "LUT error", "requantization error"]
    assert list(split.reference) == ["FAKE", "FAKE", "HYBRID"]
    # the toy's integer kernels give the output's gap; its softmax table differs from the QAT
    # softmax op by op (isolated view: one LSB), which its int8 consumers round away here
    assert split.loc["requantization error"].max_abs > 0 and split.loc["LUT error"].max_abs >= 0
    iso = res.table[res.table.view == "ISOLATED"]
    assert iso[iso.op_type == "softmax"].max_abs.max() > 0
    assert any("LUT error (fake vs hybrid)" in f for f in res.findings)
    path = write_report(res, tmp_path, "python -m quantlab +exp=consistency", "exp: {}\n")
    text = path.read_text()
    assert "sqnr_along_depth.png" in text and (tmp_path / "sqnr_along_depth.png").exists()
    assert (tmp_path / "export_gap_split.png").exists()


def test_schema_rejects_same_modes():
    from quantlab.simulate import Mode

    with pytest.raises(ValueError, match="must differ"):
        ConsistencyExp(mode_a=Mode.FIXED, mode_b=Mode.FIXED)


def test_float_ops_finding_counts_three_disjoint_groups():
    """An op quantlab does not model counts once (not also as lacking an integer kernel)."""
    import pandas as pd

    from quantlab.analysis.consistency_words import float_ops_finding

    ops = pd.DataFrame(
        {
            "op_type": ["conv2d", "log_softmax", "gelu", "sub", "relu"],
            "category": ["GEMM", "NONE", "LUT", "ADD", "PASS_THROUGH"],
            "supported": [True, False, False, True, True],
            "fixed_kernel": [
                "integer",
                "float (not modelled by quantlab)",
                "float (not supported on this platform)",
                "float between dequantize and quantize",
                "pass_through",
            ],
        }
    )
    text = float_ops_finding(ops, "p", "m")
    assert text == (
        "m has 5 captured op calls: 1 (log_softmax) are ops quantlab does not model (they run "
        "in float); 1 (gelu) run in float because p does not support them; 1 (sub) compute in "
        "float in fixed mode and quantize their output."
    )
    # a kernel that declined its call in the fixed run (fixed_in_float) counts there too
    ops["fixed_in_float"] = [True, False, False, False, False]
    assert "2 (conv2d, sub) compute in float in fixed mode" in float_ops_finding(ops, "p", "m")


def test_accumulated_finding_names_the_widest_gap_and_the_last_op():
    import pandas as pd

    from quantlab.analysis.consistency_words import accumulated_finding

    def acc(values):
        return pd.DataFrame({"name": [f"op{i}" for i in range(len(values))], "sqnr_db": values})

    text = accumulated_finding(acc([50.0, 31.5, math.inf]))
    assert "widest at op1 (31.5 dB SQNR)" in text and "(op2) it is bit-identical (inf dB)" in text
    assert "reaches 29.0 dB SQNR at the last op (op2)" in accumulated_finding(acc([40, 35, 29.0]))
    assert "op1" in accumulated_finding(acc([math.nan, 20.0, 30.0]))  # NaN rows are skipped
    assert "last op (op1)" in accumulated_finding(acc([math.nan, math.nan]))
    # a pass-through op (a slice, relu) adds no error: the sentence says so and names the
    # lowest among the ops that compute
    ops = acc([50.0, 31.5, 40.0, 60.0])
    ops["category"] = ["GEMM", "PASS_THROUGH", "LUT", "GEMM"]
    text = accumulated_finding(ops)
    assert text == (
        "Accumulated along depth, the gap is widest at op1 (31.5 dB SQNR), a pass-through op "
        "(it only moves or selects values, so its gap was made before it; the widest at an op "
        "that computes is at op2, 40.0 dB SQNR); at the last op (op3) it is 60.0 dB SQNR."
    )
    ops["category"] = ["GEMM", "GEMM", "PASS_THROUGH", "GEMM"]
    assert "pass-through" not in accumulated_finding(ops)


def test_float_ops_finding_names_eval_dropout_as_removed_at_export():
    """An eval-mode dropout (the identity, which model_check places as removed at export) is
    not counted among the ops quantlab does not model."""
    import pandas as pd

    from quantlab.analysis.consistency_words import float_ops_finding

    ops = pd.DataFrame(
        {
            "op_type": ["linear", "dropout", "dropout", "erfinv"],
            "category": ["GEMM", "NONE", "NONE", "NONE"],
            "supported": [True, False, False, False],
            "fixed_kernel": ["integer"] + ["float (not modelled by quantlab)"] * 3,
        }
    )
    assert float_ops_finding(ops, "p", "m") == (
        "m has 4 captured op calls: 2 (dropout) are the identity in eval mode (removed at "
        "export); 1 (erfinv) are ops quantlab does not model (they run in float); 0 run in "
        "float because p does not support them; 0 compute in float in fixed mode and quantize "
        "their output."
    )


def test_an_output_with_no_integer_grid_has_no_lsb_figure():
    """A float16 output (J6H/P) has no LSB: its error is not printed as "nan LSB"."""
    import pandas as pd

    from quantlab.analysis.consistency_words import lsb_words

    row = pd.Series({"err_lsb": float("nan"), "out_dtype": "FLOAT16"})
    assert lsb_words(row, "LSB") == "a FLOAT16 output (no LSB)"
    assert lsb_words(pd.Series({"err_lsb": 2.5, "out_dtype": "INT8"}), "LSB") == "2.5 LSB"


def test_each_float_output_of_a_model_gets_its_own_rows_and_finding():
    """A dict output with a precise and a coarse head: the pooled figure hides the coarse one,
    the per-output rows and the finding name both; one output has no such table."""
    import torch

    from experiments.consistency import _each_output_rows
    from quantlab.analysis.consistency_words import each_output_finding
    from quantlab.simulate import Mode

    g = torch.Generator().manual_seed(0)
    big, small = torch.randn(1000, generator=g), torch.randn(10, generator=g)
    ids = torch.arange(3)  # an integer output: no rows
    outs = {
        Mode.FLOAT: {"logits": big, "score": small, "ids": ids},
        Mode.FAKE: {"logits": big + 1e-3, "score": small + 0.3, "ids": ids},
        Mode.FIXED: {"logits": big + 2e-3, "score": small + 0.5, "ids": ids},
    }
    each = _each_output_rows(outs)
    assert set(each.output) == {"['logits']", "['score']"} and len(each) == 6
    (said,) = each_output_finding(each, Mode.FLOAT, Mode.FIXED)
    fixed = each[(each.reference == "FLOAT") & (each.compared == "FIXED")].set_index("output")
    score = fixed.sqnr_db["['score']"]
    assert f"['score'] {score:.1f} dB" in said and score < fixed.sqnr_db["['logits']"]
    assert _each_output_rows({m: big for m in outs}).empty
    assert each_output_finding(each, Mode.FAKE, Mode.HYBRID) == []  # no rows for that pair


def test_the_reference_runtimes_row_is_no_part_of_the_export_gap_split():
    """An ONNX model's float run checked against onnxruntime gets its own model_output row,
    outside the split of the export gap (its table and bar plot)."""
    from types import SimpleNamespace

    import torch

    from experiments.consistency import GAP_PARTS, _gap_parts, _output_rows
    from quantlab.simulate import Mode

    y = torch.linspace(-1, 1, 50)
    outs = {m: y + 1e-3 * i for i, m in enumerate(Mode)}
    bundle = SimpleNamespace(reference=lambda x: x + 1e-6, reference_name="onnxruntime")
    rows = _output_rows(outs, bundle, (y,))
    assert list(rows[rows.reference == "ONNXRUNTIME"].gap) == [""]
    assert list(_gap_parts(rows).gap) == list(GAP_PARTS.values())


def test_eval_runs_take_every_evaluation_item_in_runs_a_graph_takes():
    """Every evaluation batch, in runs of ``per_run`` (the first is the per-op comparison's),
    a shorter last run where the model takes any size; a graph that takes 2 batches a run gets
    whole runs only, their labels grouped alike. Before, the task metrics read the first
    ``max_eval_items`` batches only, while the report said every evaluation item."""
    import torch

    from experiments.consistency import eval_runs

    batches = [(torch.full((1, 3), float(i)),) for i in range(5)]
    labels = [torch.tensor([i]) for i in range(5)]
    runs, labs = eval_runs(batches, labels, per_run=4, whole_runs=False)
    assert [r[0][:, 0].tolist() for r in runs] == [[0, 1, 2, 3], [4]]
    assert [x.tolist() for x in labs] == [[0, 1, 2, 3], [4]]
    runs, labs = eval_runs(batches, labels, per_run=2, whole_runs=True)
    assert [r[0][:, 0].tolist() for r in runs] == [[0, 1], [2, 3]]
    assert [x.tolist() for x in labs] == [[0, 1], [2, 3]]
    runs, labs = eval_runs(batches[:1], None, per_run=2, whole_runs=True)
    assert len(runs) == 1 and labs is None  # fewer batches than a run: the one there is


def test_task_metrics_count_every_evaluation_item(tmp_path):
    """5 evaluation items, runs of 2: the per-op tables compare the first 2 items, the task
    metrics all 5 (n = 5), and the notes say both."""
    ctx = RunContext(
        PlatformConfig(name="j6m"),
        ModelConfig(name="small_cnn", pretrained=False),
        DataConfig(name="synthetic", num_calib=2, num_eval=5),
        0,
        tmp_path,
    )
    res = consistency(ConsistencyExp(max_eval_items=2), ctx)
    assert (res.tables["task_metrics"]["items"] == 5).all()
    assert any("per-op comparison: the first run, 2 evaluation items" in n for n in res.notes)
    assert any("task metrics: 5 evaluation items in 3 runs" in n for n in res.notes)


def test_lsb_counts_and_plot_only_where_outputs_have_an_integer_grid(tmp_path):
    """On J6P every op's output is float16 (no LSB): no LSB count, no empty LSB plot."""
    from quantlab.simulate.profiles import platform_config

    ctx = RunContext(
        platform_config("j6p"),
        ModelConfig(name="transformer_block", pretrained=False),
        DataConfig(name="synthetic", num_calib=2, num_eval=2),
        0,
        tmp_path,
    )
    res = consistency(ConsistencyExp(max_eval_items=2), ctx)
    (said,) = [f for f in res.findings if "ops give bit-identical outputs" in f]
    assert "no op's output has an integer grid" in said
    assert "error_lsb_along_depth" not in {p.name for p in res.plots}
