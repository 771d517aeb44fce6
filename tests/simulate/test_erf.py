"""erf as the J6 plugin builds it (its Erf: a centrosymmetric SegmentLUT of torch.erf, the
default strategy, evenly): a segment LUT in fixed mode, the float function fake-quantized in
fake mode; the runtime profiles run it in float (``platform.float_fallback_ops``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut import Strategy, build_lut, default_spec
from quantlab.numerics.quantize import quantize
from quantlab.op_kinds import OpCategory
from quantlab.platforms import PlatformConfig
from quantlab.qconfig import OpQConfig, QConfigSpec
from quantlab.simulate import Mode, Simulator

NAME = ":erf#0"


class _Erf(nn.Module):
    def forward(self, x):
        return torch.erf(x)


class _ErfGelu(nn.Module):
    """GELU written out with erf, as older BERT code does."""

    def forward(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _calibrated(module, platform: str, dtype: DType | None = None) -> Simulator:
    spec = (
        None
        if dtype is None
        else QConfigSpec(global_=OpQConfig(input_dtype=dtype, output_dtype=dtype))
    )
    sim = Simulator(module, platform, spec)
    g = torch.Generator().manual_seed(13)
    sim.calibrate([(torch.randn(8, 64, generator=g) * 1.5,) for _ in range(2)], progress=False)
    return sim


def test_the_vendor_default_is_symmetric_evenly():
    spec = default_spec("erf")
    assert spec.strategy is Strategy.EVENLY and spec.symmetric


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16])
def test_fixed_erf_is_its_segment_lut_and_fake_the_float_erf(dtype):
    sim = _calibrated(_Erf(), "j6m", dtype)
    plat, rq = sim.platform, sim.qconfig_of(NAME)
    s_in = float(sim.act_scale(NAME, "in0", dtype, rq))
    s_out = float(sim.act_scale(NAME, "out", dtype, rq))
    g = torch.Generator().manual_seed(14)
    x = torch.randn(4, 64, generator=g) * 2
    table = build_lut(
        "erf",
        dtype,
        s_in,
        dtype,
        s_out,
        plat.lut_spec("erf"),
        plat.lut_format(),
        sim.observed_range(NAME, "in0"),
    )
    xc = quantize(x, s_in, dtype, plat.fake_round).to(dtype.torch_dtype)
    got = sim.run(x, mode=Mode.FIXED)
    assert_bits_equal(got, table.evaluate(xc).to(torch.float32) * s_out)
    assert (got - torch.erf(x)).abs().max() < 3 * s_out + s_in  # a table of a smooth function

    def fq(v, s):
        return torch.fake_quantize_per_tensor_affine(v, s, 0, dtype.qmin, dtype.qmax)

    assert_bits_equal(sim.run(x, mode=Mode.FAKE), fq(torch.erf(fq(x, s_in)), s_out))
    ops = sim.ops.set_index("name")
    assert ops.loc[NAME, "category"] == "LUT" and ops.loc[NAME, "fixed_kernel"] == "lut"


@pytest.mark.parametrize("platform", ["onnxruntime", "tflite"])
def test_the_runtime_profiles_run_erf_in_float(platform):
    sim = _calibrated(_Erf(), platform)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(15))
    for mode in (Mode.FAKE, Mode.FIXED):
        assert_bits_equal(sim.run(x, mode=mode), torch.erf(x))
    assert not sim.ops.set_index("name").loc[NAME, "supported"]


def test_a_gelu_written_with_erf_runs_quantized_on_j6():
    sim = _calibrated(_ErfGelu(), "j6m", DType.INT16)
    ops = sim.ops
    assert ops.supported.all() and "erf" in set(ops.op_type)
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(16)) * 1.5).clamp(-3, 3)
    got = sim.run(x, mode=Mode.FIXED)  # inside the calibrated range: nothing saturates
    assert (got - F.gelu(x)).abs().max() < 0.01


@pytest.mark.parametrize("field", ["float_fallback_ops", "supported_ops"])
def test_a_platforms_op_lists_name_modelled_op_types(field):
    """A misspelt op type would leave its op quietly quantized or in float: refused, with the
    field and the allowed names."""
    with pytest.raises(ValueError, match=rf"platform.{field} has unknown op types \['erff'\]; "):
        PlatformConfig(name="x", **{field: ["erf", "erff"]})
    tiny = PlatformConfig(name="x", float_fallback_ops=["erf"])
    assert not tiny.runs_quantized("erf", OpCategory.LUT)
