"""Results cached by a hash of model, inputs, config and quantlab's own code.

``fingerprint(...)`` is a SHA-256 over a canonical byte stream of its arguments:

- ``nn.Module``: class path, ``repr`` (the module tree) and every state_dict entry
  (name, dtype, shape, raw bytes);
- ``Tensor``: dtype, shape and raw bytes (contiguous, on CPU);
- dataclasses: class name and fields (recursively); enums: class and member name;
- lists, tuples, dicts (keys sorted by repr) recursively; other values by ``repr``.

``code_fingerprint()`` hashes the source of the modules that decide the numbers (``CODE_PATHS``:
numerics, simulator, capture, qconfig, platforms, model-level ops, models, sensitivity and its
metrics), so a change there invalidates cached results instead of serving stale numbers.
``ResultCache`` stores one pandas DataFrame per key as a JSON document (column names, dtypes and
values; floats written exactly, inf and NaN included), written atomically inside the cache
folder it is given. Nothing is ever unpickled: a file planted in the cache folder is data at
worst, never code.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from quantlab.report.io import atomic_write_text

CACHE_FORMAT = "quantlab.result_table/1"


def _feed(h: Any, obj: Any) -> None:
    """Append a canonical encoding of ``obj`` to the hash ``h`` (type-tagged, length-framed)."""

    def put(tag: str, data: bytes) -> None:
        h.update(tag.encode() + len(data).to_bytes(8, "little") + data)

    if isinstance(obj, nn.Module):
        put("module", f"{type(obj).__module__}.{type(obj).__qualname__}\n{obj!r}".encode())
        for name, t in obj.state_dict().items():
            put("key", name.encode())
            _feed(h, t)
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        put("tensor", f"{t.dtype}{tuple(t.shape)}".encode())
        put("data", t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, enum.Enum):
        put("enum", f"{type(obj).__qualname__}.{obj.name}".encode())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        put("dataclass", type(obj).__qualname__.encode())
        for f in dataclasses.fields(obj):
            put("field", f.name.encode())
            _feed(h, getattr(obj, f.name))
    elif isinstance(obj, dict):
        put("dict", str(len(obj)).encode())
        for k in sorted(obj, key=repr):
            _feed(h, k)
            _feed(h, obj[k])
    elif isinstance(obj, list | tuple):
        put(type(obj).__name__, str(len(obj)).encode())
        for item in obj:
            _feed(h, item)
    else:
        put(type(obj).__name__, repr(obj).encode())


def fingerprint(*objs: Any) -> str:
    """Hex SHA-256 of ``objs`` (see the module docstring for what is hashed)."""
    h = hashlib.sha256()
    for obj in objs:
        _feed(h, obj)
    return h.hexdigest()


CODE_PATHS = (
    "numerics",
    "simulate",
    "models",
    "capture.py",
    "qconfig.py",
    "platforms.py",
    "platform_rules.py",
    "ops.py",
    "analysis/sensitivity.py",
    "analysis/metrics.py",
    "analysis/frozen_indices.py",
    "analysis/cache.py",
)


@functools.cache
def code_fingerprint() -> str:
    """Hex SHA-256 of the source files under ``CODE_PATHS`` of the ``quantlab`` package."""
    root = Path(__file__).resolve().parents[1]
    files: set[Path] = set()
    for rel in CODE_PATHS:
        p = root / rel
        files.update(p.rglob("*.py") if p.is_dir() else [p] if p.exists() else [])
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def table_to_json(df: pd.DataFrame) -> str:
    """``df`` as a JSON document: each column's name, dtype and values, plus ``df.attrs``.

    Column names must be strings, the index the default RangeIndex, and values and attrs plain
    JSON data (numbers, strings, booleans, None, lists, dicts); TypeError or ValueError
    otherwise. Floats are written with ``repr`` (read back bit for bit; inf and NaN too).
    """
    if not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        raise ValueError("ResultCache stores tables with the default RangeIndex; reset_index first")
    columns = []
    for name in df.columns:
        if not isinstance(name, str):
            raise TypeError(f"ResultCache needs string column names, got {name!r}")
        columns.append([name, str(df[name].dtype), df[name].tolist()])
    doc = {"format": CACHE_FORMAT, "columns": columns, "attrs": dict(df.attrs)}
    return json.dumps(doc, allow_nan=True)


def table_from_json(text: str) -> pd.DataFrame:
    """The DataFrame ``table_to_json`` wrote (ValueError for any other document)."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT:
        raise ValueError(f"not a {CACHE_FORMAT} document")
    data = {name: pd.Series(values, dtype=dtype) for name, dtype, values in doc["columns"]}
    df = pd.DataFrame(data, columns=[c[0] for c in doc["columns"]])
    df.attrs.update(doc.get("attrs", {}))
    return df


class ResultCache:
    """DataFrames on disk under ``root/<namespace>/<key>.json``; ``root=None`` disables caching.

    Only JSON documents written by ``table_to_json`` are read; an unreadable or foreign file
    counts as a miss (and is overwritten by the next ``put``).
    """

    def __init__(self, root: str | os.PathLike | None, namespace: str) -> None:
        self.folder = None if root is None else Path(root) / namespace
        self.hits = 0
        self.misses = 0

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{key}.json"

    def get(self, key: str) -> pd.DataFrame | None:
        """The DataFrame stored under ``key``, or None (also for an unreadable entry)."""
        if self.folder is None or not self._path(key).exists():
            self.misses += 1
            return None
        try:
            df = table_from_json(self._path(key).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            self.misses += 1
            return None
        self.hits += 1
        return df

    def put(self, key: str, df: pd.DataFrame) -> None:
        """Store ``df`` under ``key`` (atomically; no-op when caching is disabled)."""
        if self.folder is None:
            return
        atomic_write_text(self._path(key), table_to_json(df))
