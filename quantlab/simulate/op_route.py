"""What a quantized op call does, worked out once per op and run configuration.

The first quantized call of an op in a configuration (its argument plan, mode, per-op override,
resolved qconfig, fused chain, platform and FAKE-op choice) decides every branch of its
quantized run that does not depend on the values it receives: which kernels apply, whether a
fused clamp is folded into the output quantization, which function evaluates it. Later calls
of that op in the same configuration look the route up and follow it; any change of
configuration makes a new route.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quantlab.capture import OpCall
from quantlab.op_kinds import OpCategory
from quantlab.qconfig import ResolvedQConfig
from quantlab.simulate import args as A
from quantlab.simulate import calls
from quantlab.simulate.modes import Mode, OpMode


@dataclass(frozen=True, slots=True, eq=False)
class OpRoute:
    """The value-independent decisions of one op's quantized run (``_run_quantized_value``).

    Key (compared by identity): ``plan`` (which pins the call's function and argument layout),
    ``mode``, ``om``, ``deployed``, ``rq``, ``chain``, ``platform``. The rest follows from the
    key.
    """

    plan: A.ArgPlan
    mode: Mode
    om: OpMode | None
    deployed: bool
    rq: ResolvedQConfig
    chain: list | None  # the fused batch_norm / clamp ops of a GEMM (None: no chain)
    platform: Any
    fn: Callable  # the out-of-place function that computes the op (``calls.quantized_fn``)
    split_b: bool  # a matmul whose second operand takes the int15 split
    quantize_weight: bool
    keep_float_inputs: bool  # FAKE: a float op's output stays float (no quantize_float_inputs)
    quant_out: bool
    gemm: bool
    grid: bool
    deployed_kernel: bool  # a segment-LUT op computed by its deployed table
    single_period: bool  # FAKE sin/cos with the platform's single-period reduction
    fake_kernel: Callable | None  # FAKE: the QAT form's resolver (``fake_kernels.fake_kernel``)
    fuse_clamp: bool  # the fused clamp goes into the output fake quantization (``bounds``)


def make_route(
    call: OpCall,
    plan: A.ArgPlan,
    mode: Mode,
    om: OpMode | None,
    deployed: bool,
    rq: ResolvedQConfig,
    chain: list | None,
    platform: Any,
    fake_kernel: Callable | None,
    deployed_categories: frozenset,
) -> OpRoute:
    cat = call.category
    quant_out = om is None or om.quantize_output
    fake = mode is Mode.FAKE
    return OpRoute(
        plan,
        mode,
        om,
        deployed,
        rq,
        chain,
        platform,
        calls.quantized_fn(call),
        bool(rq.weight_split) and call.op_type == "matmul" and len(plan.acts) > 1,
        om is None or om.quantize_weight,
        not (om is not None and om.quantize_float_inputs),
        quant_out,
        cat is OpCategory.GEMM,
        cat is OpCategory.GRID_SAMPLE,
        deployed and quant_out and cat in deployed_categories,
        fake and bool(rq.single_period) and call.op_type in ("sin", "cos"),
        fake_kernel if fake and quant_out else None,
        bool(chain)
        and fake
        and quant_out
        and rq.output_dtype.is_int
        and not rq.high_precision_output,
    )


def route_matches(r: OpRoute, plan, mode, om, deployed, rq, chain, platform) -> bool:
    """Whether route ``r`` was made for this configuration (``plan`` pins the call's function
    and argument layout: ``args.plan_of``)."""
    return (
        r.plan is plan
        and r.mode is mode
        and r.om is om
        and r.deployed is deployed
        and r.rq is rq
        and r.chain is chain
        and r.platform is platform
    )
