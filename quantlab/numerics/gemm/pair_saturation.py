"""uint8 x int8 GEMM sums whose adjacent product pairs saturate to int16.

On x86 CPUs without VNNI (SSE4.1, AVX2, AVX-512 without VNNI) onnxruntime's MLAS kernels for
uint8 activations times int8 weights multiply with ``vpmaddubsw``: each pair of adjacent terms
``x[k] * w[k] + x[k + 1] * w[k + 1]`` (k even; an odd K is padded with a zero term) is
saturated to [-32768, 32767] before the int32 sums. Contract here (``Σ'`` is that pair-saturated
sum over raw codes):

* matmul / linear: ``Σ'_k x[m, k] * w[k, n] - zx * Σ_k w[k, n]``, K in the operand's order;
* convolution: the same over K in (kernel row, kernel column, input channel) order, the input
  padded with its zero point ``zx`` (MLAS runs it on the NHWC im2col); per group; a depthwise
  convolution (groups = input channels = output channels) runs MLAS's depthwise kernel, which
  is exact, so it has no pairs; nor has a convolution whose output leaves unquantized (a wide
  output, exported as ConvInteger, whose sums are exact on every CPU).

Weights are symmetric (zero point 0). Result: int64, the centred sum ``Σ (x - zx) * w`` wherever
no pair saturates. Computed as the exact sum plus a correction on the pairs of weights that can
saturate against the codes at hand (``_risky_pairs``; on trained weights a few percent), so the
cost is near an exact GEMM's. Checked bit for bit against onnxruntime's QLinearMatMul and
QLinearConv on a CPU whose kernels saturate, and against ``reference.pair_saturation``
everywhere (tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics.gemm.exact import int_conv2d as exact_conv2d
from quantlab.numerics.gemm.exact import int_matmul
from quantlab.numerics.gemm.plan import per_axis

INT16_MIN, INT16_MAX = -32768, 32767
PAIR_CHUNK_ELEMENTS = 1 << 22  # int32 pair sums held at once (16 MB)
DENSE_PAIR_FRACTION = 0.25  # above this share of pairs that can saturate: every pair summed


def _check(x: Tensor, w: Tensor) -> None:
    if x.dtype not in (torch.uint8, torch.int16, torch.int32) or w.dtype != torch.int8:
        raise TypeError(
            f"pair-saturated sums take uint8 codes (any integer dtype holding 0..255) and int8 "
            f"weights, got {x.dtype} and {w.dtype}"
        )


def pair_saturated_rows(x: Tensor, w: Tensor, zx: int = 0) -> Tensor:
    """``Σ' x w - zx Σ w`` of rows x (R, K) of raw uint8 codes against w (K, N) int8: int64
    (R, N).

    Computed as the exact centred sum ``Σ (x - zx) w`` (``int_matmul``) plus ``clamp(p) - p`` of
    the pair sums p of each pair of weights that can saturate against these rows
    (``_risky_pairs``, bounded by the column maxima of x); every other pair sums exactly. Where
    more than ``DENSE_PAIR_FRACTION`` of the pairs can saturate, every pair is summed
    (``_dense_rows``)."""
    k = x.shape[-1]
    x16 = x.to(torch.int16)
    xmax = x16.amax(0).to(torch.int32) if x16.shape[0] else torch.zeros(k, dtype=torch.int32)
    pair, col, w_even, w_odd = _risky_pairs(xmax, w)
    if pair.numel() > DENSE_PAIR_FRACTION * ((k + 1) // 2) * w.shape[1]:
        return _dense_rows(x, w) - int(zx) * w.to(torch.int64).sum(0)
    out = int_matmul(centred_codes(x16, zx), w.to(torch.int8))
    if pair.numel() and x.shape[0]:
        if k % 2:
            x16 = F.pad(x16, (0, 1))
        _add_corrections(out, x16, 2 * pair, 2 * pair + 1, col, w_even, w_odd)
    return out


def centred_codes(x: Tensor, zx: int) -> Tensor:
    """``x - zx`` of raw uint8 codes: int8 when zx is 128 (every code then fits), else int16
    (the exact GEMM's bounds are tighter for int8 operands)."""
    c = x.to(torch.int16) - int(zx)
    return c.to(torch.int8) if int(zx) == 128 else c


def _risky_pairs(xmax: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The weight pairs (k = 2 pair, 2 pair + 1; column col) whose pair sum can leave int16
    for codes in [0, xmax[k]]: ``xmax_k max(w_k, 0) + xmax_k+1 max(w_k+1, 0) > 32767`` or the
    same with min below -32768 (an odd K pads a zero term); with their two weights (int32)."""
    xmax, w32 = xmax.to(torch.int32), w.to(torch.int32)
    if w32.shape[0] % 2:
        xmax, w32 = F.pad(xmax, (0, 1)), F.pad(w32, (0, 0, 0, 1))
    we, wo = w32[0::2], w32[1::2]
    xe, xo = xmax[0::2, None], xmax[1::2, None]
    hi = xe * we.clamp(min=0) + xo * wo.clamp(min=0)
    lo = xe * we.clamp(max=0) + xo * wo.clamp(max=0)
    pair, col = torch.nonzero((hi > INT16_MAX) | (lo < INT16_MIN), as_tuple=True)
    return pair, col, we[pair, col], wo[pair, col]


def _add_corrections(out, codes, ie, io, col, w_even, w_odd) -> None:
    """out[:, col] += clamp(p) - p for the pair sums p = codes[:, ie] w_even + codes[:, io]
    w_odd (one per risky pair), in chunks of rows."""
    step = max(1, PAIR_CHUNK_ELEMENTS // max(1, ie.numel()))
    for r in range(0, codes.shape[0], step):
        rows = codes[r : r + step].to(torch.int32)
        p = rows[:, ie] * w_even + rows[:, io] * w_odd  # (rows, risky pairs)
        out[r : r + step].index_add_(1, col, (p.clamp(INT16_MIN, INT16_MAX) - p).to(torch.int64))


def _conv_by_rows(wk, zx, n, oh, ow, tap) -> Tensor:
    """Every pair summed on the (row, column, channel) im2col of each group's weights ``wk``
    (``_dense_rows``); ``tap(g, k)``: the codes K position k of group g reads."""
    og = wk[0].shape[1]
    acc = torch.empty(n, og * len(wk), max(oh, 0), max(ow, 0), dtype=torch.int64)
    for g, wg in enumerate(wk):
        cols = torch.stack([tap(g, k) for k in range(wg.shape[0])], 1)
        part = _dense_rows(cols, wg) - int(zx) * wg.to(torch.int64).sum(0)
        acc[:, g * og : (g + 1) * og] = part.reshape(n, oh, ow, og).permute(0, 3, 1, 2)
    return acc


def _dense_rows(x: Tensor, w: Tensor) -> Tensor:
    """``Σ'`` with every pair sum formed, clamped and added (chunks of rows)."""
    k = x.shape[-1]
    x32, w32 = x.to(torch.int32), w.to(torch.int32)
    if k % 2:
        x32 = F.pad(x32, (0, 1))
        w32 = F.pad(w32, (0, 0, 0, 1))
    xe, xo = x32[:, 0::2], x32[:, 1::2]
    we, wo = w32[0::2], w32[1::2]
    half, n = we.shape
    out = torch.empty(x.shape[0], n, dtype=torch.int64)
    step = max(1, PAIR_CHUNK_ELEMENTS // max(1, half * n))
    for r in range(0, x.shape[0], step):
        pairs = xe[r : r + step, :, None] * we + xo[r : r + step, :, None] * wo
        pairs.clamp_(INT16_MIN, INT16_MAX)
        out[r : r + step] = pairs.sum(1, dtype=torch.int64)
    return out


def pair_saturated_matmul(x: Tensor, w: Tensor, zx: int) -> Tensor:
    """x (..., K) raw uint8 codes with zero point ``zx``, w (K, N) int8: int64 (..., N)."""
    _check(x, w)
    if w.dim() != 2 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"shapes {tuple(x.shape)} and {tuple(w.shape)} do not match")
    acc = pair_saturated_rows(x.reshape(-1, x.shape[-1]), w, zx)
    return acc.reshape(*x.shape[:-1], w.shape[1])


def is_depthwise(in_channels: int, out_channels: int, groups: int) -> bool:
    """MLAS's depthwise kernel (exact): one input and one output channel per group."""
    return groups == in_channels == out_channels


def pair_saturated_conv(
    x: Tensor, w: Tensor, zx: int, stride=1, padding=0, dilation=1, groups: int = 1
) -> Tensor:
    """Convolution (1-d or 2-d: x (N, C, *spatial) or unbatched (C, *spatial), w (O, C / groups,
    *kernel)) of raw uint8 codes with zero point ``zx`` and int8 weights: int64 (N, O, *out), or
    (O, *out) for an unbatched x. Numeric padding only."""
    _check(x, w)
    nsp = w.dim() - 2
    if nsp not in (1, 2) or x.dim() not in (nsp + 1, nsp + 2):
        raise ValueError(
            f"conv{nsp}d needs a {nsp + 1}-d or {nsp + 2}-d input, got {tuple(x.shape)}"
        )
    if x.dim() == nsp + 1:
        return pair_saturated_conv(x[None], w, zx, stride, padding, dilation, groups)[0]
    if isinstance(padding, str):
        raise ValueError("pair-saturated convolutions take numeric padding")
    if nsp == 1:
        x, w = x.unsqueeze(2), w.unsqueeze(2)
        stride, padding, dilation = (1, _one(stride)), (0, _one(padding)), (1, _one(dilation))
    stride, padding, dilation = (per_axis(v, 2) for v in (stride, padding, dilation))
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c != cg * groups or o % groups:
        raise ValueError(f"weight {tuple(w.shape)} does not fit input {tuple(x.shape)}")
    if is_depthwise(c, o, groups):
        acc = F.conv2d(
            x.to(torch.float64) - zx,
            w.to(torch.float64),
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
        )  # products <= 2**15, K = kh * kw terms: exact in float64 for any kernel below 2**38
        acc = acc.round().to(torch.int64)
    else:
        xp = F.pad(
            x.to(torch.int16),
            (padding[1], padding[1], padding[0], padding[0]),
            value=int(zx),
        )
        oh = (xp.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        ow = (xp.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        og = o // groups

        def tap(g: int, k: int) -> Tensor:
            """Input codes read by K position k of group g: (N * OH * OW,)."""
            i, j, ch = k // (kw * cg), (k // cg) % kw, g * cg + k % cg
            return xp[
                :,
                ch,
                i * dilation[0] : i * dilation[0] + stride[0] * (oh - 1) + 1 : stride[0],
                j * dilation[1] : j * dilation[1] + stride[1] * (ow - 1) + 1 : stride[1],
            ].reshape(-1)

        # the bound of every tap of a channel: its largest code, the padding's zx included
        chan_max = xp.amax((0, 2, 3)).to(torch.int32)
        wk = [w[g * og : (g + 1) * og].permute(2, 3, 1, 0).reshape(-1, og) for g in range(groups)]
        xmax = [chan_max[g * cg : (g + 1) * cg].repeat(kh * kw) for g in range(groups)]
        risky = [_risky_pairs(m, wg) for m, wg in zip(xmax, wk, strict=True)]
        if (
            sum(r[0].numel() for r in risky)
            > DENSE_PAIR_FRACTION * groups * ((kh * kw * cg + 1) // 2) * og
        ):
            acc = _conv_by_rows(wk, zx, n, oh, ow, tap)
        else:
            # the centred codes: the padding's zx reads 0
            acc = exact_conv2d(centred_codes(x, zx), w, stride, padding, dilation, groups)
            for g, ((pair, col, w_even, w_odd), wg) in enumerate(zip(risky, wk, strict=True)):
                if pair.numel() == 0:
                    continue
                ks = torch.unique(torch.cat([2 * pair, 2 * pair + 1]))  # the taps read, sorted
                zero = torch.zeros(n * oh * ow, dtype=torch.int16)  # an odd K's padded term
                cols = torch.stack([tap(g, k) if k < wg.shape[0] else zero for k in ks.tolist()], 1)
                ie, io = torch.searchsorted(ks, 2 * pair), torch.searchsorted(ks, 2 * pair + 1)
                corr = torch.zeros(n * oh * ow, og, dtype=torch.int64)
                _add_corrections(corr, cols, ie, io, col, w_even, w_odd)
                acc[:, g * og : (g + 1) * og] += corr.reshape(n, oh, ow, og).permute(0, 3, 1, 2)
    return acc.squeeze(2) if nsp == 1 else acc


def _one(v):
    return v[0] if isinstance(v, (tuple, list)) else v
