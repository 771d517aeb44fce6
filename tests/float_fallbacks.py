"""Record the modelled ops whose fixed-point kernel declined a call (returned None), so that
they ran in float: a test that claims "every op ran its integer kernel" asserts the list empty."""

from __future__ import annotations

from quantlab.op_kinds import OpCategory
from quantlab.simulate import fixed_ops


def record_float_fallbacks(monkeypatch) -> list[str]:
    """Names of the calls whose ``fixed_ops.run_fixed`` returned None (pass-through and
    unmodelled ops excluded), appended as the runs happen while ``monkeypatch`` is active."""
    fell_back: list[str] = []
    run_fixed = fixed_ops.run_fixed

    def spy(sim, call, *args, **kwargs):
        res = run_fixed(sim, call, *args, **kwargs)
        if res is None and call.category not in (None, OpCategory.PASS_THROUGH):
            fell_back.append(call.name)
        return res

    monkeypatch.setattr(fixed_ops, "run_fixed", spy)
    return fell_back
