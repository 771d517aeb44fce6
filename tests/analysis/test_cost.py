"""Cost model: MACs x operand bytes, LUT and split overheads (quantlab.analysis.cost)."""

import pandas as pd
import pytest

from quantlab.analysis.cost import CostModel, dtype_bytes, model_cost, op_cost
from quantlab.numerics.dtypes import DType


def _row(**kw):
    base = dict(
        op_type="conv2d",
        supported=True,
        input_dtype=DType.INT8,
        weight_dtype=DType.INT8,
        output_dtype=DType.INT8,
        has_weight=True,
        flops=2000.0,
        output_shape=(1, 10),
    )
    base.update(kw)
    return pd.Series(base)


def test_gemm_cost_is_macs_times_operand_bytes():
    assert op_cost(_row(), True) == 1000.0
    assert op_cost(_row(input_dtype=DType.INT16), True) == 2000.0
    assert op_cost(_row(input_dtype="INT16", weight_dtype="int16"), True) == 4000.0
    assert op_cost(_row(supported=False), True) == 16000.0  # float32 x float32
    # Simulator.ops spelling: one dtype name per activation input, "" for none recorded
    mm = _row(op_type="matmul", has_weight=False, weight_dtype="", input_dtype="INT8,INT16")
    assert op_cost(mm, True) == 2000.0
    assert op_cost(_row(input_dtype=""), True) == 1000.0  # falls back to the output dtype
    split = op_cost(_row(weight_split=8, weight_dtype=DType.INT16), True)
    assert split == 2 * 1000 + 10 * CostModel().split_combine


def test_lut_and_other_ops():
    lut8 = _row(op_type="sigmoid", flops=0.0)
    assert op_cost(lut8, True) == 10 * CostModel().lut_direct
    assert op_cost(lut8, False) == 10 * CostModel().lut_interp
    assert op_cost(_row(op_type="sin", output_dtype=DType.INT16), True) == 10 * 4.0 * 2
    assert op_cost(_row(op_type="reshape"), True) == 0.0
    # pow: a table for an exponent other than 2, the product x * x (elementwise) for 2
    assert op_cost(_row(op_type="pow", category="LUT", output_dtype=DType.INT16), True) == 80.0
    assert op_cost(_row(op_type="pow", category="MUL", output_dtype=DType.INT16), True) == 20.0
    assert op_cost(_row(op_type="add", output_dtype=DType.FLOAT16), True) == 20.0
    ops = pd.DataFrame([_row(), _row(op_type="add")])
    assert model_cost(ops, True) == 1010.0


def test_bad_values():
    assert dtype_bytes(None) == 4 and dtype_bytes(float("nan")) == 4
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes("int4")
    with pytest.raises(ValueError, match="lut_interp"):
        CostModel(lut_interp=-1)
    with pytest.raises(ValueError, match="op_type"):
        model_cost(pd.DataFrame({"x": [1]}), True)
