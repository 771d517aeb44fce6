"""Parsing and checking of a platform profile's field values (``PlatformConfig.__post_init__``):
each error names the field and the allowed values."""

from __future__ import annotations

import enum

from quantlab.numerics.accumulator import Overflow
from quantlab.numerics.contract import GemmFamily, GemmRule
from quantlab.numerics.dtypes import DType
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round
from quantlab.platform_rules import Toolchain


def parse_toolchain(value, field_name: str) -> Toolchain:
    """``value`` as a Toolchain: a member, its name (OE_3_5_0), its value (OE-v3.5.0) or the bare
    version (3.5.0); ValueError naming ``field_name`` and the allowed names otherwise."""
    if isinstance(value, Toolchain):
        return value
    text = str(value).strip()
    for t in Toolchain:
        if text in (t.name, t.value, t.value.removeprefix("OE-v")):
            return t
    allowed = ", ".join(t.name for t in Toolchain)
    raise ValueError(f"{field_name}={value!r} is not allowed; allowed: {allowed}")


_RULE_ENUMS = {
    "family": GemmFamily,
    "activation": DType,
    "accumulator": DType,
    "accumulator_overflow": Overflow,
    "requant": Requant,
    "requant_round": Round,
    "bias_dtype": DType,
}


def _rule_value(key: str, value):
    cls = _RULE_ENUMS.get(key)
    if cls is None or isinstance(value, cls):
        return value
    if isinstance(value, str) and value in cls.__members__:
        return cls[value]
    allowed = ", ".join(cls.__members__)
    raise ValueError(f"{key}={value!r} is not a {cls.__name__}; allowed: {allowed}")


def gemm_rule(rule, index: int) -> GemmRule:
    """A ``gemm_rules`` entry (a GemmRule, or a mapping with enum members by name) as a frozen
    GemmRule (OmegaConf hands over its own copy)."""
    try:
        if isinstance(rule, GemmRule):
            return GemmRule(**{f: getattr(rule, f) for f in GemmRule.__dataclass_fields__})
        return GemmRule(**{k: _rule_value(k, v) for k, v in dict(rule).items()})
    except (TypeError, ValueError) as e:
        raise ValueError(f"platform.gemm_rules[{index}]: {e}") from None


def check_op_types(field_name: str, ops) -> None:
    """Every entry of ``ops`` an op type quantlab models (``op_kinds.KNOWN_OP_TYPES``)."""
    from quantlab.op_kinds import KNOWN_OP_TYPES

    unknown = [o for o in ops if o not in KNOWN_OP_TYPES]
    if unknown:
        allowed = ", ".join(sorted(KNOWN_OP_TYPES))
        raise ValueError(f"{field_name} has unknown op types {unknown}; allowed: {allowed}")


def check_choice(field_name: str, value, allowed) -> None:
    if value not in allowed:
        shown = ", ".join(a.name if isinstance(a, enum.Enum) else str(a) for a in allowed)
        got = value.name if isinstance(value, enum.Enum) else value
        raise ValueError(f"{field_name}={got} is not allowed; allowed: {shown}")
