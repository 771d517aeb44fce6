"""Torch calls that op capture sees as the ops they compose, not as one op.

``decomposition(func, args, kwargs)`` gives the call's parts (a function of no argument that
makes the same result through other torch calls), or None for a call captured as it is:

- ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``) runs its own code with its
  own ``has_torch_function`` check answered False, so its input projection (linear), scores
  (bmm), softmax, weighted sum (bmm), output projection (linear) and averaged weights (mean)
  are captured one by one. The same code runs: the same float bits as the call itself. With a
  mask its scores are one ``baddbmm`` (below), and with ``need_weights=False`` its scores,
  softmax and weighted sum are one ``scaled_dot_product_attention`` (below).
- ``torch.baddbmm(m, a, b, beta=beta, alpha=alpha)`` (and the method ``m.baddbmm(a, b)``) is
  ``torch.bmm(a, b) * alpha + m * beta``: a matmul of two activations, then a product by each
  factor other than 1 and the add of ``m`` (an attention mask; left out for beta 0, as torch
  ignores ``m`` then), as a chip computes it; torch's baddbmm starts its sums from ``m`` and
  may differ in the last bits.
- ``F.scaled_dot_product_attention`` without dropout is ``attention_by_definition``: matmul,
  the mask added (an add), softmax, matmul, in the order of torch's math backend
  (``SDPBackend.MATH``), whose float32 bits it gives; torch's fused CPU kernel sums in other
  orders and differs from both in the last bits. Grouped heads (``enable_gqa``: fewer key and
  value heads than query heads) first repeat each key and value head for its group of query
  heads, as the backend does, by unsqueeze, expand and reshape (layout ops, so the repeated
  heads keep their codes). With dropout the call is captured as one op (not modelled: float).
- ``torch.addmm(bias, x, w)`` with a parameter ``w``, a 1-d bias, and beta and alpha 1 (the
  Conv1D layers of Hugging Face's GPT-2 and its kin: a linear layer stored as (in, out)) is
  ``F.linear(x, w.t(), bias)``: a GEMM with a weight and a bias (``w.t()`` of a parameter is a
  constant of the model, not an op), with the float bits of the call (linear on a 2-d input is
  that same addmm). Any other addmm stays whole (not modelled: float).
- ``x @ w``, ``torch.matmul(x, w)`` and ``torch.mm(x, w)`` with a 2-d parameter ``w`` or a
  view of one (a layer's weight applied by hand, ``x @ self.weight.t()``) are
  ``F.linear(x, w.t())``: a GEMM with a weight, quantized as a layer's weight is, with the
  call's float bits (linear without a bias is that matmul). ``w @ x`` and a product of two
  activations stay the matmul.
- ``nn.LSTMCell``, ``nn.GRUCell`` and ``nn.RNNCell`` (``torch.lstm_cell``, ``gru_cell``,
  ``rnn_tanh_cell``, ``rnn_relu_cell``) are torch's own CPU steps for one cell (ATen's
  ``LSTMCell``, ``GRUCell`` and ``SimpleCell``): the hidden and the input projections (linear
  layers with their weights), their gates' adds, sigmoid / tanh / relu, products and sums, in
  torch's order, with the call's float bits; the cell state is an activation like any other.
  ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` (``torch.lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``
  on a padded batch) are ATen's CPU layers of those steps (``_sequence_parts``), with the
  call's float bits for GRU and RNN; ``nn.LSTM``'s call runs oneDNN's fused kernel on CPU,
  which differs in the last bits, and its parts give ATen's own steps' bits (the call's with
  oneDNN off). A packed sequence, projections and dropout between layers in training stay
  whole (not modelled: float).
- ``torch.einsum`` of two float operands that is one batched matrix product is the layout ops
  and the ``bmm`` torch lowers it to (``einsum_parts``): a matmul of two activations, with the
  call's float bits. Any other einsum (one or three operands, a diagonal, a label summed
  within one operand, no contracted label) stays whole (not modelled: float).
- ``F.rms_norm`` (``nn.RMSNorm``) and ``torch.rms_norm`` on float32 / float64 inputs are ATen's
  CPU steps: the square (a product, as pow 2 is), the mean over the normalized dims, eps
  added, rsqrt (a table), the product by the input and by the weight, each an op with its own
  scales, with the call's float bits. Half-precision inputs stay whole (not modelled: float).
- ``-x`` of a float tensor (``neg``, ``negative``) is the product ``x * -1.0`` (the same bits
  but a NaN's sign), ``torch.square(x)`` is ``x.pow(2)`` (the product x * x), ``F.glu`` /
  ``nn.GLU`` is ``a * sigmoid(b)`` of its two halves and ``F.softmin`` / ``nn.Softmin`` runs
  its own code, ``(-input).softmax(dim)``: each with the call's float bits. Integer and
  in-place calls stay whole.
- ``c / y`` of a nonzero Python number and a float tensor is torch's own code for it,
  ``y.reciprocal() * c`` (a reciprocal table, then a product by a constant unless c is 1),
  with the call's float bits.
- ``F.threshold``, ``F.hardshrink`` and ``F.softshrink`` of a float tensor are selects
  (``torch.where`` of the tensor and a number, and for softshrink of the shifted tensors) in
  ATen's order of comparisons, with the call's bits, NaN included (softshrink's zeros may
  differ in sign: ATen's own vector loop and scalar tail do).
- ``clamp`` / ``clip`` / ``clamp_min`` / ``clamp_max`` of a float tensor with tensor bounds is
  ``torch.maximum`` with the lower bound, then ``torch.minimum`` with the upper: the call's
  bits (each picks one operand's value). Number bounds stay the clamp op.
- ``torch.maximum`` / ``torch.minimum`` (and ``torch.max`` / ``torch.min`` of two tensors) of
  a float tensor and a number held in a 0-d tensor needing no gradient (a TF or JAX export's
  ``Max(x, 0.0)``) is the clamp with that number: the same values (the sign of a zero or a
  NaN may differ). Two tensors with values stay the elementwise maximum / minimum.
- The 2-norm (``x.norm(dim=...)``, ``torch.norm``, ``torch.linalg.vector_norm``; order 2 or
  "fro", of float tensors) is ``sqrt(sum(x * x))``: a product, a sum and a square-root table.
  torch's norm kernel sums the squares in another order, so the parts' float bits (which
  every FLOAT run computes) differ from the call's in the last place or two. ``F.normalize``
  runs its own code, ``input / input.norm(p, dim, keepdim=True).clamp_min(eps)``, so its
  norm (of order 2) splits and its clamp and division are ops too.
- ``var`` / ``std`` of a float tensor (a hand-written LayerNorm's ``x.std(-1, keepdim=True)``),
  and ``var_mean`` / ``std_mean`` (the pair with the mean), are the mean, the difference, its
  square, their sum over N - correction and, for std, the square-root table. torch reduces by
  Welford's method instead, so the parts' float bits (which every FLOAT run computes) differ
  from the call's in the last places.
- ``F.cosine_similarity`` of float tensors is ATen's steps: each operand over its 2-norm
  (the norm's parts above) clamped at eps, their product summed over dim; the norms' float
  bits differ as above, so FLOAT runs compute the parts.
- ``torch.logsumexp`` of a float tensor over given dims is ATen's CPU steps: the maximum
  (an infinite one taken as 0), exp of the difference (a table), the sum, log (a table) plus
  the maximum, with the call's float bits.
- ``F.local_response_norm`` (``nn.LocalResponseNorm``) of a float tensor is torch's own steps
  on its channels: the square, a zero pad and an average pool over windows of channels, the
  product by alpha, k added, the power beta (a table), and the division of the input by it,
  with the call's float bits.

The recurrent layers' parts are in ``recurrent_parts``, the normalizations' and reductions'
(RMSNorm, norms, var / std, logsumexp, cosine similarity, local response norm) in
``norm_parts``, the elementwise
calls' (neg, ``c / y``, clamps, threshold and shrinks, square, GLU) in ``elementwise_parts``,
einsum's plan in ``einsum_parts``; ``PARTS`` maps every function whose calls may split to its
parts.

A model with a split call runs it by its parts in every FLOAT run, captured or not
(``DecomposingMode``), so its FLOAT runs agree bit for bit; the model called plainly may differ
in the last bits (fused attention kernels). A masked call sets the rows its mask covers whole
to 0 by a ``masked_fill`` whether there are any or not (no branch on the mask's values, so
torch.fx traces it), which keeps the softmax's codes (``simulate.same_grid``).

Op capture (``capture.CaptureMode``) and the torch.fx trace of a steady program
(``simulate.traced_graph``) both take the parts, so a program's nodes are the captured ops.
"""

