"""Precision choices for a BERT-style encoder's attention and linear layers, and what an additive
attention mask does to the softmax: op roles from ``Simulator.ops``, qconfig rules per scheme,
attention mass on padded keys and the spread of the attention scores.

Roles are read from op types and module paths as transformers' BERT names them
(``<layer>.attention.self.{query,key,value}`` linears; in ``<layer>.attention.self``: the two
matmuls (QK^T, then AV), the score scaling, the mask add and the softmax).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.qconfig import OpQConfig, QConfigSpec


class Target(enum.Enum):
    """Which GEMMs a scheme changes: the attention MatMuls (QK^T, AV) or the Linear layers."""

    ATTENTION_MATMUL = "attention_matmul"
    LINEAR = "linear"


class Scheme(enum.Enum):
    """GEMM operand precision of the targeted ops; every other op keeps the background.

    INT8:         both operands int8 (a MatMul's inputs; a Linear's input and weight).
    SPLIT:        the int15 split: a MatMul's first input int8 and its second operand (K^T, V)
                  held as int16 and split into int8 halves; a Linear's input int8 and its
                  weight split into int8 halves (``weight_split=k``). Two int8 passes either way.
    DUAL_INT16:   both operands int16 (refused where the platform allows one int16 GEMM
                  operand only, e.g. Conv/Linear on J6E/M).
    INT16_WEIGHT: a Linear's input int8 and weight int16 (one int16 operand).
    """

    INT8 = "int8"
    SPLIT = "split"
    DUAL_INT16 = "dual_int16"
    INT16_WEIGHT = "int16_weight"


@dataclass(frozen=True)
class AttentionOps:
    """Op names by role, in execution order (one entry per encoder layer)."""

    qk_matmul: list[str]
    av_matmul: list[str]
    query: list[str]
    key: list[str]
    value: list[str]
    softmax: list[str]
    scores: list[str]  # the scaled scores entering the mask add
    mask_add: list[str]
    linears: list[str]


def attention_ops(ops: pd.DataFrame) -> AttentionOps:
    """Roles of a BERT encoder's ops (``Simulator.ops``); ValueError when the layout differs."""
    att = ops[ops.module.str.endswith(".attention.self")]
    mm = list(att[att.op_type == "matmul"].name)
    lin = ops[ops.op_type == "linear"]

    def proj(suffix: str) -> list[str]:
        return list(lin[lin.module.str.endswith(f".attention.self.{suffix}")].name)

    out = AttentionOps(
        qk_matmul=mm[0::2],
        av_matmul=mm[1::2],
        query=proj("query"),
        key=proj("key"),
        value=proj("value"),
        softmax=list(att[att.op_type == "softmax"].name),
        scores=list(att[att.op_type.isin(["mul", "div"])].name),
        mask_add=list(att[att.op_type == "add"].name),
        linears=list(lin.name),
    )
    n = len(out.softmax)
    sizes = {f: len(getattr(out, f)) for f in ("qk_matmul", "av_matmul", "key", "value")}
    if n == 0 or any(v != n for v in sizes.values()):
        raise ValueError(
            f"not a BERT-style encoder: {n} attention softmax ops but {sizes} (module paths "
            "'<layer>.attention.self.{query,key,value}' and two matmuls per attention expected)"
        )
    return out


