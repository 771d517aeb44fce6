"""Shared pieces of the fixed-point kernels: operand codes, constants, requantization, and
the (value, QInfo) a kernel returns (value == codes * scale exactly)."""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics import gemm
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import Requant, make_requant, requantize
from quantlab.simulate import args as A
from quantlab.simulate.qtensor import QInfo

CONST_DTYPE = DType.INT16  # scalar constants are int16 codes at scale |c| / 32767 (assumed)


def int_info(info) -> bool:
    return info is not None and info.dtype.is_int and info.dtype is not DType.INT32


def codes(args, kwargs, slot, info) -> Tensor:
    """The operand's integer codes in its dtype's torch dtype (int8/int16)."""
    return info.codes_native(A.get(args, kwargs, slot))


def emit(codes: Tensor, scale: Tensor, dtype: DType) -> tuple[Tensor, QInfo]:
    """(codes * scale as float32, QInfo): one float32 product per element (``dequantize``)."""
    codes = codes.to(dtype.torch_dtype)
    s = torch.as_tensor(scale, dtype=torch.float32).reshape(())
    return codes.to(torch.float32).mul_(s), QInfo(dtype, s, codes)


def out_scale(sim, call, rq) -> Tensor:
    return sim.act_scale(call.name, "out", rq.output_dtype, rq)


def requant(sim, acc: Tensor, real: Tensor, out: DType, axis: int | None = None) -> Tensor:
    """acc (int32 values) * real -> ``out`` codes by the platform's requantization."""
    p = sim.platform
    acc32, _ = gemm.accumulate(acc.to(torch.int64), p.accumulator, p.accumulator_overflow)
    params = make_requant(real, p.requant, p.requant_mult_bits)
    return requantize(acc32, params, out, p.requant_round, axis=axis)


def ratio(sim, num: float | Tensor, den: float | Tensor) -> Tensor:
    """num / den as the platform's requantization forms a real multiplier (float32 for
    FLOAT_RESCALE, float64 otherwise)."""
    if sim.platform.requant is Requant.FLOAT_RESCALE:
        return torch.as_tensor(num, dtype=torch.float32) / torch.as_tensor(den, dtype=torch.float32)
    n = torch.as_tensor(num, dtype=torch.float32).to(torch.float64)
    return n / torch.as_tensor(den, dtype=torch.float32).to(torch.float64)


def const(c: float) -> tuple[Tensor, Tensor]:
    """A scalar constant as (int64 code, float32 scale): code +-32767, scale |c| / 32767."""
    s = torch.tensor(abs(c) / CONST_DTYPE.qmax, dtype=torch.float32)
    code = torch.tensor(CONST_DTYPE.qmax if c > 0 else -CONST_DTYPE.qmax, dtype=torch.int64)
    return code, s


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


def clamp_output(res: tuple, bounds: tuple) -> tuple:
    """Apply a fused relu6/clamp to a GEMM result: on the output codes, at the bounds rounded
    half to even to output codes (the clamp a fused conv-relu6 does after requantization)."""
    value, info = res
    lo, hi = bounds
    if info is None or not info.dtype.is_int or info.codes is None:
        return torch.clamp(value, lo, hi), info
    s = float(info.scale)
    codes = info.codes.to(torch.int64)
    if lo is not None:
        codes = codes.clamp_min(int(round(float(lo) / s)))
    if hi is not None:
        codes = codes.clamp_max(int(round(float(hi) / s)))
    return emit(codes, info.scale, info.dtype)
