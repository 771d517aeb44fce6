"""erf as the J6 plugin builds it (its Erf: a centrosymmetric SegmentLUT of torch.erf, the
default strategy, evenly): a segment LUT in fixed mode, the float function fake-quantized in
fake mode. The onnxruntime profiles hold onnxruntime's codes in its table (DequantizeLinear ->
Erf -> QuantizeLinear, MLAS's erf: ``numerics.mlas_float32.mlas_erf``), and the export writes
it so, with fixed mode's bits; the LiteRT profiles run it in float
(``platform.float_fallback_ops``)."""

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


@pytest.mark.parametrize("platform", ["tflite", "litert_xnnpack"])
def test_the_litert_profiles_run_erf_in_float(platform):
    sim = _calibrated(_Erf(), platform)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(15))
    for mode in (Mode.FAKE, Mode.FIXED):
        assert_bits_equal(sim.run(x, mode=mode), torch.erf(x))
    assert not sim.ops.set_index("name").loc[NAME, "supported"]


@pytest.mark.parametrize("dtype", [None, DType.INT16])
def test_onnxruntime_runs_erf_as_its_table_and_the_export_gives_fixed_modes_bits(tmp_path, dtype):
    """A GELU written with erf (BERT's) on this CPU's onnxruntime profile: the erf is a table
    of onnxruntime's codes, and the exported QDQ graph (Erf between DequantizeLinear and
    QuantizeLinear) gives fixed mode's bits, at int8 (with zero points) and int16."""
    pytest.importorskip("onnxruntime")
    from quantlab.export import ActivationEncoding, to_onnx_qdq
    from quantlab.export import runtime as R
    from quantlab.export.ort_host import onnxruntime_profile

    sim = _calibrated(_ErfGelu(), onnxruntime_profile(), dtype)
    ops = sim.ops.set_index("name")
    assert ops.loc[NAME, "supported"] and ops.loc[NAME, "fixed_kernel"] == "lut"
    g = torch.Generator().manual_seed(17)
    xs = [torch.randn(8, 64, generator=g) * s for s in (0.5, 1.5, 4.0)]
    encoding = ActivationEncoding.UNSIGNED_OFFSET  # modelled on every CPU (ort_encodings)
    info = to_onnx_qdq(sim, tmp_path / "erf.onnx", (xs[0],), encoding=encoding)
    import onnx

    assert "Erf" in {n.op_type for n in onnx.load(str(info.path)).graph.node}
    sess = R.session(info.path)
    for x in xs:
        (got,) = R.run(sess, info.input_names, (x,))
        assert_bits_equal(torch.from_numpy(got), sim.run(x, mode=Mode.FIXED))
    assert not torch.equal(sim.run(xs[1], mode=Mode.FIXED), torch.erf(xs[1]))


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
