"""Exact integer GEMM (conv1d/conv2d, linear, batched matmul) for int8/int16 operand codes.

Every function returns the exact sum of products (int64; optionally the int32 or float32 tensor
a fast path computed them in). The fast paths run torch's int8 matrix product with int32 sums
(int8 matmuls and convolutions with one group; int16 operands as their int8 halves), a C loop
with int32 sums (depthwise convolutions) or float BLAS on integer-valued tensors, and are exact
by a bound, not by luck (``plan``; bit-exact-emulation s.2.1). Each call on a float path pins
torch's float precision for the kernels it runs and restores the caller's (``precision``;
the integer paths run no float kernel), and runs ``quantlab.numerics.selftest`` once per process
before its first product: AUTO stops using a path that fails it (with a warning). AUTO takes
the int8 matrix product only where it is faster than the float32 one on this machine
(``int8_speed``, measured once per process; the bits are the same either way). Thread counts
are left to the caller.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics.gemm import depthwise_native
from quantlab.numerics.gemm.int8_speed import int8_product_pays
from quantlab.numerics.gemm.kernels import conv_planned, matmul_planned
from quantlab.numerics.gemm.plan import (
    OPERAND_DTYPES,
    GemmPath,
    GemmPlan,
    depthwise_choice,
    int_product_conv,
    operand_bound,
    plan_gemm,
    plan_matmul,
    split_pays,
)
from quantlab.numerics.gemm.precision import exact_float_kernels
from quantlab.numerics.selftest import ensure_selftest

INT8_PRODUCT_PATHS = frozenset({GemmPath.INT32, GemmPath.INT32_SPLIT})
# paths that run no float kernel, so torch's float precision needs no pinning around them
INTEGER_PATHS = INT8_PRODUCT_PATHS | {GemmPath.INT32_DEPTHWISE, GemmPath.INT64}


def auto_excluded() -> frozenset[GemmPath]:
    """The paths AUTO does not take in this process: those that failed the start-up self-test,
    INT32 / INT32_SPLIT where the int8 matrix product is slower than the float32 product
    (``int8_speed``), and INT32_DEPTHWISE where its C kernels cannot be built (a forced one
    then runs torch's int64 convolution: the same bits). A forced path is run as asked."""
    excluded = set(ensure_selftest())
    if not int8_product_pays():
        excluded |= INT8_PRODUCT_PATHS
    if not depthwise_native.available():
        excluded.add(GemmPath.INT32_DEPTHWISE)
    return frozenset(excluded)


def _precision_for(plan: GemmPlan, device_type: str):
    """The context a planned GEMM runs in: torch's float precision pinned for a float path
    (``exact_float_kernels``), nothing for an integer path (it runs no float kernel)."""
    if plan.path in INTEGER_PATHS:
        return contextlib.nullcontext()
    return exact_float_kernels(device_type)


def _check_operand(t: Tensor, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int8/int16 codes, got {type(t)}")
    if t.dtype not in OPERAND_DTYPES:
        raise TypeError(f"{name} must hold int8 or int16 codes, got {t.dtype}")


def int_matmul(
    a: Tensor,
    b: Tensor,
    path: GemmPath = GemmPath.AUTO,
    as_int64: bool = True,
    b_float32: Tensor | None = None,
) -> Tensor:
    """Exact a @ b (torch.matmul semantics: 1-d, 2-d and broadcast batches) as int64.

    Operands: int8/int16 code tensors. Exactness: see the module docstring (no saturation, no
    wrap; apply ``accumulate`` for the device's int32 contract). ``as_int64=False``: a
    single-chunk float32 path returns its float32 result as it is (exact integers below 2**24),
    the INT32 path its int32 result.
    ``b_float32``: b's codes cast to float32 once by the caller (the float32 paths use it
    instead of casting b on every call).
    """
    _check_operand(a, "a")
    _check_operand(b, "b")
    _check_float32_copy(b, b_float32, "b_float32")
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError("int_matmul needs tensors with at least one dimension")
    k = a.shape[-1]
    kb = b.shape[0] if b.dim() == 1 else b.shape[-2]
    if k != kb:
        raise ValueError(
            f"int_matmul shapes {tuple(a.shape)} and {tuple(b.shape)} do not match: "
            f"a has K={k} columns, b has {kb} rows"
        )
    disabled = auto_excluded()
    plan = plan_matmul(a, b, path, disabled)
    measured = operand_bound(b) if path is GemmPath.AUTO else None  # a forced path keeps chunks
    with _precision_for(plan, a.device.type):
        return matmul_planned(a, b, k, plan, as_int64, b_float32, measured)


def _check_float32_copy(codes: Tensor, copy: Tensor | None, name: str) -> None:
    if copy is not None and (copy.shape != codes.shape or copy.dtype != torch.float32):
        raise ValueError(
            f"{name} must be the codes as float32 with shape {tuple(codes.shape)}, got "
            f"{copy.dtype} {tuple(copy.shape)}"
        )


def int_linear(
    x: Tensor,
    w: Tensor,
    path: GemmPath = GemmPath.AUTO,
    as_int64: bool = True,
    w_float32: Tensor | None = None,
) -> Tensor:
    """Exact x @ w.T as int64 (F.linear without bias): x (..., in), w (out, in) codes.
    ``as_int64``: as int_matmul; ``w_float32``: w's codes cast to float32 once by the caller."""
    _check_operand(w, "w")
    if w.dim() != 2:
        raise ValueError(f"int_linear weight must be 2-d (out, in), got shape {tuple(w.shape)}")
    _check_operand(x, "x")
    if x.dim() == 0 or x.shape[-1] != w.shape[1]:
        raise ValueError(
            f"int_linear input {tuple(x.shape)} does not match weight {tuple(w.shape)}: "
            f"last dim must be {w.shape[1]}"
        )
    _check_float32_copy(w, w_float32, "w_float32")
    wt32 = None if w_float32 is None else w_float32.t()
    return int_matmul(x, w.t(), path, as_int64, wt32)


@dataclass(frozen=True, eq=False)
class PreparedConv:
    """An exact convolution checked (and, for int8 input codes, planned) once for one input
    shape and dtype and one weight (``prepare_conv``); calling it on input codes of that shape
    and dtype runs only the planned kernels. Same contract and bits as ``int_conv2d`` /
    ``int_conv1d`` (which prepare one and call it).
    """

    x_shape: tuple[int, ...]
    x_dtype: torch.dtype
    w: Tensor
    w_float32: Tensor | None
    conv: Callable[..., Tensor]
    kw: dict
    groups: int
    cin_g: int
    unbatched: bool
    w_bound: int
    unit: int
    split_a: bool
    path: GemmPath
    disabled: frozenset
    plan: GemmPlan | None  # None: int16 input codes, planned per call from their max|x|
    int_product: tuple | None = None  # the operand dtypes of an INT32 / INT32_SPLIT product
    depthwise: bool = False  # a convolution the INT32_DEPTHWISE kernel runs

    def __call__(self, x: Tensor, as_int64: bool = True) -> Tensor:
        """Exact sums of ``x`` (codes of the prepared shape and dtype) with the weight: int64,
        or with ``as_int64=False`` a single-chunk float32 result (exact integers) or the INT32
        path's int32 result as it is."""
        if x.dtype != self.x_dtype or tuple(x.shape) != self.x_shape:
            raise ValueError(
                f"this prepared convolution takes {self.x_dtype} codes of shape "
                f"{self.x_shape}, got {x.dtype} {tuple(x.shape)}"
            )
        if self.unbatched:
            x = x.unsqueeze(0)
        plan = self.plan
        if plan is None:
            plan = plan_gemm(
                operand_bound(x),
                self.w_bound,
                self.cin_g,
                self.unit,
                self.path,
                split_a=self.split_a,
                disabled=self.disabled,
                int_product=self.int_product,
                depthwise=self.depthwise,
            )
        w_max = self.w_bound if self.path is GemmPath.AUTO else None
        args = (x, self.w, self.conv, self.kw, self.groups, self.cin_g, plan, self.w_float32, w_max)
        with _precision_for(plan, x.device.type):
            out = conv_planned(*args)
        if as_int64:
            out = out.to(torch.int64)
        return out.squeeze(0) if self.unbatched else out


def prepare_conv(
    x_shape: tuple[int, ...],
    x_dtype: torch.dtype,
    w: Tensor,
    nsp: int,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    path: GemmPath = GemmPath.AUTO,
    w_float32: Tensor | None = None,
) -> PreparedConv:
    """Check a conv{nsp}d of int8/int16 input codes of ``x_shape`` / ``x_dtype`` with weight
    codes ``w`` (zero padding, no bias) and plan it once (``plan_conv``; int8 inputs need no
    data for their bound, int16 inputs are planned per call from their measured max|x|).
    Raises ValueError / TypeError naming the operand that does not fit."""
    if x_dtype not in OPERAND_DTYPES:
        raise TypeError(f"x must hold int8 or int16 codes, got {x_dtype}")
    _check_operand(w, "w")
    if w.dim() != nsp + 2:
        raise ValueError(f"conv{nsp}d weight must be {nsp + 2}-d, got shape {tuple(w.shape)}")
    x_shape = tuple(x_shape)
    unbatched = len(x_shape) == nsp + 1
    batched = (1, *x_shape) if unbatched else x_shape
    if len(batched) != nsp + 2:
        raise ValueError(
            f"conv{nsp}d input must be {nsp + 1}-d or {nsp + 2}-d, got {len(x_shape)}-d"
        )
    if groups < 1 or batched[1] % groups or w.shape[0] % groups:
        raise ValueError(
            f"groups={groups} must divide input channels {batched[1]} and output channels "
            f"{w.shape[0]}"
        )
    cin_g = batched[1] // groups
    if w.shape[1] != cin_g:
        raise ValueError(
            f"conv{nsp}d weight {tuple(w.shape)} expects {w.shape[1] * groups} input channels "
            f"with groups={groups}, input has {batched[1]}"
        )
    _check_float32_copy(w, w_float32, "w_float32")
    disabled = auto_excluded()
    macs = math.prod(batched) * (w.shape[0] // groups) * math.prod(w.shape[2:])  # conv_macs
    split_a = split_pays(macs, groups) or path is GemmPath.FLOAT32_SPLIT
    unit = math.prod(w.shape[2:])
    w_bound = operand_bound(w)
    plan = None
    int_product = int_product_conv(batched, x_dtype, w, stride, padding, dilation, groups)
    depthwise, disabled = depthwise_choice(
        batched, x_dtype, w, stride, padding, dilation, groups, disabled
    )
    if x_dtype == torch.int8:  # operand_bound of int8 codes is their dtype bound: no data
        plan = plan_gemm(
            128,
            w_bound,
            cin_g,
            unit,
            path,
            split_a=split_a,
            disabled=disabled,
            int_product=int_product,
            depthwise=depthwise,
        )
    conv = F.conv2d if nsp == 2 else F.conv1d
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    return PreparedConv(
        x_shape,
        x_dtype,
        w,
        w_float32,
        conv,
        kw,
        groups,
        cin_g,
        unbatched,
        w_bound,
        unit,
        split_a,
        path,
        disabled,
        plan,
        int_product,
        depthwise,
    )


def _conv_exact(
    x: Tensor,
    w: Tensor,
    nsp: int,
    stride,
    padding,
    dilation,
    groups: int,
    path: GemmPath,
    w_float32: Tensor | None,
    as_int64: bool,
) -> Tensor:
    _check_operand(x, "x")
    conv = prepare_conv(
        tuple(x.shape), x.dtype, w, nsp, stride, padding, dilation, groups, path, w_float32
    )
    return conv(x, as_int64)


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
    returns its float32 result as it is (exact integers below 2**24; one widening pass saved),
    the INT32 path (int8 convolutions with one group) its int32 result.
    """
    return _conv_exact(x, w, 2, stride, padding, dilation, groups, path, w_float32, as_int64)


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
    return _conv_exact(x, w, 1, stride, padding, dilation, groups, path, w_float32, as_int64)
