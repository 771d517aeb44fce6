"""Exact integer GEMM (conv1d/conv2d, linear, batched matmul) for int8/int16 operand codes.

Every function returns the exact sum of products (int64; optionally a float32 tensor holding
those exact integers). The fast paths run float BLAS on integer-valued tensors and are exact by
a bound, not by luck (``plan``; bit-exact-emulation s.2.1). Each call pins torch's float
precision for the kernels it runs and restores the caller's (``precision``), and runs
``quantlab.numerics.selftest`` once per process before its first product: AUTO stops using a
path that fails it (with a warning). Thread counts are left to the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics.gemm.kernels import conv_planned, matmul_planned
from quantlab.numerics.gemm.plan import (
    OPERAND_DTYPES,
    GemmPath,
    operand_bound,
    plan_conv,
    plan_gemm,
)
from quantlab.numerics.gemm.precision import exact_float_kernels
from quantlab.numerics.selftest import ensure_selftest


def _check_operand(t: Tensor, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int8/int16 codes, got {type(t)}")
    if t.dtype not in OPERAND_DTYPES:
        raise TypeError(f"{name} must hold int8 or int16 codes, got {t.dtype}")


def int_matmul(a: Tensor, b: Tensor, path: GemmPath = GemmPath.AUTO) -> Tensor:
    """Exact a @ b (torch.matmul semantics: 1-d, 2-d and broadcast batches) as int64.

    Operands: int8/int16 code tensors. Exactness: see the module docstring (no saturation, no
    wrap; apply ``accumulate`` for the device's int32 contract).
    """
    _check_operand(a, "a")
    _check_operand(b, "b")
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError("int_matmul needs tensors with at least one dimension")
    k = a.shape[-1]
    kb = b.shape[0] if b.dim() == 1 else b.shape[-2]
    if k != kb:
        raise ValueError(
            f"int_matmul shapes {tuple(a.shape)} and {tuple(b.shape)} do not match: "
            f"a has K={k} columns, b has {kb} rows"
        )
    disabled = ensure_selftest()
    plan = plan_gemm(operand_bound(a), operand_bound(b), k, 1, path, disabled=disabled)
    with exact_float_kernels(a.device.type):
        return matmul_planned(a, b, k, plan)


def int_linear(x: Tensor, w: Tensor, path: GemmPath = GemmPath.AUTO) -> Tensor:
    """Exact x @ w.T as int64 (F.linear without bias): x (..., in), w (out, in) codes."""
    _check_operand(w, "w")
    if w.dim() != 2:
        raise ValueError(f"int_linear weight must be 2-d (out, in), got shape {tuple(w.shape)}")
    _check_operand(x, "x")
    if x.dim() == 0 or x.shape[-1] != w.shape[1]:
        raise ValueError(
            f"int_linear input {tuple(x.shape)} does not match weight {tuple(w.shape)}: "
            f"last dim must be {w.shape[1]}"
        )
    return int_matmul(x, w.t(), path)


def _conv_exact(
    x: Tensor,
    w: Tensor,
    nsp: int,
    conv: Callable[..., Tensor],
    stride,
    padding,
    dilation,
    groups: int,
    path: GemmPath,
    w_float32: Tensor | None,
    as_int64: bool,
) -> Tensor:
    _check_operand(x, "x")
    _check_operand(w, "w")
    if w.dim() != nsp + 2:
        raise ValueError(f"conv{nsp}d weight must be {nsp + 2}-d, got shape {tuple(w.shape)}")
    unbatched = x.dim() == nsp + 1
    if unbatched:
        x = x.unsqueeze(0)
    if x.dim() != nsp + 2:
        raise ValueError(f"conv{nsp}d input must be {nsp + 1}-d or {nsp + 2}-d, got {x.dim()}-d")
    if groups < 1 or x.shape[1] % groups or w.shape[0] % groups:
        raise ValueError(
            f"groups={groups} must divide input channels {x.shape[1]} and output channels "
            f"{w.shape[0]}"
        )
    cin_g = x.shape[1] // groups
    if w.shape[1] != cin_g:
        raise ValueError(
            f"conv{nsp}d weight {tuple(w.shape)} expects {w.shape[1] * groups} input channels "
            f"with groups={groups}, input has {x.shape[1]}"
        )
    if w_float32 is not None and (w_float32.shape != w.shape or w_float32.dtype != torch.float32):
        raise ValueError(
            f"w_float32 must be w's codes as float32 with shape {tuple(w.shape)}, got "
            f"{w_float32.dtype} {tuple(w_float32.shape)}"
        )
    disabled = ensure_selftest()
    plan = plan_conv(x, w, groups, path, disabled=disabled)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    with exact_float_kernels(x.device.type):
        out = conv_planned(x, w, conv, kw, groups, cin_g, plan, w_float32)
    if as_int64:
        out = out.to(torch.int64)
    return out.squeeze(0) if unbatched else out


def int_conv2d(
    x: Tensor,
    w: Tensor,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
    path: GemmPath = GemmPath.AUTO,
    w_float32: Tensor | None = None,
    as_int64: bool = True,
) -> Tensor:
    """Exact F.conv2d (zero padding, no bias) of int8/int16 codes as int64.

    x: (N, C, H, W) or (C, H, W); w: (O, C/groups, kh, kw). Chunks split input channels.
    ``w_float32``: w's codes cast to float32 once by the caller (the float32 paths use it
    instead of casting w on every call). ``as_int64=False``: a single-chunk float32 path
    returns its float32 result as it is (exact integers below 2**24; one widening pass saved).
    """
    return _conv_exact(
        x, w, 2, F.conv2d, stride, padding, dilation, groups, path, w_float32, as_int64
    )


def int_conv1d(
    x: Tensor,
    w: Tensor,
    stride: int | tuple[int] = 1,
    padding: int | tuple[int] | str = 0,
    dilation: int | tuple[int] = 1,
    groups: int = 1,
    path: GemmPath = GemmPath.AUTO,
    w_float32: Tensor | None = None,
    as_int64: bool = True,
) -> Tensor:
    """Exact F.conv1d (zero padding, no bias) of int8/int16 codes as int64.

    x: (N, C, L) or (C, L); w: (O, C/groups, k). ``w_float32``, ``as_int64``: as int_conv2d.
    """
    return _conv_exact(
        x, w, 1, F.conv1d, stride, padding, dilation, groups, path, w_float32, as_int64
    )
