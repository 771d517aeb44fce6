"""Float convolutions of a replayed run kept in oneDNN's blocked memory layout.

torch computes a float32 ``conv2d`` of a dense (NCHW) tensor on the CPU with oneDNN: it reorders
the input into oneDNN's blocked layout (channels in blocks of 8 or 16), runs the convolution
primitive and reorders the output back. In the computed part of a replay run
(``Simulator.run(replay=)``, FLOAT mode: the ops after the studied one), a convolution's output
that only other convolutions, residual adds and ReLUs read can stay blocked instead (a
``torch._mkldnn`` tensor): the same primitive computes it, so the same float32 values, without
the two reorders around every convolution. A ReLU6 / constant clamp fused into the convolution
(``fusion``) becomes the primitive's ``hardtanh`` post-op (a clamp is exact: the same values);
an add or ReLU of blocked tensors, in place or not, runs on them as they are (exact element-wise
operations).

Nothing is assumed: ``plan`` picks the convolutions from the discovered op graph (every consumer of
the output a convolution's input, or an add / ReLU, in place or not, whose inputs and consumers
qualify in turn), and ``BlockedConvs`` keeps a convolution's output blocked only after its first
call of each input shape and thread count gave the dense call's bits exactly (torch picks another
kernel than oneDNN's for some shapes and hosts: then that convolution stays dense), and only where
its partial sums are proven inside float32's range (``BlockedConvs``: oneDNN's fused clamp maps NaN
to its lower bound, torch's keeps it, so no NaN may arise). A blocked tensor that reaches any other
call, or the model's output, is made dense first (``dense_args``, ``dense_leaves``): a run that
departs from the discovered graph still computes the dense run's values. A modelled op writing in
place into a blocked tensor runs on it as it is (an add or ReLU) or writes the dense call's result
into it (``write_into``); any other call that would is refused (a ``RuntimeError``), since the model
would keep the blocked tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from quantlab.simulate import args as A
from quantlab.simulate import calls, trace_record

# ops that compute on blocked tensors as they are (out of place or in place), with the dense
# op's values
NATIVE_OPS = frozenset(("add", "relu"))
# calls that read only a tensor's metadata: a blocked tensor answers them as the dense one would
_METADATA = frozenset(
    (
        Tensor.shape.__get__,
        Tensor.ndim.__get__,
        Tensor.dtype.__get__,
        Tensor.device.__get__,
        Tensor.layout.__get__,
        Tensor.is_mkldnn.__get__,
        Tensor.requires_grad.__get__,
        Tensor.size,
        Tensor.dim,
        Tensor.numel,
    )
)


def available() -> bool:
    """Whether this torch build computes convolutions with oneDNN (``torch.backends.mkldnn``)
    and has its fused convolution kernel."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    try:
        torch.ops.mkldnn._convolution_pointwise  # noqa: B018 (resolving it is the check)
    except (AttributeError, RuntimeError):
        return False
    return True


def _post_op(links: list, infos: Mapping) -> tuple[str, list] | None:
    """The oneDNN post-op of a convolution's fused chain (``fusion``): ("none", []) for no
    chain, ("hardtanh", [lo, hi]) for one clamp with both bounds constant; None otherwise (a
    batch_norm, or a clamp open at one end)."""
    if not links:
        return "none", []
    if len(links) != 1:
        return None
    inf = infos[links[0]]
    if inf.op_type == "batch_norm" or inf.post is None:
        return None
    lo, hi = inf.post
    if lo is None or hi is None:
        return None
    return "hardtanh", [float(lo), float(hi)]


