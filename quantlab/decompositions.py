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
- The 2-norm (``x.norm(dim=...)``, ``torch.norm``, ``torch.linalg.vector_norm``; order 2 or
  "fro", of float tensors) is ``sqrt(sum(x * x))``: a product, a sum and a square-root table.
  torch's norm kernel sums the squares in another order, so the parts' float bits (which
  every FLOAT run computes) differ from the call's in the last place or two. ``F.normalize``
  runs its own code, ``input / input.norm(p, dim, keepdim=True).clamp_min(eps)``, so its
  norm (of order 2) splits and its clamp and division are ops too.
- ``var`` / ``std`` of a float tensor (a hand-written LayerNorm's ``x.std(-1, keepdim=True)``)
  are the mean, the difference, its square, their sum over N - correction and, for std, the
  square-root table. torch reduces by Welford's method instead, so the parts' float bits
  (which every FLOAT run computes) differ from the call's in the last places.
- ``torch.logsumexp`` of a float tensor over given dims is ATen's CPU steps: the maximum
  (an infinite one taken as 0), exp of the difference (a table), the sum, log (a table) plus
  the maximum, with the call's float bits.

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
        or not _is_parameter(w)
        or getattr(bias, "ndim", None) != 1
    ):
        return None
    return lambda: F.linear(x, w.t(), bias)


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


_RMS_NORM_PARAMS = ("input", "normalized_shape", "weight", "eps")
RMS_NORM_DTYPES = (torch.float32, torch.float64)  # computed in their own dtype (opmath)


def _rms_norm_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``F.rms_norm`` / ``torch.rms_norm`` as ATen's CPU steps (``rms_norm_symint``): the
    squares, their mean over the normalized dims, eps added (its dtype's machine epsilon when
    None), rsqrt, the product by the input, then by the weight. float32 / float64 inputs only
    (ATen computes half types in float32 and casts back: whole)."""
    p = dict(zip(_RMS_NORM_PARAMS, args)) | kwargs
    if len(args) > len(_RMS_NORM_PARAMS) or not set(p) <= set(_RMS_NORM_PARAMS):
        return None
    x, shape, w, eps = (p.get(k) for k in _RMS_NORM_PARAMS)
    try:
        if x.dtype not in RMS_NORM_DTYPES or (w is not None and w.dtype != x.dtype):
            return None
    except AttributeError:  # not tensors
        return None
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (tuple, list, torch.Size)) or not shape:
        return None
    dims = tuple(range(-len(shape), 0))
    e = torch.finfo(x.dtype).eps if eps is None else eps

    def parts():
        y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + e)
        return y if w is None else y * w

    return parts


def _is_float(t) -> bool:
    """Whether ``t`` is a floating-point tensor (or a traced value of one)."""
    try:
        return t.dtype.is_floating_point
    except AttributeError:  # not a tensor
        return False


def _neg_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``-x`` of a float tensor as ``x * -1.0``, a product by a constant: the same bits (both
    flip the sign bit alone) except a NaN's sign (the product returns the NaN as it is)."""
    if len(args) != 1 or kwargs or not _is_float(args[0]):
        return None
    x = args[0]
    return lambda: x * -1.0


def _square_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``torch.square(x)`` of a float tensor as ``x.pow(2)`` (torch computes both as x * x)."""
    if len(args) != 1 or kwargs or not _is_float(args[0]):
        return None
    x = args[0]
    return lambda: x.pow(2)


_GLU_PARAMS = ("input", "dim")


def _glu_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``F.glu(x, dim)`` of a float tensor as ``a * sigmoid(b)``, a and b the halves of x along
    dim (ATen's GLU computes the same two roundings); an odd size or a scalar stays whole (torch
    raises its own message)."""
    p = dict(zip(_GLU_PARAMS, args)) | kwargs
    if len(args) > len(_GLU_PARAMS) or not set(p) <= set(_GLU_PARAMS):
        return None
    x, dim = p.get("input"), p.get("dim", -1)
    try:
        if not _is_float(x) or not isinstance(dim, int) or x.dim() == 0 or x.shape[dim] % 2:
            return None
    except (AttributeError, IndexError, TypeError):
        return None

    def parts():
        a, b = x.chunk(2, dim)
        return a * torch.sigmoid(b)

    return parts


