"""Embedding in the simulator: a fixed-point gather of the table's codes (FIXED), the gather of
the fake-quantized table (FAKE).

The table is quantized per tensor at the op's output dtype (MinMax over the table, the
platform's scale rule) and the gathered rows keep its codes and scale
(``numerics.embedding``). The ids reach the gather by the op's ``embedding_index`` qconfig:
FIXED_ONE (index scale 1, the ids themselves) or CALIBRATED (a scale from the ids observed in
calibration at ``platform.embedding_index_dtype``). A float output dtype (float16 on J6H/P) or
``max_norm`` runs the float function between casts.
"""

from __future__ import annotations

import dataclasses

from quantlab.numerics.embedding import embedding_fixed, gather_rows, index_rows
from quantlab.numerics.fake_quant_plan import fake_quant_fn
from quantlab.qconfig import ActivationSymmetry, EmbeddingIndex
from quantlab.simulate import args as A
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.composite import ResolvedComposite
from quantlab.simulate.qat import qat_divide
from quantlab.simulate.qtensor import QInfo

_NAMES = ("input", "weight", "padding_idx", "max_norm")


def _args(call, args, kwargs):
    v = A.named(args, kwargs, _NAMES)
    return v["input"], v["weight"], v["max_norm"]


def observe(sim, call) -> None:
    """Calibration: the ids' range, for a CALIBRATED index scale."""
    ids, _, _ = _args(call, call.args, call.kwargs)
    if ids is not None and not ids.is_floating_point() and ids.numel():
        sim._obs.observe(f"{call.name}/index", ids.float())


def index_scale(sim, call, rq) -> float:
    """The scale the ids are quantized at on their way to the gather (symmetric: the index
    path has no zero point, whatever the op's ``activation_symmetry``)."""
    return _index_scale_entry(sim, call, rq)[1]


def _index_scale_entry(sim, call, rq) -> tuple[tuple | None, float]:
    """(the scale-cache key of the index scale, or None for FIXED_ONE; ``index_scale``)."""
    if rq.embedding_index is EmbeddingIndex.FIXED_ONE:
        return None, 1.0
    dt = sim.platform.embedding_index_dtype
    rq = dataclasses.replace(rq, activation_symmetry=ActivationSymmetry.SYMMETRIC)
    s = sim.act_scale(call.name, "index", dt, rq)
    return sim.act_scale_key(call.name, "index", dt, rq), float(s)


def _applies(call, args, kwargs, rq):
    """(ids, table) when the gather runs quantized, else None (the float path)."""
    ids, w, max_norm = _args(call, args, kwargs)
    if not rq.output_dtype.is_int or max_norm is not None or w is None or w.dim() != 2:
        return None
    return ids, w


def embedding_op(sim, call, plan, args, kwargs, in_infos, wq, rq):
    """FIXED: (value, QInfo) of the gather of the table's codes, or None for the float path."""
    got = _applies(call, args, kwargs, rq)
    if got is None:
        return None
    ids, w = got
    out = rq.output_dtype
    codes, s = sim.weight_q(call.name, w, out, per_channel=False)
    scale = index_scale(sim, call, rq)
    return fc.emit(embedding_fixed(ids, codes, scale, sim.platform.embedding_contract()), s, out)


def embedding_fake_op(sim, call, plan, in_infos, rq, deployed=False) -> ResolvedComposite | None:
    """FAKE: the gather of the fake-quantized table's values (the same numbers as FIXED's
    codes times their scale; ``deployed`` changes nothing) resolved for this call, or None for
    the float path."""
    got = _applies(call, call.args, call.kwargs, rq)
    if got is None:
        return None
    _, w = got
    out, p = rq.output_dtype, sim.platform
    _, s = sim.weight_q(call.name, w, out, per_channel=False)
    contract, fr = p.embedding_contract(), p.fake_round
    index_key, scale = _index_scale_entry(sim, call, rq)
    lo = -out.qmax if p.weight_narrow_range else None
    # the cached 0-d scale itself (not a new view each run): a prepared consumer checks identity
    info = QInfo(out, s if s.dim() == 0 else s.reshape(()))
    ids_slot, table, n = plan.acts[0], w.detach(), w.shape[0]
    # qat_fake_quant(x, s, out, fr, qmin=lo) per tensor, its constants worked out once
    fq = fake_quant_fn(s, out, fr, qat_divide(fr), qmin=lo)

    def compute(args, kwargs):
        rows = index_rows(A.get(args, kwargs, ids_slot), n, scale, contract)
        # per-tensor fake quant is elementwise: the gathered rows of the fake-quantized table
        # are the fake-quantized gathered rows (only the rows read are computed), in place on
        # the fresh gathered copy
        return fq(gather_rows(table, rows), inplace=True), info

    deps = () if index_key is None else ((index_key, sim._scale_cache.get(index_key)),)
    return ResolvedComposite(compute, deps=deps)
