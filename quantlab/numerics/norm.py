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

This module defines the composite: its contract, row layouts, step scales, the rsqrt table and
argument checks. ``norm_integer`` evaluates it on codes (``norm_constants``, ``norm_fixed``);
``norm_calibrate`` holds its float steps and QAT form.
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
from quantlab.numerics.lut.functions import default_spec
from quantlab.numerics.lut.segment import SegmentLut
from quantlab.numerics.lut.spec import LutSpec
from quantlab.numerics.lut.table import build_lut
from quantlab.numerics.requant import (
    Requant,
)
from quantlab.numerics.rounding import Round, round_rational

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