def _norm_parts(names: tuple[str, str, str, str]) -> Callable:
    """The parts of a 2-norm call whose positional parameters are ``names`` (input, the order,
    dim, keepdim): ``sqrt(sum(x * x))`` over ``dim`` (all elements for None), a product, a
    sum and a square-root table. torch's own norm kernel sums the squares in another order:
    its float bits differ in the last place or two (README)."""
    order_name = names[1]

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        p = dict(zip(names, args)) | kwargs
        if len(args) > len(names) or not set(p) <= {*names, "dtype"} or p.get("dtype"):
            return None
        x, dim, keepdim = p.get(names[0]), p.get("dim"), p.get("keepdim", False)
        order = p.get(order_name, "fro" if order_name == "p" else 2)
        if isinstance(order, bool) or order not in (2, "fro") or not isinstance(keepdim, bool):
            return None
        if not _is_float(x) or x.dim() == 0:
            return None
        if isinstance(dim, int):
            dim = (dim,)
        if dim is None:
            dim = tuple(range(x.dim())) if keepdim else None
        elif not (isinstance(dim, (tuple, list)) and dim and all(type(d) is int for d in dim)):
            return None

        def parts():
            squares = x * x
            total = squares.sum() if dim is None else squares.sum(tuple(dim), keepdim=keepdim)
            return torch.sqrt(total)

        return parts

    return split


def _variance_parts(root: bool) -> Callable:
    """The parts of ``var`` (``root``: ``std``) of a float tensor: the mean over ``dim`` (all
    elements for None), the difference, its square, their sum divided by N - correction
    (``unbiased``: correction 1, the default), and for std the square root (a table); the two
    passes torch's Welford reduction replaces, so the parts' float bits differ from the call's
    in the last places (README)."""

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        if not args or not _is_float(args[0]) or args[0].dim() == 0:
            return None
        x, rest = args[0], list(args[1:])
        p: dict[str, Any] = {}
        if rest and isinstance(rest[0], bool):  # var(x, unbiased)
            p["unbiased"] = rest.pop(0)
            if rest:
                return None
        for name, value in zip(("dim", "unbiased", "keepdim"), rest):
            p[name] = value
        if len(rest) > 3 or set(p) & set(kwargs):
            return None
        p |= kwargs
        if not set(p) <= {"dim", "unbiased", "correction", "keepdim"}:
            return None
        if "unbiased" in p and "correction" in p:
            return None
        correction = p.get("correction", 1 if p.get("unbiased", True) else 0)
        keepdim = p.get("keepdim", False)
        if type(correction) not in (int, float) or not isinstance(keepdim, bool):
            return None
        dim = p.get("dim")
        dims = tuple(range(x.dim())) if dim is None else (dim,) if type(dim) is int else dim
        if not (isinstance(dims, (tuple, list)) and dims and all(type(d) is int for d in dims)):
            return None
        dims = tuple(dims)
        n = math.prod(x.shape[d] for d in dims)
        if n - correction <= 0:  # torch's inf / nan: whole
            return None

        def parts():
            diff = x - x.mean(dims, keepdim=True)
            var = (diff * diff).sum(dims, keepdim=keepdim) / (n - correction)
            return torch.sqrt(var) if root else var

        return parts

    return split


_LOGSUMEXP_PARAMS = ("input", "dim", "keepdim")


def _logsumexp_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    """``torch.logsumexp(x, dim, keepdim)`` of a float tensor as ATen's CPU steps
    (``logsumexp_out_impl``): the maximum over ``dim`` (an infinite one taken as 0), the
    exp of x minus it (a table), their sum, its log (a table) plus the maximum; with the call's
    float bits."""
    p = dict(zip(_LOGSUMEXP_PARAMS, args)) | kwargs
    if len(args) > 3 or not set(p) <= set(_LOGSUMEXP_PARAMS):
        return None
    x, dim, keepdim = p.get("input"), p.get("dim"), p.get("keepdim", False)
    if not _is_float(x) or x.dim() == 0 or x.numel() == 0 or not isinstance(keepdim, bool):
        return None
    dims = (dim,) if type(dim) is int else dim
    if not (isinstance(dims, (tuple, list)) and dims and all(type(d) is int for d in dims)):
        return None
    dims = tuple(dims)

    def parts():
        top = x.amax(dims, keepdim=True)
        top = top.masked_fill(torch.isinf(top), 0.0)
        total = torch.exp(x - top).sum(dims, keepdim=keepdim)
        return torch.log(total) + (top if keepdim else top.squeeze(dims))

    return parts


_CELL_PARAMS = ("input", "hx", "w_ih", "w_hh", "b_ih", "b_hh")


