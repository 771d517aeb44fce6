"""Array plumbing shared by the references: tensors or arrays in, numpy out."""

from __future__ import annotations

import numpy as np


def as_numpy(t) -> np.ndarray:
    if hasattr(t, "detach"):
        return t.detach().cpu().numpy()
    return np.asarray(t)


def as_tuple(v, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(i) for i in v)
    if len(v) != n:
        raise ValueError(f"expected {n} values, got {v}")
    return v
