"""Conv/Linear -> batch_norm -> relu6/clamp fusion, as a deployment compiles it.

Found from one run's op graph: a batch_norm (eval) or constant clamp whose only input is the
output of a GEMM with a weight (or of a batch_norm already fused into one), and whose input has
no other consumer; a batch_norm only where it normalizes the GEMM's output channels (dim 1: a
convolution's, or a 2-D linear output's). In FAKE/FIXED mode the batch_norm is folded into the
GEMM's weight and bias and the clamp is applied to the GEMM's output (its codes in fixed mode);
the fused ops then pass their input through. FLOAT mode runs the model as written.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from quantlab.op_kinds import OpCategory


def find_fusions(order: list, infos: dict, chain: dict, fused_into: dict) -> None:
    """Extend ``chain`` (GEMM name -> fused op names, in order) and ``fused_into`` (fused op ->
    GEMM) with the chains of one run (``order``: op names; ``infos``: name -> op record with
    ``producers``, ``post``, ``op_type``, ``category``, ``has_weight``)."""
    consumers: dict[str, int] = {}
    for name in order:
        for p in infos[name].producers:
            if p is not None:
                consumers[p] = consumers.get(p, 0) + 1
    for name in order:
        inf = infos[name]
        if name in fused_into or inf.post is None or not inf.producers:
            continue
        p = inf.producers[0]
        if p is None or consumers.get(p, 0) != 1:
            continue
        head = fused_into.get(p, p)
        hinf = infos.get(head)
        if hinf is None or hinf.category is not OpCategory.GEMM or not hinf.has_weight:
            continue
        links = chain.setdefault(head, [])
        kinds = [infos[c].op_type for c in links]
        is_bn = inf.op_type == "batch_norm"
        if (is_bn and links) or (not is_bn and any(k != "batch_norm" for k in kinds)):
            continue
        if is_bn and not _channels_at_dim_1(hinf):
            continue  # the batch_norm normalizes another axis than the GEMM's output channels
        if (links[-1] if links else head) != p:
            continue
        links.append(name)
        fused_into[name] = head


def _channels_at_dim_1(gemm) -> bool:
    """Whether a GEMM's output channels lie on dim 1, the axis a batch_norm normalizes: a
    convolution's always, a linear's only for a 2-D output (its features are the last dim)."""
    shape = gemm.output_shape
    return gemm.op_type != "linear" or (shape is not None and len(shape) == 2)


def scale_output_channels(w: Tensor, k: Tensor, transposed_groups: int = 0) -> Tensor:
    """``w`` times ``k`` per output channel: along axis 0 of a conv / linear weight
    ((O, ...); ``transposed_groups`` 0), or of a transposed convolution's weight (C, O / g,
    *kernel) with g = ``transposed_groups`` groups, whose output channel g_i * (O / g) + j is
    column j of the rows of group g_i."""
    if not transposed_groups:
        return w * k.reshape([-1] + [1] * (w.dim() - 1))
    g = transposed_groups
    rows = w.reshape(g, w.shape[0] // g, *w.shape[1:])
    ks = k.reshape(g, 1, w.shape[1], *[1] * (w.dim() - 2))
    return (rows * ks).reshape(w.shape)


def fold_batch_norm(
    cache: dict,
    name: str,
    w: Tensor,
    b: Tensor | None,
    bn: tuple,
    grad: bool = False,
    transposed_groups: int = 0,
) -> tuple[Tensor, Tensor]:
    """(w', b') with w' = w * g / sqrt(var + eps) per output channel and
    b' = (b - mean) * g / sqrt(var + eps) + beta, float32 (the QAT fused conv-bn); output
    channels as ``scale_output_channels`` finds them.

    ``bn`` = (running_mean, running_var, weight g, bias beta, eps); cached in ``cache[name]``
    while the same tensors (held by the entry, compared by identity, never by ``id()``) keep
    their ``_version`` and eps its value. ``grad``: the same arithmetic on the live tensors,
    uncached, so that gradients reach w, b, g and beta (training runs).
    """
    mean, var, g, beta, eps = bn
    if grad:
        k = torch.rsqrt(var.float() + eps)
        if g is not None:
            k = k * g.float()
        wf = scale_output_channels(w, k, transposed_groups)
        b0 = b if b is not None else torch.zeros_like(mean, dtype=torch.float32)
        bf = (b0 - mean) * k + (beta if beta is not None else 0.0)
        return wf, bf.float()
    parts = (w, b, mean, var, g, beta)
    versions = tuple(t._version if isinstance(t, Tensor) else None for t in parts)
    hit = cache.get(name)
    if (
        hit is None
        or hit[2] != versions
        or hit[3] != (eps, transposed_groups)
        or not all(old is new for old, new in zip(hit[4], parts))
    ):
        k = torch.rsqrt(var.float() + eps)
        if g is not None:
            k = k * g.detach().float()
        wf = scale_output_channels(w.detach(), k, transposed_groups)
        b0 = b.detach() if b is not None else torch.zeros_like(mean, dtype=torch.float32)
        bf = (b0 - mean) * k + (beta.detach() if beta is not None else 0.0)
        hit = (
            nn.Parameter(wf, requires_grad=False),
            bf.float(),
            versions,
            (eps, transposed_groups),
            parts,
        )
        cache[name] = hit
    return hit[0], hit[1]
