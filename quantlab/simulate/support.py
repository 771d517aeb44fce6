"""The op-support table: every op type quantlab captures, and how each platform runs it."""

from __future__ import annotations

import pandas as pd

from quantlab.op_kinds import _BY_IDENTITY, _BY_NAME, OpCategory
from quantlab.platforms import PlatformConfig
from quantlab.simulate import fixed_ops


class _PlatformView:
    """The part of a Simulator that ``fixed_ops.kernel_name`` reads."""

    def __init__(self, platform: PlatformConfig) -> None:
        self.platform = platform

    def supported(self, op_type: str, category: OpCategory | None) -> bool:
        return self.platform.runs_quantized(op_type, category)


def op_types() -> dict[str, OpCategory]:
    """Every modelled op type and its category (relu6 is hardtanh(0, 6); pow's category is
    its exponent's, op_kinds.pow_exponent)."""
    out = {t: c for t, c in _BY_NAME.values()}
    out.update({t: c for t, c in _BY_IDENTITY.values()})
    out["relu6"] = OpCategory.REQUANT
    out["pow"] = OpCategory.MUL  # the exponent 2; other scalar exponents are LUT ops
    return dict(sorted(out.items()))


def op_support_table(platforms: list[PlatformConfig | str]) -> pd.DataFrame:
    """One row per (op type, platform): category, supported (else it runs in float, like a
    deployment's CPU fallback) and the fixed-mode kernel (integer, lut, pass_through,
    float_fallback). Ops outside this list always run in float."""
    from quantlab.simulate.profiles import platform_config

    rows = []
    for p in platforms:
        plat = platform_config(p) if isinstance(p, str) else p
        view = _PlatformView(plat)
        for op_type, cat in op_types().items():
            kernel = fixed_ops.kernel_name(op_type, cat, view)
            if op_type == "pow":
                lut = fixed_ops.kernel_name(op_type, OpCategory.LUT, view)
                kernel = f"{kernel}; {lut} (other scalar exponents)"
            rows.append(
                {
                    "op_type": op_type,
                    "category": cat.name,
                    "platform": plat.name,
                    "supported": view.supported(op_type, cat),
                    "fixed_kernel": kernel,
                }
            )
    return pd.DataFrame(rows)
