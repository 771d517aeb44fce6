"""Platform profiles: the arithmetic contract a device (or a reference runtime) follows.

A profile is typed data. Kernels never branch on ``name``; they read the fields. Fields that the
vendor does not document are marked "assumed" with the j6-numerics.md section they come from.
YAML options live in ``configs/platform/*.yaml`` and select enum members by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from quantlab.calibration.kinds import ActivationSymmetry, ObserverKind
from quantlab.numerics.accumulator import Overflow
from quantlab.numerics.code_bounds import BoundRule
from quantlab.numerics.contract import (
    ACCUMULATORS,
    GemmContract,
    GemmFamily,
    GemmRule,
    contract_for,
)
from quantlab.numerics.dtypes import DType
from quantlab.numerics.embedding import EmbeddingContract
from quantlab.numerics.grid_sample import GridCoord
from quantlab.numerics.lut.formats import LutFormat, TableValues
from quantlab.numerics.lut.functions import default_spec
from quantlab.numerics.lut.spec import LutSpec
from quantlab.numerics.lut.strategies import Strategy
from quantlab.numerics.norm import EpsMode, NormContract
from quantlab.numerics.quantize import Divide, QuantizeCast, ScaleRule, quantize
from quantlab.numerics.quantize_tail import QuantizeTail, quantize_scalar_tail
from quantlab.numerics.requant import Requant
from quantlab.numerics.rounding import Round
from quantlab.numerics.split import SplitCombine
from quantlab.numerics.yuv import YuvMatrix, YuvRange
from quantlab.platform_fields import check_choice, check_op_types, gemm_rule, parse_toolchain
from quantlab.platform_rules import (  # noqa: F401  (the profile's rules, imported from here too)
    AddRule,
    AvgPoolRule,
    ConcatRule,
    FloatIslands,
    MulRule,
    ResizeRule,
    Runtime,
    SoftmaxRule,
    TensorDivRule,
    Toolchain,
)

PLATFORM_DIR = Path(__file__).resolve().parent.parent / "configs" / "platform"


@dataclass
class PlatformConfig:
    """Schema of the ``platform`` config group (one YAML file per device or runtime)."""

    name: str = "j6m"
    description: str = ""

    # --- quantization of activations and weights (j6-numerics s.1)
    scale_rule: ScaleRule = ScaleRule.HALF_RANGE
    fake_round: Round = Round.HALF_EVEN  # fake_quant / QuantizeLinear rounding
    # fixed mode's codes of NaN and of quotients beyond the code range (J6: assumed, NaN -> the
    # zero point; the runtimes': measured against them)
    quantize_cast: QuantizeCast = QuantizeCast.NAN_TO_ZERO_POINT
    # how fixed mode's quantize forms x / s: a division (QuantizeLinear, TFLite) or a product by
    # fl32(1 / s) (XNNPACK)
    quantize_divide: Divide = Divide.BY_SCALE
    # elements fixed mode's quantize computes by another rule (LiteRT's own int16 QUANTIZE:
    # its scalar loop after the blocks of 8 its vector loop takes)
    quantize_tail: QuantizeTail = QuantizeTail.NONE
    weight_narrow_range: bool = False  # weights in [-qmax, qmax] (TFLite) instead of full range
    weight_per_channel: bool = True  # one weight scale per output channel; false: per tensor
    # activation observer of every op unless a qconfig says otherwise
    # (quantlab.calibration.kinds.ObserverKind): the runtime's own calibration default for
    # TFLite / ONNX Runtime; on J6 the vendor plugin's default, MSE (its per-batch MSEObserver;
    # other rules compared in reports/calibration)
    default_observer: ObserverKind = ObserverKind.MSE
    # activations with or without a zero point unless a qconfig says otherwise (J6: symmetric)
    activation_symmetry: ActivationSymmetry = ActivationSymmetry.SYMMETRIC

    # --- integer GEMM and requantization (s.6, s.7)
    accumulator: DType = DType.INT32
    accumulator_overflow: Overflow = Overflow.SATURATE  # assumed (s.7)
    requant: Requant = Requant.MUL_SHIFT  # assumed for J6 (s.7)
    requant_round: Round = Round.HALF_UP  # assumed for J6 (s.7)
    requant_mult_bits: int = 31  # bits of the integer multiplier (31 or 15)
    # per op family and activation dtype: rules that override the five fields above (and the
    # bias codes' dtype); the first matching rule applies (numerics.contract.GemmRule)
    gemm_rules: list[GemmRule] = field(default_factory=list)
    # bias codes of int16-activation GEMMs (TFLite 16x8: the converter writes INT64 unless
    # told quantized_bias_type=INT32); picks among gemm_rules by their bias_dtype
    int16_bias_dtype: DType = DType.INT64
    # how a fused relu / relu6 bound becomes an output code
    bound_rule: BoundRule = BoundRule.FLOAT64_HALF_EVEN
    # GEMM bias: true: a float32 parameter (J6: it reaches the compiler as float32, s.6); FAKE
    # adds it as is. false: the model holds int32 codes at x_scale * w_scale (a QDQ graph);
    # FAKE adds their value. FIXED adds those int32 codes either way (for J6: assumed).
    bias_float: bool = True
    add_rule: AddRule = AddRule.INTER_SCALE
    mul_rule: MulRule = MulRule.REQUANTIZE  # a product of two activations
    float_islands: FloatIslands = FloatIslands.NONE  # ops run in float between DQ and Q
    # zero point the runtime's QLinear kernels hold activation codes with (RESCALE_FLOAT_FMA):
    # 0 for int8, 128 for uint8 (ONNX QDQ exported with uint8 activations, zero point 128)
    qlinear_zero_point: int = 0
    # uint8 activations x int8 weights: adjacent product pairs of every GEMM sum saturate to
    # int16 (onnxruntime's MLAS kernels on x86 CPUs without VNNI; ``gemm.pair_saturation``)
    u8s8_pair_saturation: bool = False
    concat_rule: ConcatRule = ConcatRule.REQUANTIZE  # cat / stack of inputs at other scales
    avg_pool_rule: AvgPoolRule = AvgPoolRule.INTEGER_SUM  # average pools over windows
    tensor_div_rule: TensorDivRule = TensorDivRule.RECIPROCAL_TABLE  # x / (a tensor)
    div_reciprocal_dtype: DType = DType.INT16  # the reciprocal table's output (plugin: int16)
    add_inter_shift: int = 14  # inter = max(sx, sy) / 2**14 (s.7)
    add_left_shift: int = 20  # LEFT_SHIFT, 8-bit operands (TFLite: 20)
    add_left_shift_int16: int = 15  # LEFT_SHIFT, int16 operands (TFLite: 15)
    add_multiplier_bits: int = 20  # SHARED_SHIFT (XNNPACK: 20)
    max_int16_gemm_operands: int = 1  # J6E/M: input and weight cannot both be int16 (s.6)
    # first toolchain (``toolchain`` below) whose MatMul takes two int16 inputs on a platform with
    # max_int16_gemm_operands < 2 (OE-v3.5.0, seed 000 line 197); never with an int32 output
    dual_int16_matmul_since: Toolchain = Toolchain.OE_3_5_0
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
    # how direct-table entries are computed: the exact function in float64, or as onnxruntime's
    # float32 kernels compute each code between DequantizeLinear and QuantizeLinear
    lut_table_values: TableValues = TableValues.EXACT_FLOAT64
    # every LUT op's default dividing-point strategy; None: the J6 vendor's per-op defaults (s.3,
    # ``numerics.lut.default_spec``), whose fixed gelu points fit only the J6 table count
    lut_default_strategy: Strategy | None = None
    softmax_rule: SoftmaxRule = SoftmaxRule.SEGMENT_LUT  # integer softmax (SoftmaxRule)
    # FAKE sqrt, reciprocal, log, tan, atanh, asin and acos as the vendor's QAT modules compute
    # them (horizon plugin nn/sqrt.py, nn/qat/reciprocal.py, nn/log.py, nn/_trigonometric.py):
    # sqrt's input >= 1 code of it; reciprocal's |input| >= 1 code (int8) or 32 codes (int16),
    # sign kept; log's output >= the log spec's floor (hard_log, -10; calibration observes it
    # so too); tan's input in +-(pi - e), atanh's in +-(1 - e), e = 1 code (int8) or 32 codes
    # (int16); asin's and acos's in +-floor(1 / s) * s (``fixed_lut.qat_domain_clip``); false:
    # the float functions
    qat_lut_clips: bool = True

    # --- grid_sample (s.4)
    grid_dtype: DType = DType.INT16
    grid_coord: GridCoord = GridCoord.NORMALIZED
    grid_max_side: int = 1024  # H, W <= this (0 = no limit)
    grid_max_area: int = 720 * 1024  # H * W <= this (0 = no limit)
    grid_weight_frac_bits: int = 8  # fraction bits of sample positions / bilinear weights (assumed)
    grid_round: Round = Round.HALF_UP  # rounding of positions and of the output (assumed)
    # F.interpolate (ResizeRule); assumed on J6: linear / bilinear on the same fixed-point
    # sampler, with the grid's weight bits and rounding (numerics.resize)
    resize: ResizeRule = ResizeRule.GRID_SAMPLER

    # --- sin / cos (s.5)
    # assumed: the exporter reduces a plain sin/cos input wider than one period to one period
    # (s.5); a per-op ``single_period: true`` (the plugin's custom op) reduces whatever this says
    sincos_period_reduction: bool = True

    # --- LayerNorm / GroupNorm / InstanceNorm (numerics.norm)
    # true: the integer composite (integer mean and variance, rsqrt table, integer affine) at
    # int8/int16 activations; false: float between dequantize and quantize, as a reference
    # runtime computes a normalisation it has no integer kernel for
    norm_composite: bool = True
    norm_inter_dtype: DType = DType.INT16  # every intermediate of the composite (plugin: int16)
    norm_affine_dtype: DType = DType.INT16  # gamma / beta codes, per tensor (assumed int16)
    norm_eps_mode: EpsMode = EpsMode.IN_TABLE  # where eps enters (assumed: in the rsqrt table)
    norm_max_reduce_elements: int = 65535  # elements per mean / variance row (hbir.reduce_mean)

    # --- embedding (numerics.embedding)
    embedding_index_dtype: DType = DType.INT16  # index codes (int16 holds every id < 32768)
    embedding_max_rows: int = 32768  # table rows the gather selects from (hbir.index)

    # --- image input path (seed 002 s.6.3 and s.8.3: the pyramid delivers NV12, the toolchain
    # inserts colour conversion and (data - mean) / std; quantlab.models.input_path). The seeds
    # name the NV12 -> BGR conversion but not its arithmetic: the three fields are assumed.
    image_yuv_matrix: YuvMatrix = YuvMatrix.BT601  # assumed: luma weights of the conversion
    image_yuv_range: YuvRange = YuvRange.FULL  # assumed: full-range (JPEG-style) Y, U, V
    image_yuv_round: Round = Round.HALF_UP  # assumed: one rounding per converted value

    # --- qconfig template (s.8)
    global_dtype: DType = DType.INT8  # activations of every op not covered below
    gemm_input_dtype: DType = DType.INT8  # Conv / Linear / MatMul inputs
    weight_dtype: DType = DType.INT8
    grid_chain_dtype: DType = DType.INT16  # the ops producing a grid_sample grid
    sensitive_dtype: DType = DType.INT16  # what a sensitive op (or GEMM input) is raised to
    # the recipe's "precision ceiling": every raisable activation at this dtype (seed 004 l.61)
    ceiling_dtype: DType = DType.INT16

    supported_ops: list[str] = field(default_factory=list)  # empty: every op quantlab models
    # ops quantlab models on J6 that this profile runs in float, as its runtime's own kernels
    # for them are not modelled (the runtime profiles: log_softmax, erf, masked_fill, where, abs,
    # maximum, minimum, the trigonometric and hyperbolic tables, mish, log_sigmoid, softsign,
    # selu, tanhshrink, expm1, exp2, erfc, log2, log10, log1p, celu, logit)
    float_fallback_ops: list[str] = field(default_factory=list)
    # the runtime whose integer graph fixed mode computes bit for bit (Runtime): a steady FIXED
    # loop may run the QDQ export there (simulate.runtime_program); NONE for a device
    runtime: Runtime = Runtime.NONE

    # --- deployment units and toolchain (seed 002 lines 8-23, seed 000 lines 63 and 83)
    toolchain: Toolchain = Toolchain.OE_3_5_0  # the OE release the model is converted with
    vpu: bool = True  # a SIMT vector unit in the BPU (float, Quantize/Dequantize, Mod)
    spu: bool = True  # a RISC-V scalar unit in the BPU (TopK)
    spu_topk_from: Toolchain | None = Toolchain.OE_3_2_0  # first OE running TopK on the SPU
    bool_mask_cpu: bool = True  # bool assignment / mask ops bring Cast and Equal on the CPU
    # disputed or unstated vendor facts this profile decides: name -> the reading not followed
    assumptions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice("platform.requant_mult_bits", self.requant_mult_bits, (15, 31))
        check_choice("platform.max_int16_gemm_operands", self.max_int16_gemm_operands, (0, 1, 2))
        check_choice("platform.accumulator", self.accumulator, ACCUMULATORS)
        check_choice("platform.qlinear_zero_point", self.qlinear_zero_point, (0, 128))
        check_choice(
            "platform.div_reciprocal_dtype", self.div_reciprocal_dtype, (DType.INT8, DType.INT16)
        )
        for name in ("add_inter_shift", "add_left_shift", "add_left_shift_int16"):
            if not 0 <= getattr(self, name) <= 30:
                raise ValueError(f"platform.{name} must be in [0, 30], got {getattr(self, name)}")
        if not 1 <= self.add_multiplier_bits <= 30:
            raise ValueError(
                f"platform.add_multiplier_bits must be in [1, 30], got {self.add_multiplier_bits}"
            )
        self.gemm_rules = [gemm_rule(r, i) for i, r in enumerate(self.gemm_rules)]
        for name in ("supported_ops", "float_fallback_ops"):
            check_op_types(f"platform.{name}", getattr(self, name))
        if self.lut_default_strategy is not None:
            # MANUAL names points, which only a per-op spec can give
            allowed = [s for s in Strategy if s is not Strategy.MANUAL]
            check_choice("platform.lut_default_strategy", self.lut_default_strategy, allowed)
        self.gemm_contract()  # validates the default rule
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
                raise ValueError(f"platform.{name}=FLOAT16: {no_float16_reason(self.name)}")
        for name in ("toolchain", "dual_int16_matmul_since"):
            setattr(self, name, parse_toolchain(getattr(self, name), f"platform.{name}"))
        check_choice("platform.int16_bias_dtype", self.int16_bias_dtype, (DType.INT32, DType.INT64))
        for name in ("norm_inter_dtype", "norm_affine_dtype", "embedding_index_dtype"):
            check_choice(f"platform.{name}", getattr(self, name), (DType.INT8, DType.INT16))
        if not 1 <= self.norm_max_reduce_elements <= 65535:
            raise ValueError(
                "platform.norm_max_reduce_elements must be in [1, 65535], "
                f"got {self.norm_max_reduce_elements}"
            )
        if not 1 <= self.embedding_max_rows <= 32768:
            raise ValueError(
                f"platform.embedding_max_rows must be in [1, 32768], got {self.embedding_max_rows}"
            )
        check_choice(
            "platform.high_precision_output",
            self.high_precision_output,
            (DType.INT32, DType.FLOAT32),
        )

    def dual_int16_matmul(self) -> bool:
        """Whether this profile's toolchain runs MatMul with both inputs int16 beyond
        ``max_int16_gemm_operands`` (``toolchain`` >= ``dual_int16_matmul_since``)."""
        return self.toolchain.at_least(self.dual_int16_matmul_since)

    def int16_gemm_operands(self, op_type: str, int32_output: bool = False) -> int:
        """How many operands of a GEMM of ``op_type`` may be int16: ``max_int16_gemm_operands``,
        or 2 for a MatMul without an int32 output when ``dual_int16_matmul()``."""
        if op_type == "matmul" and not int32_output and self.dual_int16_matmul():
            return 2
        return self.max_int16_gemm_operands

    def quantize_codes(self, x: Tensor, scale, dtype: DType, zero_point: int = 0) -> Tensor:
        """Codes of float ``x`` as this platform's quantize op gives them in fixed mode
        (``dtype``'s torch dtype): x / scale formed by ``quantize_divide``, rounded by
        ``fake_round``, + ``zero_point``, saturated; NaN and overflow by ``quantize_cast``;
        the elements ``quantize_tail`` names by its rule."""
        codes = quantize(
            x,
            scale,
            dtype,
            self.fake_round,
            zero_point=zero_point,
            divide=self.quantize_divide,
            cast=self.quantize_cast,
        )
        if self.quantize_tail is QuantizeTail.SCALAR_FLOAT64_HALF_AWAY:
            codes = quantize_scalar_tail(codes, x, scale, dtype, zero_point)
        return codes

    def gemm_contract(
        self,
        op_type: str | None = None,
        int32_output: bool = False,
        activation: DType | None = None,
    ) -> GemmContract:
        """The integer contract numerics kernels apply after an exact sum (accumulator,
        requantization, bias codes, int16 operand count), composed from this profile's fields;
        with ``op_type`` the int16 operand count of that GEMM (``int16_gemm_operands``) and the
        first of ``gemm_rules`` matching its family and the ``activation`` operand's dtype (the
        profile's default fields when none matches, or when op_type or activation is None);
        for int16 activations only rules whose bias_dtype is ``int16_bias_dtype``."""
        n16 = self.max_int16_gemm_operands
        family = None
        if op_type is not None:
            n16 = self.int16_gemm_operands(op_type, int32_output)
            family = GEMM_FAMILY_OF_OP[op_type]
        default = GemmContract(
            accumulator=self.accumulator,
            accumulator_overflow=self.accumulator_overflow,
            requant=self.requant,
            requant_round=self.requant_round,
            requant_mult_bits=self.requant_mult_bits,
            max_int16_gemm_operands=n16,
            u8s8_pair_saturation=self.u8s8_pair_saturation,
        )
        bias = self.int16_bias_dtype if activation is DType.INT16 else None
        return contract_for(default, self.gemm_rules, family, activation, bias)

    def norm_contract(self) -> NormContract:
        """The normalisation composite's arithmetic (``numerics.norm.NormContract``) from this
        profile: the ``norm_*`` fields, the requantization fields, the add rule's inter shift,
        the LUT format, and ``fake_round`` for gamma / beta codes."""
        return NormContract(
            inter_dtype=self.norm_inter_dtype,
            affine_dtype=self.norm_affine_dtype,
            affine_round=self.fake_round,
            requant=self.requant,
            requant_round=self.requant_round,
            requant_mult_bits=self.requant_mult_bits,
            add_inter_shift=self.add_inter_shift,
            eps_mode=self.norm_eps_mode,
            lut_format=self.lut_format(),
            max_reduce_elements=self.norm_max_reduce_elements,
        )

    def embedding_contract(self) -> EmbeddingContract:
        """The gather's index path (``numerics.embedding.EmbeddingContract``): the
        ``embedding_*`` fields, ids rounded by ``fake_round``."""
        return EmbeddingContract(
            index_dtype=self.embedding_index_dtype,
            index_round=self.fake_round,
            max_rows=self.embedding_max_rows,
        )

    def lut_format(self) -> LutFormat:
        """The segment LUT format of this profile (``lut_tables``, ``lut_entries``,
        ``lut_index_frac_bits``, ``lut_interp_round``, ``lut_direct_int8``,
        ``lut_table_values``)."""
        return LutFormat(
            tables=self.lut_tables,
            entries=self.lut_entries,
            index_frac_bits=self.lut_index_frac_bits,
            interp_round=self.lut_interp_round,
            direct_int8=self.lut_direct_int8,
            values=self.lut_table_values,
        )

    def runs_quantized(self, op_type: str, category) -> bool:
        """Whether an op of ``op_type`` (capture category ``category``, None for an op quantlab
        does not model) runs quantized on this profile, else in float: an op in
        ``supported_ops`` (empty: every modelled op) and not in ``float_fallback_ops``."""
        if category is None or (self.supported_ops and op_type not in self.supported_ops):
            return False
        return op_type not in self.float_fallback_ops

    def lut_spec(self, func: str) -> LutSpec:
        """The default segment-LUT spec of op ``func`` on this profile: the vendor's per-op
        default (``numerics.lut.default_spec``) with its strategy replaced by
        ``lut_default_strategy`` when that is set (its other fields, e.g. symmetric, kept)."""
        spec = default_spec(func)
        if self.lut_default_strategy is None:
            return spec
        return dataclasses.replace(spec, strategy=self.lut_default_strategy, dividing_points=None)


GEMM_FAMILY_OF_OP = {
    "conv1d": GemmFamily.CONV,
    "conv2d": GemmFamily.CONV,
    "conv_transpose1d": GemmFamily.CONV,
    "conv_transpose2d": GemmFamily.CONV,
    "linear": GemmFamily.LINEAR,
    "matmul": GemmFamily.MATMUL,
}  # which ``gemm_rules`` family a captured GEMM op type follows


PLATFORM_NAMES = (
    "j6e",
    "j6m",
    "j6b",
    "j6h",
    "j6p",
    "onnxruntime",
    "onnxruntime_no_vnni",
    "tflite",
    "litert_xnnpack",
)


def float16_platforms() -> list[str]:
    """The J6 profiles with float16 in TAE/VAE (``float16_available``), from their YAML files."""
    return [n for n in PLATFORM_NAMES if n.startswith("j6") and load_platform(n).float16_available]


def no_float16_reason(name: str) -> str:
    """Why a float16 dtype is refused on platform ``name``: it has no float16 in TAE/VAE (seed 002
    lines 8-13), with the platforms that do and the dtypes allowed instead."""
    return (
        f"{name} has no float16 in TAE/VAE (platform.float16_available=false; J6E/M have no float "
        f"in TAE/VAE, seed 002 lines 8-10); float16 runs on {', '.join(float16_platforms())}; "
        f"allowed on {name}: INT8, INT16"
    )


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
