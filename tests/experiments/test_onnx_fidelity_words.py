"""The onnx_fidelity report's sentences: a float output is compared in value (it has no LSB), and
a first differing op found in a probe export that ran other kernels is said to be from it."""

from __future__ import annotations

import math

import pandas as pd

from experiments.onnx_fidelity import OnnxFidelityExp, _findings


def _row(**changes) -> dict:
    row = {
        "model": "m", "items": 8, "data": "tensors", "encoding": "SIGNED",
        "outputs_differing": 0, "outputs_compared": 768, "max_diff_lsb": 0.0,
        "max_abs_diff": 0.0, "first_diverging_op": "", "first_diverging_type": "",
        "first_diverging_kernel": "", "first_diverging_order": -1,
        "probe_kernels_match": True, "float_conv": 0, "float_add": 0,
    }  # fmt: skip
    row.update(changes)
    return row


def _said(main: dict, other: dict | None = None) -> list[str]:
    islands = pd.DataFrame({"model": [], "computes_float": []}).astype({"computes_float": bool})
    others = pd.DataFrame([other] if other else [], columns=list(main))
    return _findings(pd.DataFrame([main]), others, islands, OnnxFidelityExp())


def test_a_float_output_is_compared_in_value_not_in_lsbs():
    main, other = _said(
        _row(max_diff_lsb=math.nan, max_abs_diff=2.5e-7), _row(max_diff_lsb=math.nan)
    )
    assert "nan" not in main + other
    assert "(a float output: max |difference| 2.5e-07)" in main
    assert "(a float output: max |difference| 0)" in other
    (coded,) = _said(_row(max_diff_lsb=1.0, outputs_differing=3))
    assert "(max 1 output LSB)" in coded


def test_a_divergence_seen_only_in_a_probe_with_other_kernels_says_so():
    first = dict(first_diverging_op="conv2d_6", first_diverging_type="conv2d",
                 first_diverging_kernel="Conv", first_diverging_order=23)  # fmt: skip
    (faithful,) = _said(_row(**first))
    assert faithful.endswith("(conv2d, onnxruntime kernel Conv, op 24 in execution order).")
    (probe,) = _said(_row(probe_kernels_match=False, **first))
    assert "onnxruntime ran other computing kernels" in probe and "need not show" in probe
