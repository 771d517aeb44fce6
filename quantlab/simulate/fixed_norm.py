"""LayerNorm, GroupNorm and InstanceNorm in the simulator: the integer composite of
``quantlab.numerics.norm`` (FIXED), its QAT form (FAKE), and the calibration of its steps.

Calibration runs the composite's steps in float on the float input (``norm_steps``) and keeps
their absolute maxima and the variance range; ``NormScales`` come from those through
``scales_from_steps`` with the platform's scale rule. The arithmetic contract is
``platform.norm_contract()``. With float activations (float16 on J6H/P) or a platform without
the composite (``platform.norm_composite`` false) the op runs as its float function between
casts. An ``instance_norm`` with running statistics (eval mode, ``track_running_stats``) is a
per-channel affine op with fixed coefficients, ``x * a_c + b_c``: it runs as a per-channel
integer GEMM of one tap (``numerics.gemm.finish_gemm``, weight ``a`` quantized per channel at
the op's weight dtype, bias ``b`` as a GEMM bias).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.norm import NormContract, NormLayout, NormScales
from quantlab.numerics.norm_calibrate import (
    NormSteps,
    fake_affine,
    norm_fake_fn,
    norm_steps,
    scales_from_steps,
)
from quantlab.numerics.norm_integer import norm_constants, norm_fixed
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.composite import ResolvedComposite
from quantlab.simulate.qtensor import QInfo
from quantlab.simulate.straight_through import through

COMPOSITE_TYPES = frozenset({"layer_norm", "group_norm", "instance_norm"})

# positional argument names of each captured normalisation
_ARG_NAMES = {
    "layer_norm": ("input", "normalized_shape", "weight", "bias", "eps"),
    "group_norm": ("input", "num_groups", "weight", "bias", "eps"),
    "instance_norm": (
        "input",
        "running_mean",
        "running_var",
        "weight",
        "bias",
        "use_input_stats",
        "momentum",
        "eps",
    ),
}


# eval-mode F.batch_norm, computed on the onnxruntime profiles (``_batch_norm_island``)
_BATCH_NORM_ARGS = (
    "input",
    "running_mean",
    "running_var",
    "weight",
    "bias",
    "training",
    "momentum",
    "eps",
)


def _named_args(call, names: tuple) -> dict:
    """The call's arguments by ``names`` (positional first, else keyword; None when absent)."""
    return A.named(call.args, call.kwargs, names)


@dataclass(frozen=True)
class NormCall:
    """What the composite needs from one call: row layout, gamma, beta (or None), eps."""

    layout: NormLayout
    weight: Tensor | None
    bias: Tensor | None
    eps: float


def norm_call(call) -> NormCall | None:
    """The NormCall of a captured layer_norm / group_norm / instance_norm (None: another op,
    or an instance_norm with running statistics, which the composite does not compute)."""
    names = _ARG_NAMES.get(call.op_type)
    if names is None:
        return None
    v = _named_args(call, names)
    eps = 1e-5 if v["eps"] is None else float(v["eps"])
    if call.op_type == "layer_norm":
        layout = NormLayout.layer(v["normalized_shape"])
    elif call.op_type == "group_norm":
        layout = NormLayout.group(int(v["num_groups"]))
    else:
        if v["use_input_stats"] is False:
            return None
        layout = NormLayout.instance()
    return NormCall(layout, v["weight"], v["bias"], eps)


def running_affine(call, detach: bool = True) -> tuple[Tensor, Tensor] | None:
    """(a, b) float32 per channel of an instance_norm that uses running statistics or an
    eval-mode batch_norm (one no GEMM absorbs): a = weight / sqrt(running_var + eps) (weight 1
    when absent), b = bias - running_mean * a (bias 0 when absent); None for any other call.
    ``detach`` False: a and b carry the gradient of weight and bias (the same values)."""
    v = _running_args(call)
    if v is None:
        return None
    eps = 1e-5 if v["eps"] is None else float(v["eps"])
    rm = v["running_mean"].detach().to(torch.float32)
    rv = v["running_var"].detach().to(torch.float32)
    a = torch.rsqrt(rv + eps)

    def param(t: Tensor) -> Tensor:
        return (t.detach() if detach else t).to(torch.float32)

    if v["weight"] is not None:
        a = a * param(v["weight"])
    b = -rm * a
    if v["bias"] is not None:
        b = b + param(v["bias"])
    return a, b


