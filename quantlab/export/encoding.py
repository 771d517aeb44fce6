"""How an exported graph writes int8 activations (no ONNX import: configs name it)."""

from __future__ import annotations

import enum


class ActivationEncoding(enum.Enum):
    """How int8 activations are written.

    SIGNED: int8 codes, zero point 0 (quantlab's codes as they are).
    UNSIGNED_OFFSET: uint8 codes ``code + 128`` with zero point 128: the same values; what
    onnxruntime's x86 CPU kernels take without converting int8 Q/DQ pairs themselves.
    int16 activations, weights and biases are written the same way under both.
    """

    SIGNED = "signed"
    UNSIGNED_OFFSET = "unsigned_offset"

    @property
    def int8_zero_point(self) -> int:
        """The zero point int8 activations carry in the graph (the runtime's kernels hold
        their codes with it: ``PlatformConfig.qlinear_zero_point``)."""
        return 128 if self is ActivationEncoding.UNSIGNED_OFFSET else 0

    @classmethod
    def of_zero_point(cls, zero_point: int) -> ActivationEncoding:
        """The encoding whose int8 activations carry ``zero_point`` (0 or 128)."""
        for e in cls:
            if e.int8_zero_point == zero_point:
                return e
        raise ValueError(f"no activation encoding has zero point {zero_point}; allowed: 0, 128")
