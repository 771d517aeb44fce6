"""Per-op quantization configs and their resolution against a platform template.

Resolution, field by field (the first rule that sets a field wins):
``by_name`` > ``by_module`` (fnmatch glob on the module path; an exact module name, then the
longest matching pattern wins)
> ``by_type`` > platform template > ``global_`` > platform baseline.

Platform templates (j6-numerics s.6 and s.8) read fields of the PlatformConfig only:
- every op's activations in ``platform.global_dtype`` (int8 on J6E/M/B, float16 on J6H/P);
- Conv / Linear / MatMul inputs in ``platform.gemm_input_dtype`` and weights in
  ``platform.weight_dtype``;
- a GEMM whose output is a model output keeps a high-precision output
  (``platform.high_precision_output``: int32 on E/M/B, float32 on H/P);
- the ops producing a grid_sample grid run at ``platform.grid_chain_dtype`` (a GEMM in that
  chain takes its inputs at that dtype too where the platform allows it).
"""

from __future__ import annotations

import enum
import fnmatch
from dataclasses import dataclass, field, fields

from quantlab.calibration.kinds import (
    ActivationSymmetry,
    HistogramMethod,
    ObserverKind,
    parse_enum,
)
from quantlab.numerics.dtypes import DType
from quantlab.platforms import PlatformConfig, no_float16_reason


class EmbeddingIndex(enum.Enum):
    """How an embedding's integer ids reach the gather (``numerics.embedding``).

    FIXED_ONE:  the ids are the index codes at a fixed scale of 1 (the seed's advice): every
                id in range selects its own row.
    CALIBRATED: the ids pass through a quantizer at ``platform.embedding_index_dtype`` with a
                scale calibrated from the observed ids (the op's ``observer``), as any
                activation; ids come back rounded and may select another row.
    """

    FIXED_ONE = "fixed_one"
    CALIBRATED = "calibrated"


PER_OP_DTYPES = (DType.INT8, DType.INT16, DType.INT32, DType.FLOAT16, DType.FLOAT32)


def _per_op_dtype(value, field_name: str) -> DType:
    """``value`` as one of the dtypes an op's precision may take (``PER_OP_DTYPES``);
    ValueError naming the field and the allowed names otherwise."""
    try:
        dt = DType.parse(value)
    except ValueError:
        dt = None
    if dt not in PER_OP_DTYPES:
        allowed = ", ".join(d.name for d in PER_OP_DTYPES)
        raise ValueError(f"{field_name}: unknown dtype {value!r}; allowed: {allowed}")
    return dt


@dataclass
class OpQConfig:
    """Quantization of one op; every field optional (None = inherit from the next rule).

    input_dtype: dtype the op's activation inputs are converted to (None: take what arrives;
        a float input that carries no quantization is quantized at the op's output dtype).
    weight_dtype: dtype of weights (per-channel on axis 0, MinMax).
    output_dtype: dtype of the op's output activation.
    observer / fixed_scale / percentile / histogram_method / clip_range: activation calibration
        (see quantlab.calibration.kinds.ObserverKind); clip_range = (xmin, xmax) of CLIP.
    lut_strategy: ``quantlab.numerics.lut.Strategy`` member for LUT ops (None: per-op default).
    high_precision_output: a GEMM keeps its accumulator (int32 on E/M/B, float32 on H/P).
    weight_split: 0 off; k in 1..8 (7: no clipping, 8: full int8 range): the high/low int8
        split of a Conv/Linear weight, or of a MatMul's second operand (taken as int16, split
        into int8 halves: the int15 ``A (B_hi + B_lo)``, ``numerics.split_matmul``)
        (j6-numerics s.6).
    embedding_index: an embedding's index path (``EmbeddingIndex``; baseline FIXED_ONE).
    activation_symmetry: integer activations with a zero point or without
        (``ActivationSymmetry``; baseline ``platform.activation_symmetry``).
    single_period: sin/cos only: the vendor plugin's ``single_period=True`` custom op (opt-in,
    default off): QAT (FAKE) and the deployed op (FIXED) both reduce an input wider than one
    period to [0, 2pi] (``numerics.periodic``), whatever ``platform.sincos_period_reduction``.
    """

    input_dtype: DType | None = None
    weight_dtype: DType | None = None
    output_dtype: DType | None = None
    observer: ObserverKind | None = None
    fixed_scale: float | None = None
    percentile: float | None = None
    histogram_method: HistogramMethod | None = None
    clip_range: tuple[float, float] | None = None
    lut_strategy: object | None = None
    high_precision_output: bool | None = None
    weight_split: int | None = None
    embedding_index: EmbeddingIndex | None = None
    activation_symmetry: ActivationSymmetry | None = None
    single_period: bool | None = None

    def __post_init__(self) -> None:
        for name in ("input_dtype", "weight_dtype", "output_dtype"):
            v = getattr(self, name)
            if v is not None:
                setattr(self, name, _per_op_dtype(v, name))
        if self.observer is not None:
            self.observer = parse_enum(ObserverKind, self.observer, "observer")
        if self.histogram_method is not None:
            self.histogram_method = parse_enum(
                HistogramMethod, self.histogram_method, "histogram_method"
            )
        if self.clip_range is not None:
            lo, hi = (float(v) for v in self.clip_range)
            if not lo <= hi:
                raise ValueError(f"clip_range must be (xmin, xmax) with xmin <= xmax, got {lo, hi}")
            self.clip_range = (lo, hi)
        if isinstance(self.lut_strategy, str):
            from quantlab.numerics.lut import Strategy

            if self.lut_strategy not in Strategy.__members__:
                allowed = ", ".join(Strategy.__members__)
                raise ValueError(
                    f"lut_strategy={self.lut_strategy!r} is not allowed; allowed: {allowed}"
                )
            self.lut_strategy = Strategy[self.lut_strategy]
        if self.embedding_index is not None:
            self.embedding_index = parse_enum(
                EmbeddingIndex, self.embedding_index, "embedding_index"
            )
        if self.activation_symmetry is not None:
            self.activation_symmetry = parse_enum(
                ActivationSymmetry, self.activation_symmetry, "activation_symmetry"
            )
        if self.weight_split not in (None, 0):
            from quantlab.numerics.split import check_split_k

            check_split_k(self.weight_split)
        if self.single_period is not None and not isinstance(self.single_period, bool):
            raise ValueError(f"single_period must be true or false, got {self.single_period!r}")
        if self.fixed_scale is not None and not self.fixed_scale > 0:
            raise ValueError(f"fixed_scale must be > 0, got {self.fixed_scale}")
        if self.percentile is not None and not 0 < self.percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")
        if self.weight_dtype is not None and not self.weight_dtype.is_int:
            if self.weight_dtype is not DType.FLOAT16 and self.weight_dtype is not DType.FLOAT32:
                raise ValueError(f"weight_dtype {self.weight_dtype.name} is not allowed")


