"""The entries of candidate tables of one table problem, each computed once.

A search over dividing points (point_dp.py) evaluates the same candidate table (d0, d1) in
several passes (bounds on more and more codes, then exact), and DATA searches the candidates of
OPTIMAL's problem again. A table's entries depend only on (d0, d1) and the problem (target,
scales, dtypes, format), and ``segments.target_values`` gives every entry the same bits whatever
the batch it is computed in, so entries computed once serve every later pass and search.
"""

from __future__ import annotations

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.formats import LutFormat
from quantlab.numerics.lut.segments import TargetFn, table_entries


class TableStore:
    """Entries [P, entries] (int64 codes of ``out_dtype``) of tables ``[d0, d1]`` of one
    problem, as ``segments.table_entries`` computes them, each pair computed once."""

    def __init__(
        self,
        target: TargetFn,
        in_scale: float,
        out_scale: float,
        out_dtype: DType,
        fmt: LutFormat,
    ):
        self.target, self.in_scale, self.out_scale = target, in_scale, out_scale
        self.out_dtype, self.fmt = out_dtype, fmt
        self._row: dict[tuple[int, int], int] = {}
        self._rows = np.zeros((0, fmt.entries), dtype=np.int64)
        self._used = 0

    def __len__(self) -> int:
        return self._used

    def entries(self, d0: np.ndarray, d1: np.ndarray) -> np.ndarray:
        """Entries of the tables ``[d0[p], d1[p]]`` (int64, [P, entries], a new array)."""
        d0 = np.asarray(d0, dtype=np.int64).reshape(-1)
        d1 = np.asarray(d1, dtype=np.int64).reshape(-1)
        keys = list(zip(d0.tolist(), d1.tolist()))
        row = self._row
        idx = np.fromiter((row.get(k, -1) for k in keys), dtype=np.int64, count=len(keys))
        missing = np.flatnonzero(idx < 0)
        if missing.size:
            # a pair may be asked for twice in one call: compute each once
            new = {}
            for i in missing.tolist():
                new.setdefault(keys[i], len(new))
            pairs = np.asarray(list(new), dtype=np.int64).reshape(-1, 2)
            fresh = table_entries(
                self.target, pairs[:, 0], pairs[:, 1], self.fmt, self.in_scale, self.out_scale,
                self.out_dtype,
            )  # fmt: skip
            start = self._append(fresh)
            for k, j in new.items():
                row[k] = start + j
            idx[missing] = [row[keys[i]] for i in missing.tolist()]
        return self._rows[idx]

    def _append(self, fresh: np.ndarray) -> int:
        start = self._used
        need = start + len(fresh)
        if need > len(self._rows):
            grown = np.zeros((max(need, 2 * len(self._rows), 1024), self.fmt.entries), np.int64)
            grown[:start] = self._rows[:start]
            self._rows = grown
        self._rows[start:need] = fresh
        self._used = need
        return start
