"""Elementwise functions of two 8-bit code tensors read from a table of every pair of codes.

A function f(x, y) applied elementwise to int8/uint8 codes has 65,536 possible arguments. Built
once by f itself on every pair (``every_pair``), the table gives f's bits for any two tensors
(broadcasting) by one int32 index pass and one gather (``lookup``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from quantlab.numerics import pair_table_native

EIGHT_BIT = (torch.int8, torch.uint8)
TABLE_LIMIT = 64  # tables kept per cache (128 KiB or less each)


def every_pair(x_dtype: torch.dtype, y_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(x, y) of 65,536 codes holding every pair of codes of the two 8-bit dtypes, pair (a, b)
    at index 256 * (a mod 256) + (b mod 256)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)  # the codes mod 256
    return codes.view(x_dtype).repeat_interleave(256), codes.view(y_dtype).repeat(256)


def lookup(table: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """``table``'s entry of each pair of codes of ``x`` and ``y`` (8-bit, broadcasting), in the
    layout of ``every_pair``. Contiguous CPU codes whose broadcast is a repeat take one C pass
    (``pair_table_native``, the same entries); the rest an int32 index pass and a gather."""
    out = pair_table_native.lookup_native(table, x, y)
    if out is not None:
        return out
    index = x.view(torch.uint8).to(torch.int32).mul_(256)
    index = index + y.view(torch.uint8)
    return table.index_select(0, index.reshape(-1)).reshape(index.shape)


class PairTables:
    """Tables by key, built on first use by ``build(x, y)`` on ``every_pair`` (at most
    ``TABLE_LIMIT`` kept)."""

    def __init__(self) -> None:
        self._tables: dict[tuple, Tensor] = {}

    def get(
        self,
        key: tuple,
        x_dtype: torch.dtype,
        y_dtype: torch.dtype,
        build: Callable[[Tensor, Tensor], Tensor],
    ) -> Tensor:
        full = (*key, x_dtype, y_dtype)
        table = self._tables.get(full)
        if table is None:
            table = build(*every_pair(x_dtype, y_dtype))
            if len(self._tables) >= TABLE_LIMIT:
                self._tables.clear()
            self._tables[full] = table
        return table

    def apply(
        self, key: tuple, x: Tensor, y: Tensor, fn: Callable[[Tensor, Tensor], Tensor]
    ) -> Tensor:
        """``fn(x, y)`` (an elementwise function of two code tensors, broadcasting): read from
        the table of ``fn`` on every pair (built once per ``key`` and dtypes) where both are
        8-bit codes, else computed."""
        if x.dtype in EIGHT_BIT and y.dtype in EIGHT_BIT:
            return lookup(self.get(key, x.dtype, y.dtype, fn), x, y)
        return fn(x, y)

    def __len__(self) -> int:
        return len(self._tables)
