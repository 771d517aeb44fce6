"""Results cached by a hash of model, inputs, config and quantlab's own code.

``fingerprint(...)`` is a SHA-256 over a canonical byte stream of its arguments:

- ``nn.Module``: class path, ``repr`` (the module tree) and every state_dict entry
  (name, dtype, shape, raw bytes);
- ``Tensor``: dtype, shape and raw bytes (contiguous, on CPU);
- dataclasses: class name and fields (recursively); enums: class and member name;
- lists, tuples, dicts (keys sorted by repr) recursively; other values by ``repr``.

``code_fingerprint()`` hashes the source of the modules that decide the numbers (``CODE_PATHS``:
numerics, simulator, capture, qconfig, platforms, model-level ops, models, sensitivity), so a
change there invalidates cached results instead of serving stale numbers.
``ResultCache`` stores one pandas DataFrame per key as a pickle, written atomically.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import io
import os
import pickle
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from quantlab.report.io import atomic_write_bytes

CACHE_ENV = "QUANTLAB_CACHE_DIR"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "quantlab"


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
    "ops.py",
    "analysis/sensitivity.py",
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


def default_cache_dir() -> Path:
    """``$QUANTLAB_CACHE_DIR`` if set, else ``~/.cache/quantlab``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else DEFAULT_CACHE_DIR


class ResultCache:
    """DataFrames on disk under ``root/<namespace>/<key>.pkl``; ``root=None`` disables caching."""

    def __init__(self, root: str | os.PathLike | None, namespace: str) -> None:
        self.folder = None if root is None else Path(root) / namespace
        self.hits = 0
        self.misses = 0

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / f"{key}.pkl"

    def get(self, key: str) -> pd.DataFrame | None:
        """The DataFrame stored under ``key``, or None (also for an unreadable entry)."""
        if self.folder is None or not self._path(key).exists():
            self.misses += 1
            return None
        try:
            with open(self._path(key), "rb") as f:
                df = pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
            self.misses += 1
            return None
        self.hits += 1
        return df

    def put(self, key: str, df: pd.DataFrame) -> None:
        """Store ``df`` under ``key`` (atomically; no-op when caching is disabled)."""
        if self.folder is None:
            return
        buf = io.BytesIO()
        pickle.dump(df, buf, protocol=pickle.HIGHEST_PROTOCOL)
        atomic_write_bytes(self._path(key), buf.getvalue())