def _lstm_step(ig, hx, w_hh, b_hh):
    """One LSTM step on its input projection ``ig`` (ATen's LSTMCell on CPU)."""
    h, c = hx
    gates = F.linear(h, w_hh, b_hh) + ig
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * c + i * g
    return o * torch.tanh(cy), cy


def _gru_step(ig, h, w_hh, b_hh):
    """One GRU step on its input projection ``ig`` (ATen's GRUCell on CPU). torch adds the
    reset and update gates' parts in place into strided views of the hidden projection and
    takes their sigmoids there, row by row; one add of both gates and a sigmoid of each half
    (a strided view) takes the same rows, so the same float bits."""
    hg = F.linear(h, w_hh, b_hh)
    n = hg.shape[1] // 3
    gates = hg[:, : 2 * n] + ig[:, : 2 * n]
    reset, update = torch.sigmoid(gates[:, :n]), torch.sigmoid(gates[:, n:])
    new = torch.tanh(ig[:, 2 * n :] + hg[:, 2 * n :] * reset)
    return (h - new) * update + new


def _simple_step(activation: Callable) -> Callable:
    """One tanh / relu RNN step on its input projection (ATen's SimpleCell)."""
    return lambda ig, h, w_hh, b_hh: activation(F.linear(h, w_hh, b_hh) + ig)


def _cell_arguments(args: tuple, kwargs: dict) -> dict | None:
    """A cell call's arguments by name, or None for a call torch itself would refuse (it then
    runs whole and raises its own message): a batch of inputs (2-d) is what the modules pass."""
    p = dict(zip(_CELL_PARAMS, args)) | kwargs
    if len(args) > len(_CELL_PARAMS) or not set(p) <= set(_CELL_PARAMS) or len(p) < 4:
        return None
    if getattr(p.get("input"), "ndim", None) != 2:
        return None
    return {k: p.get(k) for k in _CELL_PARAMS}


def _cell_parts(step: Callable, lstm: bool = False) -> Callable:
    """The parts of one cell call: its input projection, then ``step``."""

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        p = _cell_arguments(args, kwargs)
        if p is None or (lstm and not _pair(p["hx"])):
            return None

        def parts():
            ig = F.linear(p["input"], p["w_ih"], p["b_ih"])
            return step(ig, p["hx"], p["w_hh"], p["b_hh"])

        return parts

    return split


def _pair(hx) -> bool:
    return isinstance(hx, (list, tuple)) and len(hx) == 2


def _initial_states(hx, lstm: bool) -> list:
    """Each layer's and direction's initial state (LSTM: (h, c) pairs) from the call's stacked
    ones. All-zero states (what the modules make in their forward when given none: constants,
    which the op capture would see sliced as ops and a torch.fx trace would not) are sliced
    outside the capture, so a steady program's trace and the capture see the same ops."""
    stacked = list(hx) if lstm else [hx]
    with torch._C.DisableTorchFunction():
        zeros = all(isinstance(t, Tensor) and not bool(t.any()) for t in stacked)
        rows = [t.unbind(0) for t in stacked] if zeros else None
    if rows is None:  # states the model computed or was given: sliced as ops
        rows = [t.unbind(0) for t in stacked]
    return list(zip(*rows)) if lstm else list(rows[0])


