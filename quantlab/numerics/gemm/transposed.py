"""Exact transposed convolution (conv_transpose1d / conv_transpose2d) of int8/int16 codes.

Output element o sums w[c, o_c, t] * x[c, i] over the input channels c of o's group and the
kernel taps t that land on o, at most K = (C / groups) * prod(kernel) products; "padding"
crops the full output, so no padded tap enters a sum (an input's zero point is taken out by
``centre_codes`` before, and the sums stay exact). Every product and partial sum is an integer
of magnitude <= K * max|x| * max|w|: in float32 below 2**24, in float64 below 2**53, each is
exact in any summation order, so torch's float transposed convolution (direct, no transform,
IEEE precision pinned by ``exact_float_kernels``) returns the exact sums. Past 2**53 (never for
int8/int16 codes below 8.4 million terms) the sums run in int64 loops.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics.dtypes import FLOAT32_EXACT, FLOAT64_EXACT
from quantlab.numerics.gemm.exact import _check_operand
from quantlab.numerics.gemm.precision import exact_float_kernels


def transposed_terms(w: Tensor, groups: int) -> int:
    """K: the most products one output of a transposed convolution with weight ``w``
    (C, O / groups, *kernel) sums."""
    return (w.shape[0] // groups) * math.prod(w.shape[2:])


def _bound(t: Tensor) -> int:
    if t.numel() == 0:
        return 0
    return int(t.abs().max()) if t.dtype != torch.int8 else 128


def int_conv_transpose(
    x: Tensor,
    w: Tensor,
    stride=1,
    padding=0,
    output_padding=0,
    groups: int = 1,
    dilation=1,
    as_int64: bool = True,
) -> Tensor:
    """Exact F.conv_transpose1d / F.conv_transpose2d (by ``w``'s rank; no bias) of int8/int16
    codes: int64, or with ``as_int64=False`` the float32 / float64 tensor of exact integers.

    x: (N, C, *spatial) or (C, *spatial); w: (C, O / groups, *kernel); arguments as torch's.
    """
    _check_operand(x, "x")
    _check_operand(w, "w")
    nsp = w.dim() - 2
    if nsp not in (1, 2) or x.dim() not in (nsp + 1, nsp + 2):
        raise ValueError(
            f"a transposed convolution takes a 3-d or 4-d weight and an input of its rank "
            f"(or one less), got input {tuple(x.shape)} and weight {tuple(w.shape)}"
        )
    conv = F.conv_transpose2d if nsp == 2 else F.conv_transpose1d
    kw = dict(
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        groups=groups,
        dilation=dilation,
    )
    total = transposed_terms(w, groups) * _bound(x) * _bound(w)
    if total <= FLOAT32_EXACT:
        dt = torch.float32
    elif total <= FLOAT64_EXACT:
        dt = torch.float64
    else:
        raise ValueError(
            f"a transposed convolution summing up to {total} (> 2**53) has no exact float path"
        )
    with exact_float_kernels(x.device.type):
        out = conv(x.to(dt), w.to(dt), **kw)
    return out.to(torch.int64) if as_int64 else out
