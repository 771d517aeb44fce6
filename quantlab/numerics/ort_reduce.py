"""ONNX Runtime's float32 ReduceSum / ReduceMean (CPU) in its summation order, which decides the
last bit of a sum and so the code a QuantizeLinear after it gives.

onnxruntime drops the leading kept axes of size 1, merges neighbouring kept (K) and reduced (R)
axes, and sums by the pattern that leaves (each add one IEEE float32 operation):
  * [R], [K, R]: each contiguous row by Eigen's SSE redux: the row's start rounded up to a
    16-byte boundary (the buffer is aligned, a row starts at element d * n); from there two
    4-lane accumulators over blocks of 8, one more block of 4, the lanes reduced as
    (l0 + l2) + (l1 + l3), then the unaligned head and the tail added one by one (a row with
    no full block of 4: summed left to right);
  * [R, K]: the rows added one after the other, r0 + r1 + ...;
  * [K, R, K]: a product with a vector of ones (MLAS's single-row SGEMM): R in groups of 4, each
    group summed left to right and then added to the running sum, then a group of 2, then 1;
  * [R, K, R] with K > 1 and no kept axis of size 1 dropped before it: the trailing R by the
    redux, then the leading R row after row.
ReduceMean divides that sum by fl32(n) (n: the reduced element count). These patterns are
checked against onnxruntime on random shapes and axes (tests/runtime/test_ort_reduce.py);
``emulated`` says whether a reduction is one of them. Others ([R, 1, R], four or more runs)
are summed in torch's order, which can differ from onnxruntime's in the last bit.
"""

from __future__ import annotations

import torch
from torch import Tensor


def onnxruntime_reduce(v: Tensor, dims, mean: bool = False, keepdim: bool = False) -> Tensor:
    """ReduceSum (or ReduceMean) of float32 ``v`` over ``dims`` (None: all) as onnxruntime
    computes it (module doc); the output shaped as ``torch.sum(v, dims, keepdim)``."""
    if v.dtype != torch.float32:
        raise TypeError(f"onnxruntime_reduce takes float32 values, got {v.dtype}")
    reduced = _reduced(v.shape, dims)
    out_shape = [(1 if d in reduced else n) for d, n in enumerate(v.shape)]
    if not keepdim:
        out_shape = [n for d, n in enumerate(v.shape) if d not in reduced]
    count = 1
    for d in reduced:
        count *= v.shape[d]
    kinds, sizes, order = _plan(v.shape, reduced)
    x = v.contiguous().reshape(sizes) if sizes else v.reshape(())
    s = _ORDERS[order](x, kinds) if order else x.sum([i for i, k in enumerate(kinds) if k == "R"])
    if mean:
        s = s / torch.tensor(float(count), dtype=torch.float32)
    return s.reshape(out_shape)


def emulated(shape, dims) -> bool:
    """Whether onnxruntime's order is emulated for this reduction (module doc)."""
    return _plan(tuple(shape), _reduced(shape, dims))[2] is not None


def _reduced(shape, dims) -> set[int]:
    """The reduced axes; None or no axes: all of them (torch's sum and onnxruntime's default)."""
    nd = len(shape)
    dims = (dims,) if isinstance(dims, int) else tuple(dims or ())
    return {d % nd for d in dims} if dims else set(range(nd))


def _plan(shape, reduced) -> tuple[list[str], list[int], str | None]:
    """The runs of kept ("K") and reduced ("R") axes after the leading kept axes of size 1,
    their sizes, and the summation order of their pattern (None: not emulated)."""
    kinds: list[str] = []
    sizes: list[int] = []
    dropped = False
    for d, n in enumerate(shape):
        kind = "R" if d in reduced else "K"
        if n == 1 and not kinds and kind == "K":
            dropped = True
            continue
        if kinds and kinds[-1] == kind:
            sizes[-1] *= n
        else:
            kinds.append(kind)
            sizes.append(n)
    pattern = "".join(kinds)
    order = {"": "copy", "K": "copy", "R": "redux", "KR": "redux", "RK": "rows", "KRK": "ones"}
    if pattern == "RKR" and sizes[1] > 1 and not dropped:
        return kinds, sizes, "redux_rows"
    return kinds, sizes, order.get(pattern)


def _in_order(x: Tensor, axis: int) -> Tensor:
    """x's slices along ``axis`` added one after the other, starting from the first."""
    acc = x.select(axis, 0).clone()
    for i in range(1, x.shape[axis]):
        acc = acc + x.select(axis, i)
    return acc


def _ones_product(x: Tensor) -> Tensor:
    """(K1, R, K2) -> (K1, K2): R in groups of 4, 2, 1 (module doc)."""
    r = x.shape[1]
    acc = None
    k = 0
    for g in (4,) * (r // 4) + ((2,) if r % 4 >= 2 else ()) + ((1,) if r % 2 else ()):
        t = _in_order(x[:, k : k + g], 1)
        acc = t if acc is None else acc + t
        k += g
    return acc


def _redux_rows(x: Tensor) -> Tensor:
    """(rows, n) -> (rows,): each row by Eigen's SSE redux, row d starting at element d * n of
    a 16-byte-aligned buffer (module doc)."""
    rows, n = x.shape
    offsets = (torch.arange(rows) * n) % 4
    out = torch.empty(rows, dtype=torch.float32)
    for off in offsets.unique().tolist():
        idx = (offsets == off).nonzero().squeeze(1)
        out[idx] = _redux(x[idx], off)
    return out


def _redux(x: Tensor, offset: int) -> Tensor:
    n = x.shape[1]
    head = min((4 - offset) % 4, n)
    end4 = head + (n - head) // 4 * 4
    end8 = head + (n - head) // 8 * 8
    if end4 == head:  # no aligned block of 4: left to right
        return _in_order(x, 1)
    p0 = x[:, head : head + 4].clone()
    if end4 - head > 4:
        p1 = x[:, head + 4 : head + 8].clone()
        for i in range(head + 8, end8, 8):
            p0 = p0 + x[:, i : i + 4]
            p1 = p1 + x[:, i + 4 : i + 8]
        p0 = p0 + p1
        if end4 > end8:
            p0 = p0 + x[:, end8 : end8 + 4]
    r = (p0[:, 0] + p0[:, 2]) + (p0[:, 1] + p0[:, 3])
    for j in (*range(head), *range(end4, n)):
        r = r + x[:, j]
    return r


def _redux_all(x: Tensor, kinds) -> Tensor:
    return _redux_rows(x.reshape(1, -1))[0] if kinds == ["R"] else _redux_rows(x)


def _redux_then_rows(x: Tensor, kinds) -> Tensor:
    r1, k, r2 = x.shape
    return _in_order(_redux_rows(x.reshape(r1 * k, r2)).reshape(r1, k), 0)


_ORDERS = {
    "copy": lambda x, kinds: x.clone(),
    "redux": _redux_all,
    "rows": lambda x, kinds: _in_order(x, 0),
    "ones": lambda x, kinds: _ones_product(x),
    "redux_rows": _redux_then_rows,
}
