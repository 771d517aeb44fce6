import pytest

pytest.importorskip("ai_edge_litert")
pytest.importorskip("onnxruntime")

from mlas_inputs import GELU_EMULATED  # noqa: E402

from experiments.runtime_fidelity import (  # noqa: E402
    Runtime,
    RuntimeFidelityExp,
    matching_profiles,
    runtime_fidelity,
)
from quantlab.experiment import RunContext  # noqa: E402
from quantlab.platforms import PlatformConfig  # noqa: E402


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    exp = RuntimeFidelityExp(
        runtimes=[Runtime.LITERT_DEFAULT, Runtime.ONNXRUNTIME],
        profiles=["tflite", "litert_xnnpack", "onnxruntime", "onnxruntime_no_vnni"],
        cases=4,
    )
    ctx = RunContext(PlatformConfig(name="j6m"), None, None, 0, tmp_path_factory.mktemp("r"))
    return runtime_fidelity(exp, ctx)


def test_rows_count_outputs_and_the_matching_profile_is_exact(result):
    """Every family under its runtime's profile gives 0 differing outputs (onnxruntime's Gelu
    only on a CPU whose GELU the profile emulates, ``mlas_inputs.GELU_EMULATED``; XNNPACK takes
    the TRANSPOSE_CONV cases of seeds 0..3; RESIZE_BILINEAR int8 under XNNPACK, int16 under LiteRT's
    own kernel)."""
    df = result.table
    # LiteRT (12 and QUANTIZE int8 / int16), onnxruntime GEMMs, QuantizeLinear (uint8, int8,
    # int16), its 17 tables (uint8 / int8)
    families = 14 + 4 + 3 + 2 * 17
    assert len(df) == families * 4  # x 4 profiles
    assert (df.outputs > 0).all() and (df.cases == 4).all()
    own = df[df.profile == df.runtime.map(matching_profiles())]
    int8 = own[own.dtype != "int16"]  # int16 activations are symmetric
    assert len(own) == families and (int8.cases_with_zero_points > 0).all()
    exact = own if GELU_EMULATED else own[own.family != "Gelu"]
    assert int(exact.differing.sum()) == 0
    if GELU_EMULATED:
        assert list(result.tables["matching_profiles"].differing) == [0] * families
        assert any("0 differing outputs" in f for f in result.findings)


def test_bad_options_name_the_field():
    with pytest.raises(ValueError, match="exp.cases"):
        RuntimeFidelityExp(cases=0)
    with pytest.raises(ValueError, match="unknown platform"):
        RuntimeFidelityExp(profiles=["nope"])


def test_reference_rows_cover_16x8_with_both_bias_dtypes():
    """LiteRT's reference kernels: 16x8 models with the converter's int64 bias and with an int32
    bias (the profile told by int16_bias_dtype), and both resizes on int8 and int16 codes,
    give 0 differing outputs under ``tflite``."""
    from experiments.runtime_fidelity import measure

    exp = RuntimeFidelityExp(runtimes=[Runtime.LITERT_REFERENCE], profiles=["tflite"], cases=3)
    df = measure(exp, progress=False)
    fams = set(df.family)
    for fam in (
        "TRANSPOSE_CONV int8",
        "TRANSPOSE_CONV 16x8 int64 bias",
        "TRANSPOSE_CONV 16x8 int32 bias",
        "CONV_2D 16x8 int32 bias",
        "FULLY_CONNECTED 16x8 int32 bias",
        "CONV_2D 16x8 int64 bias",
        "DEPTHWISE_CONV_2D 16x8 int64 bias",
        "FULLY_CONNECTED 16x8 int64 bias",
        "RESIZE_BILINEAR int8",
        "RESIZE_BILINEAR int16",
        "RESIZE_NEAREST_NEIGHBOR int8",
        "RESIZE_NEAREST_NEIGHBOR int16",
    ):
        assert fam in fams, fams
    assert "DEPTHWISE_CONV_2D 16x8 int32 bias" not in fams  # no such LiteRT kernel
    assert (df.outputs > 0).all() and int(df.differing.sum()) == 0


def test_default_transpose_conv_differs_only_where_xnnpack_declines():
    """LiteRT's default interpreter on int8 TRANSPOSE_CONV: the cases XNNPACK declines (SAME,
    kernel smaller than the stride) run LiteRT's own kernel and give the ``tflite`` profile's
    bits; they hold every output that differs from ``litert_xnnpack``, and a finding says so."""
    from experiments.runtime_fidelity import _count, _findings, _litert_families
    from quantlab.platforms import load_platform

    (fam,) = [
        f
        for f in _litert_families(Runtime.LITERT_DEFAULT)
        if (f.op, f.dtype) == ("TRANSPOSE_CONV", "int8")
    ]
    names = ("tflite", "litert_xnnpack")
    df, declined = _count([fam], {n: load_platform(n) for n in names}, 60, False)
    dec = declined[("litert_default", "TRANSPOSE_CONV int8")]
    differing = dict(zip(df.profile, df.differing))
    assert dec["cases"] >= 5 and dec["differing"]["tflite"] == 0
    assert dec["differing"]["litert_xnnpack"] == differing["litert_xnnpack"] > 0
    (finding,) = [f for f in _findings(df, declined) if "XNNPACK declines" in f]
    assert "SAME padding with a kernel smaller than the stride" in finding
    assert f"({dec['cases']} of 60 cases)" in finding and "by the `tflite` rule" in finding
