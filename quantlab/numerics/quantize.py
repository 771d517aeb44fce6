"""Symmetric quantization (zero point 0): scales, quantize, dequantize, fake_quant."""

from __future__ import annotations

import enum


class ScaleRule(enum.Enum):
    """How a scale is derived from an observed absolute maximum ``amax``.

    HALF_RANGE: amax / ((qmax - qmin) / 2), i.e. amax/127.5 (int8), amax/32767.5 (int16): J6 (s.1).
    QMAX:       amax / qmax, the common convention (TFLite, torch.ao symmetric).
    POT:        the smallest power of two >= amax / qmax (older BPU architectures; option).
    """

    HALF_RANGE = "half_range"
    QMAX = "qmax"
    POT = "pot"
