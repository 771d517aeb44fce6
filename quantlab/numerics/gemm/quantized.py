"""Quantized GEMM ops: the exact integer sum (``exact``), then ``finish_gemm`` under a
``GemmContract`` (bias, accumulator, requantization). They read the contract only; a platform
composes it (``PlatformConfig.gemm_contract()``)."""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.contract import GemmContract
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm.exact import int_conv1d, int_conv2d, int_linear, int_matmul
from quantlab.numerics.gemm.finish import GemmStats, finish_gemm


def check_gemm_operands(x: Tensor, w: Tensor, contract: GemmContract) -> None:
    """Reject more int16 operands than ``contract.max_int16_gemm_operands`` allows (s.6)."""
    n16 = int(x.dtype == torch.int16) + int(w.dtype == torch.int16)
    if n16 > contract.max_int16_gemm_operands:
        raise ValueError(
            f"a GEMM with {n16} int16 operands is not available under this contract "
            f"(max_int16_gemm_operands={contract.max_int16_gemm_operands}); "
            "use int8 for one operand"
        )


def _finish(acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, axis):
    stats = GemmStats()
    out = finish_gemm(
        acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, axis, stats, reuse_acc=True
    )
    return out, stats


def qconv2d(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    contract: GemmContract,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> tuple[Tensor, GemmStats]:
    """Quantized conv2d: exact ``int_conv2d`` then ``finish_gemm`` (output channels on dim 1).

    w_scale: scalar or per output channel (O,); bias: float (O,) or None.
    """
    check_gemm_operands(x_codes, w_codes, contract)
    acc = int_conv2d(x_codes, w_codes, stride, padding, dilation, groups)
    axis = 1 if acc.dim() == 4 else 0
    return _finish(acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, axis)


def qconv1d(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    contract: GemmContract,
    stride: int | tuple[int] = 1,
    padding: int | tuple[int] | str = 0,
    dilation: int | tuple[int] = 1,
    groups: int = 1,
) -> tuple[Tensor, GemmStats]:
    """Quantized conv1d: exact ``int_conv1d`` then ``finish_gemm`` (output channels on dim 1)."""
    check_gemm_operands(x_codes, w_codes, contract)
    acc = int_conv1d(x_codes, w_codes, stride, padding, dilation, groups)
    axis = 1 if acc.dim() == 3 else 0
    return _finish(acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, axis)


def qlinear(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    contract: GemmContract,
) -> tuple[Tensor, GemmStats]:
    """Quantized linear: exact x @ w.T, w (out, in) with per-out-channel scales on the last dim."""
    check_gemm_operands(x_codes, w_codes, contract)
    acc = int_linear(x_codes, w_codes)
    return _finish(acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, -1)


def qmatmul(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    contract: GemmContract,
) -> tuple[Tensor, GemmStats]:
    """Quantized matmul x @ w (torch.matmul shapes); a 1-d w_scale is per column of w (last dim).

    For int16 operands on J6 apply ``clamp_int16_operand`` and ``coarsen_int16_matmul_scale``
    first (the simulator does this when quantizing the operands).
    """
    check_gemm_operands(x_codes, w_codes, contract)
    acc = int_matmul(x_codes, w_codes)
    return _finish(acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, -1)
