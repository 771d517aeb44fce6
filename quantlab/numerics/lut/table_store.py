"""The entries of candidate tables of one table problem, each computed once.

A search over dividing points (point_dp.py) evaluates the same candidate table (d0, d1) in
several passes (bounds on more and more codes, then exact), and DATA searches the candidates of
OPTIMAL's problem again. A table's entries depend only on (d0, d1) and the problem (target,
scales, dtypes, format), and ``segments.target_values`` gives every entry the same bits whatever
the batch it is computed in, so entries computed once serve every later pass and search.
"""

from __future__ import annotations

import threading

import numpy as np

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.formats import LutFormat
from quantlab.numerics.lut.segments import TargetFn, table_entries

_KEY_BITS = 20  # a pair's key: (d0 + 2^19) << 20 | (d1 + 2^19); codes are int16 at most


class TableStore:
    """Entries [P, entries] (int64 codes of ``out_dtype``) of tables ``[d0, d1]`` of one
    problem, as ``segments.table_entries`` computes them, each pair computed once; and the
    saturated target of every input code (``segment_cost.saturated_target_lsb``), once."""

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
        self.saturated: np.ndarray | None = None  # set by the first SegmentCosts of the problem
        self._keys = np.zeros(0, dtype=np.int64)  # sorted pair keys
        self._key_rows = np.zeros(0, dtype=np.int64)  # their rows in self._rows
        self._rows = np.zeros((0, fmt.entries), dtype=np.int64)
        self._used = 0
        self._lock = threading.Lock()  # builds on several threads may share a store

    def __len__(self) -> int:
        return self._used

    def entries(self, d0: np.ndarray, d1: np.ndarray) -> np.ndarray:
        """Entries of the tables ``[d0[p], d1[p]]`` (int64, [P, entries], a new array)."""
        with self._lock:
            return self._entries(d0, d1)

    def _entries(self, d0: np.ndarray, d1: np.ndarray) -> np.ndarray:
        d0 = np.asarray(d0, dtype=np.int64).reshape(-1)
        d1 = np.asarray(d1, dtype=np.int64).reshape(-1)
        half = 1 << (_KEY_BITS - 1)
        keys = ((d0 + half) << _KEY_BITS) | (d1 + half)
        rows = self._lookup(keys)
        missing = rows < 0
        if missing.any():
            new = np.unique(keys[missing])  # a pair asked for twice in one call: once
            mask = (1 << _KEY_BITS) - 1
            fresh = table_entries(
                self.target, (new >> _KEY_BITS) - half, (new & mask) - half, self.fmt,
                self.in_scale, self.out_scale, self.out_dtype,
            )  # fmt: skip
            start = self._append(fresh)
            keys_all = np.concatenate([self._keys, new])
            rows_all = np.concatenate([self._key_rows, start + np.arange(len(new))])
            order = np.argsort(keys_all, kind="stable")
            self._keys, self._key_rows = keys_all[order], rows_all[order]
            rows[missing] = self._lookup(keys[missing])
        return self._rows[rows]

    def _lookup(self, keys: np.ndarray) -> np.ndarray:
        """Row of each key, -1 where the pair has not been computed."""
        pos = np.searchsorted(self._keys, keys)
        pos = np.minimum(pos, max(len(self._keys) - 1, 0))
        if not len(self._keys):
            return np.full(len(keys), -1, dtype=np.int64)
        return np.where(self._keys[pos] == keys, self._key_rows[pos], -1)

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