def plan(order: list, infos: Mapping, chain: Mapping) -> dict[str, tuple[str, list, bool]]:
    """Convolution name -> (its post-op, its scalars, whether its output may stay blocked), for
    the float32 ``conv2d`` calls of one run's op graph (``order``, ``infos``: name -> op
    record; ``chain``: GEMM -> fused ops) with a fused chain oneDNN computes (none, or one
    clamp). An output may stay blocked where every op that reads it (the output of its fused
    chain's last op) reads it as the input of a convolution of the plan, or is an add / ReLU
    (out of place or in place) all of whose inputs may stay blocked and whose own readers
    qualify in turn; an output nothing reads (the model's) is made dense. A convolution whose
    output is made dense runs blocked only when its input arrives blocked (it then saves the
    reorder of its input)."""
    readers: dict[str, list[tuple[str, int]]] = {}
    for name in order:
        for i, p in enumerate(infos[name].producers):
            if p is not None:
                readers.setdefault(p, []).append((name, i))
    convs: dict[str, tuple[str, list]] = {}
    end_of: dict[str, str] = {}  # last op of a convolution's chain -> the convolution
    for name in order:
        inf = infos[name]
        if inf.op_type != "conv2d" or not inf.has_weight or inf.inplace:
            continue
        if len(inf.input_shapes) != 1 or len(inf.input_shapes[0]) != 4:
            continue
        links = chain.get(name, [])
        post = _post_op(links, infos)
        if post is not None:
            convs[name] = post
            end_of[links[-1] if links else name] = name
    native = {
        n
        for n in order
        if infos[n].op_type in NATIVE_OPS
        and len(infos[n].producers) == (2 if infos[n].op_type == "add" else 1)
    }
    blocked = set(end_of) | native

    def reads_blocked(reader: str, i: int) -> bool:
        inf = infos[reader]
        if inf.op_type == "conv2d":  # one that runs blocked: it takes the blocked input
            return i == 0 and reader in convs
        return reader in blocked and all(p in blocked for p in inf.producers)

    changed = True
    while changed:
        changed = False
        for p in sorted(blocked):
            rs = readers.get(p)
            if not rs or not all(reads_blocked(r, i) for r, i in rs):
                blocked.discard(p)
                changed = True
    kept = {conv for end, conv in end_of.items() if end in blocked}
    return {conv: (*post, conv in kept) for conv, post in convs.items()}


def _pair(v: Any) -> list[int] | None:
    """A convolution's stride / padding / dilation as two ints (None: a string padding)."""
    if isinstance(v, int):
        return [v, v]
    if isinstance(v, tuple | list) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return list(v)
    return None


def identical_bits(a: Tensor, b: Tensor) -> bool:
    """Whether two float32 tensors hold identical bits: stricter than
    ``traced_graph.same_bits``, NaN payloads count as well as zero signs."""
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


# a bound on every partial sum below which float32 arithmetic cannot overflow, with room for
# the rounding of sums of up to 10^7 terms (a factor (1 + 2^-24)^(10^7) < 2)
FINITE_LIMIT = torch.finfo(torch.float32).max / 4


