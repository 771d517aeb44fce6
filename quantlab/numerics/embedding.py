"""Embedding as a fixed-point gather: the table's codes, selected by integer indices.

On J6 the gather (``hbir.index``, BPU) keeps its input's dtype, so the output codes are the
table's codes and carry the table's scale: a table quantized per tensor (J6 activations are
per tensor, j6-numerics s.1) gathers into an activation with no requantization. The index
tensor is an activation too: the seed's advice is a fixed scale of 1 (its codes are the ids);
with any other scale the ids pass through a quantizer and come back rounded, and rows change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import check_codes
from quantlab.numerics.quantize import quantize
from quantlab.numerics.rounding import Round, round_float


@dataclass(frozen=True)
class EmbeddingContract:
    """The gather's limits and the index path.

    index_dtype: dtype of the index tensor's codes: INT16 holds every id of a table the gather
                 accepts (up to 32767); INT8 saturates ids above 127.
    index_round: rounding of ids to index codes at a non-unit scale and of codes back to row
                 numbers (assumed HALF_EVEN, the fake-quant rounding).
    max_rows:    most table rows the gather may select from (hbir.index: select dim in
                 [1, 32768], published).
    """

    index_dtype: DType = DType.INT16
    index_round: Round = Round.HALF_EVEN
    max_rows: int = 32768

    def __post_init__(self) -> None:
        if self.index_dtype not in (DType.INT8, DType.INT16):
            raise ValueError(
                f"EmbeddingContract.index_dtype must be INT8 or INT16, got {self.index_dtype!r}"
            )
        if not isinstance(self.index_round, Round):
            allowed = ", ".join(m.name for m in Round)
            raise ValueError(f"EmbeddingContract.index_round must be a Round ({allowed})")
        if not 1 <= self.max_rows <= 32768:
            raise ValueError(
                f"EmbeddingContract.max_rows must be in [1, 32768], got {self.max_rows}"
            )


J6_EMBEDDING = EmbeddingContract()


def index_rows(
    ids: Tensor, rows: int, index_scale: float = 1.0, contract: EmbeddingContract = J6_EMBEDDING
) -> Tensor:
    """The table row each id reads (int64, ids' shape) after the index path.

    codes = ``quantize(id, index_scale, index_dtype, index_round)`` (float32 division, as any
    activation is quantized; ids up to 2**24 are exact in float32); row = round(code *
    index_scale) (exact in float64: 16 x 24 bits), clamped to [0, rows - 1] (assumed: an
    out-of-range row reads the nearest end). With index_scale 1 (the fixed scale) the row is
    the id, saturated. Rounding: ``index_round`` for both roundings. Raises TypeError for
    non-integer ids, ValueError for ids outside [0, rows), a non-positive scale, or more rows
    than ``max_rows``.
    """
    c = contract
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"embedding ids must be an integer tensor, got {ids.dtype}")
    if not 1 <= rows <= c.max_rows:
        raise ValueError(
            f"the table has {rows} rows; the fixed-point gather selects from 1 to {c.max_rows} "
            "(EmbeddingContract.max_rows)"
        )
    s = float(index_scale)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"index_scale must be finite and > 0, got {index_scale}")
    i = ids.to(torch.int64)
    if i.numel() and (int(i.min()) < 0 or int(i.max()) >= rows):
        raise ValueError(
            f"embedding ids must be in [0, {rows}), got [{int(i.min())}, {int(i.max())}]"
        )
    if s == 1.0:  # the fixed scale: the same rows without the float passes
        return _unit_scale_rows(i, c.index_dtype)
    return _scaled_rows(i, rows, s, c)


def _scaled_rows(ids: Tensor, rows: int, s: float, c: EmbeddingContract) -> Tensor:
    """``index_rows`` by its float passes (int64 ``ids`` in [0, rows))."""
    codes = quantize(ids.to(torch.float32), s, c.index_dtype, c.index_round)
    back = round_float(codes.to(torch.float64) * float(np.float32(s)), c.index_round)
    return back.clamp(0, rows - 1).to(torch.int64)


def _unit_scale_rows(ids: Tensor, index_dtype: DType) -> Tensor:
    """``index_rows`` at index scale 1 for ids in [0, rows), rows <= 32768: min(id, qmax).

    Each id is an integer below 2**15, exact in float32, and id / 1 is exact, so every
    rounding gives code = clamp(id, qmin, qmax) = min(id, qmax) (qmin < 0 <= id); then code * 1
    is exact in float64, rounds to itself, and lies in [0, id] within [0, rows - 1], so the
    final clamp keeps it."""
    return ids.clamp(max=index_dtype.qmax)


def gather_rows(table: Tensor, rows: Tensor) -> Tensor:
    """``table[rows]`` (rows: int64 row numbers in range): the same values by one
    ``index_select`` along the first dim (a copy, exact), shape rows.shape + table.shape[1:]."""
    return table.index_select(0, rows.reshape(-1)).reshape(*rows.shape, *table.shape[1:])


def embedding_fixed(
    ids: Tensor,
    table_codes: Tensor,
    index_scale: float = 1.0,
    contract: EmbeddingContract = J6_EMBEDDING,
) -> Tensor:
    """Gathered codes: ``table_codes[index_rows(ids, ...)]``, shape ids.shape + (D,), the
    table's dtype (int8/int16) and scale. Exact (a gather)."""
    check_codes(table_codes, "table_codes")
    if table_codes.dim() != 2:
        raise ValueError(f"table_codes must be (rows, D), got {tuple(table_codes.shape)}")
    rows = index_rows(ids, table_codes.shape[0], index_scale, contract)
    return gather_rows(table_codes, rows)
