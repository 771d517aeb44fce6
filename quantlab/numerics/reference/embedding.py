"""Slow, obviously-correct twin of ``embedding.embedding_fixed``, for tests only: one id at a
time: the index codes by the reference ``quantize`` (numpy float32 division, Fractions), the
row by an exact Fraction product. Returns a numpy int64 array."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from quantlab.numerics.embedding import J6_EMBEDDING, EmbeddingContract
from quantlab.numerics.reference.requant import quantize
from quantlab.numerics.reference.rounding import round_fraction


def embedding_fixed(
    ids, table_codes, index_scale: float = 1.0, contract: EmbeddingContract = J6_EMBEDDING
) -> np.ndarray:
    """Reference of ``embedding.embedding_fixed`` (valid arguments only)."""
    table = np.asarray(table_codes).astype(np.int64)
    ids = np.asarray(ids).astype(np.int64)
    s = np.float32(index_scale)
    codes = quantize(ids, s, contract.index_dtype, contract.index_round)
    rows = table.shape[0]
    out = np.empty(ids.shape + (table.shape[1],), dtype=np.int64)
    for idx in np.ndindex(ids.shape):
        row = round_fraction(int(codes[idx]) * Fraction(float(s)), contract.index_round)
        row = min(max(row, 0), rows - 1)
        out[idx] = table[row]
    return out
