"""The side table that carries quantization with a tensor between ops.

In fixed mode every quantized activation is a float32 tensor whose values equal
``codes * scale`` exactly (one float32 product of an integer |code| < 2**24 and the scale); its
``QInfo`` holds the integer codes, the scale and the dtype. The entry lives exactly as long as
the tensor (a weak reference removes it), keyed by the tensor object, never by its values.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import quantize


@dataclass(frozen=True)
class QInfo:
    """How a tensor is quantized: ``dtype``; for integer dtypes ``scale`` (float32, one value),
    optionally the integer ``codes`` and the ``zero_point`` (values == (codes - zero_point) *
    scale exactly)."""

    dtype: DType
    scale: Tensor | None = None
    codes: Tensor | None = None
    zero_point: int = 0

    def codes_of(self, value: Tensor) -> Tensor:
        """The integer codes (int64) of ``value``.

        Exactness: ``value = fl((code - zp) * s)`` with |code - zp| <= 2**15, so ``value / s``
        is within 2**-8 of ``code - zp`` and ``quantize`` (half to even) recovers it exactly
        (used after pass-through ops, which select values without changing them).
        """
        if self.codes is not None and self.codes.shape == value.shape:
            return self.codes.to(torch.int64)
        assert self.scale is not None and self.dtype.is_int and self.dtype.bits <= 16
        return quantize(value, self.scale, self.dtype, zero_point=self.zero_point).to(torch.int64)

    def codes_native(self, value: Tensor) -> Tensor:
        """``codes_of`` in the dtype's own torch dtype (int8 / int16 / int32)."""
        if self.codes is not None and self.codes.shape == value.shape:
            return self.codes.to(self.dtype.torch_dtype)
        return self.codes_of(value).to(self.dtype.torch_dtype)


class _KeyedRef(weakref.ref):
    """A weak reference that knows its table key (one shared callback, no closure per entry)."""

    __slots__ = ("key",)


class QTable:
    """id(tensor) -> (weak reference, value); entries vanish with their tensors."""

    def __init__(self) -> None:
        self._d: dict[int, tuple[weakref.ref, object]] = {}
        d = self._d

        def _gone(ref: _KeyedRef, d=d) -> None:
            entry = d.get(ref.key)
            if entry is not None and entry[0] is ref:
                del d[ref.key]

        self._gone = _gone

    def set(self, t: Tensor, info: object) -> None:
        key = id(t)
        e = self._d.get(key)
        if e is not None and e[0]() is t:  # the same tensor: keep its reference
            self._d[key] = (e[0], info)
            return
        ref = _KeyedRef(t, self._gone)
        ref.key = key
        self._d[key] = (ref, info)

    def get(self, t: object):
        if not isinstance(t, Tensor):
            return None
        e = self._d.get(id(t))
        if e is None or e[0]() is not t:
            return None
        return e[1]

    def drop(self, t: Tensor) -> None:
        self._d.pop(id(t), None)

    def __bool__(self) -> bool:
        return bool(self._d)

    def live(self) -> list[tuple[Tensor, object]]:
        """(tensor, value) of every entry whose tensor is still alive."""
        out = []
        for ref, value in list(self._d.values()):
            t = ref()
            if t is not None:
                out.append((t, value))
        return out

    def clear(self) -> None:
        self._d.clear()
