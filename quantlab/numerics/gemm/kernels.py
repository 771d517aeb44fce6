"""The exact GEMM kernels for a chosen ``GemmPlan``: int8 products summed in int32, float32
K-chunks summed in float64, the FLOAT32_SPLIT high/low left operand, float64, int64. Callers
validate the operands, choose the plan (``plan``) and pin the float precision
(``precision.exact_float_kernels``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from quantlab.numerics.dtypes import FLOAT32_EXACT
from quantlab.numerics.gemm.plan import GemmPath, GemmPlan
from quantlab.numerics.rounding import Round, round_float


def _sum_chunks_f64(parts) -> Tensor:
    """Sum exact float32 chunk results in float64 (exact: the caller's plan keeps the whole sum
    below 2**53), one in-place add per chunk."""
    acc = None
    for part in parts:
        if acc is None:
            acc = part.to(torch.float64)
        else:
            acc.add_(part)
    return acc


def int8_matmul_int32(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of int8 codes (torch.matmul semantics, b of one or two dimensions) as int32 by
    torch's int8 matrix product: the leading axes of ``a`` fold into rows. Exact under the
    INT32 plan's bound (``plan``)."""
    k = a.shape[-1]
    rows = a.reshape(-1, k)
    cols = b if b.dim() == 2 else b.reshape(k, 1)
    out = torch._int_mm(rows, cols)
    return out.reshape((*a.shape[:-1], *b.shape[1:]))


def int8_pointwise_conv_int32(x: Tensor, w: Tensor) -> Tensor:
    """A 1x1 convolution (stride 1, no padding, one group) of batched int8 codes ``x`` (N, C,
    *spatial) with ``w`` (O, C, 1...) as int32: per item, the matrix product w (O, C) @ x (C,
    positions), written straight into the (N, O, *spatial) output. Exact under the INT32
    plan's bound (``plan``)."""
    n, c = x.shape[:2]
    o = w.shape[0]
    w2 = w.reshape(o, c)
    xs = x.reshape(n, c, -1)
    out = torch.empty((n, o, xs.shape[2]), dtype=torch.int32, device=x.device)
    for i in range(n):
        torch._int_mm(w2, xs[i], out=out[i])
    return out.reshape(n, o, *x.shape[2:])


def rows_fit_float32(af: Tensor, b_max: int, dim: int = -1) -> bool:
    """Whether one float32 product is exact for these operands whatever the kernel's order and
    blocking: every partial sum of an output is a sum of some of its terms a_ik * b_kj, so at
    most ``max_i sum_k |a_ik| * b_max`` in magnitude; below 2**24, every one is an exact
    integer. ``af``: the left operand's codes as float32, K along ``dim``; ``b_max``: a bound
    on |b|. The row sums are float32 sums of nonnegative integers, in any order: each is
    exact up to 2**24 and at least min(true sum, 2**24) beyond (rounding is monotone and
    2**24 is a float32), so ``sum * b_max < 2**24`` proves ``true sum * b_max < 2**24``. One
    pass and one host read."""
    if af.numel() == 0:
        return True
    return float(af.abs().sum(dim).amax()) * b_max < FLOAT32_EXACT


