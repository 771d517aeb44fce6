"""The rules a platform profile chooses among where devices and runtimes differ: the
toolchain release, how two scales are added, how softmax, concatenation and average pools turn
codes into codes, and which ops a runtime leaves in float between dequantize and quantize.
``quantlab.platforms.PlatformConfig`` holds one member of each; YAML selects them by name."""

from __future__ import annotations

import enum


class Toolchain(enum.Enum):
    """The vendor's OpenExplorer (OE) release a model is converted with. Facts the seeds gate on
    a release (fmod on the VPU, TopK on the SPU) hold from that release on."""

    OE_3_0_0 = "OE-v3.0.0"
    OE_3_2_0 = "OE-v3.2.0"
    OE_3_5_0 = "OE-v3.5.0"

    def at_least(self, other: Toolchain) -> bool:
        """True when this release is ``other`` or newer."""
        return _release(self) >= _release(other)


def _release(t: Toolchain) -> tuple[int, ...]:
    return tuple(int(p) for p in t.value.removeprefix("OE-v").split("."))


class AddRule(enum.Enum):
    """How two quantized tensors with different scales are added.

    RESCALE_FLOAT: dequantize both, add in float, requantize (ONNX Runtime QLinearAdd style).
    RESCALE_FLOAT_FMA: ONNX Runtime's QLinearAdd (MLAS) as it runs: two fused multiply-adds,
                   codes held with ``qlinear_zero_point`` (numerics.fma_add).
    INTER_SCALE:   the J6 plugin rule: inter = max(sx, sy) / 2**add_inter_shift,
                   x*round(sx/inter) + y*round(sy/inter) in int32, then requantize (s.7, assumed).
    LEFT_SHIFT:    TFLite's reference ADD: operands scaled up by 2**add_left_shift (int8) or
                   2**add_left_shift_int16, three double-rounding multipliers
                   (``numerics.add_rules.add_left_shift``).
    SHARED_SHIFT:  XNNPACK's add: two integer multipliers of add_multiplier_bits bits sharing
                   one right shift, one rounding (``numerics.add_rules.add_shared_shift``).
    """

    RESCALE_FLOAT = "rescale_float"
    RESCALE_FLOAT_FMA = "rescale_float_fma"
    INTER_SCALE = "inter_scale"
    LEFT_SHIFT = "left_shift"
    SHARED_SHIFT = "shared_shift"


class MulRule(enum.Enum):
    """How a product of two quantized tensors is requantized.

    REQUANTIZE:  the product of the centred codes requantized as the GEMM contract requantizes
                 an accumulator (``numerics.product_requant``), the output zero point added
                 after the rounding.
    QLINEAR_MUL: ONNX Runtime's QLinearMul (MLAS, x86) where the runtime holds the operands and
                 the output in one 8-bit type: fl32(fl32(acc) * M) with the output's zero point
                 added in float32 before the rounding (``numerics.qlinear_mul``).
    """

    REQUANTIZE = "requantize"
    QLINEAR_MUL = "qlinear_mul"


class SoftmaxRule(enum.Enum):
    """How an integer softmax turns input codes into output codes.

    SEGMENT_LUT:     the J6 composite: exp LUT, integer row sum, reciprocal LUT, requantization
                     (``numerics.lut.lut_softmax``).
    FLOAT_EXP_TABLE: ONNX Runtime's QLinearSoftmax on 8-bit codes: a 256-entry float32 exp
                     table, a float32 row sum, rne(T * floor(1 / sy) / sum) in double
                     (``numerics.exp_table_softmax``); int16 codes run in float between
                     dequantize and quantize, as ONNX Runtime runs them (it fuses 8-bit only).
    """

    SEGMENT_LUT = "segment_lut"
    FLOAT_EXP_TABLE = "float_exp_table"


class FloatIslands(enum.Enum):
    """Which ops the runtime leaves in float32 between dequantize and quantize ("float
    islands") instead of running them on integer codes.

    NONE:            none: every modelled op runs its integer kernel (the add rule, a
                     product's requantization, an integer sum).
    ONNXRUNTIME_QDQ: what ONNX Runtime has no QLinear kernel for in a QDQ graph: it fuses add
                     and mul of two 8-bit tensors to an 8-bit output (QLinearAdd /
                     QLinearMul) and a global mean whose scales QLinearGlobalAveragePool takes
                     (``float_window_pool.global_mean_in_range``), and leaves sub,
                     add / mul with an int16 operand or output or a scalar constant (held as
                     int16 codes), a clamp (Clip), the other sums and means (ReduceSum /
                     ReduceMean), a convolution / linear / matmul with an int16 operand
                     or output, and GridSample (at its input's scale, reading the grid's
                     dequantized value: ``numerics.ort_grid_sample``) between
                     DequantizeLinear and QuantizeLinear. Those run as it
                     runs them: each operand dequantized, fl32(s * (c - z)), the float32 op,
                     then QuantizeLinear, rne(fl32(v / s_out)) + z_out saturated
                     (``fake_round``). Sums in onnxruntime's order (``numerics.ort_reduce``,
                     where emulated); a float GEMM in torch's order (``fixed_gemm_float``),
                     which may differ from onnxruntime's in the last bit.
    """

    NONE = "none"
    ONNXRUNTIME_QDQ = "onnxruntime_qdq"


