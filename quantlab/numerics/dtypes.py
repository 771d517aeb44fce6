"""Numeric formats quantlab emulates: int8, uint8, int16, int32, int64, float16 and float32.

Signed integer formats are two's-complement with their full range (int8 is [-128, 127], not
the narrow [-127, 127]); j6-numerics section 1. UINT8 is [0, 255] (asymmetric activations of
ONNX Runtime and TFLite graphs, always with a zero point); INT64 is an accumulator format only.
Float formats are IEEE binary16 / binary32.
"""

from __future__ import annotations

import enum

import torch

FLOAT32_EXACT = 1 << 24  # every integer of magnitude <= 2**24 is a float32
FLOAT64_EXACT = 1 << 53  # every integer of magnitude <= 2**53 is a float64

_BITS = {
    "int8": 8,
    "uint8": 8,
    "int16": 16,
    "int32": 32,
    "int64": 64,
    "float16": 16,
    "float32": 32,
}
_INT_VALUES = frozenset(("int8", "uint8", "int16", "int32", "int64"))
# code ranges of the integer formats: two's complement [-2**(bits-1), 2**(bits-1) - 1]; UINT8
# [0, 255]
_QMIN = {v: 0 if v == "uint8" else -(1 << (_BITS[v] - 1)) for v in _INT_VALUES}
_QMAX = {v: 255 if v == "uint8" else (1 << (_BITS[v] - 1)) - 1 for v in _INT_VALUES}
_TORCH_DTYPES = {
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "float32": torch.float32,
}


class DType(enum.Enum):
    """A tensor format on the device. Configs select members by name (``INT8``, ``FLOAT16``...)."""

    INT8 = "int8"
    UINT8 = "uint8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT16 = "float16"
    FLOAT32 = "float32"

    __hash__ = object.__hash__  # members are singletons: identity hashing, done in C

    @property
    def is_int(self) -> bool:
        return self._value_ in _INT_VALUES

    @property
    def is_float(self) -> bool:
        return self._value_ not in _INT_VALUES

    @property
    def bits(self) -> int:
        return _BITS[self._value_]

    @property
    def qmin(self) -> int:
        """Smallest code of an integer format, -2**(bits-1) (0 for UINT8)."""
        hit = _QMIN.get(self._value_)
        if hit is None:
            self._require_int("qmin")
        return hit

    @property
    def qmax(self) -> int:
        """Largest code of an integer format, 2**(bits-1) - 1 (255 for UINT8)."""
        hit = _QMAX.get(self._value_)
        if hit is None:
            self._require_int("qmax")
        return hit

    @property
    def max_finite(self) -> float:
        """Largest finite magnitude (qmax for integers)."""
        if self.is_int:
            return float(self.qmax)
        return float(torch.finfo(self.torch_dtype).max)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype that stores this format exactly (codes for integers)."""
        return _TORCH_DTYPES[self._value_]

    def _require_int(self, what: str) -> None:
        if not self.is_int:
            raise ValueError(f"{what} is defined for integer formats only, got {self.name}")

    @classmethod
    def parse(cls, value: DType | str) -> DType:
        """Accept a member or its name/value (``"INT8"`` or ``"int8"``); clear error otherwise."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            for m in cls:
                if value in (m.name, m.value):
                    return m
        allowed = ", ".join(m.name for m in cls)
        raise ValueError(f"unknown dtype {value!r}; allowed: {allowed}")


INT_DTYPES = (DType.INT8, DType.INT16, DType.INT32)