def matmul_planned(
    a: Tensor,
    b: Tensor,
    k: int,
    plan: GemmPlan,
    as_int64: bool = True,
    b_float32: Tensor | None = None,
    b_max: int | None = None,
) -> Tensor:
    """Exact ``a @ b`` (int8/int16 codes, K = ``k``) as int64 on ``plan``'s path; with
    ``as_int64=False`` a single-chunk FLOAT32 plan returns its float32 product as it is (exact
    integers below 2**24; callers that take float sums save the widening pass). ``b_float32``:
    b's codes already cast to float32 (used instead of casting b). ``b_max``: a bound on |b|;
    given, a FLOAT32 plan that needs chunks runs as one product when ``a``'s measured rows
    allow it (``rows_fit_float32``). The INT32 path returns int32 (int64 with ``as_int64``)."""
    if plan.path is GemmPath.INT32:
        out = int8_matmul_int32(a, b)
        return out.to(torch.int64) if as_int64 else out
    if plan.path is GemmPath.INT64:
        return torch.matmul(a.to(torch.int64), b.to(torch.int64))
    if plan.path is GemmPath.FLOAT64:
        return torch.matmul(a.to(torch.float64), b.to(torch.float64)).to(torch.int64)
    af = a.to(torch.float32)
    bf = b.to(torch.float32) if b_float32 is None else b_float32
    if plan.chunk >= k or (b_max is not None and rows_fit_float32(af, b_max)):
        out = torch.matmul(af, bf)
        return out.to(torch.int64) if as_int64 else out

    def parts():
        for k0 in range(0, k, plan.chunk):
            k1 = k0 + plan.chunk
            bs = bf[k0:k1] if bf.dim() == 1 else bf[..., k0:k1, :]
            yield torch.matmul(af[..., k0:k1], bs)

    return _sum_chunks_f64(parts()).to(torch.int64)


def conv_planned(
    x: Tensor,
    w: Tensor,
    conv: Callable[..., Tensor],
    kw: dict,
    groups: int,
    cin_g: int,
    plan: GemmPlan,
    w_float32: Tensor | None = None,
    w_max: int | None = None,
) -> Tensor:
    """Exact ``conv(x, w, **kw)`` (batched codes) on ``plan``'s path. A single-chunk FLOAT32
    plan returns the float32 conv itself (exact integers; callers widen it), the INT32 path
    int32 (a 1x1 convolution without stride, padding or groups), every other path int64.
    ``w_float32``: w's codes already cast to float32 (used instead of casting w). ``w_max``: a
    bound on |w|; given, a 1x1 convolution without groups whose FLOAT32 plan needs chunks runs
    as one conv when ``x``'s measured channel sums allow it (``rows_fit_float32`` along the
    channels: each output is a matmul row of one position)."""
    if plan.path is GemmPath.INT32:
        return int8_pointwise_conv_int32(x, w)
    if plan.path is GemmPath.INT64:
        return conv(x.to(torch.int64), w.to(torch.int64), **kw)
    if plan.path is GemmPath.FLOAT64:
        return conv(x.to(torch.float64), w.to(torch.float64), **kw).to(torch.int64)
    wf = w.to(torch.float32) if w_float32 is None else w_float32
    if plan.path is GemmPath.FLOAT32_SPLIT:
        xf = x.to(torch.float32)
        hi = round_float(xf * (1.0 / 256), Round.HALF_EVEN)  # exact scaling; |hi| <= 128
        lo = xf - hi * 256  # exact; |lo| <= 128
        both = _conv_chunks_f32(torch.cat([hi, lo]), wf, conv, kw, groups, cin_g, plan.chunk)
        n = x.shape[0]
        return (both[:n] * 256 + both[n:]).to(torch.int64)  # float64, exact below 2**53
    xf = x.to(torch.float32)
    if plan.chunk >= cin_g:
        return conv(xf, wf, **kw)
    pointwise = groups == 1 and all(d == 1 for d in w.shape[2:])
    if w_max is not None and pointwise and rows_fit_float32(xf, w_max, dim=1):
        return conv(xf, wf, **kw)
    return _conv_chunks_f32(xf, wf, conv, kw, groups, cin_g, plan.chunk).to(torch.int64)


def _conv_chunks_f32(xf: Tensor, wf: Tensor, conv, kw, groups: int, cin_g: int, chunk: int):
    """Sum over input-channel chunks of float32 convs (each exact), in float64."""
    n = xf.shape[0]
    sp = xf.shape[2:]
    xg = xf.reshape(n, groups, cin_g, *sp)

    def parts():
        for c0 in range(0, cin_g, chunk):
            c1 = min(c0 + chunk, cin_g)
            xs = xg[:, :, c0:c1].reshape(n, groups * (c1 - c0), *sp)
            yield conv(xs, wf[:, c0:c1], **kw)

    return _sum_chunks_f64(parts())
