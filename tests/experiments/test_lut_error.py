import pytest

from experiments.lut_error import LutErrorExp, lut_error
from quantlab.experiment import RunContext
from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import Strategy
from quantlab.platforms import PlatformConfig


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    exp = LutErrorExp(
        functions=["sigmoid", "gelu"],
        strategies=[Strategy.EVENLY, Strategy.CURVATURE, Strategy.MINIMAX],
        in_dtypes=[DType.INT8],
        out_dtypes=[DType.INT16, DType.INT8],
        profile_bins=32,
    )
    ctx = RunContext(PlatformConfig(name="j6m"), None, None, 0, tmp_path_factory.mktemp("lut"))
    return lut_error(exp, ctx)


def test_columns_and_rows(result):
    df = result.table
    for col in (
        "function", "strategy", "chosen", "in_dtype", "out_dtype", "region", "codes",
        "max_err_lsb", "mean_err_lsb", "max_err", "fake_max_err_lsb", "gap_max_lsb",
        "interp_max_err_lsb", "bound_lsb", "is_default", "dividing_points",
    ):  # fmt: skip
        assert col in df.columns
    alls = df[df.region == "all"]
    # sigmoid: 3 strategies (int8->int16) + direct; gelu: 3 + MANUAL + direct
    assert len(alls) == 4 + 5
    assert (alls.codes == 256).all()
    direct = alls[alls.strategy == "DIRECT"]
    assert (direct.gap_max_lsb == 0).all() and (direct.max_err_lsb <= 0.5 + 1e-9).all()
    assert (alls.fake_max_err_lsb <= 0.5 + 1e-9).all()


def test_side_by_side_and_findings(result):
    cmp = result.tables["strategies_int8_to_int16"]
    assert set(cmp.function) == {"sigmoid", "gelu"}
    assert (cmp.minimax_lsb <= cmp.best_vendor_lsb).all()
    assert (cmp.gain_vs_best_vendor >= 1).all()
    assert "manual_lsb" in cmp.columns  # gelu's vendor points
    assert any("no worse than the better" in f and "2 of 2 ops" in f for f in result.findings)
    prof = result.tables["error_profile"]
    assert set(prof.strategy) >= {"EVENLY", "CURVATURE", "MINIMAX"}
    assert prof.dividing_point.notna().any()
    assert result.plots and result.plots[0].vlines == "dividing_point"


def test_bad_config():
    with pytest.raises(ValueError, match="exp.functions"):
        LutErrorExp(functions=["erf"])
    with pytest.raises(ValueError, match="MANUAL"):
        LutErrorExp(strategy=Strategy.MANUAL)
    with pytest.raises(ValueError, match="exp.in_dtypes"):
        LutErrorExp(in_dtypes=[DType.FLOAT16])
