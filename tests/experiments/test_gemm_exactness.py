import pytest
import torch

from experiments.gemm_exactness import (
    DataKind,
    GemmExactnessExp,
    GemmOp,
    GemmShape,
    gemm_exactness,
    measure,
)
from quantlab.experiment import RunContext
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm import Overflow
from quantlab.platforms import PlatformConfig


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    exp = GemmExactnessExp(
        shapes=[
            GemmShape(GemmOp.MATMUL, c_in=1100, c_out=3, size=4),
            GemmShape(GemmOp.CONV2D, c_in=4, c_out=4, size=5, groups=2, padding=1),
            GemmShape(GemmOp.CONV1D, c_in=3, c_out=2, size=9, kernel=3, stride=2),
        ],
        x_dtypes=[DType.INT8, DType.INT16],
        w_dtypes=[DType.INT16],
        overflow=Overflow.WRAP,
        repeats=1,
    )
    ctx = RunContext(PlatformConfig(name="j6m"), None, None, 0, tmp_path_factory.mktemp("g"))
    return gemm_exactness(exp, ctx)


def test_columns_and_exactness(result):
    df = result.table
    for col in (
        "shape", "op", "K", "operands", "data", "path", "outputs", "mismatches_fast",
        "mismatches_plain_float32", "int32_overflows", "acc_bits", "time_ratio_fast_over_float32",
        "reference_over_fast",
    ):  # fmt: skip
        assert col in df.columns
    assert len(df) == 3 * 2 * 1 * 2
    assert (df.mismatches_fast == 0).all()
    assert set(df.data) == {"random", "adversarial"}
    # int16 x int16 adversarial, K = 1100: 1100 * 32765**2 > 2**31 and plain float32 fails
    big = df[(df.op == "matmul") & (df.operands == "int16 x int16") & (df.data == "adversarial")]
    assert int(big.int32_overflows.iloc[0]) == int(big.outputs.iloc[0])
    assert int(big.mismatches_plain_float32.iloc[0]) > 0
    assert (df.overflow_mode == "WRAP").all()


def test_timed_at_the_stated_thread_count_and_restored():
    seen = []
    exp = GemmExactnessExp(
        shapes=[GemmShape(GemmOp.MATMUL, c_in=8, c_out=2, size=2)],
        x_dtypes=[DType.INT8],
        w_dtypes=[DType.INT8],
        data=[DataKind.RANDOM],
        repeats=1,
        threads=3,
    )
    before = torch.get_num_threads()
    real = torch.Tensor.__matmul__

    def spy(a, b):
        seen.append(torch.get_num_threads())
        return real(a, b)

    torch.Tensor.__matmul__ = spy
    try:
        measure(exp, progress=False)
    finally:
        torch.Tensor.__matmul__ = real
    assert seen and set(seen) == {3}
    assert torch.get_num_threads() == before


def test_findings_and_plots(result):
    assert result.findings[0].startswith("The fast path equals the int64 reference bit for bit")
    assert "12 of 12" in result.findings[0]
    assert {p.name for p in result.plots} == {"time_ratio", "plain_float32_errors"}
    assert set(result.tables) == {"summary"}


def test_schema_rejects_bad_values():
    with pytest.raises(ValueError, match="allowed: INT8, INT16"):
        GemmExactnessExp(x_dtypes=[DType.FLOAT16])
    with pytest.raises(ValueError, match="groups"):
        GemmShape(GemmOp.CONV2D, c_in=3, groups=2)
    with pytest.raises(ValueError, match="must not be empty"):
        GemmExactnessExp(shapes=[])


def test_unknown_dtype_name_fails_at_compose():
    from quantlab.config import compose

    with pytest.raises(Exception) as err:
        compose(["+exp=gemm_exactness", "exp.x_dtypes=[INT4]"])
    chain = f"{err.value} {err.value.__cause__}"
    assert "INT4" in chain and "INT8, INT16" in chain
