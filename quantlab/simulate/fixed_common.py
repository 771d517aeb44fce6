"""Shared pieces of the fixed-point kernels: operand codes, constants, requantization, and
the (value, QInfo) a kernel returns (value == codes * scale exactly). The arithmetic is
``quantlab.numerics``; these helpers pick the platform's parameters."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from quantlab.numerics.add_rules import add_left_shift, add_shared_shift
from quantlab.numerics.code_bounds import CONSTANT_DTYPE, BoundRule, bound_codes, constant_codes
from quantlab.numerics.contract import requantize_accumulator
from quantlab.numerics.dtypes import DType
from quantlab.numerics.fma_add import qlinear_add
from quantlab.numerics.product_requant import product_form, requantize_product
from quantlab.numerics.qlinear_mul import qlinear_mul
from quantlab.numerics.quantize import dequantize
from quantlab.numerics.requant import (
    INT32_MAX,
    int32_requant,
    make_requant,
    requant_scale,
    requantize_int32,
    rescale_multiplier,
)
from quantlab.numerics.scaled_add import add_constants, add_float_rescale, add_inter_scale
from quantlab.platforms import AddRule, FloatIslands, MulRule
from quantlab.simulate import args as A
from quantlab.simulate.qtensor import QInfo


def int_info(info) -> bool:
    """An int8/int16 operand with zero point 0 (what every integer kernel takes)."""
    return zp_info(info) and info.zero_point == 0


def zp_info(info) -> bool:
    """An int8/uint8/int16 operand, with or without a zero point (the kernels that take zero
    points: GEMMs on int8, add / sub, mul, pooling, means, cat / clamp, LUT ops on 8-bit codes,
    nearest resampling, grid_sample, softmax's exp table; the others fall back to float)."""
    return info is not None and info.dtype.is_int and info.dtype is not DType.INT32


def centred(args, kwargs, slot, info) -> Tensor:
    """The operand's codes minus its zero point (int64, exact)."""
    return info.codes_of(A.get(args, kwargs, slot)) - info.zero_point


def codes(args, kwargs, slot, info) -> Tensor:
    """The operand's integer codes in its dtype's torch dtype (int8/int16)."""
    return info.codes_native(A.get(args, kwargs, slot))


def emit(
    codes: Tensor, scale: Tensor, dtype: DType, zero_point: int = 0, value: Tensor | None = None
) -> tuple[Tensor, QInfo]:
    """((codes - zero_point) * scale as float32, QInfo): one float32 product per element
    (``dequantize``). ``value``: that product, already computed with the codes
    (``finish_gemm(with_values=True)``)."""
    codes = codes.to(dtype.torch_dtype)
    s = torch.as_tensor(scale, dtype=torch.float32)
    if s.dim():  # a 0-d scale passes as the same object (plan-time caches key on it)
        s = s.reshape(())
    if value is None and zero_point:
        value = dequantize(codes, s, zero_point=zero_point)
    elif value is None:  # the same float32 product; a vectorised cast then an in-place product
        value = codes.to(torch.float32, copy=True).mul_(s)
    return value, QInfo(dtype, s, codes, zero_point)


def out_scale(sim, call, rq) -> Tensor:
    return sim.act_scale(call.name, "out", rq.output_dtype, rq)


def out_zero_point(sim, call, rq) -> int:
    return sim.act_zero_point(call.name, "out", rq.output_dtype, rq)


def requant(
    sim, acc: Tensor, real: Tensor, out: DType, axis: int | None = None, zero_point: int = 0
) -> Tensor:
    """acc (exact integers) * real (+ the output's ``zero_point``) -> ``out`` codes by the
    platform's accumulator and requantization (``numerics.contract.requantize_accumulator``)."""
    contract = sim.platform.gemm_contract()
    return requantize_accumulator(acc, real, out, contract, axis, zero_point)


def add_codes(p, xc, xs, yc, ys, so, out: DType, zero_points=(0, 0, 0), constants=None) -> Tensor:
    """Codes of x + y (codes xc, yc at scales xs, ys; output scale so, dtype ``out``) by the
    platform's ``add_rule``; ``zero_points`` = (x's, y's, output's). ``constants``: the
    INTER_SCALE rule's ``add_constants`` of these scales (``inter_add_constants``), or None."""
    if p.add_rule is AddRule.INTER_SCALE:
        return add_inter_scale(
            xc,
            xs,
            yc,
            ys,
            so,
            out,
            p.requant,
            p.requant_round,
            p.add_inter_shift,
            p.requant_mult_bits,
            zero_points=zero_points,
            constants=constants,
        )
    if p.add_rule is AddRule.RESCALE_FLOAT_FMA:  # int8 codes held as uint8 + 128 (or not)
        held = p.qlinear_zero_point if out is DType.INT8 else 0
        return qlinear_add(xc, xs, yc, ys, so, out, held, zero_points)
    if p.add_rule is AddRule.LEFT_SHIFT:
        left = p.add_left_shift_int16 if out.bits > 8 else p.add_left_shift
        return add_left_shift(xc, xs, yc, ys, so, out, left, zero_points)
    if p.add_rule is AddRule.SHARED_SHIFT:
        return add_shared_shift(xc, xs, yc, ys, so, out, p.add_multiplier_bits, zero_points)
    return add_float_rescale(xc, xs, yc, ys, so, out, p.requant_round, zero_points=zero_points)


def inter_add_constants(sim, name: str, xs, ys, so, out: DType):
    """The INTER_SCALE add rule's constants for op ``name`` (kept while the scale objects
    stay the same), or None under another add rule."""
    p = sim.platform
    if p.add_rule is not AddRule.INTER_SCALE:
        return None
    rule = (p.requant, p.requant_round, p.add_inter_shift, p.requant_mult_bits)
    return sim.op_memo(
        name, "add", (xs, ys, so, out, *rule), lambda: add_constants(xs, ys, so, out, *rule)
    )


def sub_codes(p, xc, xs, yc, ys, so, out: DType, zero_points=(0, 0, 0), constants=None) -> Tensor:
    """Codes of x - y: the platform's add of x and -y, whose codes are -yc (int64: -(-128) is
    128) and zero point -zy (LiteRT's SUB reference kernels and XNNPACK's subtract give these
    bits)."""
    zx, zy, zo = zero_points
    return add_codes(p, xc, xs, -yc.to(torch.int64), ys, so, out, (zx, -zy, zo), constants)


def ratio(sim, num: float | Tensor, den: float | Tensor, count: int = 1) -> Tensor:
    """num / (den * count) as the platform's requantization forms a real multiplier
    (``numerics.requant.rescale_multiplier``)."""
    return rescale_multiplier(num, den, sim.platform.requant, count)


def rescale(
    sim,
    name: str,
    acc: Tensor,
    num: Tensor,
    den: Tensor,
    out: DType,
    count: int = 1,
    zero_point: int = 0,
    part: int = 0,
) -> Tensor:
    """``requant(sim, acc, ratio(sim, num, den, count), out, zero_point)``: codes at scale
    ``num`` (summed over ``count`` values where it is a mean) to ``out`` codes at scale ``den``,
    the ratio kept for op ``name`` (its ``part``-th operand) while the scale objects stay."""
    rule = sim.platform.requant
    real = sim.op_memo(
        name, f"ratio/{part}", (num, den, count, rule), lambda: ratio(sim, num, den, count)
    )
    return requant(sim, acc, real, out, zero_point=zero_point)


def const(c: float) -> tuple[Tensor, Tensor]:
    """A scalar constant as (int64 code, float32 scale) (``code_bounds.constant_codes``)."""
    return constant_codes(c)


def operand(args, kwargs, slot, info, zero_point: bool = False, native: bool = False):
    """(codes int64, scale) of a tensor operand with integer quantization, or of a nonzero
    scalar constant; None when the operand is neither. ``zero_point``: also a tensor with a
    zero point, as (codes, scale, zero point) (a constant's is 0). ``native``: a tensor's
    codes in their own dtype (int8 / uint8 / int16), for kernels that widen them."""
    v = A.get(args, kwargs, slot)
    if isinstance(v, Tensor):
        if not (zp_info(info) if zero_point else int_info(info)):
            return None
        res = (info.codes_native(v) if native else info.codes_of(v), info.scale)
        return (*res, info.zero_point) if zero_point else res
    if isinstance(v, (int, float)) and v != 0:
        res = const(float(v))
        return (*res, 0) if zero_point else res
    return None


def operand_dtype(args, kwargs, slot, info) -> DType:
    """The dtype an operand's codes are held in: its QInfo's, or CONSTANT_DTYPE (a scalar)."""
    return info.dtype if isinstance(A.get(args, kwargs, slot), Tensor) else CONSTANT_DTYPE


def runs_in_float(p, op_type: str, operand_dtypes, out: DType) -> bool:
    """Whether the platform computes this add / sub / mul in float32 between dequantize and
    quantize (``platform.float_islands``, ``dequantize_quantize``)."""
    if p.float_islands is FloatIslands.NONE:
        return False
    return op_type == "sub" or out.bits != 8 or any(d.bits != 8 for d in operand_dtypes)


def dequantize_quantize(fn, operands, so, out: DType, zero_point: int, p) -> Tensor:
    """Codes of ``fn`` of the operands as a runtime computes it between DequantizeLinear and
    QuantizeLinear: each operand (codes, scale, zero point) dequantized to float32,
    fl32(s * (c - z)); ``fn`` in float32 (one IEEE operation); then quantized as platform
    ``p`` quantizes (``PlatformConfig.quantize_codes``)."""
    values = [dequantize(c, s, zero_point=z) for c, s, z in operands]
    return p.quantize_codes(fn(*values), so, out, zero_point)


def clamp_output(res: tuple, bounds: tuple, rule: BoundRule = BoundRule.FLOAT64_HALF_EVEN) -> tuple:
    """Apply a fused relu6/clamp to a GEMM result: on the output codes, at the bounds rounded
    half to even to output codes (the clamp a fused conv-relu6 does after requantization;
    ``rule``: see ``bound_codes``)."""
    value, info = res
    lo, hi = bounds
    if info is None or not info.dtype.is_int or info.codes is None:
        return torch.clamp(value, lo, hi), info
    zp = info.zero_point
    lo_c, hi_c = bound_codes(lo, hi, info.scale, info.dtype, rule=rule, zero_point=zp)
    codes = info.codes.to(torch.int64).clamp_min(lo_c).clamp_max(hi_c)
    return emit(codes, info.scale, info.dtype, zp)


def warn_float(call, why: str) -> None:
    """Warn (once per op and reason) that op ``call`` runs in float in fixed mode because of its
    activation zero points: ``why`` says what its integer kernel does not take."""
    warnings.warn(
        f"op {call.name} ({call.op_type}) runs in float in fixed mode: {why}; its activations "
        "have zero points (activation_symmetry: ASYMMETRIC), set activation_symmetry: SYMMETRIC "
        "for it to run its integer kernel",
        stacklevel=3,
    )


def centred_bound(in_infos, i: int, zero_point: int, constant: bool) -> int:
    """max|code - zero_point| over operand ``i``'s code range (its QInfo dtype; a scalar
    constant: CONSTANT_DTYPE's qmax)."""
    dt = CONSTANT_DTYPE if constant else in_infos[i].dtype
    return max(abs(dt.qmin - zero_point), abs(dt.qmax - zero_point))


def product_requant(p, xs, ys, so, out: DType, bound: int):
    """The requantization of a product of codes by xs * ys / so, as ``requant`` encodes it
    under the platform's GEMM contract: (its exact float form for products of magnitude at
    most ``bound``, or None (``numerics.product_requant``); the int32 preparation,
    ``requantize_int32``)."""
    contract = p.gemm_contract()
    params = make_requant(
        requant_scale(xs, ys, so, p.requant), contract.requant, contract.requant_mult_bits
    )
    rounding = contract.requant_round
    return product_form(params, rounding, bound), int32_requant(params, out, rounding)


def product(sim, call, rq, a, b, dtypes, bound: int, key: tuple):
    """(value, QInfo) of the product of operands ``a`` and ``b`` ((codes, scale, zero point)
    each; ``dtypes`` theirs) under the platform's mul rule; ``bound``: the largest |product of
    centred codes|; ``key``: what the operands' constants are kept by."""
    (xc, xs, zx), (yc, ys, zy) = a, b
    so = out_scale(sim, call, rq)
    zo = out_zero_point(sim, call, rq)
    out = rq.output_dtype
    if runs_in_float(sim.platform, "mul", dtypes, out):
        codes = dequantize_quantize(torch.mul, (a, b), so, out, zo, sim.platform)
        return emit(codes, so, out, zo)
    held = qlinear_mul_offset(sim.platform, (*dtypes, out))
    if held is not None:
        y = yc if isinstance(yc, Tensor) else torch.tensor(int(yc), dtype=out.torch_dtype)
        return emit(qlinear_mul(xc, xs, y, ys, so, out, held, (zx, zy, zo)), so, out, zo)
    form, k = sim.op_memo(
        call.name,
        "mul",
        (*key, so, out, zo, bound, sim.platform),
        lambda: product_requant(sim.platform, xs, ys, so, out, bound),
    )
    if form is not None:  # one float dtype, exact by the bound (numerics.product_requant)
        return emit(requantize_product(xc, zx, yc, zy, form, out, zo), so, out, zo)
    acc = centred_int64(xc, zx) * centred_int64(yc, zy)
    if zo or bound > INT32_MAX:  # the general path (its accumulator contract applies)
        real = requant_scale(xs, ys, so, sim.platform.requant)
        return emit(requant(sim, acc, real, out, zero_point=zo), so, out, zo)
    return emit(requantize_int32(acc, k).to(out.torch_dtype), so, out)


def qlinear_mul_offset(p, dtypes) -> int | None:
    """Under ``MulRule.QLINEAR_MUL``, the offset the runtime holds the output's codes with (128
    for int8 codes written as uint8, else 0) when it holds the operands and the output
    (``dtypes``) in one 8-bit type, so that it fuses them into QLinearMul; None otherwise."""
    if p.mul_rule is not MulRule.QLINEAR_MUL:
        return None
    held = [DType.UINT8 if d is DType.INT8 and p.qlinear_zero_point else d for d in dtypes]
    if len(set(held)) != 1 or held[0] not in (DType.INT8, DType.UINT8):
        return None
    return p.qlinear_zero_point if dtypes[-1] is DType.INT8 else 0


def centred_int64(codes: Tensor, zero_point: int) -> Tensor:
    c = codes.to(torch.int64)
    return c - zero_point if zero_point else c
