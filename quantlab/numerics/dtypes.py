"""Numeric formats quantlab emulates: int8, int16, int32, float16 and float32.

Integer formats are two's-complement with their full range (int8 is [-128, 127], not the
narrow [-127, 127]); j6-numerics section 1. Float formats are IEEE binary16 / binary32.
"""

from __future__ import annotations

import enum

import torch

_BITS = {"int8": 8, "int16": 16, "int32": 32, "float16": 16, "float32": 32}
_INT_VALUES = frozenset(("int8", "int16", "int32"))


class DType(enum.Enum):
    """A tensor format on the device. Configs select members by name (``INT8``, ``FLOAT16``...)."""

    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    FLOAT16 = "float16"
    FLOAT32 = "float32"

    @property
    def is_int(self) -> bool:
        return self.value in _INT_VALUES

    @property
    def is_float(self) -> bool:
        return self.value not in _INT_VALUES

    @property
    def bits(self) -> int:
        return _BITS[self.value]

    @property
    def qmin(self) -> int:
        """Smallest code of an integer format, -2**(bits-1)."""
        if self.value not in _INT_VALUES:
            self._require_int("qmin")
        return -(1 << (_BITS[self.value] - 1))

    @property
    def qmax(self) -> int:
        """Largest code of an integer format, 2**(bits-1) - 1."""
        if self.value not in _INT_VALUES:
            self._require_int("qmax")
        return (1 << (_BITS[self.value] - 1)) - 1

    @property
    def max_finite(self) -> float:
        """Largest finite magnitude (qmax for integers)."""
        if self.is_int:
            return float(self.qmax)
        return float(torch.finfo(self.torch_dtype).max)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype that stores this format exactly (codes for integers)."""
        return {
            "int8": torch.int8,
            "int16": torch.int16,
            "int32": torch.int32,
            "float16": torch.float16,
            "float32": torch.float32,
        }[self.value]

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