from __future__ import annotations

import math
import operator
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from quantlab.einsum_parts import contract, einsum_plan
from quantlab.elementwise_parts import ELEMENTWISE
from quantlab.norm_parts import (
    cosine_similarity_parts,
    local_response_norm_parts,
    logsumexp_parts,
    rms_norm_parts,
    two_norm_parts,
    variance_parts,
)
from quantlab.recurrent_parts import RECURRENT

_CHECKS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")


def _own_body(func: Callable) -> Callable | None:
    """``func`` whose own ``has_torch_function`` checks (any of ``_CHECKS``) answer False: run
    under a torch function mode, its code hands the mode each call it makes instead of itself
    as one call. The functions it calls keep their checks (they read their own module's
    globals). None where torch's code no longer makes such a check (the call stays one op)."""
    if not set(_CHECKS) & set(func.__code__.co_names):
        return None
    names = dict(func.__globals__, **dict.fromkeys(_CHECKS, lambda *_: False))
    body = types.FunctionType(
        func.__code__, names, func.__name__, func.__defaults__, func.__closure__
    )
    body.__kwdefaults__ = func.__kwdefaults__
    return body


_MHA_BODY = _own_body(F.multi_head_attention_forward)
_SOFTMIN_BODY = _own_body(F.softmin)  # (-input).softmax(dim): the negation, then a softmax
# input / input.norm(p, dim, keepdim=True).clamp_min(eps).expand_as(input)
_NORMALIZE_BODY = _own_body(F.normalize)