class BlockedConvs:
    """Blocked runs of a Simulator's float convolutions, and what it knows to allow them.

    ``checked``: (op name, input shape, torch threads) -> whether the blocked form gave the
    dense call's bits on that key's first call. Values are proven finite along the way: a
    fused clamp (oneDNN's clip) maps NaN to its lower bound where torch's keeps NaN, so a
    convolution runs blocked only where no partial sum can overflow float32 (nor, with finite
    inputs, make a NaN): ``bound(input) * max_o sum |w_o| + max |b| < FINITE_LIMIT``, the
    input's bound being the largest magnitude of a dense tensor entering the blocked part, or
    the bound its blocked producer was shown to keep (a clamp's largest bound magnitude;
    ``weight_bounds`` kept per weight)."""

    def __init__(self) -> None:
        self.checked: dict[tuple, bool] = {}
        self.weight_bounds: dict[str, tuple[tuple, tuple[float, float]]] = {}

    def _weight_bound(self, name: str, w: Tensor, b: Tensor | None) -> tuple[float, float]:
        """(max_o sum |w_o|, max |b|) of a convolution (float64; inf or NaN for a weight that
        is not finite), kept while the weight and bias tensors and their versions stay."""
        stamp = (id(w), w._version, id(b), None if b is None else b._version)
        hit = self.weight_bounds.get(name)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        w_sum = float(w.detach().abs().flatten(1).sum(1, dtype=torch.float64).max())
        b_max = 0.0 if b is None else float(b.detach().abs().max())
        self.weight_bounds[name] = (stamp, (w_sum, b_max))
        return w_sum, b_max

    def run(self, call, post: tuple[str, list, bool], bounds) -> Tensor | None:
        """``call`` (a float32 ``conv2d`` of ``plan``) and its fused post-op, computed blocked:
        a blocked tensor, its bound set in ``bounds`` (a QTable: blocked tensor -> bound), or,
        for an output ``plan`` makes dense, a dense tensor. None where the blocked form is not
        known to give the dense call's bits, or the output is made dense and the input is not
        blocked (then the caller computes it as the model does). The first call of a key
        computes both and compares them bit for bit."""
        if len(call.args) < 2:
            return None
        x, w = call.args[0], call.args[1]
        b = call.args[2] if len(call.args) > 2 else call.kwargs.get("bias")
        attr, scalars, keep = post
        p = A.conv_params(call)
        stride, padding = _pair(p.get("stride", 1)), _pair(p.get("padding", 0))
        dilation, groups = _pair(p.get("dilation", 1)), p.get("groups", 1)
        if (
            stride is None
            or padding is None
            or dilation is None
            or not isinstance(groups, int)
            or not isinstance(x, Tensor)
            or not (keep or x.is_mkldnn)
            or x.device.type != "cpu"
            or x.dtype != torch.float32
            or x.dim() != 4
            or not all(
                isinstance(t, Tensor) and not t.is_mkldnn and t.dtype == torch.float32
                for t in ((w,) if b is None else (w, b))
            )
        ):
            return None
        key = (call.name, tuple(x.shape), torch.get_num_threads())
        ok = self.checked.get(key)
        if ok is False:
            return None
        x_bound = bounds.get(x) if x.is_mkldnn else magnitude(x)
        if x_bound is None:
            return None
        w_sum, b_max = self._weight_bound(call.name, w, b)
        acc_bound = x_bound * w_sum + b_max
        if not acc_bound < FINITE_LIMIT:  # NaN or inf fail too
            return None
        xb = x if x.is_mkldnn else x.to_mkldnn()
        try:
            out = pointwise_conv(xb, w, b, padding, stride, dilation, groups, attr, scalars)
        except (RuntimeError, NotImplementedError):
            if ok:  # it ran for this key before: not a kernel this build lacks
                raise
            self.checked[key] = False  # this torch build has no such kernel for the shape
            return None
        if ok is None:
            dense = call.run((x.to_dense() if x.is_mkldnn else x, *call.args[1:]), call.kwargs)
            if attr == "hardtanh":
                dense = torch.nn.functional.hardtanh(dense, *scalars)
            ok = identical_bits(out.to_dense(), dense)
            self.checked[key] = ok
            if not ok:
                return None
        if not keep:
            return out.to_dense()
        bounds.set(out, max(abs(v) for v in scalars) if attr == "hardtanh" else acc_bound)
        return out


def magnitude(x: Tensor) -> float:
    """The largest magnitude in a dense float tensor (NaN when it holds a NaN, 0 when empty);
    one pass, no temporary (``aminmax``)."""
    if x.numel() == 0:
        return 0.0
    lo, hi = x.aminmax()
    return float(torch.maximum(-lo, hi))  # torch.maximum propagates NaN


def pointwise_conv(x, w, b, padding, stride, dilation, groups, attr, scalars) -> Tensor:
    """oneDNN's convolution of blocked ``x`` with a post-op (torch's fused CPU kernel)."""
    return torch.ops.mkldnn._convolution_pointwise(
        x, w, b, padding, stride, dilation, groups, attr, scalars, ""
    )


