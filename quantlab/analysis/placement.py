"""Where each op of a model runs on a J6 platform and toolchain, and why, from the seeds.

``model_placement`` runs a model once (float mode, no calibration) and returns one row per
captured op and per deployment pattern (quantlab.simulate.patterns), in execution order:
``unit`` (a ``Unit``), ``engine`` (TAE, VAE, AAE, DTE, VPU, SPU, CPU), ``precision``, ``reason``,
``seed`` (the vendor document and line the rule comes from, or the platform assumption it takes)
and ``fix`` (what the seeds suggest). ``fixed_kernel`` is how quantlab itself simulates the op.
Seed lines refer to the originals in the shared seeds folder: 000 (operator support and
optimisation), 002 (J6E/M deployment guide), 004 (platform differences).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import pandas as pd

from quantlab.op_kinds import EVAL_IDENTITY_TYPES
from quantlab.platforms import PlatformConfig, Toolchain
from quantlab.simulate.patterns import PatternCall, record_patterns


class Unit(enum.Enum):
    """Where an op runs after conversion."""

    BPU_FIXED = "BPU fixed point"
    BPU_FLOAT = "BPU float"
    VPU = "VPU"
    SPU = "SPU"
    CPU = "CPU fallback"
    REFUSED = "refused"
    UNPLACED = "not placed"  # quantlab does not model it and no seed places it
    REMOVED = "removed at export"  # an identity in eval mode (dropout)


UNIT_ORDER = [u.value for u in (Unit.CPU, Unit.REFUSED, Unit.UNPLACED, Unit.SPU, Unit.VPU,
                                Unit.BPU_FLOAT, Unit.BPU_FIXED, Unit.REMOVED)]  # fmt: skip


@dataclass(frozen=True)
class Placement:
    unit: Unit
    engine: str
    precision: str
    reason: str
    seed: str
    fix: str = ""


# captured op categories -> (BPU engine, its seed line)
_ENGINES = {
    "GEMM": ("TAE", "seed 002 line 17 (TAE: Conv, MatMul, Linear; int8/int16 inputs)"),
    "POOL": ("AAE", "seed 002 line 18 (AAE: pooling, resize, warping)"),
    "RESAMPLE": ("AAE", "seed 002 line 18 (AAE: pooling, resize, warping)"),
    "GRID_SAMPLE": ("AAE", "seed 002 line 18 (AAE warping accelerates GridSample)"),
    "PASS_THROUGH": ("DTE", "seed 002 line 19 (DTE: layout transforms)"),
}
_VAE = ("VAE", "seed 002 line 20 (VAE: Add, Mul, table look-up)")
# pass-through ops that compute each value rather than move it: the vector engine's; and
# max pooling, which keeps its input's scale but is pooling: the AAE's
_VAE_PASS_THROUGH = frozenset({"abs", "relu", "amax", "amin", "max", "min"})
_AAE_PASS_THROUGH = frozenset(
    {"max_pool1d", "max_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d"}
)
_FIXES = {
    "layer_norm": "Dynamic Tanh instead of LayerNorm: 4 ops instead of 8, no ReduceMean "
    "(seed 000 line 119)",
    "softmax": "softmax-free attention (SimA), keeping the last layer's softmax "
    "(seed 000 lines 125-127)",
    "embedding": "keep the index path in fixed point, so the lookup runs on the BPU in one "
    "segment: quantize the index tensor with fix_scale=1 (seed 000 lines 141-147)",
}


def _oe(t: Toolchain) -> str:
    return t.value


def _index_text(p: PatternCall) -> str:
    d = p.detail
    cast = d.get("cast_to")
    fits = d["fits"]
    text = f"{d['index_dtype']} index, largest {d['largest_index']} (fits {fits})"
    return text + (f", cast to {cast}" if cast else "")


def _index_fix(p: PatternCall) -> str:
    fits = p.detail["fits"]
    if fits == "int32":
        return "the index exceeds int16: split the reduced dimension before the ArgMax"
    return f"cast the index to {fits} after the op (seed 000 line 87)"


def _index_cast(p: PatternCall, plat: PlatformConfig) -> Placement | None:
    """The CPU Cast an int64 index brings (seed 000 line 87), unless a narrow cast follows."""
    cast = p.detail.get("cast_to")
    if cast in ("int8", "int16"):
        return None
    return Placement(
        Unit.CPU,
        "CPU",
        _index_text(p),
        f"the {p.detail['index_dtype']} index brings a Cast on the CPU",
        "seed 000 line 87",
        _index_fix(p),
    )


def _topk(p: PatternCall | None, plat: PlatformConfig) -> Placement:
    prec = _index_text(p) if p is not None else "float values, int64 index"
    since = plat.spu_topk_from
    fix = f"enable_spu=True with OE >= {_oe(since)} (seed 000 line 83)" if since else ""
    seed = "seed 000 line 83"
    if "spu_topk_from" in plat.assumptions or "spu" in plat.assumptions:
        seed += " (assumed: platform.assumptions)"
    if plat.spu and since is not None and plat.toolchain.at_least(since):
        note, fix = "", ""
        if not plat.toolchain.at_least(Toolchain.OE_3_5_0):
            note = "; a Gather/Index after it may bring a CPU Cast before OE-v3.5.0"
            fix = "OE >= OE-v3.5.0 if a CPU Cast follows (seed 000 line 83)"
        return Placement(
            Unit.SPU,
            "SPU",
            prec,
            f"TopK runs on the SPU from {_oe(since)} (enable_spu=True){note}",
            seed,
            fix,
        )
    why = (
        f"{plat.name} has no SPU"
        if not plat.spu or since is None
        else f"TopK reaches the SPU only from {_oe(since)}; toolchain is {_oe(plat.toolchain)}"
    )
    return Placement(Unit.CPU, "CPU", prec, why, seed if plat.spu else "seed 002 line 13", fix)


def _fmod(plat: PlatformConfig) -> Placement:
    if plat.vpu and plat.toolchain.at_least(Toolchain.OE_3_5_0):
        return Placement(
            Unit.VPU,
            "VPU",
            "int16 / int32",
            "fmod exports as Mod, on the VPU from OE-v3.5.0",
            "seed 000 line 63",
        )
    why = (
        f"{plat.name} has no VPU"
        if not plat.vpu
        else f"Mod reaches the VPU from OE-v3.5.0; toolchain is {_oe(plat.toolchain)}"
    )
    fix = "OE >= OE-v3.5.0 (seed 000 line 63)" if plat.vpu else ""
    seed = "seed 000 line 63" + ("" if plat.vpu else "; seed 002 line 13 (no VPU)")
    return Placement(Unit.CPU, "CPU", "float32", why, seed, fix)


def _remainder(plat: PlatformConfig) -> Placement:
    alt = _fmod(plat)
    return Placement(
        Unit.CPU,
        "CPU",
        "float32",
        "no seed places remainder / % on the BPU; fmod is the supported form",
        "seed 000 lines 63-65",
        f"torch.fmod when dividend and divisor are positive (seed 000 line 65); fmod runs on: "
        f"{alt.unit.value}",
    )


def _bool_mask(plat: PlatformConfig) -> Placement:
    fix = "torch.where(mask, value, x) (seed 000 line 53)"
    if plat.bool_mask_cpu:
        seed = "seed 000 line 55"
        if "bool_mask_cpu" in plat.assumptions:
            seed += " (assumed: platform.assumptions)"
        return Placement(
            Unit.CPU, "CPU", "bool", "bool assignment brings Cast and Equal on the CPU", seed, fix
        )
    return Placement(
        Unit.BPU_FIXED,
        "VAE",
        "bool mask",
        "seed 000 line 55 names J6E/M only for the CPU Cast/Equal",
        "seed 000 line 55 (assumed: platform.assumptions)",
        fix,
    )


def pattern_placement(p: PatternCall, plat: PlatformConfig) -> Placement | None:
    """The placement a pattern decides (None: the captured op's own rule applies)."""
    kind = p.detail.get("kind")
    if kind == "bool_mask":
        return _bool_mask(plat)
    if p.pattern in ("setitem", "index_put"):
        return Placement(
            Unit.CPU,
            "CPU",
            "float32",
            "in-place assignment into a slice exports as ScatterND, a CPU op",
            "seed 000 line 11",
            "build the tensor by concatenation of regions (torch.cat along W, then H) instead of "
            "assigning into it (seed 000 line 49)",
        )
    if p.pattern == "nonzero":
        return Placement(
            Unit.CPU,
            "CPU",
            "int64 index",
            "the J6 BPU does not support NonZero",
            "seed 000 line 69",
            "a fixed-shape equivalent (mask multiply, torch.where) (seed 000 line 69)",
        )
    if p.pattern == "einsum":
        return Placement(
            Unit.REFUSED,
            "-",
            "-",
            "J6 does not support torch.einsum",
            "seed 000 line 73",
            "rewrite as matmul with permute/reshape (seed 000 line 73)",
        )
    if p.pattern in ("argmax", "argmin"):
        cast = _index_cast(p, plat)
        if cast is not None:
            return cast
        return Placement(
            Unit.BPU_FIXED,
            "VAE",
            _index_text(p),
            "the index is cast to int8/int16, so no CPU Cast is needed",
            "seed 000 line 87",
        )
    if p.pattern == "topk":
        return _topk(p, plat)
    if p.pattern == "fmod":
        return _fmod(plat)
    if p.pattern == "remainder":
        return _remainder(plat)
    if p.pattern == "multi_add":
        return Placement(
            Unit.BPU_FIXED,
            "VAE",
            f"one add of {p.detail['inputs']} inputs",
            "a many-input Add of large tensors may be bandwidth bound (load/store longer than "
            "compute)",
            "seed 000 line 91",
            "if bandwidth bound, add the inputs one by one (seed 000 line 91)",
        )
    if p.pattern == "where":
        wide = p.detail.get("broadcast")
        return Placement(
            Unit.BPU_FIXED,
            "VAE",
            "select",
            "where with broadcast operands (slower than full-shape operands)"
            if wide
            else "where (the seeds' replacement for bool assignment)",
            "seed 000 line 149" if wide else "seed 000 line 53",
            "give where's constant operands the full shape (seed 000 line 149)" if wide else "",
        )
    return None


def _unmodelled(op_type: str) -> Placement:
    if op_type in EVAL_IDENTITY_TYPES:
        return Placement(
            Unit.REMOVED, "-", "-", "an identity in eval mode, which the exported model drops", "-"
        )
    if op_type == "embedding":
        return Placement(
            Unit.BPU_FIXED,
            "VAE",
            "fixed point with a fixed scale of 1 on the index path",
            "an embedding whose index path stays in fixed point runs on the BPU in one segment",
            "seed 000 lines 141-147",
            "quantize the index tensor with fix_scale=1 (seed 000 line 145)",
        )
    return Placement(
        Unit.UNPLACED,
        "-",
        "float32 in quantlab",
        f"quantlab does not model {op_type!r} and no seed places it (it runs in float here)",
        "-",
    )


def op_placement(row: pd.Series, plat: PlatformConfig) -> Placement:
    """The placement of one captured op (a ``Simulator.ops`` row) without a pattern."""
    if row["category"] == "NONE":
        return _unmodelled(row["op_type"])
    if not row["supported"]:
        return Placement(
            Unit.CPU,
            "CPU",
            "float32",
            f"{row['op_type']!r} runs in float on this platform (platform.supported_ops, "
            "float_fallback_ops)",
            "-",
        )
    engine, seed = _ENGINES.get(row["category"], _VAE)
    if row["op_type"] in _VAE_PASS_THROUGH:
        engine, seed = _VAE
    elif row["op_type"] in _AAE_PASS_THROUGH:
        engine, seed = _ENGINES["POOL"]
    out = row["output_dtype"]
    ins = row["input_dtype"]
    prec = f"in {ins}" + (f", weight {row['weight_dtype']}" if row["weight_dtype"] else "")
    prec += f", out {out}"
    reason = f"{row['category'].lower()} op on the {engine}"
    if row["fused_into"]:
        engine, seed = _ENGINES["GEMM"]
        reason = f"fused into {row['fused_into']}"
    if row["category"] == "GEMM" and out in ("INT32", "FLOAT32"):
        if out == "INT32":
            reason = "GEMM feeding a model output: int32 output, then dequantized to float32"
            seed = "seed 002 line 17; seed 004 lines 103-107"
        else:
            reason = "GEMM feeding a model output: float32 output"
            seed = "seed 004 line 109"
    if row["op_type"] in ("conv_transpose1d", "conv_transpose2d"):
        reason += "; a transposed convolution placed and computed as Conv (assumed)"
    if row["op_type"] in ("amax", "amin"):
        reason += "; a max / min reduction, which selects input codes, placed so (assumed)"
    is_float = out in ("FLOAT16", "FLOAT32")
    if "FLOAT32" in ins.split(",") and not is_float:
        reason += "; its float32 input (from a float op or the model input) is quantized on entry"
        seed += "; seed 002 line 21 (VPU: Quantize)"
    unit = Unit.BPU_FLOAT if is_float and plat.float16_available else Unit.BPU_FIXED
    if unit is Unit.BPU_FLOAT:
        seed += "; seed 002 lines 11-13 (float in TAE/VAE)"
    return Placement(unit, engine, prec, reason, seed, _FIXES.get(row["op_type"], ""))


def _relu_after_gemm(row, categories: dict) -> str | None:
    """The GEMM a relu directly follows (its input's producer), whose output stage applies
    it on the TAE as it does a fused clamp (an assumption: the documents name the fused
    clamp), or None. ``categories``: op name -> category name."""
    producers = row.get("producers") if row["op_type"] == "relu" else None
    producer = producers[0] if producers else None
    return producer if producer and categories.get(producer) == "GEMM" else None


def model_placement(sim, inputs: tuple) -> pd.DataFrame:
    """One row per captured op and per pattern call of one float run of ``sim``'s model on
    ``inputs`` (module docstring), in execution order (``position``)."""
    plat = sim.platform
    pats = record_patterns(sim, inputs)
    ops = sim.ops
    categories = dict(zip(ops["name"], ops["category"]))
    by_pos: dict[int, list[PatternCall]] = {}
    for p in pats:
        by_pos.setdefault(p.position, []).append(p)
    rows = []

    def add(name, op_type, module, pattern, place: Placement, kernel: str) -> None:
        rows.append(
            {
                "position": len(rows),
                "name": name,
                "op_type": op_type,
                "module": module,
                "pattern": pattern,
                "unit": place.unit.value,
                "engine": place.engine,
                "precision": place.precision,
                "reason": place.reason,
                "seed": place.seed,
                "fix": place.fix,
                "fixed_kernel": kernel,
            }
        )

    for i in range(len(ops) + 1):
        row = ops.iloc[i] if i < len(ops) else None
        own = None
        for p in by_pos.get(i, []):
            same = row is not None and p.op_type == row["op_type"] and p.module == row["module"]
            if same and own is None:
                own = p
                continue
            place = pattern_placement(p, plat)
            if place is not None:
                add(p.name, p.op_type, p.module, p.pattern, place, "not captured")
        if row is None:
            break
        place = pattern_placement(own, plat) if own is not None else None
        if place is None and row["op_type"] == "topk":
            place = _topk(None, plat)
        if place is None:
            place = op_placement(row, plat)
            gemm = _relu_after_gemm(row, categories)
            if gemm is not None and place.unit is Unit.BPU_FIXED:
                engine, seed = _ENGINES["GEMM"]
                place = replace(place, engine=engine, seed=seed, reason=f"applied by {gemm}")
        pattern = own.pattern if own is not None else ""
        kernel = row["fixed_kernel"]
        if bool(row.get("fixed_in_float", False)):  # its kernel declined this call
            kernel = "float_fallback (the fixed kernel declined this call)"
            place = replace(
                place,
                reason=f"{place.reason}; quantlab's fixed kernel declines this call: quantlab "
                "computes it in float and quantizes the output",
            )
        add(row["name"], row["op_type"], row["module"], pattern, place, kernel)
    return pd.DataFrame(rows)


def unit_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Ops per unit (every unit listed, CPU fallback first)."""
    counts = table["unit"].value_counts()
    return pd.DataFrame(
        {"unit": UNIT_ORDER, "ops": [int(counts.get(u, 0)) for u in UNIT_ORDER]}
    ).assign(share=lambda d: d["ops"] / max(len(table), 1))
