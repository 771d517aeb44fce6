"""QConfig resolution order, platform templates read from platform fields, and clear errors."""

from __future__ import annotations

import pytest

from quantlab.numerics.dtypes import DType
from quantlab.platforms import PlatformConfig
from quantlab.qconfig import (
    ObserverKind,
    OpContext,
    OpQConfig,
    QConfigSpec,
    resolve,
    validate_names,
)

J6M = PlatformConfig()
J6P = PlatformConfig(
    name="j6p",
    float16_available=True,
    max_int16_gemm_operands=2,
    high_precision_output=DType.FLOAT32,
    global_dtype=DType.FLOAT16,
    gemm_input_dtype=DType.INT8,
    grid_chain_dtype=DType.FLOAT16,
    sensitive_dtype=DType.FLOAT16,
    ceiling_dtype=DType.FLOAT16,
)
CONV = OpContext("backbone.0:conv2d#0", "conv2d", "backbone.0")


def test_resolution_order_field_by_field():
    spec = QConfigSpec(
        global_=OpQConfig(output_dtype=DType.INT16, observer=ObserverKind.MINMAX),
        by_type={"conv2d": OpQConfig(output_dtype=DType.INT8, weight_split=7)},
        by_module={
            "backbone.*": OpQConfig(observer=ObserverKind.PERCENTILE),
            "backbone.0": OpQConfig(percentile=99.0),
            "back*": OpQConfig(percentile=50.0),
        },
        by_name={"backbone.0:conv2d#0": OpQConfig(fixed_scale=0.25)},
    )
    r = resolve(spec, J6M, CONV)
    assert r.output_dtype is DType.INT8  # by_type beats global_
    assert r.observer is ObserverKind.MINMAX  # longest module glob "backbone.0" sets no observer
    assert r.percentile == 99.0  # the longest matching module pattern wins
    assert r.fixed_scale == 0.25 and r.weight_split == 7
    other = resolve(spec, J6M, OpContext(":sigmoid#0", "sigmoid", ""))
    assert other.output_dtype is DType.INT16 and other.observer is ObserverKind.MINMAX
    base = resolve(QConfigSpec(), J6M, other_ctx := OpContext(":exp#0", "exp", ""))
    assert base.output_dtype is DType.INT8 and base.observer is J6M.default_observer
    assert other_ctx.name == ":exp#0"


def test_platform_templates_from_fields():
    head = OpContext("fc:linear#0", "linear", "fc", feeds_output=True)
    assert resolve(QConfigSpec(), J6M, head).high_precision_output
    assert not resolve(QConfigSpec(use_platform_template=False), J6M, head).high_precision_output
    grid = OpContext(":add#3", "add", "", in_grid_chain=True)
    assert resolve(QConfigSpec(), J6M, grid).output_dtype is DType.INT16
    # H/P: global float16, int8 Conv/MatMul inputs and weights
    conv = resolve(QConfigSpec(), J6P, CONV)
    assert conv.input_dtype is DType.INT8 and conv.weight_dtype is DType.INT8
    assert conv.output_dtype is DType.FLOAT16
    assert resolve(QConfigSpec(), J6P, OpContext(":exp#0", "exp", "")).input_dtype is None
    # a user rule beats the template
    spec = QConfigSpec(by_name={"fc:linear#0": OpQConfig(high_precision_output=False)})
    assert not resolve(spec, J6M, head).high_precision_output


def test_errors_name_the_field_and_allowed_values():
    with pytest.raises(ValueError, match="weight_split k=9 is not allowed"):
        OpQConfig(weight_split=9)
    with pytest.raises(ValueError, match="observer='BEST' is not allowed; allowed: MINMAX"):
        OpQConfig(observer="BEST")
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        OpQConfig(output_dtype="int4")
    with pytest.raises(ValueError, match="float16 is not available on j6m"):
        resolve(QConfigSpec(global_=OpQConfig(output_dtype=DType.FLOAT16)), J6M, CONV)
    with pytest.raises(ValueError, match="the model's ops are:\n  a:conv2d#0\n  b:relu#0"):
        validate_names(
            QConfigSpec(by_name={"c:conv2d#0": OpQConfig()}),
            ["a:conv2d#0", "b:relu#0"],
            {"conv2d", "relu"},
        )
    with pytest.raises(ValueError, match="unknown op type.*allowed: conv2d, relu"):
        validate_names(QConfigSpec(by_type={"conv": OpQConfig()}), [], {"conv2d", "relu"})
    assert OpQConfig(observer="MSE").observer is ObserverKind.MSE
    with pytest.raises(ValueError, match="histogram_method='MAX' is not allowed; allowed: MSE"):
        OpQConfig(histogram_method="MAX")
    with pytest.raises(ValueError, match="clip_range must be"):
        OpQConfig(clip_range=(1.0, -1.0))
    assert OpQConfig(clip_range=[-2, 3]).clip_range == (-2.0, 3.0)
