"""Shared exactness helpers for tests: identical bits, edge values, tie values."""

from __future__ import annotations

import numpy as np
import torch

from quantlab.numerics.dtypes import DType


def leaves(v) -> list:
    """A model's output as a flat list: the values inside (nested) tuples and lists, in order;
    anything else (a tensor) is one leaf."""
    return [u for w in v for u in leaves(w)] if isinstance(v, (tuple, list)) else [v]


def _as_tensor(a) -> torch.Tensor:
    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(a))
    return a


def assert_bits_equal(
    actual, expected, inputs: dict | None = None, check_dtype: bool = True, max_show: int = 5
) -> None:
    """Demand identical values (and dtype, shape). On failure show the first mismatches and the
    inputs at those positions (``inputs``: name -> tensor of the same shape, optional)."""
    a, e = _as_tensor(actual), _as_tensor(expected)
    assert tuple(a.shape) == tuple(e.shape), f"shape {tuple(a.shape)} != {tuple(e.shape)}"
    if check_dtype:
        assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
    if a.is_floating_point():
        same = (a == e) | (torch.isnan(a) & torch.isnan(e))
        # distinguish +0.0 / -0.0 as bits do
        same &= torch.signbit(a) == torch.signbit(e)
    else:
        same = a == e
    if bool(same.all()):
        return
    bad = (~same).nonzero()
    lines = [f"{int((~same).sum())} of {same.numel()} elements differ; first:"]
    for idx in bad[:max_show].tolist():
        t = tuple(idx)
        extra = ""
        if inputs:
            extra = " " + ", ".join(
                f"{k}={_as_tensor(v)[t].item()}"
                for k, v in inputs.items()
                if tuple(_as_tensor(v).shape) == tuple(a.shape)
            )
        lines.append(f"  at {t}: actual={a[t].item()} expected={e[t].item()}{extra}")
    raise AssertionError("\n".join(lines))


def edge_values(dtype: DType) -> torch.Tensor:
    """0, +-1, +-2, +-2**i +- {0, 1, 2}, min..min+2, max-2..max, within ``dtype`` (int64)."""
    lo, hi = dtype.qmin, dtype.qmax
    vals = {0, 1, -1, 2, -2, lo, lo + 1, lo + 2, hi, hi - 1, hi - 2}
    for i in range(dtype.bits):
        for d in (-2, -1, 0, 1, 2):
            for s in (1, -1):
                v = s * (1 << i) + d
                if lo <= v <= hi:
                    vals.add(v)
    return torch.tensor(sorted(vals), dtype=torch.int64)


def tie_values() -> torch.Tensor:
    """k + 0.5 for k in -8..8 (float64): the cases where rounding modes disagree."""
    return torch.arange(-8, 9, dtype=torch.float64) + 0.5
