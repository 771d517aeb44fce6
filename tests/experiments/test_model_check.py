"""The model_check experiment on a toy model: table, CPU-fallback list first, counts, plot."""

from __future__ import annotations

from experiments.model_check import ModelCheckExp, model_check_exp
from quantlab.data.schema import DataConfig
from quantlab.experiment import RunContext
from quantlab.models.schema import ModelConfig
from quantlab.platforms import PlatformConfig, Toolchain
from quantlab.report import write_report


def test_model_check_report(tmp_path):
    plat = PlatformConfig(name="j6m", toolchain=Toolchain.OE_3_0_0)
    ctx = RunContext(
        plat,
        ModelConfig(name="small_cnn", pretrained=False),
        DataConfig(name="synthetic", num_calib=1, num_eval=1),
        0,
        tmp_path,
    )
    res = model_check_exp(ModelCheckExp(), ctx)
    t = res.table
    assert (t.platform == "j6m").all() and (t.toolchain == "OE-v3.0.0").all()
    assert t.position.tolist() == list(range(len(t)))
    assert list(res.tables)[0] == "cpu_fallback_and_unplaced"
    counts = res.tables["unit_counts"]
    assert counts.ops.sum() == len(t) and counts.unit.iloc[0] == "CPU fallback"
    assert res.findings[0].startswith(f"small_cnn on j6m with OE-v3.0.0: {len(t)} rows")
    write_report(res, tmp_path, "python -m quantlab +exp=model_check", "exp: {}\n")
    md = (tmp_path / "report.md").read_text()
    assert md.index("## cpu fallback and unplaced") < md.index("## placement")
    assert (tmp_path / "op_sequence.png").stat().st_size > 0


def test_sequence_plot_rows_follow_the_given_categories():
    import pandas as pd

    from quantlab.report import Plot, PlotKind
    from quantlab.report.plots import draw

    df = pd.DataFrame({"position": [0, 1, 2, 3], "unit": ["b", "c", "b", "a"]})
    plot = Plot("seq", "position", "unit", "op position", "unit", kind=PlotKind.SEQUENCE,
                categories=("a", "b", "z"))  # fmt: skip
    ax = draw(plot, df).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "z", "c"]
    offsets = [c.get_offsets()[:, 1].tolist() for c in ax.collections]
    assert offsets == [[1.0, 1.0], [3.0], [0.0]]  # b, c, a on their rows
    assert ax.get_xlabel() == "op position" and ax.get_ylabel() == "unit"


def test_a_failed_fixed_run_leaves_the_placement_and_says_so(tmp_path, monkeypatch):
    from quantlab.simulate import Mode, Simulator

    run = Simulator.run

    def refuse(self, *inputs, mode=Mode.FIXED, **kwargs):
        if Mode.parse(mode) is Mode.FIXED:
            raise ValueError("op x: no kernel for this test")
        return run(self, *inputs, mode=mode, **kwargs)

    monkeypatch.setattr(Simulator, "run", refuse)
    ctx = RunContext(
        PlatformConfig(name="j6m"),
        ModelConfig(name="small_cnn", pretrained=False),
        DataConfig(name="synthetic", num_calib=1, num_eval=1),
        0,
        tmp_path,
    )
    res = model_check_exp(ModelCheckExp(), ctx)
    assert len(res.table) > 0
    assert any("fixed-mode run on the input failed (ValueError: op x" in f for f in res.findings)


def test_model_check_and_consistency_say_when_calibration_saw_infinities(tmp_path):
    """A -inf attention mask: both reports name the point and what quantizing it does."""
    import sys

    import torch
    from user_package import PACKAGE, write_package

    from experiments.consistency import ConsistencyExp, consistency

    write_package(tmp_path / "pkg")
    sys.path.insert(0, str(tmp_path / "pkg"))
    try:
        g = torch.Generator().manual_seed(0)
        items = [(torch.randn(1, 5, 8, generator=g),) for _ in range(4)]
        torch.save({"calib": items[:2], "eval": items[2:]}, tmp_path / "x.pt")
        ctx = RunContext(
            PlatformConfig(name="j6m"),
            ModelConfig(name="custom", target=f"{PACKAGE}.nets:masked"),
            DataConfig(name="tensors", path=str(tmp_path / "x.pt"), num_calib=2, num_eval=2),
            0,
            tmp_path,
        )
        for res in (model_check_exp(ModelCheckExp(), ctx), consistency(ConsistencyExp(), ctx)):
            (said,) = [f for f in res.findings if f.startswith("Calibration saw NaN or infinite")]
            assert ":softmax#0/in0 (" in said and "stops masking" in said
    finally:
        sys.path.remove(str(tmp_path / "pkg"))
        for name in [m for m in sys.modules if m.startswith(PACKAGE)]:
            del sys.modules[name]
