"""What calibration's warning and the experiments' findings say about NaN and infinities."""

from __future__ import annotations

from quantlab.numerics.quantize import QuantizeCast
from quantlab.simulate.non_finite import non_finite_words


def test_the_non_finite_words_name_the_code_nan_takes_on_each_platform():
    points = {"m:softmax#0/in0": (3, 40)}
    said = {c: non_finite_words(points, c) for c in QuantizeCast}
    assert "NaN the zero point" in said[QuantizeCast.NAN_TO_ZERO_POINT]
    assert "NaN the lowest" in said[QuantizeCast.NAN_TO_LOWEST]
    assert "NaN the highest" in said[QuantizeCast.NAN_TO_HIGHEST]
    assert "-inf, +inf and NaN take the lowest code" in said[QuantizeCast.INT32_CAST]
    assert all("m:softmax#0/in0 (3 of 40)" in w for w in said.values())
    assert non_finite_words({}, QuantizeCast.NAN_TO_LOWEST) is None