def _running_args(call) -> dict | None:
    """The named arguments of a call ``running_affine`` computes (an instance_norm of running
    statistics, an eval-mode batch_norm with them), or None for any other call."""
    if call.op_type == "instance_norm":
        v = _named_args(call, _ARG_NAMES["instance_norm"])
        if v["use_input_stats"] is not False:
            return None
    elif call.op_type == "batch_norm":
        v = _named_args(call, _BATCH_NORM_ARGS)
        if v["training"]:
            return None
    else:
        return None
    return None if v["running_mean"] is None or v["running_var"] is None else v


def _integer_affine(sim, call) -> bool:
    """Whether ``call`` runs as the per-channel affine of ``running_affine``: an instance_norm
    of running statistics, or an eval-mode batch_norm where the platform has no float island
    for it (the onnxruntime profiles compute BatchNormalization's float32 steps)."""
    from quantlab.platform_rules import FloatIslands

    if call.op_type == "batch_norm" and sim.platform.float_islands is FloatIslands.ONNXRUNTIME_QDQ:
        return False
    return _running_args(call) is not None


def _running_op(sim, call, plan, args, kwargs, in_infos, rq, mode):
    """(value, QInfo) of an instance_norm with running statistics or a standalone eval-mode
    batch_norm as ``x * a_c + b_c``: FIXED the exact per-channel products of the codes, bias
    and requantization by ``finish_gemm``; FAKE the QAT form (weight fake-quantized, output
    quantized)."""
    from quantlab.numerics import gemm
    from quantlab.numerics.quantize import dequantize
    from quantlab.simulate.modes import Mode

    info = in_infos[0] if in_infos else None
    ab = running_affine(call)
    if ab is None or not fc.int_info(info) or not rq.output_dtype.is_int:
        return None
    if not rq.weight_dtype.is_int:
        return None
    a, b = ab
    wc, ws = sim.weight_q(call.name, a.reshape(-1, 1), rq.weight_dtype, per_channel=True)
    wc = wc.reshape(-1)
    out = rq.output_dtype
    x = A.get(args, kwargs, plan.acts[0])
    shape = [1, -1] + [1] * (x.dim() - 2)
    if mode is Mode.FAKE:
        w = dequantize(wc, ws, axis=0)
        if torch.is_grad_enabled():  # a training run: the same values with the gradients of
            a, b = running_affine(call, detach=False)  # weight and bias, straight through
            w = through(a, w)  # the weight's fake quant
        y = x * w.reshape(shape) + b.reshape(shape)
        return sim.quantize_act(call.name, "out", y, out, rq, mode)
    xc = fc.codes(args, kwargs, plan.acts[0], info)
    acc = xc.to(torch.int64) * wc.to(torch.int64).reshape(shape)
    so = fc.out_scale(sim, call, rq)
    contract = sim.platform.gemm_contract("conv2d", False, activation=info.dtype)
    codes = gemm.finish_gemm(acc, info.scale, ws, b, so, out, contract, channel_axis=1)
    return fc.emit(codes, so, out)