def attention_by_definition(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(q k^T * scale + mask) v, scale 1 / sqrt(E) by default, as torch's math backend
    computes it in float: with ``enable_gqa`` each key and value head repeated for its group of
    query heads (dim -3); q and k^T each times sqrt(|scale|) (q negated for a negative scale),
    matmul, the mask added (a bool mask, or ``is_causal``'s lower triangle, as 0 where True and
    -inf where False), softmax over the last axis (a row the mask covers whole gives 0s, as the
    backend's safe softmax), matmul."""
    if enable_gqa:
        key, value = _repeat_heads(key, query.shape[-3]), _repeat_heads(value, query.shape[-3])
    factor = math.sqrt(1.0 / math.sqrt(query.shape[-1]) if scale is None else abs(scale))
    q = query * (-factor if scale is not None and scale < 0 else factor)
    scores = torch.matmul(q, key.transpose(-2, -1) * factor)
    if is_causal:
        attn_mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    if attn_mask is None:
        return torch.matmul(torch.softmax(scores, -1), value)
    if attn_mask.dtype == torch.bool:  # no float operand: no op of the model
        attn_mask = torch.where(attn_mask, 0.0, -math.inf)
        if attn_mask.dtype != query.dtype:
            with torch._C.DisableTorchFunction():
                attn_mask = attn_mask.to(query.dtype)
    probs = torch.softmax(scores + attn_mask, -1)
    # rows the mask covers whole, read from the mask (an input), set to 0 whether there are any
    # or not (no branch on values: torch.fx traces it); the codes keep their grid (same_grid)
    covered = torch.isneginf(attn_mask).all(-1, keepdim=True).expand(probs.shape[:-1] + (1,))
    return torch.matmul(probs.masked_fill(covered, 0.0), value)


def _repeat_heads(t: Tensor, heads: int) -> Tensor:
    """``t`` (..., H, S, E) with each of its H heads repeated heads / H times in place
    (``repeat_interleave`` along dim -3), by layout ops alone."""
    h = t.shape[-3]  # divides heads (_groups_fit)
    if h == heads:
        return t
    shape = t.shape[:-3] + (h, heads // h) + t.shape[-2:]
    return t.unsqueeze(-3).expand(shape).reshape(t.shape[:-3] + (heads,) + t.shape[-2:])


_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def _sdpa_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    if len(args) > len(_SDPA_PARAMS):
        return None
    p = dict(zip(_SDPA_PARAMS, args)) | kwargs
    mask, causal = p.get("attn_mask"), p.get("is_causal", False)
    q, k, v, gqa = p.get("query"), p.get("key"), p.get("value"), bool(p.get("enable_gqa", False))
    if (
        p.get("dropout_p", 0.0)
        or (mask is not None and causal)  # torch refuses it: the call says so itself
        or not set(p) <= {*_SDPA_PARAMS, "enable_gqa"}
        or (gqa and not _groups_fit(q, k, v))  # torch refuses it: the call says so itself
    ):
        return None
    scale = p.get("scale")
    return lambda: attention_by_definition(q, k, v, mask, bool(causal), scale, gqa)


def _groups_fit(q, k, v) -> bool:
    """Whether grouped-query attention can repeat k's and v's heads to q's: tensors (or traced
    values that answer layout questions, ``traced_graph``) of at least 3 dims whose head counts
    divide q's."""
    try:
        if min(t.dim() for t in (q, k, v)) < 3:
            return False
        return all(q.shape[-3] % t.shape[-3] == 0 for t in (k, v))
    except (AttributeError, TypeError, ZeroDivisionError):  # not tensors, or no heads
        return False


_ADDMM_PARAMS = ("input", "mat1", "mat2")


def _addmm_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    p = dict(zip(_ADDMM_PARAMS, args)) | kwargs
    bias, x, w = p.get("input"), p.get("mat1"), p.get("mat2")
    if (
        len(args) > len(_ADDMM_PARAMS)
        or not set(p) <= {*_ADDMM_PARAMS, "beta", "alpha"}
        or p.get("beta", 1) != 1
        or p.get("alpha", 1) != 1
        or not _views_parameter(w)
        or getattr(bias, "ndim", None) != 1
    ):
        return None
    return lambda: F.linear(x, w.t(), bias)


def _matmul_parts(args: tuple, kwargs: dict, least_dims: int = 1) -> Callable[[], Any] | None:
    if kwargs or len(args) != 2:  # the out= form: whole
        return None
    x, w = args
    if not _views_parameter(w) or getattr(w, "ndim", None) != 2:
        return None
    try:
        fits = x.dtype == w.dtype and x.dtype.is_floating_point and least_dims <= x.ndim
    except AttributeError:  # not a tensor
        return None
    if not fits or (least_dims == 2 and x.ndim != 2):
        return None  # torch's own call raises its own message
    return lambda: F.linear(x, w.t())


def _mm_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """torch.mm takes 2-d operands only (linear would take more)."""
    return _matmul_parts(args, kwargs, least_dims=2)


_BADDBMM_PARAMS = ("input", "batch1", "batch2")


def _baddbmm_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    p = dict(zip(_BADDBMM_PARAMS, args)) | kwargs
    beta, alpha = p.get("beta", 1), p.get("alpha", 1)
    if (
        len(args) > len(_BADDBMM_PARAMS)
        or not set(p) <= {*_BADDBMM_PARAMS, "beta", "alpha"}
        or not all(isinstance(f, (int, float)) and math.isfinite(f) for f in (beta, alpha))
    ):
        return None
    m, a, b = p.get("input"), p.get("batch1"), p.get("batch2")

    def parts():
        scores = torch.bmm(a, b)
        if alpha != 1:
            scores = scores * alpha
        if beta == 0:
            return scores
        return scores + (m if beta == 1 else m * beta)

    return parts


def _einsum_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    if kwargs or len(args) < 2 or not isinstance(args[0], str):
        return None
    operands = args[1:]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])  # einsum(equation, [a, b])
    if len(operands) != 2:
        return None
    a, b = operands
    try:
        dtypes = (a.dtype, b.dtype)
        shapes = (a.shape, b.shape)
    except AttributeError:  # not tensors
        return None
    if dtypes[0] != dtypes[1] or not dtypes[0].is_floating_point:
        return None
    plan = einsum_plan(args[0], *shapes)
    return None if plan is None else lambda: contract(a, b, plan)


def _views_parameter(w) -> bool:
    """Whether ``w`` is a parameter or a view of one (``w.t()``, ``w.T``), or a traced value
    whose example is (``traced_graph``: torch.fx hands the parts a model attribute as a traced
    value)."""
    v = getattr(w, "example_value", w)
    return isinstance(v, nn.Parameter) or type(getattr(v, "_base", None)) is nn.Parameter


def _body_parts(body: Callable | None) -> Callable:
    """The parts of a call that runs ``body``, the function's own code (``_own_body``), on the
    call's arguments; None where torch's code makes no check to answer."""
    return lambda args, kwargs: None if body is None else (lambda: body(*args, **kwargs))


def _normalize_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    if kwargs.get("out") is not None or len(args) > 4:  # the out= form: whole
        return None
    return _body_parts(_NORMALIZE_BODY)(args, kwargs)


def _two_norm(order: str) -> Callable:
    return two_norm_parts(("input", order, "dim", "keepdim"))


# every function whose calls may split -> its parts for a call's (args, kwargs), or None
PARTS: dict[Callable, Callable[[tuple, dict], Callable[[], Any] | None]] = {
    F.multi_head_attention_forward: _body_parts(_MHA_BODY),
    F.scaled_dot_product_attention: _sdpa_parts,
    torch.addmm: _addmm_parts,
    torch.matmul: _matmul_parts,
    Tensor.matmul: _matmul_parts,  # x @ w
    operator.matmul: _matmul_parts,  # x @ w traced by torch.fx
    torch.mm: _mm_parts,
    Tensor.mm: _mm_parts,
    torch.baddbmm: _baddbmm_parts,
    Tensor.baddbmm: _baddbmm_parts,
    torch.functional.einsum: _einsum_parts,  # torch.einsum
    F.rms_norm: rms_norm_parts,
    torch.rms_norm: rms_norm_parts,
    **ELEMENTWISE,
    F.softmin: _body_parts(_SOFTMIN_BODY),
    torch.norm: _two_norm("p"),
    Tensor.norm: _two_norm("p"),
    torch.linalg.vector_norm: _two_norm("ord"),
    F.normalize: _normalize_parts,
    torch.logsumexp: logsumexp_parts,
    Tensor.logsumexp: logsumexp_parts,
    torch.var: variance_parts(root=False),
    Tensor.var: variance_parts(root=False),
    torch.std: variance_parts(root=True),
    Tensor.std: variance_parts(root=True),
    torch.cosine_similarity: cosine_similarity_parts,  # F.cosine_similarity
    torch.var_mean: variance_parts(root=False, with_mean=True),
    torch.std_mean: variance_parts(root=True, with_mean=True),
    F.local_response_norm: local_response_norm_parts,
    **RECURRENT,
}
SPLIT = frozenset(PARTS)


def splits(func) -> bool:
    """Whether ``decomposition`` may split calls of ``func`` (a set lookup: every torch call
    asks)."""
    try:
        return func in SPLIT
    except TypeError:  # not hashable: not one of them
        return False


def decomposition(func: Callable, args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """The parts of call ``func(*args, **kwargs)`` (module docstring), or None."""
    split = PARTS.get(func) if splits(func) else None  # unhashable targets: none
    return None if split is None else split(args, kwargs)


class DecomposingMode(TorchFunctionMode):
    """Runs every torch call as it is, except a call ``decomposition`` splits, which runs by its
    parts: a model run outside op capture then computes what a captured FLOAT run computes (and,
    as any torch function mode does, keeps nn.MultiheadAttention off its fused path)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if splits(func):
            parts = decomposition(func, args, kwargs)
            if parts is not None:
                with self:
                    return parts()
        return func(*args, **kwargs)
