"""The integer contract a device applies to an exact integer result (a GEMM's sum of products,
a product of codes, a sum of codes): the accumulator, then requantization to output codes.

Platforms compose a ``GemmContract`` from their fields (``PlatformConfig.gemm_contract()``);
kernels read only the contract, never a platform.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from quantlab.numerics.accumulator import Overflow, accumulate
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import Requant, make_requant, requantize
from quantlab.numerics.rounding import Round


@dataclass(frozen=True)
class GemmContract:
    """accumulator / accumulator_overflow: the accumulator and what it does past its range;
    requant / requant_round / requant_mult_bits: how it becomes int8/int16 codes
    (``requant.requantize``); max_int16_gemm_operands: how many GEMM operands may be int16
    (2 allows int16 x int16). Field names follow the platform's. Hashable: caches key on it."""

    accumulator: DType = DType.INT32
    accumulator_overflow: Overflow = Overflow.SATURATE
    requant: Requant = Requant.MUL_SHIFT
    requant_round: Round = Round.HALF_UP
    requant_mult_bits: int = 31
    max_int16_gemm_operands: int = 2

    def __post_init__(self) -> None:
        for name, cls in (
            ("accumulator", DType),
            ("accumulator_overflow", Overflow),
            ("requant", Requant),
            ("requant_round", Round),
        ):
            if not isinstance(getattr(self, name), cls):
                allowed = ", ".join(m.name for m in cls)
                raise ValueError(f"GemmContract.{name} must be a {cls.__name__} ({allowed})")
        if not self.accumulator.is_int:
            raise ValueError(
                f"GemmContract.accumulator must be an integer dtype, got {self.accumulator.name}"
            )
        if self.requant_mult_bits not in (15, 31):
            raise ValueError(
                f"GemmContract.requant_mult_bits must be 15 or 31, got {self.requant_mult_bits}"
            )
        if self.max_int16_gemm_operands not in (0, 1, 2):
            raise ValueError(
                "GemmContract.max_int16_gemm_operands must be 0, 1 or 2, "
                f"got {self.max_int16_gemm_operands}"
            )


def requantize_accumulator(
    acc: Tensor, real: Tensor | float, out: DType, contract: GemmContract, axis: int | None = None
) -> Tensor:
    """Exact integer values -> ``out`` codes under ``contract``: the accumulator contract
    (``accumulate``), then ``requantize`` by the real multiplier ``real`` (scalar, or 1-d along
    ``axis``) encoded with the contract's scheme and multiplier bits."""
    acc32, _ = accumulate(acc, contract.accumulator, contract.accumulator_overflow)
    params = make_requant(real, contract.requant, contract.requant_mult_bits)
    return requantize(acc32, params, out, contract.requant_round, axis=axis)
