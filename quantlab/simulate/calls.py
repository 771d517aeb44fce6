"""Facts about one captured call the simulator needs: fusable post-op parameters, in-place
semantics, shapes and flops."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from quantlab.capture import OpCall, out_of_place_name
from quantlab.numerics.dtypes import DType
from quantlab.op_kinds import OpCategory
from quantlab.simulate import args as A


def post_params(call: OpCall) -> tuple | None:
    """batch_norm (eval): (running_mean, running_var, weight, bias, eps); relu6/clamp with
    constant bounds: (lo, hi); else None."""
    a, k = call.args, call.kwargs
    if call.op_type == "batch_norm":
        names = ("input", "running_mean", "running_var", "weight", "bias", "training", "m", "eps")
        v = A.named(a, k, names)
        if v["training"] or v["running_mean"] is None or v["running_var"] is None:
            return None
        eps = v["eps"] if v["eps"] is not None else 1e-5
        return v["running_mean"], v["running_var"], v["weight"], v["bias"], float(eps)
    if call.op_type == "relu6":
        return 0.0, 6.0
    name = out_of_place_name(call.func) if call.op_type == "clamp" else ""
    if name == "hardtanh":
        lo = k.get("min_val", a[1] if len(a) > 1 else -1.0)
        hi = k.get("max_val", a[2] if len(a) > 2 else 1.0)
        return float(lo), float(hi)
    if name in ("clamp", "clip"):
        lo = k.get("min", a[1] if len(a) > 1 else None)
        hi = k.get("max", a[2] if len(a) > 2 else None)
        if isinstance(lo, Tensor) or isinstance(hi, Tensor):
            return None
        return lo, hi
    return None


OUT_OF_PLACE = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


def substitute(call: OpCall, recorded: Any) -> Any:
    """A recorded output standing in for an op's result (replay, isolated view): a copy, so
    the record never changes; an in-place op writes it into its target, as the model expects
    (aliases of the target see it)."""
    target = inplace_target(call)
    if target is not None and isinstance(recorded, Tensor) and recorded.shape == target.shape:
        return target.copy_(recorded)
    return tree_map(lambda t: t.clone() if isinstance(t, Tensor) else t, recorded)


def is_inplace(call: OpCall) -> bool:
    return bool(call.kwargs.get("inplace")) or _inplace_by_name(call.func)


def _inplace_by_name(func) -> bool:
    """Whether ``func``'s name says it changes its first argument (``__iadd__``, ``mul_``)."""
    hit = _INPLACE_NAME.get(func)
    if hit is None:
        name = getattr(func, "__name__", "")
        hit = name.startswith("__i") or (name.endswith("_") and not name.startswith("_"))
        _INPLACE_NAME[func] = hit
    return hit


_INPLACE_NAME: dict = {}


def inplace_target(call: OpCall) -> Tensor | None:
    """The tensor an in-place call (``x += y``, ``x.mul_(y)``, ``inplace=True``) changes."""
    if is_inplace(call) and call.args and isinstance(call.args[0], Tensor):
        return call.args[0]
    return None


def out_of_place(call: OpCall):
    """The function to evaluate a quantized op with: in-place arithmetic (``x += y``,
    ``x.mul_(y)``, ``t.clamp_(0, 6)``) becomes its out-of-place form, so a tensor that carries
    codes is never changed behind its side-table entry (Python rebinds the name to the result)."""
    if _inplace_by_name(call.func):
        if call.op_type in OUT_OF_PLACE:
            return OUT_OF_PLACE[call.op_type]
        return getattr(torch, out_of_place_name(call.func))  # relu, clamp_min, sigmoid, ...
    return call.func


def quantized_fn(call: OpCall):
    """The function a FAKE or FIXED run evaluates the op with: ``out_of_place``, but torch.topk
    with ONNX's order of equal values (``topk_order``: quantized values tie often)."""
    if call.func in (torch.topk, Tensor.topk):
        from quantlab.simulate.topk_order import topk_lower_index_first

        return topk_lower_index_first
    return out_of_place(call)


def float_slots(call: OpCall) -> list:
    return [("a", i) for i, v in enumerate(call.args) if A.is_float_tensor(v)]


def shape_of(out) -> tuple | None:
    if isinstance(out, Tensor):
        return tuple(out.shape)
    leaves = [tuple(t.shape) for t in tree_flatten(out)[0] if isinstance(t, Tensor)]
    return tuple(leaves) if leaves else None


def flops(call: OpCall, plan: A.ArgPlan, out) -> int:
    if not isinstance(out, Tensor):
        return 0
    n = out.numel()
    if call.category is not OpCategory.GEMM:
        return n
    if plan.weight is not None:
        w = A.get(call.args, call.kwargs, plan.weight)
        if call.op_type in A.TRANSPOSED:  # each input element meets O / groups x kernel taps
            x = A.get(call.args, call.kwargs, plan.acts[0])
            return 2 * x.numel() * (w.numel() // max(w.shape[0], 1))
        k = (w.numel() // max(w.shape[0], 1)) if call.op_type != "linear" else w.shape[-1]
    else:
        a = A.get(call.args, call.kwargs, plan.acts[0])
        k = a.shape[-1] if call.op_type != "conv2d" else 1
    return 2 * n * int(k)


def dt_names(dts: list) -> str:
    return ",".join(d.name if isinstance(d, DType) else "" for d in dts)
