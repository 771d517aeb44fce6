"""Platform profiles: the arithmetic contract a device (or a reference runtime) follows.

A profile is typed data. Kernels never branch on ``name``; they read the fields. Fields that the
vendor does not document are marked "assumed" with the j6-numerics.md section they come from.
YAML options live in ``configs/platform/*.yaml`` and select enum members by name.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from quantlab.calibration.kinds import ObserverKind
from quantlab.numerics.accumulator import Overflow
from quantlab.numerics.contract import GemmContract
from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample import GridCoord
from quantlab.numerics.lut.formats import LutFormat
from quantlab.numerics.quantize import ScaleRule
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round
from quantlab.numerics.split import SplitCombine

PLATFORM_DIR = Path(__file__).resolve().parent.parent / "configs" / "platform"


class AddRule(enum.Enum):
    """How two quantized tensors with different scales are added.

    RESCALE_FLOAT: dequantize both, add in float, requantize (ONNX Runtime QLinearAdd style).
    INTER_SCALE:   the J6 plugin rule: inter = max(sx, sy) / 2**add_inter_shift,
                   x*round(sx/inter) + y*round(sy/inter) in int32, then requantize (s.7, assumed).
    """

    RESCALE_FLOAT = "rescale_float"
    INTER_SCALE = "inter_scale"


@dataclass
class PlatformConfig:
    """Schema of the ``platform`` config group (one YAML file per device or runtime)."""

    name: str = "j6m"
    description: str = ""

    # --- quantization of activations and weights (j6-numerics s.1)
    scale_rule: ScaleRule = ScaleRule.HALF_RANGE
    fake_round: Round = Round.HALF_EVEN  # fake_quant / QuantizeLinear rounding
    weight_narrow_range: bool = False  # weights in [-qmax, qmax] (TFLite) instead of full range
    weight_per_channel: bool = True  # one weight scale per output channel; false: per tensor
    # activation observer of every op unless a qconfig says otherwise
    # (quantlab.calibration.kinds.ObserverKind): the runtime's own calibration default for
    # TFLite / ONNX Runtime; MSE_POOLED on J6 (the vendor's default is MSE, its per-batch search,
    # which profiles may name instead; compared in reports/calibration)
    default_observer: ObserverKind = ObserverKind.MSE_POOLED

    # --- integer GEMM and requantization (s.6, s.7)
    accumulator: DType = DType.INT32
    accumulator_overflow: Overflow = Overflow.SATURATE  # assumed (s.7)
    requant: Requant = Requant.MUL_SHIFT  # assumed for J6 (s.7)
    requant_round: Round = Round.HALF_UP  # assumed for J6 (s.7)
    requant_mult_bits: int = 31  # bits of the integer multiplier (31 or 15)
    # GEMM bias: true: a float32 parameter (J6: it reaches the compiler as float32, s.6); FAKE
    # adds it as is. false: the model holds int32 codes at x_scale * w_scale (a QDQ graph);
    # FAKE adds their value. FIXED adds those int32 codes either way (for J6: assumed).
    bias_float: bool = True
    add_rule: AddRule = AddRule.INTER_SCALE
    add_inter_shift: int = 14  # inter = max(sx, sy) / 2**14 (s.7)
    max_int16_gemm_operands: int = 1  # J6E/M: input and weight cannot both be int16 (s.6)
    int16_operand_max: int = 32639  # usable int16 operand range upper end, inferred (s.6)
    int16_matmul_coarsen: bool = True  # int16 matmul operand scale x max(32767/32639, sqrt(K/2))
    high_precision_output: DType = DType.INT32  # GEMM feeding a model output (int32, or float32)
    # high/low weight split: how the two partial accumulators combine (assumed, s.6)
    weight_split_combine: SplitCombine = SplitCombine.WIDE_ACCUMULATOR

    # --- float16 (s.1)
    float16_available: bool = False
    float16_saturate: bool = True  # clip to +-65504 instead of overflowing to inf

    # --- segment look-up tables (s.3)
    lut_tables: int = 6  # inner tables between the dividing points
    lut_entries: int = 64  # entries per inner table (both ends included)
    lut_index_frac_bits: int = 8  # fractional bits of the table index (interpolation weight)
    lut_interp_round: Round = Round.HALF_UP  # assumed (s.3)
    lut_direct_int8: bool = True  # int8 in / int8 out uses one 256-entry table

    # --- grid_sample (s.4)
    grid_dtype: DType = DType.INT16
    grid_coord: GridCoord = GridCoord.NORMALIZED
    grid_max_side: int = 1024  # H, W <= this (0 = no limit)
    grid_max_area: int = 720 * 1024  # H * W <= this (0 = no limit)
    grid_weight_frac_bits: int = 8  # fraction bits of sample positions / bilinear weights (assumed)
    grid_round: Round = Round.HALF_UP  # rounding of positions and of the output (assumed)

    # --- sin / cos (s.5)
    sincos_period_reduction: bool = True  # exporter reduces inputs wider than one period

    # --- qconfig template (s.8)
    global_dtype: DType = DType.INT8  # activations of every op not covered below
    gemm_input_dtype: DType = DType.INT8  # Conv / Linear / MatMul inputs
    weight_dtype: DType = DType.INT8
    grid_chain_dtype: DType = DType.INT16  # the ops producing a grid_sample grid
    sensitive_dtype: DType = DType.INT16  # what a sensitive op (or GEMM input) is raised to
    # the recipe's "precision ceiling": every raisable activation at this dtype (seed 004 l.61)
    ceiling_dtype: DType = DType.INT16

    supported_ops: list[str] = field(default_factory=list)  # empty: every op quantlab models

    def __post_init__(self) -> None:
        _check_choice("platform.requant_mult_bits", self.requant_mult_bits, (15, 31))
        _check_choice("platform.max_int16_gemm_operands", self.max_int16_gemm_operands, (0, 1, 2))
        _check_choice("platform.accumulator", self.accumulator, (DType.INT32,))
        if not 0 <= self.add_inter_shift <= 30:
            raise ValueError(
                f"platform.add_inter_shift must be in [0, 30], got {self.add_inter_shift}"
            )
        if self.lut_tables < 1:
            raise ValueError(f"platform.lut_tables must be >= 1, got {self.lut_tables}")
        if self.lut_entries < 2:
            raise ValueError(f"platform.lut_entries must be >= 2, got {self.lut_entries}")
        if not 0 <= self.lut_index_frac_bits <= 15:
            raise ValueError(
                f"platform.lut_index_frac_bits must be in [0, 15], got {self.lut_index_frac_bits}"
            )
        if not 0 <= self.grid_weight_frac_bits <= 15:
            raise ValueError(
                "platform.grid_weight_frac_bits must be in [0, 15], "
                f"got {self.grid_weight_frac_bits}"
            )
        if not 0 < self.int16_operand_max <= 32767:
            raise ValueError(
                f"platform.int16_operand_max must be in [1, 32767], got {self.int16_operand_max}"
            )
        for name in ("global_dtype", "gemm_input_dtype", "sensitive_dtype", "ceiling_dtype"):
            dt = getattr(self, name)
            if dt.is_float and dt is DType.FLOAT16 and not self.float16_available:
                raise ValueError(
                    f"platform.{name}={dt.name} but float16 is not available on {self.name} "
                    "(platform.float16_available=false); allowed: INT8, INT16"
                )
        _check_choice(
            "platform.high_precision_output",
            self.high_precision_output,
            (DType.INT32, DType.FLOAT32),
        )

    def gemm_contract(self) -> GemmContract:
        """The integer contract numerics kernels apply after an exact sum (accumulator,
        requantization, int16 operand count), composed from this profile's fields."""
        return GemmContract(
            accumulator=self.accumulator,
            accumulator_overflow=self.accumulator_overflow,
            requant=self.requant,
            requant_round=self.requant_round,
            requant_mult_bits=self.requant_mult_bits,
            max_int16_gemm_operands=self.max_int16_gemm_operands,
        )

    def lut_format(self) -> LutFormat:
        """The segment LUT format of this profile (``lut_tables``, ``lut_entries``,
        ``lut_index_frac_bits``, ``lut_interp_round``, ``lut_direct_int8``)."""
        return LutFormat(
            tables=self.lut_tables,
            entries=self.lut_entries,
            index_frac_bits=self.lut_index_frac_bits,
            interp_round=self.lut_interp_round,
            direct_int8=self.lut_direct_int8,
        )


