"""The exact GEMM kernels for a chosen ``GemmPlan``: int8 products summed in int32 (int16
operands as their int8 halves), depthwise convolutions in C with int32 sums, float32 K-chunks
summed in float64, the FLOAT32_SPLIT high/low left operand, float64, int64. Callers validate the
operands, choose the plan (``plan``) and pin the float precision
(``precision.exact_float_kernels``)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics.dtypes import FLOAT32_EXACT
from quantlab.numerics.gemm.depthwise_native import depthwise_conv_int32
from quantlab.numerics.gemm.plan import GemmPath, GemmPlan, per_axis
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


def _int_mm_operand(t: Tensor) -> Tensor:
    """A 2-d int8 operand in a layout torch's int8 matrix product reads correctly: row-major
    with exactly those strides, or column-major with both sizes above 1, else a row-major copy
    (its CPU kernel takes the strides as given: stride-0 (expanded) and overlapping views, and
    a one-row matrix with strides (1, 1), give wrong sums)."""
    rows, cols = t.shape
    if t.stride() == (cols, 1) or (rows > 1 and cols > 1 and t.stride() == (1, rows)):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _int_mm(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """int32 ``a @ b`` of 2-d int8 operands by ``torch._int_mm`` (into ``out``, row-major)."""
    return torch._int_mm(_int_mm_operand(a), _int_mm_operand(b), out=out)


def int8_matmul_int32(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of int8 codes (torch.matmul semantics, b of one or two dimensions) as int32 by
    torch's int8 matrix product: the leading axes of ``a`` fold into rows. Exact under the
    INT32 plan's bound (``plan``)."""
    k = a.shape[-1]
    rows = a.reshape(-1, k)
    cols = b if b.dim() == 2 else b.reshape(k, 1)
    out = _int_mm(rows, cols)
    return out.reshape((*a.shape[:-1], *b.shape[1:]))


IM2COL_BLOCK_BYTES = 1 << 24  # int8 im2col columns copied per product (bounds the memory)