def scheme_spec(
    roles: AttentionOps,
    target: Target,
    scheme: Scheme,
    k: int = 7,
    background: DType = DType.INT8,
) -> QConfigSpec:
    """The qconfig rules of one scheme on one target over the platform template: every op's
    output at ``background`` (``global_``), the targeted GEMMs' operands by op name; with an
    int8 background the producers of int16 operands (query/key/value Linears, softmax) output
    int16 so that the operand carries int16 values."""
    i8, i16 = DType.INT8, DType.INT16
    by_name: dict[str, OpQConfig] = {}
    producers: list[str] = []
    if target is Target.ATTENTION_MATMUL:
        mms = roles.qk_matmul + roles.av_matmul
        if scheme is Scheme.INT8:
            by_name = {n: OpQConfig(input_dtype=i8) for n in mms}
        elif scheme is Scheme.SPLIT:
            by_name = {n: OpQConfig(input_dtype=i8, weight_split=k) for n in mms}
            producers = roles.key + roles.value
        elif scheme is Scheme.DUAL_INT16:
            by_name = {n: OpQConfig(input_dtype=i16) for n in mms}
            producers = roles.query + roles.key + roles.value + roles.softmax
    else:
        rule = {
            Scheme.INT8: OpQConfig(input_dtype=i8, weight_dtype=i8),
            Scheme.SPLIT: OpQConfig(input_dtype=i8, weight_dtype=i8, weight_split=k),
            Scheme.INT16_WEIGHT: OpQConfig(input_dtype=i8, weight_dtype=i16),
            Scheme.DUAL_INT16: OpQConfig(input_dtype=i16, weight_dtype=i16),
        }.get(scheme)
        by_name = {n: rule for n in roles.linears} if rule is not None else {}
    if not by_name:
        raise ValueError(f"scheme {scheme.name} does not apply to target {target.name}")
    if background is not i16:
        for n in producers:
            by_name.setdefault(n, OpQConfig(output_dtype=i16))
    return QConfigSpec(global_=OpQConfig(output_dtype=background), by_name=by_name)


def padded_key_mass(outputs: dict, softmax: list[str], attention_mask: Tensor) -> Tensor:
    """Per item (B,): the attention probability on padded keys, summed over keys and averaged
    over heads, layers and the item's real query positions (0 in exact float arithmetic with a
    large negative mask). ``outputs``: op name -> softmax output (B, H, T, T)."""
    keep = attention_mask.to(torch.float64)  # (B, T)
    pad = 1.0 - keep
    per_layer = []
    for name in softmax:
        p = outputs[name].to(torch.float64)  # (B, H, Tq, Tk)
        mass = (p * pad[:, None, None, :]).sum(-1).mean(1)  # (B, Tq)
        per_layer.append((mass * keep).sum(-1) / keep.sum(-1))
    return torch.stack(per_layer).mean(0)


def score_spread(outputs: dict, scores: list[str], attention_mask: Tensor) -> float:
    """Largest spread (max - min) of the attention scores over any query row of real tokens,
    over all keys (padded keys included), in logits: how far below a row's maximum a mask must
    push a key for the softmax's exp table to see it at its floor."""
    keep = attention_mask.bool()
    spread = 0.0
    for name in scores:
        s = outputs[name].to(torch.float64)  # (B, H, Tq, Tk)
        rows = s.amax(-1) - s.amin(-1)  # (B, H, Tq)
        spread = max(spread, float(rows.masked_select(keep[:, None, :]).max()))
    return spread


def clamped_mask_value(spread: float, exp_floor: float = 12.0) -> float:
    """The smallest-magnitude additive mask that still puts every padded key at least
    ``exp_floor`` logits (the exp table's input range, [-12, 0] on J6: j6-numerics s.3) below its
    row's maximum: -(ceil(spread) + exp_floor)."""
    if not (math.isfinite(spread) and spread >= 0):
        raise ValueError(f"score spread must be a finite number >= 0, got {spread}")
    return -float(math.ceil(spread) + exp_floor)


def saturated_share(trace, names: list[str]) -> float:
    """Share of the output codes of ``names`` (a fixed-mode Trace) at their dtype's limits."""
    hit = total = 0
    for n in names:
        info = trace.qinfo.get(n)
        if info is None or isinstance(info, list) or not info.dtype.is_int:
            continue
        c = info.codes_of(trace.outputs[n])
        hit += int(((c <= info.dtype.qmin) | (c >= info.dtype.qmax)).sum())
        total += c.numel()
    return hit / total if total else math.nan


@dataclass(frozen=True)
class ItemMean:
    """A per-item diagnostic as a bootstrap metric: the mean of the tested per-item values
    (``quantlab.analysis.confidence.bootstrap`` resamples the items)."""

    name: str = "item_mean"
    higher_is_better: bool = False

    def item_values(self, ref_outputs: list, test_outputs: list, labels=None) -> Tensor:
        return torch.cat([t.reshape(-1).to(torch.float64) for t in test_outputs])

    def __call__(self, ref_outputs: list, test_outputs: list, labels=None) -> float:
        return float(self.item_values(ref_outputs, test_outputs).mean())
