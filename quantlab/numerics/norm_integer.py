"""The normalisation composite of ``quantlab.numerics.norm`` in integers: its constants,
prepared once per scales, parameters, eps, row length, output dtype and contract
(``norm_constants``), and its evaluation on codes (``norm_fixed``).

Two forms give the same integers. The general form runs each step as the module docstring of
``norm`` states it (int64 products and sums, each step's prepared requantization, the J6 add
rule). When every element-wise requantization is MUL_SHIFT rounded HALF_UP with a right shift
1 <= n <= 62 (J6's contract), ``NormShifts`` folds each step's product, the add rule's
multipliers and its per-row or per-channel term into one exact int64 ``acc * q + offset``,
then one shift and one clamp (``norm_shifts`` states the bounds); for a LayerNorm (rows over
the trailing dims) its element-wise passes run in C (``norm_integer_native``, the same
integers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.segment import SegmentLut
from quantlab.numerics.norm import (
    CODE_DTYPES,
    J6_NORM,
    EpsMode,
    NormContract,
    NormLayout,
    NormScales,
    check_codes,
    check_eps,
    eps_codes,
    f32,
    real_multiplier,
    rsqrt_lut,
)
from quantlab.numerics.norm_integer_native import norm_shifted_rows
from quantlab.numerics.quantize import quantize
from quantlab.numerics.requant import (
    INT32_MAX,
    Int32Requant,
    int32_requant,
    make_requant,
    requantize_int32,
)
from quantlab.numerics.scaled_add import AddConstants, add_constants, add_inter_scale


def _requant(real: Tensor, out: DType, c: NormContract) -> Int32Requant:
    return int32_requant(make_requant(real, c.requant, c.requant_mult_bits), out, c.requant_round)


def _add_constants(sx, sy, so, out: DType, c: NormContract) -> AddConstants:
    return add_constants(
        sx, sy, so, out, c.requant, c.requant_round, c.add_inter_shift, c.requant_mult_bits
    )


def _add(x: Tensor, y: Tensor, k: AddConstants, out: DType, c: NormContract) -> Tensor:
    res = add_inter_scale(
        x,
        1.0,
        y,
        1.0,
        1.0,
        out,
        c.requant,
        c.requant_round,
        c.add_inter_shift,
        c.requant_mult_bits,
        constants=k,
    )  # the scales are k's
    return res.to(torch.int64)


@dataclass(frozen=True)
class StepShift:
    """A step's requantization when it is MUL_SHIFT rounded HALF_UP with a right shift
    1 <= n <= 62: codes = clamp(floor((acc * q + 2**(n-1)) / 2**n), lo, hi), as Python ints.
    ``norm_fixed`` folds the product, the add rule's multipliers and the per-row or
    per-channel terms into acc * q before the shift (every partial value below 2**62)."""

    q: int
    n: int
    offset: int
    lo: int
    hi: int

    @staticmethod
    def of(r: Int32Requant) -> StepShift | None:
        """The StepShift of a prepared requantization, or None when it is not of that form."""
        if not r.fast or not 1 <= int(r.shift) <= 62:
            return None
        q = int(r.params.multiplier)
        return StepShift(q, int(r.shift), int(r.offset), r.out.qmin, r.out.qmax)

    def finish_(self, t: Tensor) -> Tensor:
        """In place on int64 ``t`` = acc * q + offset: the shift (a floor) and the clamp."""
        return t.bitwise_right_shift_(self.n).clamp_(self.lo, self.hi)


@dataclass(frozen=True)
class NormShifts:
    """The element-wise steps of ``norm_fixed`` as StepShifts, when all of them have that form
    (``norm_shifts``): diff (with the add rule's mx, my), square, normed, and, with gamma /
    beta, scaled (with gamma * q per channel) and the output add (beta * my * q + offset per
    channel, beside mx)."""

    diff: StepShift
    diff_m: tuple[int, int]
    square: StepShift
    normed: StepShift
    scaled: StepShift | None
    gamma_q: Tensor | None
    out_add: StepShift | None
    out_m: tuple[int, int] | None
    beta_term: Tensor | None


def _code_abs_max(dt: DType) -> int:
    return max(-dt.qmin, dt.qmax)


def norm_shifts(
    diff: AddConstants,
    square: Int32Requant,
    normed: Int32Requant,
    gamma: Tensor | None,
    scaled: Int32Requant | None,
    beta: Tensor | None,
    out_add: AddConstants | None,
    c: NormContract,
) -> NormShifts | None:
    """``NormShifts`` of these steps, or None when one requantization is not a StepShift or an
    add could leave int32 (for int16 input codes, the widest ``norm_fixed`` takes): the
    int64 forms are then exact, |acc * q| < 2**31 * 2**31 (adds) or 2**30 * 2**31 (products
    of two int16 codes), so the offset's sum stays below 2**63."""
    steps = [StepShift.of(r) for r in (diff.requant, square, normed)]
    steps += [StepShift.of(scaled) if scaled is not None else None]
    steps += [StepShift.of(out_add.requant) if out_add is not None else None]
    d, sq, nm, sc, oa = steps
    if d is None or sq is None or nm is None or (scaled is not None and sc is None):
        return None
    if out_add is not None and oa is None:
        return None
    inter = _code_abs_max(c.inter_dtype)
    if _code_abs_max(DType.INT16) * diff.inter.mx + inter * diff.inter.my > INT32_MAX:
        return None
    gamma_q = None if gamma is None else gamma * sc.q
    out_m = beta_term = None
    if out_add is not None:
        mx, my = out_add.inter.mx, out_add.inter.my
        if inter * mx + _code_abs_max(c.affine_dtype) * my > INT32_MAX:
            return None
        out_m = (mx, my)
        beta_term = beta * (my * oa.q) + oa.offset
    return NormShifts(d, (diff.inter.mx, diff.inter.my), sq, nm, sc, gamma_q, oa, out_m, beta_term)


@dataclass(frozen=True)
class NormConstants:
    """What ``norm_fixed`` derives from its scales, parameters, eps, row length ``n``, output
    dtype and contract: each step's prepared requantization, the add rule's constants, the
    rsqrt table, eps codes (ADD_CODES), the gamma / beta codes (int64, unshaped) and the
    StepShift form of the element-wise steps when they have it (``shifts``)."""

    n: int
    mean: Int32Requant
    diff: AddConstants
    square: Int32Requant
    var: Int32Requant
    eps_codes: int
    rsqrt: SegmentLut
    normed: Int32Requant
    gamma: Tensor | None
    scaled: Int32Requant | None
    beta: Tensor | None
    out_add: AddConstants | None
    shifts: NormShifts | None = None


def norm_constants(
    in_scale: float,
    n: int,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    scales: NormScales,
    out_scale: float,
    out_dtype: DType,
    contract: NormContract = J6_NORM,
) -> NormConstants:
    """The constants of ``norm_fixed`` for rows of ``n`` elements (arguments as there), for a
    caller that keeps them while those stay the same and passes them as ``constants=``."""
    c = contract
    out_dtype = DType.parse(out_dtype)
    if out_dtype not in CODE_DTYPES:
        raise ValueError(f"out_dtype must be INT8 or INT16, got {out_dtype.name}")
    eps = check_eps(eps)
    scales.require(weight is not None, bias is not None)
    s_in, s_out = f32(in_scale), f32(out_scale)
    if not (s_in > 0 and s_out > 0 and math.isfinite(s_in) and math.isfinite(s_out)):
        raise ValueError(f"in_scale and out_scale must be finite and > 0, got {s_in}, {s_out}")
    dt, s, r = c.inter_dtype, scales, c.requant
    last = weight is None and bias is None
    n_dt, s_n = (out_dtype, s_out) if last else (dt, s.normed)
    normed = _requant(real_multiplier((s.diff, s.rsqrt), s_n, 1, r), n_dt, c)
    gamma = scaled = beta = out_add = None
    if weight is not None:
        gamma = quantize(weight, s.gamma, c.affine_dtype, c.affine_round).to(torch.int64)
        w_dt, s_w = (out_dtype, s_out) if bias is None else (dt, s.scaled)
        scaled = _requant(real_multiplier((s_n, s.gamma), s_w, 1, r), w_dt, c)
        s_n = s_w
    if bias is not None:
        beta = quantize(bias, s.beta, c.affine_dtype, c.affine_round).to(torch.int64)
        out_add = _add_constants(s_n, s.beta, s_out, out_dtype, c)
    eps_c = eps_codes(eps, s.var) if c.eps_mode is EpsMode.ADD_CODES else 0
    diff = _add_constants(s_in, s.mean, s.diff, dt, c)
    square = _requant(real_multiplier((s.diff, s.diff), s.square, 1, r), dt, c)
    return NormConstants(
        n=n,
        mean=_requant(real_multiplier((s_in,), s.mean, n, r), dt, c),
        diff=diff,
        square=square,
        var=_requant(real_multiplier((s.square,), s.var, n, r), dt, c),
        eps_codes=eps_c,
        rsqrt=rsqrt_lut(s, eps, c),
        normed=normed,
        gamma=gamma,
        scaled=scaled,
        beta=beta,
        out_add=out_add,
        shifts=norm_shifts(diff, square, normed, gamma, scaled, beta, out_add, c),
    )


def norm_fixed(
    codes: Tensor,
    in_scale: float,
    layout: NormLayout,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    scales: NormScales,
    out_scale: float,
    out_dtype: DType,
    contract: NormContract = J6_NORM,
    constants: NormConstants | None = None,
) -> Tensor:
    """Normalised output codes of ``codes`` (int8/int16, scale ``in_scale``), steps 1-8 of the
    module docstring; returns ``out_dtype`` (INT8/INT16) codes of ``codes``' shape.

    weight / bias: float gamma / beta (or None), quantized per tensor to ``affine_dtype`` at
    ``scales.gamma`` / ``scales.beta`` with ``affine_round``, saturating.
    Rounding: every step one requantization by ``requant`` / ``requant_round`` (steps 2 and 8
    through the add rule); step 5 the table's interpolation rounding. Saturation: every step
    saturates to its dtype. Exactness: integer arithmetic in int64; every accumulator is an
    exact int32 value (module docstring), so no step checks its range.
    ``constants``: ``norm_constants`` of the same arguments, kept by the caller (None: derived
    here).
    """
    c = contract
    check_codes(codes)
    out_dtype = DType.parse(out_dtype)
    if out_dtype not in CODE_DTYPES:
        raise ValueError(f"out_dtype must be INT8 or INT16, got {out_dtype.name}")
    n = layout.rows(codes).shape[1]
    if not 1 <= n <= c.max_reduce_elements:
        raise ValueError(
            f"a normalisation row holds {n} elements; the reduction allows 1 to "
            f"{c.max_reduce_elements} (NormContract.max_reduce_elements)"
        )
    if constants is None:
        constants = norm_constants(
            in_scale, n, weight, bias, eps, scales, out_scale, out_dtype, contract
        )
    elif constants.n != n:
        raise ValueError(f"norm constants are for rows of {constants.n} elements, got {n}")
    k, dt = constants, c.inter_dtype
    if k.shifts is not None:
        native = norm_shifted_rows(codes, layout, k, c, out_dtype)  # the same codes, in C
        if native is not None:
            return native
        return _norm_shifted(codes, layout, k, c).to(out_dtype.torch_dtype)
    x = codes.to(torch.int64)
    rows = layout.rows(x)
    mu = requantize_int32(rows.sum(1, keepdim=True), k.mean)
    d = _add(rows, -mu, k.diff, dt, c)
    sq = requantize_int32(d * d, k.square)
    v = requantize_int32(sq.sum(1, keepdim=True), k.var)
    if c.eps_mode is EpsMode.ADD_CODES:
        v = (v + k.eps_codes).clamp_max(dt.qmax)
    r = k.rsqrt.evaluate(v.to(dt.torch_dtype)).to(torch.int64)
    y = requantize_int32(d * r, k.normed).reshape(x.shape)
    if k.gamma is not None:
        y = requantize_int32(y * layout.affine(k.gamma, x, "weight"), k.scaled)
    if k.beta is not None:
        y = _add(y, layout.affine(k.beta, x, "bias"), k.out_add, out_dtype, c)
    return y.to(out_dtype.torch_dtype)


def _norm_shifted(codes: Tensor, layout: NormLayout, k: NormConstants, c: NormContract) -> Tensor:
    """``norm_fixed``'s steps on int8/int16 ``codes`` when ``k.shifts`` holds (NormShifts):
    the same integers as its general form, with each element-wise step's product, add-rule
    multipliers and per-row or per-channel terms folded into acc * q + offset (exact int64,
    ``norm_shifts``) and one shift and clamp; returns int64 codes of ``codes``' shape. The
    codes enter the first sum and add as they are (both widen them to int64)."""
    f, dt, shape = k.shifts, c.inter_dtype, codes.shape
    rows = layout.rows(codes)
    mu = requantize_int32(rows.sum(1, keepdim=True, dtype=torch.int64), k.mean)
    mx, my = f.diff_m
    # diff: (x * mx - mu * my) * q + offset
    d = f.diff.finish_(torch.add(mu * (-my * f.diff.q) + f.diff.offset, rows, alpha=mx * f.diff.q))
    # square: d * d * q + offset
    sq = f.square.finish_(torch.addcmul(_scalar(f.square.offset), d, d, value=f.square.q))
    v = requantize_int32(sq.sum(1, keepdim=True), k.var)
    if c.eps_mode is EpsMode.ADD_CODES:
        v = (v + k.eps_codes).clamp_max(dt.qmax)
    r = k.rsqrt.evaluate(v.to(dt.torch_dtype)).to(torch.int64)
    # normed: d * (r * q) + offset
    y = f.normed.finish_((d * (r * f.normed.q)).add_(f.normed.offset)).reshape(shape)
    if f.scaled is not None:  # scaled: y * (gamma * q) + offset
        g = layout.affine(f.gamma_q, y, "weight")
        y = f.scaled.finish_((y * g).add_(f.scaled.offset))
    if f.out_add is not None:  # out: y * mx * q + (beta * my * q + offset)
        b = layout.affine(f.beta_term, y, "bias")
        y = f.out_add.finish_(torch.add(b, y, alpha=f.out_m[0] * f.out_add.q))
    return y


def _scalar(v: int) -> Tensor:
    return torch.tensor(v, dtype=torch.int64)