def native_operands(call, bounds) -> tuple[tuple, float] | None:
    """The arguments a ``NATIVE_OPS`` call (FLOAT; no keyword but ``inplace``) computes on in
    blocked form, and its output's bound (a sum's: its operands' sum; a ReLU keeps its
    input's); None where it cannot. An add of a blocked and a dense tensor of the same shape
    takes the dense one blocked (one reorder, as making the other dense would take); an
    in-place call's target must be blocked already; the bounds must be known and the output's
    below ``FINITE_LIMIT``."""
    if any(k != "inplace" for k in call.kwargs):
        return None
    args = call.args
    if calls.is_inplace(call) and not (args and isinstance(args[0], Tensor) and args[0].is_mkldnn):
        return None
    if len(args) != (2 if call.op_type == "add" else 1):
        return None
    if not all(isinstance(v, Tensor) and v.dtype == torch.float32 for v in args):
        return None
    if not any(v.is_mkldnn for v in args) or any(v.shape != args[0].shape for v in args):
        return None
    bs = [bounds.get(v) if v.is_mkldnn else magnitude(v) for v in args]
    if any(v is None for v in bs) or not sum(bs) < FINITE_LIMIT:
        return None
    return tuple(v if v.is_mkldnn else v.to_mkldnn() for v in args), sum(bs)


def write_into(target: Tensor, call, bounds) -> Tensor:
    """An in-place ``call`` into blocked ``target`` that does not run on blocked tensors:
    computed on dense copies of its arguments, its result copied into ``target`` (so the model
    holds the values the dense call writes), the bound of ``target`` set to the result's
    largest magnitude (dropped when not below ``FINITE_LIMIT``). RuntimeError where the result
    is no tensor of the target's shape and dtype."""
    res = call.run(dense_leaves(tuple(call.args)), dense_leaves(dict(call.kwargs)))
    if not (isinstance(res, Tensor) and res.shape == target.shape and res.dtype == target.dtype):
        raise RuntimeError(
            f"{call.name} writes in place into a convolution output kept in oneDNN's blocked "
            "layout and returns no tensor like it; set Simulator.blocked_replay = False for "
            "this model"
        )
    bound = magnitude(res)
    target.copy_(res.to_mkldnn())
    if bound < FINITE_LIMIT:
        bounds.set(target, bound)
    else:
        bounds.drop(target)
    return target


def has_blocked(args: tuple, kwargs: Mapping) -> bool:
    """Whether a call's arguments hold a blocked tensor (at any depth)."""
    return any(isinstance(v, Tensor) and v.is_mkldnn for v in tree_flatten((args, kwargs))[0])


def dense_leaves(tree: Any) -> Any:
    """``tree`` with every blocked tensor replaced by its dense copy."""
    return tree_map(lambda v: v.to_dense() if isinstance(v, Tensor) and v.is_mkldnn else v, tree)


def dense_args(func, args: tuple, kwargs: Mapping) -> tuple[tuple, dict] | None:
    """The arguments of a call that is about to read a blocked tensor, made dense; None when
    it holds none or reads only metadata. RuntimeError for a call that writes into one
    (``trace_record.written_tensor``: in place, ``__setitem__``, ``out=``): the model would go
    on holding the blocked tensor."""
    if func in _METADATA or not has_blocked(args, kwargs):
        return None
    written = trace_record.written_tensor(func, args, kwargs)
    if written is not None and written.is_mkldnn:
        raise RuntimeError(
            f"{getattr(func, '__name__', func)} would write in place into a convolution output "
            "that a replay run keeps in oneDNN's blocked layout: this run's op graph departs "
            "from the discovered one; set Simulator.blocked_replay = False for this model"
        )
    return dense_leaves(tuple(args)), dense_leaves(dict(kwargs))
