"""Fixed-point kernels of the simulator (placeholder dispatch, filled below)."""

from __future__ import annotations


def kernel_name(op_type, category, sim) -> str:
    return "float_fallback"


def run_fixed(sim, call, plan, args, kwargs, in_infos, wq, rq, quant_out):
    return None
