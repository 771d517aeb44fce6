"""Shared pieces of the fixed-point kernels: operand codes, constants, requantization, and
the (value, QInfo) a kernel returns (value == codes * scale exactly). The arithmetic is
``quantlab.numerics``; these helpers pick the platform's parameters."""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.contract import requantize_accumulator
from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import bound_codes, constant_codes, dequantize
from quantlab.numerics.requant import rescale_multiplier
from quantlab.simulate import args as A
from quantlab.simulate.qtensor import QInfo


def int_info(info) -> bool:
    return info is not None and info.dtype.is_int and info.dtype is not DType.INT32


def codes(args, kwargs, slot, info) -> Tensor:
    """The operand's integer codes in its dtype's torch dtype (int8/int16)."""
    return info.codes_native(A.get(args, kwargs, slot))


def emit(codes: Tensor, scale: Tensor, dtype: DType) -> tuple[Tensor, QInfo]:
    """(codes * scale as float32, QInfo): one float32 product per element (``dequantize``)."""
    codes = codes.to(dtype.torch_dtype)
    s = torch.as_tensor(scale, dtype=torch.float32).reshape(())
    return dequantize(codes, s), QInfo(dtype, s, codes)


def out_scale(sim, call, rq) -> Tensor:
    return sim.act_scale(call.name, "out", rq.output_dtype, rq)


def requant(sim, acc: Tensor, real: Tensor, out: DType, axis: int | None = None) -> Tensor:
    """acc (exact integers) * real -> ``out`` codes by the platform's accumulator and
    requantization (``numerics.contract.requantize_accumulator``)."""
    return requantize_accumulator(acc, real, out, sim.platform.gemm_contract(), axis)


def ratio(sim, num: float | Tensor, den: float | Tensor, count: int = 1) -> Tensor:
    """num / (den * count) as the platform's requantization forms a real multiplier
    (``numerics.requant.rescale_multiplier``)."""
    return rescale_multiplier(num, den, sim.platform.requant, count)


def const(c: float) -> tuple[Tensor, Tensor]:
    """A scalar constant as (int64 code, float32 scale) (``numerics.quantize.constant_codes``)."""
    return constant_codes(c)


def operand(args, kwargs, slot, info):
    """(codes int64, scale) of a tensor operand with integer quantization, or of a nonzero
    scalar constant; None when the operand is neither."""
    v = A.get(args, kwargs, slot)
    if isinstance(v, Tensor):
        if not int_info(info):
            return None
        return info.codes_of(v), info.scale
    if isinstance(v, (int, float)) and v != 0:
        return const(float(v))
    return None


def clamp_output(res: tuple, bounds: tuple, quotient_float32: bool = False) -> tuple:
    """Apply a fused relu6/clamp to a GEMM result: on the output codes, at the bounds rounded
    half to even to output codes (the clamp a fused conv-relu6 does after requantization;
    ``quotient_float32``: see ``bound_codes``)."""
    value, info = res
    lo, hi = bounds
    if info is None or not info.dtype.is_int or info.codes is None:
        return torch.clamp(value, lo, hi), info
    lo_c, hi_c = bound_codes(lo, hi, info.scale, info.dtype, quotient_float32)
    codes = info.codes.to(torch.int64).clamp_min(lo_c).clamp_max(hi_c)
    return emit(codes, info.scale, info.dtype)
