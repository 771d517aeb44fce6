"""Torch calls that op capture sees as the ops they compose, not as one op.

``decomposition(func, args, kwargs)`` gives the call's parts (a function of no argument that
makes the same result through other torch calls), or None for a call captured as it is:

- ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``) runs its own code with its
  own ``has_torch_function`` check answered False, so its input projection (linear), scores
  (bmm), softmax, weighted sum (bmm), output projection (linear) and averaged weights (mean)
  are captured one by one. The same code runs: the same float bits as the call itself. With a
  mask its scores are one ``baddbmm``, and with ``need_weights=False`` its scores, softmax and
  weighted sum are one ``scaled_dot_product_attention`` (below).
- ``F.scaled_dot_product_attention`` without mask, causal mask, dropout or grouped heads is
  ``attention_by_definition``: matmul, softmax, matmul, in the order of torch's math backend
  (``aten._scaled_dot_product_attention_math``), whose float32 bits it gives; torch's fused CPU
  kernel sums in other orders and differs from both in the last bits. With any of those, the
  call is captured as one op (not modelled: float).

Op capture (``capture.CaptureMode``) and the torch.fx trace of a steady program
(``simulate.traced_graph``) both take the parts, so a program's nodes are the captured ops.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def _own_body(func: Callable) -> Callable:
    """``func`` whose own ``has_torch_function`` check answers False: run under a torch function
    mode, its code hands the mode each call it makes instead of itself as one call. The
    functions it calls keep their checks (they read their own module's globals)."""
    names = dict(func.__globals__, has_torch_function=lambda *_: False)
    body = types.FunctionType(
        func.__code__, names, func.__name__, func.__defaults__, func.__closure__
    )
    body.__kwdefaults__ = func.__kwdefaults__
    return body


# None where torch's code no longer makes that check by that name (the call stays one op)
_MHA_BODY = (
    _own_body(F.multi_head_attention_forward)
    if "has_torch_function" in F.multi_head_attention_forward.__code__.co_names
    else None
)


def attention_by_definition(
    query: Tensor, key: Tensor, value: Tensor, scale: float | None = None
) -> Tensor:
    """softmax(q k^T * scale) v, scale 1 / sqrt(E) by default, as torch's math backend computes
    it in float: q and k^T each times sqrt(|scale|) (q negated for a negative scale), then
    matmul, softmax over the last axis, matmul."""
    factor = math.sqrt(1.0 / math.sqrt(query.shape[-1]) if scale is None else abs(scale))
    q = query * (-factor if scale is not None and scale < 0 else factor)
    scores = torch.matmul(q, key.transpose(-2, -1) * factor)
    return torch.matmul(torch.softmax(scores, -1), value)


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def _sdpa_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    if len(args) > len(_SDPA_PARAMS):
        return None
    p = dict(zip(_SDPA_PARAMS, args)) | kwargs
    if (
        p.get("attn_mask") is not None
        or p.get("dropout_p", 0.0)
        or p.get("is_causal", False)
        or p.get("enable_gqa", False)
        or not set(p) <= {*_SDPA_PARAMS, "enable_gqa"}
    ):
        return None
    return lambda: attention_by_definition(p["query"], p["key"], p["value"], p.get("scale"))


# the functions ``decomposition`` may split (callers on a hot path test identity first)
MULTI_HEAD_ATTENTION = F.multi_head_attention_forward
SCALED_DOT_PRODUCT_ATTENTION = F.scaled_dot_product_attention


def decomposition(func: Callable, args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """The parts of call ``func(*args, **kwargs)`` (module docstring), or None."""
    if func is F.multi_head_attention_forward and _MHA_BODY is not None:
        return lambda: _MHA_BODY(*args, **kwargs)
    if func is F.scaled_dot_product_attention:
        return _sdpa_parts(args, kwargs)
    return None