class AvgPoolRule(enum.Enum):
    """How an average pool over windows (avg_pool2d, adaptive pooling to more than one value)
    turns input codes into output codes.

    INTEGER_SUM:      the window's codes summed exactly, requantized by the ratio of scales
                      over the count (``requant``); padding falls back to float.
    FLOAT_WINDOW_SUM: ONNX Runtime's QLinearAveragePool: codes dequantized in float32, each
                      window summed in float32 row by row, divided by the count, quantized
                      with the zero point added in float32 (``numerics.float_window_pool``).
    """

    INTEGER_SUM = "integer_sum"
    FLOAT_WINDOW_SUM = "float_window_sum"


class ResizeRule(enum.Enum):
    """How ``F.interpolate`` turns codes into codes.

    GRID_SAMPLER:   nearest (and nearest-exact) selects the input's codes as torch's float32
                    model maps positions (``numerics.torch_nearest``); linear and bilinear run
                    grid_sample's fixed-point sampler (``numerics.resize``): torch's source
                    positions rounded to ``grid_weight_frac_bits`` bits, weights
                    (2^P - f, f), one rounding to the input's codes; both then requantized to
                    the op's output (assumed for J6: the AAE runs resize as it runs warping).
    ONNXRUNTIME:    onnxruntime's Resize (``numerics.ort_resize``): nearest selects codes by
                    its float32 indices (nearest-exact as torch's float32 model maps it,
                    exported as a Gather per axis), then requantized to the op's output;
                    bilinear of a 4-d input is its float32 kernel between dequantize and
                    quantize (linear of a 3-d input: torch's float interpolate there).
    LITERT:         LiteRT's own kernels, on the stored codes, the output at the input's scale
                    and zero point (``numerics.litert_resize``): RESIZE_NEAREST_NEIGHBOR maps
                    positions by the float32 size ratio (nearest: floor; nearest-exact: half-pixel
                    centres); RESIZE_BILINEAR takes 10-bit positions from the size ratio, sums the
                    weighted codes exactly and rounds half away from zero (int8 and int16 codes;
                    torch's align_corners=False is half_pixel_centers).
    LITERT_XNNPACK: LiteRT's default interpreter: as LITERT, but int8 bilinear resizes go to
                    XNNPACK (float32 positions, weights rounded to 11 bits, the exact sum rounded
                    half up).
    """

    GRID_SAMPLER = "grid_sampler"
    ONNXRUNTIME = "onnxruntime"
    LITERT = "litert"
    LITERT_XNNPACK = "litert_xnnpack"


class TensorDivRule(enum.Enum):
    """How a division by a tensor (not a constant) turns codes into codes.

    RECIPROCAL_TABLE: x times a segment-LUT reciprocal of the divisor, at
                      ``div_reciprocal_dtype`` with its own calibrated scale, then the
                      platform's product (the J6 plugin's Div: a reciprocal SegmentLUT, int16,
                      and a mul).
    FLOAT:            float between dequantize and quantize (a runtime's float Div: IEEE
                      float32 division, then the output's quantization).
    """

    RECIPROCAL_TABLE = "reciprocal_table"
    FLOAT = "float"


class ConcatRule(enum.Enum):
    """How cat / stack bring inputs at other scales (or zero points) to the output's.

    REQUANTIZE:          the input's codes times the ratio of scales, by the platform's
                         requantization (``requant``, ``requant_round``).
    DEQUANTIZE_QUANTIZE: QuantizeLinear(DequantizeLinear(x)) per input code: fl32(sx * (x - zx)),
                         divided by the output scale, rounded by ``fake_round``, + zy (ONNX
                         Runtime's QLinearConcat, a 256-entry table per input built that way).
    """

    REQUANTIZE = "requantize"
    DEQUANTIZE_QUANTIZE = "dequantize_quantize"


class Runtime(enum.Enum):
    """The runtime whose integer graph a profile's fixed mode computes, bit for bit.

    NONE:        none on this host (a device: fixed mode is the only way to run it here).
    ONNXRUNTIME: onnxruntime's CPU kernels: the profile's ONNX QDQ export, run there, gives
                 fixed mode's bits (tests/export). A steady FIXED loop may run that export in
                 an onnxruntime session (``simulate.runtime_program``).
    """

    NONE = "none"
    ONNXRUNTIME = "onnxruntime"
