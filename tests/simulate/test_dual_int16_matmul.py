"""MatMul with both inputs int16 on J6E/M: gated by platform.toolchain (>= OE-v3.5.0), never
for an int32 output or for Conv/Linear; a clear error names the fields."""

import dataclasses

import pytest
import torch
from torch import nn

from quantlab.analysis.metrics import sqnr_db
from quantlab.numerics.dtypes import DType
from quantlab.platforms import PlatformConfig, Toolchain
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator
from quantlab.simulate.profiles import platform_config


class _Scores(nn.Module):
    def forward(self, q, kt):
        return q @ kt


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 16, 32, generator=g), torch.randn(2, 32, 16, generator=g)


def _sim(platform, dtype):
    rule = OpQConfig(input_dtype=dtype, output_dtype=DType.INT16, high_precision_output=False)
    sim = Simulator(_Scores(), platform, QConfigSpec(by_type={"matmul": rule}))
    sim.calibrate([_inputs()], progress=False)
    return sim


def test_dual_int16_matmul_needs_the_toolchain_field():
    j6m = platform_config("j6m")
    assert j6m.toolchain is Toolchain.OE_3_5_0 and j6m.dual_int16_matmul()  # the default
    old = dataclasses.replace(j6m, toolchain=Toolchain.OE_3_2_0)
    assert not old.dual_int16_matmul()
    with pytest.raises(ValueError) as e:
        _sim(old, DType.INT16)
    msg = str(e.value)
    assert "matmul" in msg and "toolchain >= OE-v3.5.0" in msg
    assert "platform.toolchain=OE_3_2_0" in msg
    new = dataclasses.replace(old, toolchain="OE-v3.5.0")
    x = _inputs()
    ref = x[0] @ x[1]
    errs = {}
    for dt in (DType.INT8, DType.INT16):
        y = _sim(new, dt).run(*x, mode=Mode.FIXED)
        errs[dt] = sqnr_db(ref, y)
    assert errs[DType.INT16] > errs[DType.INT8] + 20  # int16 inputs: far closer to float


def test_conv_linear_and_int32_outputs_stay_single_int16():
    new = dataclasses.replace(platform_config("j6m"), toolchain="3.5.0")
    assert new.int16_gemm_operands("matmul") == 2
    assert new.int16_gemm_operands("matmul", int32_output=True) == 1
    assert new.int16_gemm_operands("linear") == 1
    assert new.gemm_contract("matmul").max_int16_gemm_operands == 2
    lin = Simulator(
        nn.Linear(8, 4),
        new,
        QConfigSpec(
            by_type={
                "linear": OpQConfig(
                    input_dtype=DType.INT16, weight_dtype=DType.INT16, high_precision_output=False
                )
            }
        ),
    )
    with pytest.raises(ValueError, match="max_int16_gemm_operands=1"):
        lin.calibrate([(torch.randn(3, 8),)], progress=False)


def test_bad_toolchain_version_names_the_field():
    with pytest.raises(
        ValueError, match="platform.toolchain='3.5' is not allowed; allowed: OE_3_0_0"
    ):
        PlatformConfig(toolchain="3.5")
    with pytest.raises(ValueError, match="platform.dual_int16_matmul_since"):
        PlatformConfig(dual_int16_matmul_since="9.9.9")
    assert PlatformConfig(toolchain="3.2.0").toolchain is Toolchain.OE_3_2_0
