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
        strategies=[
            Strategy.EVENLY,
            Strategy.CURVATURE,
            Strategy.MINIMAX,
            Strategy.OPTIMAL,
            Strategy.DATA,
        ],
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
        "interp_max_err_lsb", "bound_lsb", "is_default", "dividing_points", "data_mean_err_lsb",
        "build_s", "build_cpu_s",
    ):  # fmt: skip
        assert col in df.columns
    alls = df[df.region == "all"]
    # sigmoid: 5 strategies (int8->int16) + direct; gelu: 5 + MANUAL + direct
    assert len(alls) == 6 + 7
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
    others = cmp[["evenly_lsb", "curvature_lsb", "minimax_lsb"]].min(axis=1)
    assert (cmp.optimal_lsb <= others).all() and (
        cmp.optimal_lsb <= cmp.manual_lsb.fillna(1e9)
    ).all()
    data = result.tables["data_strategies_int8_to_int16"]
    assert (data.data_data_lsb <= data.optimal_data_lsb * (1 + 1e-9)).all()
    assert (data.data_max_over_optimal_max <= 2 + 1e-9).all()
    assert any("OPTIMAL's max error is <= every other" in f and "2 of 2 ops" in f
               for f in result.findings)  # fmt: skip
    times = result.tables["build_times"]
    assert set(times.strategy) >= {"OPTIMAL", "DATA"} and (times.max_s > 0).all()
    assert {p.name for p in result.plots} == {"error_along_input", "error_under_data", "build_time"}
    assert any("no worse than the better" in f and "2 of 2 ops" in f for f in result.findings)
    prof = result.tables["error_profile"]
    assert set(prof.strategy) >= {"EVENLY", "CURVATURE", "MINIMAX", "OPTIMAL", "DATA"}
    assert prof.dividing_point.notna().any()
    assert result.plots[0].vlines == "dividing_point"


def test_bad_config():
    with pytest.raises(ValueError, match="exp.functions"):
        LutErrorExp(functions=["lgamma"])
    with pytest.raises(ValueError, match="MANUAL"):
        LutErrorExp(strategy=Strategy.MANUAL)
    with pytest.raises(ValueError, match="exp.in_dtypes"):
        LutErrorExp(in_dtypes=[DType.FLOAT16])
    with pytest.raises(ValueError, match="exp.data_sigma_fraction"):
        LutErrorExp(data_sigma_fraction=0.0)
