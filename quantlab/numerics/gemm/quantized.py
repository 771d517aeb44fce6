"""Quantized GEMM ops: the exact integer sum (``exact``), then ``finish_gemm`` under a
``GemmContract`` (bias, accumulator, requantization). They read the contract only; a platform
composes it (``PlatformConfig.gemm_contract()``).

Asymmetric activations: the input's zero point is taken out exactly before the sum
(``centre_codes``: x - zx as int16 codes, |x - zx| <= 255 for int8 / uint8), so the sum is
sum w * (x - zx) and a convolution's zero padding is padding with zx (what TFLite's skipped
taps and ONNX Runtime's zx padding compute); the output's zero point is added after
requantization (``finish_gemm``). Weights are symmetric.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.contract import GemmContract
from quantlab.numerics.dtypes import DType
from quantlab.numerics.gemm.exact import int_conv1d, int_conv2d, int_linear, int_matmul
from quantlab.numerics.gemm.finish import GemmStats, finish_gemm
from quantlab.numerics.gemm.pair_saturation import pair_saturated_conv, pair_saturated_matmul
from quantlab.numerics.gemm.transposed import int_conv_transpose
from quantlab.numerics.quantize import check_zero_point


def centre_codes(x: Tensor, zero_point: int = 0) -> Tensor:
    """x - zero_point as exact GEMM operand codes: int8/int16 codes with zero point 0 as they
    are; uint8 codes, or int8 codes with a zero point, as int16 (|x - zp| <= 255). An int16
    operand must have zero point 0 (ValueError)."""
    if x.dtype == torch.uint8:
        dt = DType.UINT8
    elif x.dtype in (torch.int8, torch.int16):
        dt = DType.INT8 if x.dtype == torch.int8 else DType.INT16
    else:
        raise TypeError(f"GEMM activation codes must be int8, uint8 or int16, got {x.dtype}")
    zp = check_zero_point(zero_point, dt)
    if dt is DType.INT16 and zp:
        raise ValueError(f"int16 GEMM activations are symmetric (zero point 0), got {zp}")
    if dt is not DType.UINT8 and not zp:
        return x
    return x.to(torch.int16) - zp


def check_gemm_operands(x: Tensor, w: Tensor, contract: GemmContract) -> None:
    """Reject more int16 operands than ``contract.max_int16_gemm_operands`` allows (s.6)."""
    n16 = int(x.dtype == torch.int16) + int(w.dtype == torch.int16)
    if n16 > contract.max_int16_gemm_operands:
        raise ValueError(
            f"a GEMM with {n16} int16 operands is not available under this contract "
            f"(max_int16_gemm_operands={contract.max_int16_gemm_operands}); "
            "use int8 for one operand"
        )


def _finish(acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, axis, zy=0):
    stats = GemmStats()
    out = finish_gemm(
        acc,
        x_scale,
        w_scale,
        bias,
        out_scale,
        out_dtype,
        contract,
        axis,
        stats,
        reuse_acc=True,
        out_zero_point=zy,
    )
    return out, stats


def _pairs(contract: GemmContract, x_codes: Tensor, w_codes: Tensor) -> bool:
    """Whether this GEMM sums saturated product pairs (``contract.u8s8_pair_saturation`` with
    uint8 activations and int8 weights)."""
    return (
        contract.u8s8_pair_saturation
        and x_codes.dtype == torch.uint8
        and w_codes.dtype == torch.int8
    )


def _conv_sums(x_codes, w_codes, zx, stride, padding, dilation, groups, contract, nsp: int):
    """Exact centred sums of a convolution, or the pair-saturated ones the contract asks for."""
    if _pairs(contract, x_codes, w_codes):
        return pair_saturated_conv(x_codes, w_codes, zx, stride, padding, dilation, groups)
    exact = int_conv2d if nsp == 2 else int_conv1d
    return exact(centre_codes(x_codes, zx), w_codes, stride, padding, dilation, groups)


def _matmul_sums(x_codes: Tensor, w_codes: Tensor, zx: int, contract: GemmContract) -> Tensor:
    """Exact centred sums of x @ w, or the pair-saturated ones (w of one or two dimensions)."""
    if _pairs(contract, x_codes, w_codes):
        if w_codes.dim() > 2:
            raise ValueError(
                "u8s8_pair_saturation takes a weight of one or two dimensions, got shape "
                f"{tuple(w_codes.shape)}"
            )
        if w_codes.dim() == 1:
            return pair_saturated_matmul(x_codes, w_codes.unsqueeze(1), zx).squeeze(-1)
        return pair_saturated_matmul(x_codes, w_codes, zx)
    return int_matmul(centre_codes(x_codes, zx), w_codes)


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
    zero_points: tuple[int, int] = (0, 0),
) -> tuple[Tensor, GemmStats]:
    """Quantized conv2d: exact ``int_conv2d`` then ``finish_gemm`` (output channels on dim 1).

    w_scale: scalar or per output channel (O,); bias: float (O,), integer codes, or None;
    ``zero_points`` = (input's, output's); x_codes int8, uint8 or int16.
    """
    check_gemm_operands(x_codes, w_codes, contract)
    acc = _conv_sums(
        x_codes, w_codes, zero_points[0], stride, padding, dilation, groups, contract, 2
    )
    axis = 1 if acc.dim() == 4 else 0
    return _finish(
        acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, axis, zero_points[1]
    )


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
    zero_points: tuple[int, int] = (0, 0),
) -> tuple[Tensor, GemmStats]:
    """Quantized conv1d: exact ``int_conv1d`` then ``finish_gemm`` (output channels on dim 1);
    ``zero_points`` as qconv2d."""
    check_gemm_operands(x_codes, w_codes, contract)
    acc = _conv_sums(
        x_codes, w_codes, zero_points[0], stride, padding, dilation, groups, contract, 1
    )
    axis = 1 if acc.dim() == 3 else 0
    return _finish(
        acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, axis, zero_points[1]
    )


def qconv_transpose(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    contract: GemmContract,
    stride=1,
    padding=0,
    output_padding=0,
    groups: int = 1,
    dilation=1,
    zero_points: tuple[int, int] = (0, 0),
) -> tuple[Tensor, GemmStats]:
    """Quantized conv_transpose1d / conv_transpose2d (by ``w_codes``' rank, (C, O / groups,
    *kernel)): exact ``int_conv_transpose`` then ``finish_gemm`` (output channels on dim 1).
    w_scale: scalar or per output channel (O,); ``zero_points`` as qconv2d."""
    check_gemm_operands(x_codes, w_codes, contract)
    xc = centre_codes(x_codes, zero_points[0])
    acc = int_conv_transpose(xc, w_codes, stride, padding, output_padding, groups, dilation)
    axis = 1 if acc.dim() == w_codes.dim() else 0
    return _finish(
        acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, axis, zero_points[1]
    )


def qlinear(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    contract: GemmContract,
    zero_points: tuple[int, int] = (0, 0),
) -> tuple[Tensor, GemmStats]:
    """Quantized linear: exact x @ w.T, w (out, in) with per-out-channel scales on the last dim;
    ``zero_points`` as qconv2d."""
    check_gemm_operands(x_codes, w_codes, contract)
    if _pairs(contract, x_codes, w_codes):
        acc = _matmul_sums(x_codes, w_codes.t(), zero_points[0], contract)
    else:
        acc = int_linear(centre_codes(x_codes, zero_points[0]), w_codes)
    return _finish(acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, -1, zero_points[1])


def qmatmul(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    contract: GemmContract,
    zero_points: tuple[int, int] = (0, 0),
) -> tuple[Tensor, GemmStats]:
    """Quantized matmul x @ w (torch.matmul shapes); a 1-d w_scale is per column of w (last dim);
    ``zero_points`` as qconv2d (x's and the output's; w is symmetric).

    For int16 operands on J6 apply ``clamp_int16_operand`` and ``coarsen_int16_matmul_scale``
    first (the simulator does this when quantizing the operands).
    """
    check_gemm_operands(x_codes, w_codes, contract)
    acc = _matmul_sums(x_codes, w_codes, zero_points[0], contract)
    return _finish(acc, x_scale, w_scale, bias, out_scale, out_dtype, contract, -1, zero_points[1])