def _sequence_parts(step: Callable, lstm: bool = False) -> Callable:
    """The parts of an ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` call (``torch.lstm``, ``gru``,
    ``rnn_tanh``, ``rnn_relu`` on a padded batch): ATen's CPU layers, layer by layer and
    direction by direction, each the input projection of the whole sequence (one linear
    layer), its steps (``step``, backwards for the reverse direction), their outputs stacked
    (and the two directions' concatenated); the final states stacked. None for a packed
    sequence, projections (``proj_size``), dropout between layers in training, or a call
    torch would refuse."""

    def split(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
        if kwargs or len(args) != 9 or not isinstance(args[2], (list, tuple)):
            return None  # a packed sequence's overload, or not torch's call
        x, hx, params, biases, layers, dropout, train, bidirectional, batch_first = args
        dirs, per = 2 if bidirectional else 1, 4 if biases else 2
        if (
            getattr(x, "ndim", None) != 3
            or len(params) != layers * dirs * per  # projections (w_hr) among them
            or (train and dropout and layers > 1)
            or (lstm and not _pair(hx))
        ):
            return None

        def parts():
            seq = x.transpose(0, 1) if batch_first else x
            starts = _initial_states(hx, lstm)
            finals = []
            for layer in range(layers):
                outs = []
                for d in range(dirs):
                    k = layer * dirs + d
                    w_ih, w_hh, *b = params[k * per : (k + 1) * per]
                    b_ih, b_hh = b if b else (None, None)
                    steps = F.linear(seq, w_ih, b_ih).unbind(0)
                    h, ys = starts[k], []
                    for ig in steps if d == 0 else steps[::-1]:
                        h = step(ig, h, w_hh, b_hh)
                        ys.append(h[0] if lstm else h)
                    outs.append(torch.stack(ys if d == 0 else ys[::-1], 0))
                    finals.append(h)
                seq = outs[0] if dirs == 1 else torch.cat(outs, outs[0].dim() - 1)
            out = seq.transpose(0, 1) if batch_first else seq
            if lstm:
                return out, torch.stack([f[0] for f in finals]), torch.stack([f[1] for f in finals])
            return out, torch.stack(finals)

        return parts

    return split


def _is_parameter(w) -> bool:
    """Whether ``w`` is a parameter, or a traced value whose example is one (``traced_graph``:
    torch.fx hands the parts a model attribute as a traced value)."""
    return isinstance(w, nn.Parameter) or isinstance(
        getattr(w, "example_value", None), nn.Parameter
    )


# the functions ``decomposition`` may split (``splits``: callers on a hot path ask it first)
def _body_parts(body: Callable | None) -> Callable:
    """The parts of a call that runs ``body``, the function's own code (``_own_body``), on the
    call's arguments; None where torch's code makes no check to answer."""
    return lambda args, kwargs: None if body is None else (lambda: body(*args, **kwargs))


def _normalize_parts(args: tuple, kwargs: dict) -> Callable[[], Any] | None:
    if kwargs.get("out") is not None or len(args) > 4:  # the out= form: whole
        return None
    return _body_parts(_NORMALIZE_BODY)(args, kwargs)


def _two_norm(order: str) -> Callable:
    return _norm_parts(("input", order, "dim", "keepdim"))


# what nn.LSTMCell, nn.GRUCell, nn.RNNCell and nn.LSTM, nn.GRU, nn.RNN call, and their parts
RECURRENT = {
    torch.lstm_cell: _cell_parts(_lstm_step, lstm=True),
    torch.gru_cell: _cell_parts(_gru_step),
    torch.rnn_tanh_cell: _cell_parts(_simple_step(torch.tanh)),
    torch.rnn_relu_cell: _cell_parts(_simple_step(torch.relu)),
    torch.lstm: _sequence_parts(_lstm_step, lstm=True),
    torch.gru: _sequence_parts(_gru_step),
    torch.rnn_tanh: _sequence_parts(_simple_step(torch.tanh)),
    torch.rnn_relu: _sequence_parts(_simple_step(torch.relu)),
}

# every function whose calls may split -> its parts for a call's (args, kwargs), or None
PARTS: dict[Callable, Callable[[tuple, dict], Callable[[], Any] | None]] = {
    F.multi_head_attention_forward: _body_parts(_MHA_BODY),
    F.scaled_dot_product_attention: _sdpa_parts,
    torch.addmm: _addmm_parts,
    torch.baddbmm: _baddbmm_parts,
    Tensor.baddbmm: _baddbmm_parts,
    torch.functional.einsum: _einsum_parts,  # torch.einsum
    F.rms_norm: _rms_norm_parts,
    torch.rms_norm: _rms_norm_parts,
    # operator.neg: torch.fx's trace of ``-x``
    **dict.fromkeys(
        (Tensor.__neg__, Tensor.neg, Tensor.negative, torch.neg, torch.negative, operator.neg),
        _neg_parts,
    ),
    torch.square: _square_parts,
    Tensor.square: _square_parts,
    F.glu: _glu_parts,
    F.softmin: _body_parts(_SOFTMIN_BODY),
    torch.norm: _two_norm("p"),
    Tensor.norm: _two_norm("p"),
    torch.linalg.vector_norm: _two_norm("ord"),
    F.normalize: _normalize_parts,
    torch.logsumexp: _logsumexp_parts,
    Tensor.logsumexp: _logsumexp_parts,
    torch.var: _variance_parts(root=False),
    Tensor.var: _variance_parts(root=False),
    torch.std: _variance_parts(root=True),
    Tensor.std: _variance_parts(root=True),
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
