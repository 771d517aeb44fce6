"""Fixed-mode GEMM operands: their codes as the integer GEMM takes them (centred on a zero
point, J6's int16 operand rules) and the magnitude the exact-sum bound assumes. (A convolution
call's parameters: ``args.conv_params``.)"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics import gemm
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import dequantize, quantize
from quantlab.simulate import fixed_common as fc


def prepare_int16(sim, codes: Tensor, scale: Tensor, dtype: DType, k: int, matmul: bool):
    """J6 int16 GEMM operands: coarsen a matmul operand's scale by max(32767/32639, sqrt(K/2))
    (requantizing its codes once, half to even) and clamp to the usable int16 range (s.6)."""
    coarse = int16_scale(sim.platform, scale, dtype, k, matmul)
    return int16_codes(sim.platform, codes, scale, coarse, dtype), (
        scale if coarse is None else coarse
    )


def int16_scale(p, scale: Tensor, dtype: DType, k: int, matmul: bool) -> Tensor | None:
    """The coarsened scale of an int16 matmul operand (``prepare_int16``), or None where the
    operand keeps its scale. A function of the scale object, K and the platform alone."""
    if dtype is DType.INT16 and matmul and p.int16_matmul_coarsen:
        return gemm.coarsen_int16_matmul_scale(scale, k, p.int16_operand_max)
    return None


def int16_codes(p, codes: Tensor, scale: Tensor, coarse: Tensor | None, dtype: DType) -> Tensor:
    """An operand's GEMM codes (``prepare_int16``): int8 codes (or centred int8 codes, int16)
    as they are; int16 codes requantized to ``coarse`` (when not None, half to even) and
    clamped to the usable int16 range."""
    if dtype is not DType.INT16:  # int8, or int8 centred on its zero point (int16)
        return codes if codes.dtype == torch.int16 else codes.to(dtype.torch_dtype)
    if coarse is not None:
        codes = quantize(dequantize(codes, scale), coarse, DType.INT16, p.fake_round)
    return gemm.clamp_int16_operand(codes.to(torch.int16), p.int16_operand_max)


def operand_codes(args, kwargs, slot, info) -> Tensor:
    """GEMM operand codes: int8/int16 codes as they are; int8 codes with a zero point centred
    on it, as int16 (|x - zx| <= 255; ``numerics.gemm.centre_codes``)."""
    codes = fc.codes(args, kwargs, slot, info)
    return gemm.centre_codes(codes, info.zero_point) if info.zero_point else codes


def magnitude(info, dtype: DType | None = None) -> int:
    """The largest |operand code| + 1 the exact-sum bound assumes (256 for centred int8)."""
    if info is not None and info.zero_point:
        return 256
    return (info.dtype if info is not None else dtype).qmax + 1
