"""The names of the calibration rules (observers) and of the full-histogram methods.

Every rule ends in an absolute maximum ``amax``; the scale is then the platform's scale rule
applied to it (``quantlab.numerics.compute_scale(amax, dtype, platform.scale_rule)``), and every
search compares candidates by the scale that rule gives them. EMA below means the vendor plugin's
moving average ``m = m + 0.01 * (cur - m)`` over calibration batches, started by the first batch;
min and max are averaged separately and ``amax = max(-min, max, 0)``.
"""

from __future__ import annotations

import enum


class ObserverKind(enum.Enum):
    """How an activation scale is calibrated.

    The vendor plugin's observers (horizon_plugin_pytorch ``observer_v2``, defaults as shipped):

    MINMAX:     MinMaxObserver: EMA of each batch's min and max.
    MSE:        MSEObserver (the plugin's default, and the J6 profiles'): per batch, the
                candidate ``a_b * (1 - 0.01 i)``, i = 0..94 (a_b the batch's absolute maximum)
                with the lowest L2 fake-quant error over every value of the batch (ties: the
                larger i; errors exact, quantlab.calibration.mse_search); EMA of the chosen
                (min, max).
    KL:         KLObserver, 512 bins, KL computed once over the accumulated histogram (the
                plugin's recommended ``update_interval`` = number of calibration steps): TensorRT
                style entropy search over |x| (see quantlab.calibration.kl).
    PERCENTILE: PercentileObserver: per batch, a 2048-bin histogram of |x| over [0, a_b]; clip
                at ``(i + 0.5) * a_b / 2048`` where bin i holds the ``percentile``-th value;
                EMA of (max(min, -clip), min(max, clip)).
    MIX:        MixObserver: per batch, clips at 9 fixed percentiles (99.9 ... 99.9999) of the
                same histogram, keeping the one with the lowest L2 fake-quant error; EMA.
    CLIP:       ClipObserver: (min, max) of the batches (averaging constant 1.0: the last batch)
                clamped to ``clip_range`` (default (-1, 1)).
    CLIPSTD:    ClipStdObserver: per batch (max(min, mean - 3 std), min(max, mean + 3 std)); EMA.
    HISTOGRAM:  HistogramObserver (plugin 3.x): one histogram of every calibration value
                (4096 bins over [-M, M], M the first batch's max rounded up to a power of two and
                doubled as needed, as the plugin does; its bin count is not public); the scale
                comes from ``histogram_method``, which can be changed after calibration without
                running the model again (the plugin's ``reset_scale(method=...)``).
    FIXED:      FixedScaleObserver: ``fixed_scale`` (default 1.0), e.g. for index-like tensors.

    Other runtimes' defaults and quantlab's own rules:

    GLOBAL_MINMAX: min and max over every calibration value (TFLite's and ONNX Runtime's
                calibration default).
    MSE_POOLED:    the plugin's MSE candidates and L2 error, searched once over a pooled strided
                   subsample (at most 2**14 values) of all batches that also keeps every batch's
                   min and max: quantlab's former J6 default (kept bit for bit).
                   Each kept extreme weighs as much as one subsampled value, which stands for
                   hundreds, so the search overweights the tails and hardly clips (scale near
                   GLOBAL_MINMAX's); HISTOGRAM with method MSE is the same error counted over
                   every value once (see reports/calibration, mse_diagnosis).
    """

    MINMAX = "minmax"
    MSE = "mse"
    KL = "kl"
    PERCENTILE = "percentile"
    MIX = "mix"
    CLIP = "clip"
    CLIPSTD = "clipstd"
    HISTOGRAM = "histogram"
    FIXED = "fixed"
    GLOBAL_MINMAX = "global_minmax"
    MSE_POOLED = "mse_pooled"


class ActivationSymmetry(enum.Enum):
    """Whether an integer activation carries a zero point.

    SYMMETRIC:  codes = round(x / s), zero point 0, s from the op's observer (J6).
    ASYMMETRIC: codes = round(x / s) + z, one zero point z per tensor, (s, z) from the observed
                min and max (``numerics.quantize.compute_zero_point_scale``: the MinMax
                calibrators of ONNX Runtime and TFLite, whose converters write such tensors).
    """

    SYMMETRIC = "symmetric"
    ASYMMETRIC = "asymmetric"


class HistogramMethod(enum.Enum):
    """How a HISTOGRAM observer turns its histogram into ``amax`` (quantlab.calibration.search).

    MSE:        the candidate ``amax * k / 512``, k = 1..512, with the lowest expected squared
                error, each histogram bin taken as uniformly filled (exact integral; exact zeros
                cost nothing). The plugin's default method ("an integral estimate of the error").
    SQNR:       AIMET's tf_enhanced SQNR search: candidates ``amax * k / 100``, k = 1..101, noise =
                rounding noise + 3 x clipping noise (gamma = 3), same integral as MSE.
    KL:         the KL entropy search of ObserverKind.KL on the histogram's |x| bins.
    PERCENTILE: the upper edge of the |x| bin holding the ``percentile``-th value.
    """

    MSE = "mse"
    SQNR = "sqnr"
    KL = "kl"
    PERCENTILE = "percentile"


def parse_enum(cls: type[enum.Enum], value, field_name: str) -> enum.Enum:
    """``value`` as a member of ``cls`` (a member, its name or its value); ValueError naming
    ``field_name`` and the allowed names otherwise."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        for m in cls:
            if value in (m.name, m.value):
                return m
    allowed = ", ".join(m.name for m in cls)
    raise ValueError(f"{field_name}={value!r} is not allowed; allowed: {allowed}")
