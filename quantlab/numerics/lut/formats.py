"""The hardware's LUT format (tables, entries, index bits, rounding) and its profiles."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from quantlab.numerics.rounding import Round


class TableValues(enum.Enum):
    """How a direct table's entries are computed from the function.

    EXACT_FLOAT64:   T[q] = round(f(q s_in) / s_out) in float64 (the exact function; J6, LiteRT).
    RUNTIME_FLOAT32: each entry as an ONNX Runtime QDQ group computes it: fl32(s_in (q - z_in)),
                     the float32 function as onnxruntime's kernel computes it, then
                     QuantizeLinear, rne(fl32(y / s_out)) + z_out
                     (``numerics.lut.runtime_values``).
    """

    EXACT_FLOAT64 = "exact_float64"
    RUNTIME_FLOAT32 = "runtime_float32"


@dataclass(frozen=True)
class LutFormat:
    """The hardware's table format. Other devices are profiles of the same fields.

    tables:          inner tables between the dividing points (J6: 6).
    entries:         entries per table, both ends included (J6: 64).
    index_frac_bits: fractional bits of the table index = interpolation weight bits (J6: 8).
    interp_round:    rounding of the interpolation and of the tails (assumed HALF_UP, s.3).
    direct_int8:     int8 in / int8 out uses one direct table of 256 entries.
    table_round:     rounding of table entries (HALF_EVEN, the fake-quant rounding, s.1).
    slope_bits:      signed mantissa bits of tail slopes, intercepts and index multipliers (16).
    values:          how direct-table entries are computed (``TableValues``; EXACT_FLOAT64).
    """

    tables: int = 6
    entries: int = 64
    index_frac_bits: int = 8
    interp_round: Round = Round.HALF_UP
    direct_int8: bool = True
    table_round: Round = Round.HALF_EVEN
    slope_bits: int = 16
    values: TableValues = TableValues.EXACT_FLOAT64

    def __post_init__(self) -> None:
        if self.tables < 1:
            raise ValueError(f"LutFormat.tables must be >= 1, got {self.tables}")
        if self.entries < 2:
            raise ValueError(
                f"LutFormat.entries must be >= 2 (both table ends), got {self.entries}"
            )
        if not 0 <= self.index_frac_bits <= 15:
            raise ValueError(
                f"LutFormat.index_frac_bits must be in [0, 15], got {self.index_frac_bits}"
            )
        if not 2 <= self.slope_bits <= 24:
            raise ValueError(f"LutFormat.slope_bits must be in [2, 24], got {self.slope_bits}")
        if not isinstance(self.values, TableValues):
            allowed = ", ".join(v.name for v in TableValues)
            raise ValueError(f"LutFormat.values must be a TableValues ({allowed})")
        for name in ("interp_round", "table_round"):
            if not isinstance(getattr(self, name), Round):
                allowed = ", ".join(r.name for r in Round)
                raise ValueError(f"LutFormat.{name} must be a Round ({allowed})")


J6_FORMAT = LutFormat()
TOSA_LIKE_FORMAT = LutFormat(tables=1, entries=513, index_frac_bits=7, direct_int8=True)
"""One 513-entry table over the whole int16 range with 7 fraction bits (TOSA TABLE geometry,
bit-exact-emulation.md s.4.2); unlike TOSA, the output is rounded to the output dtype here."""