@dataclass(frozen=True)
class ResolvedQConfig:
    """An op's qconfig with every field decided (what the simulator executes)."""

    input_dtype: DType | None
    weight_dtype: DType
    output_dtype: DType
    observer: ObserverKind
    fixed_scale: float
    percentile: float
    histogram_method: HistogramMethod
    clip_range: tuple[float, float]
    lut_strategy: object | None
    high_precision_output: bool
    weight_split: int
    embedding_index: EmbeddingIndex = EmbeddingIndex.FIXED_ONE
    activation_symmetry: ActivationSymmetry = ActivationSymmetry.SYMMETRIC
    single_period: bool = False


@dataclass
class QConfigSpec:
    """User rules; see the module docstring for the resolution order."""

    global_: OpQConfig | None = None
    by_type: dict[str, OpQConfig] = field(default_factory=dict)
    by_module: dict[str, OpQConfig] = field(default_factory=dict)
    by_name: dict[str, OpQConfig] = field(default_factory=dict)
    use_platform_template: bool = True


GEMM_TYPES = frozenset(
    {"conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "linear", "matmul"}
)


@dataclass(frozen=True)
class OpContext:
    """What a template needs to know about one op (from the discovery run)."""

    name: str
    op_type: str
    module: str
    feeds_output: bool = False  # its output reaches a model output (through pass-through ops)
    in_grid_chain: bool = False  # it produces (part of) a grid_sample grid


def platform_baseline(platform: PlatformConfig) -> OpQConfig:
    """The values every op starts from: global dtype, the platform's default activation observer
    (``platform.default_observer``), MinMax weights; the vendor observers' defaults
    (percentile 99.99, ClipObserver range (-1, 1), HistogramObserver method MSE)."""
    return OpQConfig(
        input_dtype=None,
        weight_dtype=platform.weight_dtype,
        output_dtype=platform.global_dtype,
        observer=platform.default_observer,
        fixed_scale=1.0,
        percentile=99.99,
        histogram_method=HistogramMethod.MSE,
        clip_range=(-1.0, 1.0),
        lut_strategy=None,
        high_precision_output=False,
        weight_split=0,
        embedding_index=EmbeddingIndex.FIXED_ONE,
        activation_symmetry=platform.activation_symmetry,
        single_period=False,
    )


def platform_template(platform: PlatformConfig, ctx: OpContext) -> OpQConfig:
    """The vendor-recipe rules for one op (j6-numerics s.6, s.8), from platform fields only."""
    t = OpQConfig()
    if ctx.op_type in GEMM_TYPES:
        if platform.gemm_input_dtype != platform.global_dtype:
            t.input_dtype = platform.gemm_input_dtype
        t.weight_dtype = platform.weight_dtype
        if ctx.feeds_output:
            t.high_precision_output = True
    if ctx.in_grid_chain:
        t.output_dtype = platform.grid_chain_dtype
        chain = platform.grid_chain_dtype
        if ctx.op_type in GEMM_TYPES and (chain.is_float or platform.max_int16_gemm_operands >= 2):
            t.input_dtype = chain  # a GEMM in the chain computes at the chain's precision
    return t


def _merge(rules: list[OpQConfig | None]) -> dict:
    out: dict = {}
    for f in fields(OpQConfig):
        for r in rules:
            if r is not None and getattr(r, f.name) is not None:
                out[f.name] = getattr(r, f.name)
                break
    return out


def module_rule(spec: QConfigSpec, module: str) -> OpQConfig | None:
    """The ``by_module`` rule for a module path: an exact name wins, then the longest matching
    glob (the first given among equally long ones)."""
    best, best_key = None, None
    for pattern, rule in spec.by_module.items():
        if fnmatch.fnmatchcase(module, pattern):
            key = (pattern == module, len(pattern))
            if best_key is None or key > best_key:
                best, best_key = rule, key
    return best


def resolve(spec: QConfigSpec, platform: PlatformConfig, ctx: OpContext) -> ResolvedQConfig:
    """Resolve one op's qconfig: by_name > by_module > by_type > template > global_ > baseline."""
    template = platform_template(platform, ctx) if spec.use_platform_template else None
    merged = _merge(
        [
            spec.by_name.get(ctx.name),
            module_rule(spec, ctx.module),
            spec.by_type.get(ctx.op_type),
            template,
            spec.global_,
            platform_baseline(platform),
        ]
    )
    merged.setdefault("input_dtype", None)
    merged.setdefault("lut_strategy", None)
    r = ResolvedQConfig(**merged)
    _check_float16(r, platform, ctx)
    return r


def _check_float16(r: ResolvedQConfig, platform: PlatformConfig, ctx: OpContext) -> None:
    if platform.float16_available:
        return
    for name in ("input_dtype", "weight_dtype", "output_dtype"):
        if getattr(r, name) is DType.FLOAT16:
            raise ValueError(f"op {ctx.name}: {name}=FLOAT16: {no_float16_reason(platform.name)}")


def validate_names(spec: QConfigSpec, op_names: list[str], op_types: set[str]) -> None:
    """Fail on a ``by_name`` key the model does not have (listing its ops) or an unknown type."""
    names = set(op_names)
    unknown = [n for n in spec.by_name if n not in names]
    if unknown:
        listing = "\n  ".join(op_names)
        raise ValueError(
            f"qconfig.by_name names unknown op(s) {unknown}; the model's ops are:\n  {listing}"
        )
    bad_types = [t for t in spec.by_type if t not in op_types]
    if bad_types:
        raise ValueError(
            f"qconfig.by_type names unknown op type(s) {bad_types}; allowed: "
            + ", ".join(sorted(op_types))
        )


def _nearest(word: str, candidates: list[str], n: int = 5) -> list[str]:
    import difflib

    return difflib.get_close_matches(word, candidates, n=n, cutoff=0.0)


def check_matches(spec: QConfigSpec, ops: list[OpContext], source: str = "qconfig") -> None:
    """Fail when a rule of ``spec`` matches no op of the model: a ``by_name`` key that is no op
    name, a ``by_module`` glob that matches no op's module path, a ``by_type`` key that is no
    op type of the model. The message lists every such rule with the nearest op names (or op
    types); ``source`` names where the spec came from (e.g. its file)."""
    names = [o.name for o in ops]
    modules = sorted({o.module for o in ops})
    types = sorted({o.op_type for o in ops})
    problems = []
    for key in spec.by_name:
        if key not in set(names):
            near = ", ".join(_nearest(key, names))
            problems.append(f"by_name {key!r} is no op of the model; nearest op names: {near}")
    for pattern in spec.by_module:
        if not any(fnmatch.fnmatchcase(m, pattern) for m in modules):
            plain = pattern.replace("*", "").replace("?", "")
            near = ", ".join(_nearest(plain, names))
            problems.append(
                f"by_module {pattern!r} matches no op's module path; nearest op names: {near}"
            )
    for op_type in spec.by_type:
        if op_type not in types:
            near_types = _nearest(op_type, types, 3)
            near = ", ".join([o.name for o in ops if o.op_type == near_types[0]][:5])
            problems.append(
                f"by_type {op_type!r} is no op type of the model (its op types: "
                f"{', '.join(types)}); nearest op names: {near}"
            )
    if problems:
        raise ValueError(
            f"{source}: {len(problems)} rule(s) match no op of the model:\n  "
            + "\n  ".join(problems)
        )


from quantlab.qconfig_file import load, save  # noqa: E402, F401  (the YAML form of a QConfigSpec)