def _summary(steps: NormSteps) -> NormSteps:
    """The steps reduced to what ``scales_from_steps`` reads (each absolute maximum; the
    variance's min and max), so calibration keeps a few numbers per batch."""

    def amax(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.abs().max().reshape(1)

    var = torch.stack([steps.var.min(), steps.var.max()])
    return NormSteps(
        mean=amax(steps.mean),
        diff=amax(steps.diff),
        square=amax(steps.square),
        var=var,
        rsqrt=amax(steps.rsqrt),
        normed=amax(steps.normed),
        scaled=amax(steps.scaled),
        out=amax(steps.out),
        gamma=amax(steps.gamma),
        beta=amax(steps.beta),
    )


def observe(sim, call) -> None:
    """Calibration: record the step statistics of one float normalisation call."""
    nc = norm_call(call)
    x = A.get(call.args, call.kwargs, ("a", 0) if call.args else ("k", "input"))
    if nc is None or not A.is_float_tensor(x) or x.numel() == 0:
        return
    steps = norm_steps(x.detach(), nc.layout, nc.weight, nc.bias, nc.eps)
    sim._norm_obs.setdefault(call.name, []).append(_summary(steps))


def norm_scales(sim, name: str) -> NormScales:
    """The calibrated NormScales of op ``name`` (cached until the next calibration)."""
    return norm_scales_entry(sim, name, sim.platform.norm_contract())[1]


def norm_scales_entry(sim, name: str, c: NormContract) -> tuple[tuple, NormScales]:
    """(its scale-cache key, the calibrated NormScales) of op ``name`` under contract ``c``."""
    key = (name, "norm_scales", c.inter_dtype, c.affine_dtype, sim.platform.scale_rule)
    hit = sim._scale_cache.get(key)
    if hit is not None:
        return key, hit
    seen = sim._norm_obs.get(name)
    if not seen:
        raise ValueError(
            f"op {name}: no calibration statistics for its normalisation steps; calibrate with "
            "inputs that reach this op"
        )
    scales = scales_from_steps(seen, c, sim.platform.scale_rule)
    sim._scale_cache[key] = scales
    return key, scales


def _applies(sim, call, in_infos, rq) -> NormCall | None:
    info = in_infos[0] if in_infos else None
    if not sim.platform.norm_composite or not fc.int_info(info) or not rq.output_dtype.is_int:
        return None
    return norm_call(call)


def norm_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    """FIXED: (value, QInfo) of the integer composite on the input codes, or None."""
    if call.op_type == "layer_norm" and not sim.platform.norm_composite:
        return _layer_norm_island(sim, call, plan, args, kwargs, in_infos, rq)
    affine = _integer_affine(sim, call)
    if call.op_type == "batch_norm" and not affine:
        return _batch_norm_island(sim, call, plan, args, kwargs, in_infos, rq)
    if affine:
        from quantlab.simulate.modes import Mode

        return _running_op(sim, call, plan, args, kwargs, in_infos, rq, Mode.FIXED)
    if call.op_type in ("group_norm", "instance_norm") and not sim.platform.norm_composite:
        return _grouped_norm_island(sim, call, plan, args, kwargs, in_infos, rq)
    nc = _applies(sim, call, in_infos, rq)
    if nc is None:
        return None
    info, out = in_infos[0], rq.output_dtype
    xc = fc.codes(args, kwargs, plan.acts[0], info)
    so = fc.out_scale(sim, call, rq)
    scales, contract = norm_scales(sim, call.name), sim.platform.norm_contract()
    n = nc.layout.rows(xc).shape[1]
    w, b = nc.weight, nc.bias
    # scales are cached objects, new when they change; gamma / beta by identity and version
    key = (info.scale, so, scales, w, b, _version(w), _version(b), nc.eps, n, out, contract)
    constants = sim.op_memo(
        call.name,
        "norm",
        key,
        lambda: norm_constants(
            float(info.scale), n, w, b, nc.eps, scales, float(so), out, contract
        ),
    )
    codes = norm_fixed(
        xc, info.scale, nc.layout, w, b, nc.eps, scales, so, out, contract, constants=constants
    )
    return fc.emit(codes, so, out)


def _float_island(sim, call, plan, args, kwargs, in_infos, rq, fn):
    """(value, QInfo) of ``fn`` on the dequantized input codes, quantized at the op's output
    (``fc.dequantize_quantize``): a norm as the onnxruntime profiles run it between
    DequantizeLinear and QuantizeLinear; None on other platforms, for an input without codes
    or a float output (the float fallback)."""
    from quantlab.platform_rules import FloatIslands

    p = sim.platform
    info = in_infos[0] if in_infos else None
    if (
        p.float_islands is not FloatIslands.ONNXRUNTIME_QDQ
        or not fc.zp_info(info)
        or not rq.output_dtype.is_int
    ):
        return None
    xc = fc.codes(args, kwargs, plan.acts[0], info)
    out, so, zo = rq.output_dtype, fc.out_scale(sim, call, rq), fc.out_zero_point(sim, call, rq)
    codes = fc.dequantize_quantize(fn, [(xc, info.scale, info.zero_point)], so, out, zo, p)
    return fc.emit(codes, so, out, zo)


def _batch_norm_island(sim, call, plan, args, kwargs, in_infos, rq):
    """An eval-mode batch_norm as onnxruntime's BatchNormalization computes it
    (``numerics.ort_batch_norm``) in a float island (``_float_island``); None otherwise."""
    from quantlab.numerics.ort_batch_norm import ort_batch_norm

    v = _named_args(call, _BATCH_NORM_ARGS)
    mean, var = v["running_mean"], v["running_var"]
    if v["training"] or mean is None or var is None:
        return None
    eps = 1e-5 if v["eps"] is None else float(v["eps"])

    def fn(x):
        return ort_batch_norm(x, mean, var, v["weight"], v["bias"], eps)

    return _float_island(sim, call, plan, args, kwargs, in_infos, rq, fn)


def _layer_norm_island(sim, call, plan, args, kwargs, in_infos, rq):
    """A layer_norm as onnxruntime's LayerNormalization computes it
    (``numerics.ort_layer_norm``) in a float island (``_float_island``); None otherwise."""
    from quantlab.numerics.ort_layer_norm import ort_layer_norm

    def fn(x):
        nc = norm_call(call)
        return ort_layer_norm(x, len(nc.layout.normalized_shape), nc.weight, nc.bias, nc.eps)

    return _float_island(sim, call, plan, args, kwargs, in_infos, rq, fn)


def _grouped_norm_island(sim, call, plan, args, kwargs, in_infos, rq):
    """A group_norm, or an instance_norm of its input's statistics (one group per channel), as
    onnxruntime computes its ONNX form (``numerics.ort_layer_norm.ort_group_norm``:
    LayerNormalization per group, then Mul and Add per channel) in a float island
    (``_float_island``); None otherwise."""
    from quantlab.numerics.ort_layer_norm import ort_group_norm

    v = _named_args(call, _ARG_NAMES[call.op_type])
    eps = 1e-5 if v["eps"] is None else float(v["eps"])
    groups = v.get("num_groups")

    def fn(x):
        g = x.shape[1] if groups is None else int(groups)
        return ort_group_norm(x, g, v["weight"], v["bias"], eps)

    return _float_island(sim, call, plan, args, kwargs, in_infos, rq, fn)


def _version(t: Tensor | None) -> int | None:
    return None if t is None else t._version


def norm_fake_op(sim, call, plan, in_infos, rq, deployed=False) -> ResolvedComposite | None:
    """FAKE: the composite's QAT form (every step fake-quantized at its calibrated scale,
    exact rsqrt, also in a ``deployed`` run) resolved for this call, or None for the float
    path."""
    if _integer_affine(sim, call):
        from quantlab.simulate.modes import Mode

        def running(args, kwargs):
            return _running_op(sim, call, plan, args, kwargs, in_infos, rq, Mode.FAKE)

        return ResolvedComposite(running)
    nc = _applies(sim, call, in_infos, rq)
    if nc is None:
        return None
    out = rq.output_dtype
    so = fc.out_scale(sim, call, rq)
    p = sim.platform
    contract, fr = p.norm_contract(), p.fake_round
    scales_key, scales = norm_scales_entry(sim, call.name, contract)
    w, b = nc.weight, nc.bias
    # gamma and beta enter detached: their fake quant is kept by identity and version
    key = (scales, w, b, _version(w), _version(b), contract, fr)
    affine = sim.op_memo(
        call.name, "fake_affine", key, lambda: fake_affine(w, b, scales, contract, fr)
    )
    # the cached 0-d scale itself (not a new view each run): a prepared consumer checks identity
    info = QInfo(out, so if so.dim() == 0 else so.reshape(()))
    fn = norm_fake_fn(nc.layout, w, b, nc.eps, scales, float(so), out, contract, fr, affine)
    x_slot = plan.acts[0]

    def compute(args, kwargs):
        return fn(A.get(args, kwargs, x_slot)), info

    out_key = sim.act_scale_key(call.name, "out", out, rq)
    return ResolvedComposite(compute, deps=((out_key, so), (scales_key, scales)))
