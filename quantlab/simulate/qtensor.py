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
from quantlab.numerics.quantize import dequantize, quantize


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


def values_hold(t: Tensor, info: object) -> bool:
    """Whether ``t``'s values are still the ones its QInfo ``info`` describes: its codes'
    values (``(codes - zero_point) * scale``, as ``fixed_common.emit`` made them) or, without
    codes, values on its integer grid. False for anything else (float16, no scale)."""
    if not isinstance(info, QInfo) or not info.dtype.is_int or info.scale is None:
        return False
    if info.codes is not None and info.codes.shape == t.shape:
        held = dequantize(info.codes, info.scale, zero_point=info.zero_point)
    else:
        codes = quantize(t, info.scale, info.dtype, zero_point=info.zero_point)
        held = dequantize(codes, info.scale, zero_point=info.zero_point)
    return torch.equal(held, t)


class QTable:
    """id(tensor) -> (weak reference, value, the tensor's version); entries vanish with their
    tensors.

    ``check``: a table whose values describe the tensor's values (QInfo) checks an entry whose
    tensor was written since it was set (its ``_version`` moved: by itself, or through a view,
    which shares the version counter, as ``t.permute(...).add_(1)`` writes ``t``):
    ``check(tensor, value)`` true keeps it (a write elsewhere in the storage, as into another
    chunk), false drops it. Without ``check`` entries hold whatever the tensor's version."""

    def __init__(self, check=None) -> None:
        self._check = check
        self._d: dict[int, tuple[weakref.ref, object, int]] = {}
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
            self._d[key] = (e[0], info, t._version)
            return
        ref = _KeyedRef(t, self._gone)
        ref.key = key
        self._d[key] = (ref, info, t._version)

    def get(self, t: object):
        if not isinstance(t, Tensor):
            return None
        e = self._d.get(id(t))
        if e is None or e[0]() is not t:
            return None
        if e[2] != t._version and self._check is not None:
            if not self._check(t, e[1]):
                del self._d[id(t)]
                return None
            self._d[id(t)] = (e[0], e[1], t._version)
        return e[1]

    def drop(self, t: Tensor) -> None:
        self._d.pop(id(t), None)

    def __bool__(self) -> bool:
        return bool(self._d)

    def live(self) -> list[tuple[Tensor, object]]:
        """(tensor, value) of every entry whose tensor is still alive."""
        out = []
        for ref, value, _ in list(self._d.values()):
            t = ref()
            if t is not None:
                out.append((t, value))
        return out

    def clear(self) -> None:
        self._d.clear()