def _check_choice(field_name: str, value, allowed) -> None:
    if value not in allowed:
        shown = ", ".join(a.name if isinstance(a, enum.Enum) else str(a) for a in allowed)
        got = value.name if isinstance(value, enum.Enum) else value
        raise ValueError(f"{field_name}={got} is not allowed; allowed: {shown}")


PLATFORM_NAMES = ("j6e", "j6m", "j6b", "j6h", "j6p", "onnxruntime", "tflite")


def load_platform(name: str) -> PlatformConfig:
    """Compose ``configs/platform/<name>.yaml`` into a PlatformConfig (outside a Hydra run).

    Every platform file extends the schema (``defaults: [schema]``) and sets values only, so
    this is the merge Hydra does for the ``platform`` group: the schema's defaults, then the
    file's values, validated by the schema (unknown keys and enum names are rejected).
    """
    from omegaconf import OmegaConf

    path = PLATFORM_DIR / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"unknown platform {name!r}; allowed: {', '.join(PLATFORM_NAMES)}")
    raw = OmegaConf.load(path)
    defaults = list(raw.pop("defaults", ["schema"]))
    if defaults != ["schema"]:
        raise ValueError(f"{path}: defaults must be [schema], got {defaults}")
    merged = OmegaConf.merge(OmegaConf.structured(PlatformConfig), raw)
    return OmegaConf.to_object(merged)
