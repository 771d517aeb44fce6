"""LayerNorm, GroupNorm and InstanceNorm in fixed point, as a J6-style composite of vector ops.

The J6 BPU has no LayerNorm instruction (``hbir.layernorm`` is VPU float16 only in the
compiler's J6E/J6P constraint tables); the vendor plugin's QAT LayerNorm is eight ops, every
intermediate int16 with its own calibrated scale (horizon-plugin.md s.1.5, plugin
``nn/qat/layernorm.py``), and GroupNorm / InstanceNorm are exported as the same LayerNorm over
a reshaped input (seed 000, "Norm optimisation"). On integer codes x (scale s_in), per row of
the N reduced elements:

1. mean:   mu = requant(sum(x), s_in / (N s_mean))                    [reduce_mean]
2. diff:   d = x - mu by the J6 add rule, to s_diff                    [sub]
3. square: q = requant(d * d, s_diff^2 / s_square)                     [mul]
4. var:    v = requant(sum(q), s_square / (N s_var))                   [reduce_mean]
5. rsqrt:  r = segment LUT of 1/sqrt(v + eps), s_var -> s_rsqrt        [rsqrt]
6. normed: n = requant(d * r, s_diff s_rsqrt / s_normed)               [mul]
7. scaled: w = requant(n * g, s_normed s_gamma / s_scaled), g = gamma codes   [mul]
8. out:    y = w + b by the J6 add rule, b = beta codes, to s_out      [add]

The last step present writes the output dtype and scale (no gamma: step 6 or 8 is last; no
beta: step 7 is last). Every sum stays exact in an int32 accumulator: at most
``max_reduce_elements`` = 65535 (published) codes of at most 2**15 give |sum| < 2**31, and each
product of two int16 codes is at most 2**30. What the vendor does not publish is a field of
``NormContract`` marked "assumed".
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.lut.formats import J6_FORMAT, LutFormat
from quantlab.numerics.lut.functions import LutSpec, default_spec
from quantlab.numerics.lut.segment import SegmentLut
from quantlab.numerics.lut.table import build_lut
from quantlab.numerics.quantize import quantize
from quantlab.numerics.requant import (
    INT32_MAX,
    Int32Requant,
    Requant,
    int32_requant,
    make_requant,
    requantize_int32,
)
from quantlab.numerics.rounding import Round, round_rational
from quantlab.numerics.scaled_add import AddConstants, add_constants, add_inter_scale

CODE_DTYPES = (DType.INT8, DType.INT16)


class EpsMode(enum.Enum):
    """Where the normalisation's epsilon enters the integer chain.

    IN_TABLE:  the rsqrt table holds 1/sqrt(v + eps) (the plugin's LUT function
               ``rsqrt(x + eps)``, horizon-plugin.md s.1.5): exact whatever s_var is.
    ADD_CODES: eps is rounded half to even to variance codes, added with saturation, and the
               table holds 1/sqrt(v) (assumed alternative lowering; an eps below half a
               variance code vanishes and a zero variance meets the table's saturated end).
    """

    IN_TABLE = "in_table"
    ADD_CODES = "add_codes"


def _check_enum(name: str, value, cls) -> None:
    if not isinstance(value, cls):
        allowed = ", ".join(m.name for m in cls)
        raise ValueError(f"NormContract.{name} must be a {cls.__name__} ({allowed}), got {value!r}")


@dataclass(frozen=True)
class NormContract:
    """The arithmetic of the normalisation composite (module docstring). Platforms set it.

    inter_dtype:       dtype of every intermediate (mean .. scaled): INT16, the plugin's int16
                       qconfig for LayerNorm's inner ops (published, horizon-plugin.md s.1.5).
    affine_dtype:      dtype of the quantized gamma / beta (int16 QuantStubs in the plugin).
    affine_round:      rounding of gamma / beta to codes (the fake-quant rounding, HALF_EVEN).
    requant:           requantization of every step (assumed MUL_SHIFT, j6-numerics s.7).
    requant_round:     its rounding (assumed HALF_UP, j6-numerics s.7).
    requant_mult_bits: bits of the integer multiplier (31 or 15).
    add_inter_shift:   the J6 add rule's inter scale max(sx, sy) / 2**shift for steps 2 and 8
                       (assumed 14, j6-numerics s.7).
    eps_mode:          where eps enters (EpsMode; IN_TABLE is the plugin's way).
    rsqrt_spec:        the rsqrt table's spec (published default: symmetric, curvature); its
                       eps is replaced by the op's eps under IN_TABLE, by 0 under ADD_CODES.
    lut_format:        the table format (6 x 64 entries, 8 index fraction bits on J6).
    max_reduce_elements: most elements one reduction may sum (hbir.reduce_mean: 65535,
                       published); it keeps every sum inside int32.
    The multipliers: prod(numerator scales) / (denominator scale * N) in float64 from the
    float32 scales (float32, left to right, for FLOAT_RESCALE), encoded once per step.
    """

    inter_dtype: DType = DType.INT16
    affine_dtype: DType = DType.INT16
    affine_round: Round = Round.HALF_EVEN
    requant: Requant = Requant.MUL_SHIFT
    requant_round: Round = Round.HALF_UP
    requant_mult_bits: int = 31
    add_inter_shift: int = 14
    eps_mode: EpsMode = EpsMode.IN_TABLE
    rsqrt_spec: LutSpec = default_spec("rsqrt")
    lut_format: LutFormat = J6_FORMAT
    max_reduce_elements: int = 65535

    def __post_init__(self) -> None:
        for name in ("inter_dtype", "affine_dtype"):
            if getattr(self, name) not in CODE_DTYPES:
                raise ValueError(
                    f"NormContract.{name} must be INT8 or INT16, got {getattr(self, name)!r}"
                )
        _check_enum("affine_round", self.affine_round, Round)
        _check_enum("requant_round", self.requant_round, Round)
        _check_enum("requant", self.requant, Requant)
        _check_enum("eps_mode", self.eps_mode, EpsMode)
        if self.requant_mult_bits not in (15, 31):
            raise ValueError(
                f"NormContract.requant_mult_bits must be 15 or 31, got {self.requant_mult_bits}"
            )
        if not 0 <= self.add_inter_shift <= 15:
            raise ValueError(
                f"NormContract.add_inter_shift must be in [0, 15], got {self.add_inter_shift}"
            )
        if not 1 <= self.max_reduce_elements <= 65535:
            raise ValueError(
                "NormContract.max_reduce_elements must be in [1, 65535] (int32 sums of int16 "
                f"codes), got {self.max_reduce_elements}"
            )
        if not isinstance(self.rsqrt_spec, LutSpec) or not isinstance(self.lut_format, LutFormat):
            raise ValueError("NormContract.rsqrt_spec / lut_format must be a LutSpec / LutFormat")


J6_NORM = NormContract()


class NormAxes(enum.Enum):
    """Which elements one normalisation row holds.

    LAST:     the trailing ``normalized_shape`` dims (F.layer_norm); gamma/beta of that shape.
    GROUPS:   x (B, C, *): each of ``num_groups`` channel groups with all its positions
              (F.group_norm); gamma/beta per channel (C,).
    CHANNELS: x (B, C, *): each channel's positions (F.instance_norm); gamma/beta (C,).
    """

    LAST = "last"
    GROUPS = "groups"
    CHANNELS = "channels"


@dataclass(frozen=True)
class NormLayout:
    """How an input maps to normalisation rows and how gamma/beta broadcast on it."""

    axes: NormAxes
    normalized_shape: tuple[int, ...] = ()
    num_groups: int = 1

    @classmethod
    def layer(cls, normalized_shape) -> NormLayout:
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        shape = tuple(int(s) for s in shape)
        if not shape or any(s < 1 for s in shape):
            raise ValueError(f"normalized_shape must be non-empty and positive, got {shape}")
        return cls(NormAxes.LAST, shape)

    @classmethod
    def group(cls, num_groups: int) -> NormLayout:
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {num_groups}")
        return cls(NormAxes.GROUPS, num_groups=int(num_groups))

    @classmethod
    def instance(cls) -> NormLayout:
        return cls(NormAxes.CHANNELS)

    def rows(self, x: Tensor) -> Tensor:
        """x as (rows, N) normalisation rows (a view when possible); ValueError on a shape that
        does not fit the layout."""
        if self.axes is NormAxes.LAST:
            k = len(self.normalized_shape)
            if tuple(x.shape[x.dim() - k :]) != self.normalized_shape or x.dim() < k:
                raise ValueError(
                    f"input of shape {tuple(x.shape)} does not end in normalized_shape "
                    f"{self.normalized_shape}"
                )
            return x.reshape(-1, math.prod(self.normalized_shape))
        if x.dim() < 2:
            raise ValueError(f"{self.axes.name} needs an input (B, C, *), got {tuple(x.shape)}")
        c = x.shape[1]
        groups = self.num_groups if self.axes is NormAxes.GROUPS else c
        if c % groups:
            raise ValueError(f"num_groups={groups} must divide the channel count {c}")
        return x.reshape(x.shape[0] * groups, -1)

    def affine(self, p: Tensor, x: Tensor, name: str) -> Tensor:
        """gamma or beta reshaped to broadcast on x; ValueError naming ``name`` otherwise."""
        if self.axes is NormAxes.LAST:
            want = self.normalized_shape
            view = p
        else:
            want = (x.shape[1],)
            view = p.reshape((-1,) + (1,) * (x.dim() - 2))
        if tuple(p.shape) != want:
            raise ValueError(f"{name} must have shape {want}, got {tuple(p.shape)}")
        return view


def f32(v) -> float:
    """A scale as the float32 value quantlab holds it (a Python float)."""
    return float(np.float32(float(v)))


@dataclass(frozen=True)
class NormScales:
    """Calibrated scales of the composite's steps (float32 values; module docstring).

    ``normed`` is needed when gamma or beta follows; ``scaled`` when gamma and beta both do;
    ``gamma`` / ``beta`` with those parameters. ``var_range``: the observed (min, max) variance,
    which narrows the rsqrt table's input range like any calibrated LUT (None: not narrowed).
    """

    mean: float
    diff: float
    square: float
    var: float
    rsqrt: float
    normed: float | None = None
    scaled: float | None = None
    gamma: float | None = None
    beta: float | None = None
    var_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "var_range" or v is None:
                continue
            if not (math.isfinite(float(v)) and float(v) > 0):
                raise ValueError(f"NormScales.{f.name} must be finite and > 0, got {v}")
            object.__setattr__(self, f.name, f32(v))
        if self.var_range is not None:
            lo, hi = (float(v) for v in self.var_range)
            object.__setattr__(self, "var_range", (lo, hi))

    def require(self, gamma: bool, beta: bool) -> None:
        """ValueError naming the scale a chain with these parameters needs but lacks."""
        need = []
        if gamma or beta:
            need.append("normed")
        if gamma and beta:
            need.append("scaled")
        if gamma:
            need.append("gamma")
        if beta:
            need.append("beta")
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            raise ValueError(f"NormScales needs {', '.join(missing)} for this gamma/beta")


def real_multiplier(num: tuple[float, ...], den: float, count: int, scheme: Requant) -> Tensor:
    """prod(num) / (den * count): float32 left to right for FLOAT_RESCALE (float32 tensor),
    else float64 of the float32 scales (float64 tensor; den * count is exact there)."""
    if scheme is Requant.FLOAT_RESCALE:
        v = torch.tensor(f32(num[0]), dtype=torch.float32)
        for s in num[1:]:
            v = v * torch.tensor(f32(s), dtype=torch.float32)
        return v / (torch.tensor(f32(den), dtype=torch.float32) * float(count))
    return torch.tensor(math.prod(f32(s) for s in num) / (f32(den) * count), dtype=torch.float64)


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


def eps_codes(eps: float, var_scale: float) -> int:
    """ADD_CODES: eps in variance codes, the exact quotient eps / s_var rounded half to even."""
    return round_rational(Fraction(float(eps)) / Fraction(f32(var_scale)), Round.HALF_EVEN)


def rsqrt_lut(scales: NormScales, eps: float, c: NormContract = J6_NORM) -> SegmentLut:
    """The step-5 table: inter_dtype codes at s_var -> inter_dtype codes at s_rsqrt, of
    1/sqrt(v + eps) (IN_TABLE) or 1/sqrt(v) (ADD_CODES), narrowed by ``scales.var_range``.
    When s_rsqrt saturates the output at every code, the table spans the full input range."""
    table_eps = float(eps) if c.eps_mode is EpsMode.IN_TABLE else 0.0
    spec = dataclasses.replace(c.rsqrt_spec, eps=table_eps)
    observed = scales.var_range
    if observed is not None and not observed[1] > observed[0]:
        observed = None  # a constant observed variance cannot narrow a table
    dt = c.inter_dtype
    r_max = dt.qmax * scales.rsqrt
    if 1.0 / (r_max * r_max) - table_eps >= (dt.qmax - 1) * scales.var:
        # every variance code saturates the output: the inverse-function rule would leave no
        # range, so the table spans the whole input range (its entries saturate)
        spec = dataclasses.replace(spec, range_rule=False)
    return build_lut("rsqrt", dt, scales.var, dt, scales.rsqrt, spec, c.lut_format, observed)


def check_codes(codes: Tensor, name: str = "codes") -> DType:
    """The DType of int8/int16 codes; TypeError otherwise."""
    for dt in CODE_DTYPES:
        if codes.dtype == dt.torch_dtype:
            return dt
    raise TypeError(f"{name} must hold int8 or int16 codes, got {codes.dtype}")


def check_eps(eps: float) -> float:
    eps = float(eps)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return eps


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
