"""What it means that calibration saw NaN or infinite values at activation points
(``Simulator.non_finite_points``): the words experiments report, and the warning a
calibration gives once."""

from __future__ import annotations

import warnings

from quantlab.numerics.quantize import QuantizeCast

_NAN_CODE = {
    QuantizeCast.NAN_TO_ZERO_POINT: "-inf and +inf take the lowest and highest code and NaN the "
    "zero point",
    QuantizeCast.NAN_TO_LOWEST: "-inf and +inf take the lowest and highest code and NaN the lowest",
    QuantizeCast.NAN_TO_HIGHEST: "-inf and +inf take the lowest and highest code and NaN the "
    "highest (8-bit; 16-bit codes take the lowest for NaN and +inf)",
    QuantizeCast.INT32_CAST: "-inf, +inf and NaN take the lowest code",
}


def non_finite_words(points: dict[str, tuple[int, int]], cast: QuantizeCast) -> str | None:
    """What it means that calibration saw NaN or infinite values at ``points``
    (``Simulator.non_finite_points``) on a platform that quantizes them by ``cast``, naming
    them; None when it saw none."""
    if not points:
        return None
    shown = ", ".join(f"{k} ({n} of {total})" for k, (n, total) in list(points.items())[:4])
    more = f" and {len(points) - 4} more" if len(points) > 4 else ""
    return (
        f"Calibration saw NaN or infinite values at {len(points)} activation point(s): "
        f"{shown}{more}. Their scales come from the finite values; quantized, "
        f"{_NAN_CODE[cast]}, so an additive attention mask of -inf stops masking (its keys take "
        "the add's lowest code and keep weight; a finite mask such as -100 with the mask add at "
        "int16 still masks; README, 'Any eager model, unmodified')."
    )


def warn_non_finite(points: dict[str, tuple[int, int]], cast: QuantizeCast) -> None:
    """Warn once per calibration when activation points saw NaN or infinite values, naming
    them: their scales come from the finite values, and ``cast`` says which codes NaN and the
    infinities take."""
    words = non_finite_words(points, cast)
    if words is not None:
        warnings.warn(words, stacklevel=3)
