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

from quantlab.numerics.embedding import embedding_fixed, index_rows
from quantlab.qconfig import ActivationSymmetry, EmbeddingIndex
from quantlab.simulate import fixed_common as fc
from quantlab.simulate.modes import Mode
from quantlab.simulate.qat import qat_fake_quant
from quantlab.simulate.qtensor import QInfo

_NAMES = ("input", "weight", "padding_idx", "max_norm")


def _args(call, args, kwargs):
    v = {n: (args[i] if i < len(args) else kwargs.get(n)) for i, n in enumerate(_NAMES)}
    return v["input"], v["weight"], v["max_norm"]


def observe(sim, call) -> None:
    """Calibration: the ids' range, for a CALIBRATED index scale."""
    ids, _, _ = _args(call, call.args, call.kwargs)
    if ids is not None and not ids.is_floating_point() and ids.numel():
        sim._obs.observe(f"{call.name}/index", ids.float())


def index_scale(sim, call, rq) -> float:
    """The scale the ids are quantized at on their way to the gather (symmetric: the index
    path has no zero point, whatever the op's ``activation_symmetry``)."""
    if rq.embedding_index is EmbeddingIndex.FIXED_ONE:
        return 1.0
    dt = sim.platform.embedding_index_dtype
    rq = dataclasses.replace(rq, activation_symmetry=ActivationSymmetry.SYMMETRIC)
    return float(sim.act_scale(call.name, "index", dt, rq))


def embedding_op(sim, call, plan, args, kwargs, in_infos, wq, rq, mode: Mode = Mode.FIXED):
    """(value, QInfo) of the gather in ``mode`` (FIXED: the table's codes; FAKE: the
    fake-quantized table's values, the same numbers), or None for the float path."""
    ids, w, max_norm = _args(call, args, kwargs)
    out = rq.output_dtype
    if not out.is_int or max_norm is not None or w is None or w.dim() != 2:
        return None
    p = sim.platform
    codes, s = sim.weight_q(call.name, w, out, per_channel=False)
    contract = p.embedding_contract()
    scale = index_scale(sim, call, rq)
    if mode is Mode.FIXED:
        return fc.emit(embedding_fixed(ids, codes, scale, contract), s, out)
    lo = -out.qmax if p.weight_narrow_range else None
    rows = index_rows(ids, w.shape[0], scale, contract)
    # per-tensor fake quant is elementwise: the gathered rows of the fake-quantized table are
    # the fake-quantized gathered rows (only the rows read are computed)
    values = qat_fake_quant(w.detach()[rows], s, out, p.fake_round, None, lo)
    # the cached 0-d scale itself (not a new view each run): a prepared consumer checks identity
    return values, QInfo(out, s if s.dim() == 0 else s.reshape(()))


def embedding_fake_op(sim, call, plan, args, kwargs, in_infos, rq):
    """FAKE form of ``embedding_op``."""
    return embedding_op(sim, call, plan, args, kwargs, in_infos, None, rq, Mode.FAKE)