def int8_conv_int32(x: Tensor, w: Tensor, stride=1, padding=0, dilation=1) -> Tensor:
    """A convolution with one group of batched int8 codes ``x`` (N, C, *spatial) and ``w`` (O,
    C, *kernel), zero ``padding`` (ints; a 1x1 kernel also takes "valid" / "same") as int32,
    by torch's int8 matrix product per item: w (O, C * taps) @ columns (C * taps, positions).
    A 1x1 kernel with stride 1 and no padding takes x itself as the columns; any other kernel
    copies its columns (im2col: a strided view of the zero-padded codes, copied in blocks of
    output rows of at most ``IM2COL_BLOCK_BYTES``). The sums are written straight into the
    (N, O, *out) output. Exact under the INT32 plan's bound (``plan``)."""
    nsp = x.dim() - 2
    n, c = x.shape[:2]
    o = w.shape[0]
    ksize = tuple(w.shape[2:])
    w2 = w.reshape(o, -1)
    pointwise = all(k == 1 for k in ksize)
    if pointwise and isinstance(padding, str):
        padding = 0
    stride, padding = per_axis(stride, nsp), per_axis(padding, nsp)
    dilation = per_axis(dilation, nsp)
    if pointwise and all(s == 1 for s in stride) and not any(padding):
        xs = x.reshape(n, c, -1)
        out = torch.empty((n, o, xs.shape[2]), dtype=torch.int32, device=x.device)
        for i in range(n):
            _int_mm(w2, xs[i], out=out[i])
        return out.reshape(n, o, *x.shape[2:])
    if any(padding):
        x = F.pad(x, [p for p in reversed(padding) for _ in (0, 1)])
    sp = x.shape[2:]
    out_sp = [(sp[i] - dilation[i] * (ksize[i] - 1) - 1) // stride[i] + 1 for i in range(nsp)]
    st = x.stride()
    taps = x.as_strided(
        (n, c, *ksize, *out_sp),
        (
            st[0],
            st[1],
            *(st[2 + i] * dilation[i] for i in range(nsp)),
            *(st[2 + i] * stride[i] for i in range(nsp)),
        ),
    )
    out = torch.empty((n, o, *out_sp), dtype=torch.int32, device=x.device)
    k = w2.shape[1]
    row = math.prod(out_sp[1:])  # positions per output row (first spatial axis)
    block = max(1, IM2COL_BLOCK_BYTES // max(1, k * row))
    for i in range(n):
        for r0 in range(0, out_sp[0], block):
            r1 = min(r0 + block, out_sp[0])
            cols = taps[i].narrow(1 + nsp, r0, r1 - r0).reshape(k, -1)
            dest = out[i].narrow(1, r0, r1 - r0)
            if r0 == 0 and r1 == out_sp[0]:
                _int_mm(w2, cols, out=dest.reshape(o, -1))
            else:
                dest.copy_(_int_mm(w2, cols).reshape(dest.shape))
    return out


def int8_halves(t: Tensor) -> tuple[Tensor, Tensor]:
    """int16 codes ``a`` (|a| <= INT8_HALVES_MAX) as int8 halves (hi, lo), a = 256 * hi + lo
    exactly: hi = (a + 128) >> 8 (an arithmetic shift: floor), lo = a - 256 * hi, both in
    [-128, 127]."""
    a = t.to(torch.int32)
    hi = (a + 128) >> 8
    lo = a - (hi << 8)
    return hi.to(torch.int8), lo.to(torch.int8)


def by_int8_halves(a: Tensor, b: Tensor, product: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """The exact int64 sums ``product(a, b)`` of int8/int16 codes from int8 x int8 products
    (``product``: an INT32 kernel): each int16 operand split into its ``int8_halves`` and the
    half products combined with weights 256**i, ``sum (256 hi + lo) b = 256 sum hi b + sum lo b``
    (int64: below K * 2**30 in magnitude)."""
    a_parts = [(0, a)] if a.dtype == torch.int8 else list(zip((8, 0), int8_halves(a)))
    b_parts = [(0, b)] if b.dtype == torch.int8 else list(zip((8, 0), int8_halves(b)))
    acc = None
    for sa, pa in a_parts:
        for sb, pb in b_parts:
            part = product(pa, pb).to(torch.int64)
            if sa + sb:
                part.bitwise_left_shift_(sa + sb)
            acc = part if acc is None else acc.add_(part)
    return acc


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
    allow it (``rows_fit_float32``). The INT32 path returns int32 (int64 with ``as_int64``),
    INT32_SPLIT int64."""
    if plan.path is GemmPath.INT32:
        out = int8_matmul_int32(a, b)
        return out.to(torch.int64) if as_int64 else out
    if plan.path is GemmPath.INT32_SPLIT:
        return by_int8_halves(a, b, int8_matmul_int32)
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
    plan returns the float32 conv itself (exact integers; callers widen it), the INT32 and
    INT32_DEPTHWISE paths int32 (INT32_SPLIT: a convolution with one group), every other path
    int64.
    ``w_float32``: w's codes already cast to float32 (used instead of casting w). ``w_max``: a
    bound on |w|; given, a 1x1 convolution without groups whose FLOAT32 plan needs chunks runs
    as one conv when ``x``'s measured channel sums allow it (``rows_fit_float32`` along the
    channels: each output is a matmul row of one position)."""
    if plan.path in (GemmPath.INT32, GemmPath.INT32_SPLIT):
        args = (kw["stride"], kw["padding"], kw["dilation"])
        if plan.path is GemmPath.INT32:
            return int8_conv_int32(x, w, *args)
        return by_int8_halves(x, w, lambda xs, ws: int8_conv_int32(xs, ws, *args))
    if plan.path is GemmPath.INT32_DEPTHWISE:
        return _depthwise(x, w, kw)
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


def _depthwise(x: Tensor, w: Tensor, kw: dict) -> Tensor:
    """The INT32_DEPTHWISE kernel on a conv2d, or on a conv1d as a conv2d of height 1."""
    nsp = x.dim() - 2
    padding = 0 if kw["padding"] == "valid" else kw["padding"]
    args = [per_axis(v, nsp) for v in (kw["stride"], padding, kw["dilation"])]
    if nsp == 2:
        return depthwise_conv_int32(x, w, *args)
    args = [(1 if i != 1 else 0, *v) for i, v in enumerate(args)]  # height 1: no padding
    return depthwise_conv_int32(x.unsqueeze(2), w.unsqueeze(2), *args).squeeze(2)


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
