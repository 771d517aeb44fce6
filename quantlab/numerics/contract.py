"""The integer contract a device applies to an exact integer result (a GEMM's sum of products,
a product of codes, a sum of codes): the accumulator, then requantization to output codes.

Platforms compose a ``GemmContract`` from their fields (``PlatformConfig.gemm_contract()``);
kernels read only the contract, never a platform.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from torch import Tensor

from quantlab.numerics.accumulator import Overflow, accumulate
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import Requant, make_requant, requantize
from quantlab.numerics.rounding import Round


class GemmFamily(enum.Enum):
    """The op family of a GEMM, for per-family rules (``GemmRule``).

    CONV: conv1d / conv2d, grouped and depthwise included (TFLite CONV_2D and
    DEPTHWISE_CONV_2D, ONNX QLinearConv); LINEAR: F.linear (TFLite FULLY_CONNECTED);
    MATMUL: torch.matmul of two activations or an activation and a constant (QLinearMatMul).
    """

    CONV = "conv"
    LINEAR = "linear"
    MATMUL = "matmul"


ACCUMULATORS = (DType.INT32, DType.INT64)
BIAS_DTYPES = (DType.INT32, DType.INT64)


def _check_rule_fields(owner: str, rule) -> None:
    for name, cls in (
        ("accumulator", DType),
        ("accumulator_overflow", Overflow),
        ("requant", Requant),
        ("requant_round", Round),
        ("bias_dtype", DType),
    ):
        if not isinstance(getattr(rule, name), cls):
            allowed = ", ".join(m.name for m in cls)
            raise ValueError(f"{owner}.{name} must be a {cls.__name__} ({allowed})")
    for name, allowed in (("accumulator", ACCUMULATORS), ("bias_dtype", BIAS_DTYPES)):
        if getattr(rule, name) not in allowed:
            shown = ", ".join(d.name for d in allowed)
            raise ValueError(
                f"{owner}.{name} must be one of {shown}, got {getattr(rule, name).name}"
            )
    if rule.requant_mult_bits not in (15, 31):
        raise ValueError(
            f"{owner}.requant_mult_bits must be 15 or 31, got {rule.requant_mult_bits}"
        )


@dataclass(frozen=True)
class GemmRule:
    """A platform's integer rule for one op family and activation dtype, overriding its
    default contract (e.g. TFLite: FULLY_CONNECTED rescales in float64; 16x8 convs take an
    int64 bias and accumulator). ``family`` / ``activation``: which GEMMs it governs (the
    activation operand's dtype: INT8, UINT8 or INT16); the other fields are a
    ``GemmContract``'s. Hashable."""

    family: GemmFamily = GemmFamily.CONV
    activation: DType = DType.INT8
    accumulator: DType = DType.INT32
    accumulator_overflow: Overflow = Overflow.SATURATE
    requant: Requant = Requant.MUL_SHIFT
    requant_round: Round = Round.HALF_UP
    requant_mult_bits: int = 31
    bias_dtype: DType = DType.INT32

    def __post_init__(self) -> None:
        if not isinstance(self.family, GemmFamily):
            raise ValueError(
                f"GemmRule.family must be a GemmFamily ({', '.join(m.name for m in GemmFamily)})"
            )
        if self.activation not in (DType.INT8, DType.UINT8, DType.INT16):
            raise ValueError(
                f"GemmRule.activation must be INT8, UINT8 or INT16, got {self.activation!r}"
            )
        _check_rule_fields("GemmRule", self)

    def matches(self, family: GemmFamily, activation: DType) -> bool:
        return self.family is family and self.activation is activation


@dataclass(frozen=True)
class GemmContract:
    """accumulator / accumulator_overflow: the accumulator (INT32 or INT64) and what it does
    past its range; requant / requant_round / requant_mult_bits: how it becomes output codes
    (``requant.requantize``); bias_dtype: the integer bias codes' format (INT32, or INT64 as
    TFLite's 16x8 kernels take it; ``quantize_bias`` saturates to it); max_int16_gemm_operands:
    how many GEMM operands may be int16 (2 allows int16 x int16); u8s8_pair_saturation: uint8
    activations times int8 weights sum adjacent product pairs saturated to int16
    (``gemm.pair_saturation``: onnxruntime on x86 without VNNI). Field names follow the
    platform's. Hashable: caches key on it."""

    accumulator: DType = DType.INT32
    accumulator_overflow: Overflow = Overflow.SATURATE
    requant: Requant = Requant.MUL_SHIFT
    requant_round: Round = Round.HALF_UP
    requant_mult_bits: int = 31
    max_int16_gemm_operands: int = 2
    bias_dtype: DType = DType.INT32
    u8s8_pair_saturation: bool = False

    def __post_init__(self) -> None:
        _check_rule_fields("GemmContract", self)
        if not isinstance(self.u8s8_pair_saturation, bool):
            raise ValueError(
                "GemmContract.u8s8_pair_saturation must be true or false, "
                f"got {self.u8s8_pair_saturation!r}"
            )
        if self.max_int16_gemm_operands not in (0, 1, 2):
            raise ValueError(
                "GemmContract.max_int16_gemm_operands must be 0, 1 or 2, "
                f"got {self.max_int16_gemm_operands}"
            )


def contract_for(
    default: GemmContract,
    rules,
    family: GemmFamily | None,
    activation: DType | None,
    bias_dtype: DType | None = None,
) -> GemmContract:
    """The contract of a GEMM of ``family`` with ``activation`` operands: the first matching
    ``GemmRule`` of ``rules`` (with ``bias_dtype``: one taking bias codes of that dtype) over
    ``default`` (which keeps its max_int16_gemm_operands), or ``default`` when none matches (or
    family / activation is None)."""
    if family is None or activation is None:
        return default
    for r in rules:
        if r.matches(family, activation) and bias_dtype in (None, r.bias_dtype):
            return replace(
                default,
                accumulator=r.accumulator,
                accumulator_overflow=r.accumulator_overflow,
                requant=r.requant,
                requant_round=r.requant_round,
                requant_mult_bits=r.requant_mult_bits,
                bias_dtype=r.bias_dtype,
            )
    return default


def requantize_accumulator(
    acc: Tensor,
    real: Tensor | float,
    out: DType,
    contract: GemmContract,
    axis: int | None = None,
    zero_point: int = 0,
) -> Tensor:
    """Exact integer values -> ``out`` codes under ``contract``: the accumulator contract
    (``accumulate``), then ``requantize`` by the real multiplier ``real`` (scalar, or 1-d along
    ``axis``) encoded with the contract's scheme and multiplier bits, plus the output's
    ``zero_point``."""
    acc32, _ = accumulate(acc, contract.accumulator, contract.accumulator_overflow)
    params = make_requant(real, contract.requant, contract.requant_mult_bits)
    return requantize(acc32, params, out, contract.requant_round, axis=axis, zero_point=zero_point)
