"""One-op TFLite models built in memory from the LiteRT flatbuffer schema, and their runs.

``conv2d_model``, ``depthwise_model``, ``transpose_conv_model``, ``fully_connected_model``,
``add_model``, ``sub_model``, ``lut_model`` and ``resize_model`` return the bytes of a
model with one quantized operator (int8 activations with any zero point, or 16x8: int16
activations with zero point 0, int8 weights, int32 or int64 bias); ``ModelBuilder.finish_graph``
chains several operators; the ``*Case`` dataclasses hold every parameter so that a test can run
the same case in LiteRT and in an oracle. ``run`` executes a model single-threaded with LiteRT's
reference kernels (``Kernels.REFERENCE``, ``OpResolverType.BUILTIN_REF``) or with the default
interpreter (``Kernels.DEFAULT``: builtin kernels plus the XNNPACK delegate, which takes int8
conv, depthwise, fully connected, add and RESIZE_BILINEAR, and int8 TRANSPOSE_CONV when its
padding allows).

Layouts are TFLite's: activations NHWC, conv and transposed conv filters (O, KH, KW, I),
depthwise filters (1, KH, KW, C * multiplier), fully connected weights (units, depth). The
schema module is the one ``ai-edge-litert`` ships (``ai_edge_litert.schema_py_generated``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as S
from ai_edge_litert.interpreter import Interpreter, OpResolverType

_TENSOR_TYPE = {
    np.dtype(np.float32): S.TensorType.FLOAT32,
    np.dtype(np.int8): S.TensorType.INT8,
    np.dtype(np.uint8): S.TensorType.UINT8,
    np.dtype(np.int16): S.TensorType.INT16,
    np.dtype(np.int32): S.TensorType.INT32,
    np.dtype(np.int64): S.TensorType.INT64,
}


class Activation(enum.Enum):
    """A fused activation (schema ``ActivationFunctionType``)."""

    NONE = S.ActivationFunctionType.NONE
    RELU = S.ActivationFunctionType.RELU
    RELU6 = S.ActivationFunctionType.RELU6


class Padding(enum.Enum):
    """Schema ``Padding``: SAME pads (total // 2) before and the rest after; VALID pads none."""

    SAME = S.Padding.SAME
    VALID = S.Padding.VALID


class Kernels(enum.Enum):
    """Which LiteRT kernels run a model."""

    REFERENCE = OpResolverType.BUILTIN_REF  # reference kernels, no delegate
    DEFAULT = OpResolverType.AUTO  # builtin kernels and the default XNNPACK delegate


@dataclass(frozen=True)
class QParams:
    """Affine quantization of an activation tensor: real = scale * (code - zero_point)."""

    scale: np.float32
    zero_point: int


@dataclass(frozen=True)
class ConvCase:
    """CONV_2D or DEPTHWISE_CONV_2D: x (N, H, W, C) codes, w codes in TFLite layout, per-tensor
    (shape (1,)) or per-channel (shape (O,)) float32 weight scales, integer bias (O,) of
    ``bias.dtype`` (int32 or int64)."""

    x: np.ndarray
    xq: QParams
    w: np.ndarray
    w_scale: np.ndarray
    bias: np.ndarray
    yq: QParams
    stride: tuple[int, int]
    dilation: tuple[int, int]
    padding: Padding
    activation: Activation
    depth_multiplier: int = 0  # > 0: a depthwise conv


@dataclass(frozen=True)
class TransposeConvCase:
    """TRANSPOSE_CONV: x (N, H, W, I) codes, w (O, KH, KW, I) int8 codes, per-tensor (1,) or
    per-channel (O,) float32 weight scales, integer bias (O,) (int32, or int64 / int32 for
    16x8) or None, the output's spatial size ``out_hw`` (the operator's output_shape input;
    with ``padding`` and ``stride`` it must give back the input's size, see
    ``transpose_conv_padding``)."""

    x: np.ndarray
    xq: QParams
    w: np.ndarray
    w_scale: np.ndarray
    bias: np.ndarray | None
    yq: QParams
    stride: tuple[int, int]
    padding: Padding
    activation: Activation
    out_hw: tuple[int, int]


@dataclass(frozen=True)
class FullyConnectedCase:
    """FULLY_CONNECTED: x (B, K) codes, w (units, K) int8 codes, scales (1,) or (units,),
    integer bias (units,) or None."""

    x: np.ndarray
    xq: QParams
    w: np.ndarray
    w_scale: np.ndarray
    bias: np.ndarray | None
    yq: QParams
    activation: Activation


@dataclass(frozen=True)
class AddCase:
    """ADD of two same-shape tensors of codes (int8 or int16)."""

    a: np.ndarray
    aq: QParams
    b: np.ndarray
    bq: QParams
    yq: QParams
    activation: Activation


class ModelBuilder:
    """Collects tensors and buffers of a one-subgraph model (buffer 0 is the empty one)."""

    def __init__(self) -> None:
        self.tensors: list = []
        self.buffers: list = [S.BufferT()]

    def tensor(self, name, dtype, shape, scale=None, zero_point=None, axis=0, data=None) -> int:
        t = S.TensorT()
        t.name = name
        t.type = _TENSOR_TYPE[np.dtype(dtype)]
        t.shape = [int(v) for v in shape]
        t.buffer = 0
        if data is not None:
            buf = S.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data, dtype=dtype).tobytes(), np.uint8)
            self.buffers.append(buf)
            t.buffer = len(self.buffers) - 1
        if scale is not None:
            q = S.QuantizationParametersT()
            q.scale = [float(s) for s in np.atleast_1d(np.asarray(scale, np.float32))]
            zp = np.zeros(len(q.scale), np.int64) if zero_point is None else zero_point
            q.zeroPoint = [int(z) for z in np.atleast_1d(zp)]
            q.quantizedDimension = axis
            t.quantization = q
        self.tensors.append(t)
        return len(self.tensors) - 1

    def finish(self, builtin: int, inputs, outputs, options_type, options, graph_inputs) -> bytes:
        return self.finish_graph([(builtin, inputs, outputs, options_type, options)], graph_inputs)

    def finish_graph(self, ops: list[tuple], graph_inputs, graph_outputs=None) -> bytes:
        """The model of ``ops`` in order, each (builtin, inputs, outputs, options type,
        options); the graph's outputs default to the last op's."""
        codes, operators = [], []
        for builtin, inputs, outputs, options_type, options in ops:
            if builtin not in codes:
                codes.append(builtin)
            op = S.OperatorT()
            op.opcodeIndex = codes.index(builtin)
            op.inputs = list(inputs)
            op.outputs = list(outputs)
            op.builtinOptionsType = options_type
            op.builtinOptions = options
            operators.append(op)
        sg = S.SubGraphT()
        sg.tensors = self.tensors
        sg.inputs = list(graph_inputs)
        sg.outputs = list(ops[-1][2] if graph_outputs is None else graph_outputs)
        sg.operators = operators
        model = S.ModelT()
        model.version = 3
        model.operatorCodes = []
        for builtin in codes:
            code = S.OperatorCodeT()
            code.builtinCode = builtin
            code.deprecatedBuiltinCode = min(builtin, 127)
            code.version = 1
            model.operatorCodes.append(code)
        model.subgraphs = [sg]
        model.buffers = self.buffers
        b = flatbuffers.Builder(1024)
        b.Finish(model.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())


def _bias_type(bias: np.ndarray | None, act: np.dtype) -> int:
    """The options' quantized_bias_type: 16x8 kernels read the bias as int64 unless it is set
    to INT32 (an int32 bias with the field unset would be read as int64)."""
    if bias is None or np.dtype(act) != np.int16:
        return S.TensorType.FLOAT32  # unset
    return _TENSOR_TYPE[bias.dtype]


def conv2d_model(c: ConvCase) -> bytes:
    """CONV_2D (``c.depth_multiplier == 0``) or DEPTHWISE_CONV_2D model of a ConvCase."""
    m = ModelBuilder()
    act = c.x.dtype
    out_ch = c.w.shape[0] if c.depth_multiplier == 0 else c.w.shape[3]
    w_axis = 0 if c.depth_multiplier == 0 else 3
    n, h, w_, _ = c.x.shape
    oh, ow = conv_output_size((h, w_), c.w.shape[1:3], c.stride, c.dilation, c.padding)
    xi = m.tensor("x", act, c.x.shape, c.xq.scale, c.xq.zero_point)
    wi = m.tensor("w", np.int8, c.w.shape, c.w_scale, None, w_axis, c.w)
    bias_scale = (np.float64(c.xq.scale) * c.w_scale.astype(np.float64)).astype(np.float32)
    bi = m.tensor("b", c.bias.dtype, c.bias.shape, bias_scale, None, 0, c.bias)
    yi = m.tensor("y", act, (n, oh, ow, out_ch), c.yq.scale, c.yq.zero_point)
    if c.depth_multiplier == 0:
        o = S.Conv2DOptionsT()
        o.quantizedBiasType = _bias_type(c.bias, act)
        builtin, otype = S.BuiltinOperator.CONV_2D, S.BuiltinOptions.Conv2DOptions
    else:
        o = S.DepthwiseConv2DOptionsT()
        o.depthMultiplier = c.depth_multiplier
        builtin = S.BuiltinOperator.DEPTHWISE_CONV_2D
        otype = S.BuiltinOptions.DepthwiseConv2DOptions
    o.padding = c.padding.value
    o.strideH, o.strideW = c.stride
    o.dilationHFactor, o.dilationWFactor = c.dilation
    o.fusedActivationFunction = c.activation.value
    return m.finish(builtin, [xi, wi, bi], [yi], otype, o, [xi])


def transpose_conv_model(c: TransposeConvCase, bias_type=None) -> bytes:
    """TRANSPOSE_CONV model of a TransposeConvCase: inputs (output_shape, a constant int32
    (4,) tensor; weights; x; bias, or -1 without one), options padding, strides and fused
    activation. 16x8: the options' quantized_bias_type is ``bias_type`` (np.int32 / np.int64,
    what the converter's option writes) or by default the bias's dtype, unset without a bias
    (LiteRT then runs the int64 kernel)."""
    m = ModelBuilder()
    act = c.x.dtype
    n, out_ch = c.x.shape[0], c.w.shape[0]
    out_shape = np.array([n, *c.out_hw, out_ch], np.int32)
    si = m.tensor("output_shape", np.int32, (4,), data=out_shape)
    wi = m.tensor("w", np.int8, c.w.shape, c.w_scale, None, 0, c.w)
    xi = m.tensor("x", act, c.x.shape, c.xq.scale, c.xq.zero_point)
    bi = -1
    if c.bias is not None:
        bias_scale = (np.float64(c.xq.scale) * c.w_scale.astype(np.float64)).astype(np.float32)
        bi = m.tensor("b", c.bias.dtype, c.bias.shape, bias_scale, None, 0, c.bias)
    yi = m.tensor("y", act, out_shape, c.yq.scale, c.yq.zero_point)
    o = S.TransposeConvOptionsT()
    o.padding = c.padding.value
    o.strideH, o.strideW = c.stride
    o.fusedActivationFunction = c.activation.value
    o.quantizedBiasType = _bias_type(c.bias, act)
    if bias_type is not None and np.dtype(act) == np.int16:
        o.quantizedBiasType = _TENSOR_TYPE[np.dtype(bias_type)]
    return m.finish(
        S.BuiltinOperator.TRANSPOSE_CONV,
        [si, wi, xi, bi],
        [yi],
        S.BuiltinOptions.TransposeConvOptions,
        o,
        [xi],
    )


def fully_connected_model(c: FullyConnectedCase) -> bytes:
    """FULLY_CONNECTED model of a FullyConnectedCase (keep_num_dims false, output (B, units))."""
    m = ModelBuilder()
    act = c.x.dtype
    xi = m.tensor("x", act, c.x.shape, c.xq.scale, c.xq.zero_point)
    wi = m.tensor("w", np.int8, c.w.shape, c.w_scale, None, 0, c.w)
    ins = [xi, wi, -1]
    if c.bias is not None:
        bias_scale = (np.float64(c.xq.scale) * c.w_scale.astype(np.float64)).astype(np.float32)
        ins[2] = m.tensor("b", c.bias.dtype, c.bias.shape, bias_scale, None, 0, c.bias)
    yi = m.tensor("y", act, (c.x.shape[0], c.w.shape[0]), c.yq.scale, c.yq.zero_point)
    o = S.FullyConnectedOptionsT()
    o.fusedActivationFunction = c.activation.value
    o.quantizedBiasType = _bias_type(c.bias, act)
    return m.finish(
        S.BuiltinOperator.FULLY_CONNECTED,
        ins,
        [yi],
        S.BuiltinOptions.FullyConnectedOptions,
        o,
        [xi],
    )


def add_model(c: AddCase, subtract: bool = False) -> bytes:
    """ADD (or SUB: a - b) model of an AddCase (both operands are graph inputs)."""
    m = ModelBuilder()
    ai = m.tensor("a", c.a.dtype, c.a.shape, c.aq.scale, c.aq.zero_point)
    bi = m.tensor("b", c.b.dtype, c.b.shape, c.bq.scale, c.bq.zero_point)
    yi = m.tensor("y", c.a.dtype, c.a.shape, c.yq.scale, c.yq.zero_point)
    o = S.SubOptionsT() if subtract else S.AddOptionsT()
    o.fusedActivationFunction = c.activation.value
    o.potScaleInt16 = False  # the general-scale int16 kernel (what the converter emits)
    if subtract:
        return m.finish(S.BuiltinOperator.SUB, [ai, bi], [yi], S.BuiltinOptions.SubOptions, o,
                        [ai, bi])  # fmt: skip
    return m.finish(S.BuiltinOperator.ADD, [ai, bi], [yi], S.BuiltinOptions.AddOptions, o, [ai, bi])


def sub_model(c: AddCase) -> bytes:
    """SUB model (a - b) of an AddCase."""
    return add_model(c, subtract=True)


@dataclass(frozen=True)
class LutCase:
    """LOGISTIC or TANH (``op``: "sigmoid" / "tanh") on every int8 code ``x``: input (scale,
    zero point) any, output the fixed parameters the int8 kernels require (1/256 and -128 for
    LOGISTIC, 1/128 and 0 for TANH)."""

    op: str
    x: np.ndarray
    xq: QParams
    yq: QParams


LUT_OUTPUT = {
    "sigmoid": QParams(np.float32(1 / 256), -128),
    "tanh": QParams(np.float32(1 / 128), 0),
}
_LUT_BUILTIN = {"sigmoid": S.BuiltinOperator.LOGISTIC, "tanh": S.BuiltinOperator.TANH}


def lut_model(c: LutCase) -> bytes:
    """LOGISTIC / TANH model of a LutCase (no options)."""
    m = ModelBuilder()
    xi = m.tensor("x", np.int8, c.x.shape, c.xq.scale, c.xq.zero_point)
    yi = m.tensor("y", np.int8, c.x.shape, c.yq.scale, c.yq.zero_point)
    return m.finish(_LUT_BUILTIN[c.op], [xi], [yi], S.BuiltinOptions.NONE, None, [xi])


@dataclass(frozen=True)
class QuantizeCase:
    """QUANTIZE of float32 ``x`` (any shape; 4-d read as N, H, W, C) to ``dtype`` codes with
    output parameters ``yq``."""

    x: np.ndarray
    yq: QParams
    dtype: type


def quantize_model(c: QuantizeCase) -> bytes:
    """QUANTIZE model (float32 in, ``c.dtype`` codes out) of a QuantizeCase."""
    m = ModelBuilder()
    xi = m.tensor("x", np.float32, list(c.x.shape))
    yi = m.tensor("y", c.dtype, list(c.x.shape), scale=c.yq.scale, zero_point=[c.yq.zero_point])
    options = S.QuantizeOptionsT()
    return m.finish(S.BuiltinOperator.QUANTIZE, [xi], [yi], S.BuiltinOptions.QuantizeOptions,
                    options, [xi])  # fmt: skip


@dataclass(frozen=True)
class ResizeCase:
    """RESIZE_BILINEAR (or RESIZE_NEAREST_NEIGHBOR, ``nearest``) of x (N, H, W, C) int8 or int16
    codes to ``out_hw``; the output keeps the input's quantization (the kernels work on the
    stored codes)."""

    x: np.ndarray
    xq: QParams
    out_hw: tuple[int, int]
    align_corners: bool
    half_pixel_centers: bool
    nearest: bool = False


def resize_model(c: ResizeCase) -> bytes:
    """RESIZE_BILINEAR or RESIZE_NEAREST_NEIGHBOR model of a ResizeCase (the size a constant
    input)."""
    m = ModelBuilder()
    n, _, _, ch = c.x.shape
    xi = m.tensor("x", c.x.dtype, c.x.shape, c.xq.scale, c.xq.zero_point)
    si = m.tensor("size", np.int32, [2], data=np.array(c.out_hw, np.int32))
    yi = m.tensor("y", c.x.dtype, [n, *c.out_hw, ch], c.xq.scale, c.xq.zero_point)
    if c.nearest:
        o = S.ResizeNearestNeighborOptionsT()
        op, kind = (
            S.BuiltinOperator.RESIZE_NEAREST_NEIGHBOR,
            S.BuiltinOptions.ResizeNearestNeighborOptions,
        )
    else:
        o = S.ResizeBilinearOptionsT()
        op, kind = S.BuiltinOperator.RESIZE_BILINEAR, S.BuiltinOptions.ResizeBilinearOptions
    o.alignCorners = c.align_corners
    o.halfPixelCenters = c.half_pixel_centers
    return m.finish(op, [xi, si], [yi], kind, o, [xi])


def conv_output_size(size, kernel, stride, dilation, padding: Padding) -> tuple[int, int]:
    """TFLite's output height and width (ComputeOutSize)."""
    out = []
    for n, k, s, d in zip(size, kernel, stride, dilation):
        eff = (k - 1) * d + 1
        out.append((n + s - 1) // s if padding is Padding.SAME else (n - eff + s) // s)
    return out[0], out[1]


def same_padding_before(size, kernel, stride, dilation, padding: Padding) -> tuple[int, int]:
    """Padding before each spatial dim (TFLite ComputePaddingHeightWidth: total // 2)."""
    if padding is Padding.VALID:
        return 0, 0
    oh, ow = conv_output_size(size, kernel, stride, dilation, padding)
    pads = []
    for n, o, k, s, d in zip(size, (oh, ow), kernel, stride, dilation):
        eff = (k - 1) * d + 1
        pads.append(max((o - 1) * s + eff - n, 0) // 2)
    return pads[0], pads[1]


def transpose_conv_padding(in_hw, out_hw, kernel, stride, padding: Padding):
    """TFLite's padding of a TRANSPOSE_CONV, as its kernel computes it (transpose_conv.cc Eval:
    ComputePaddingHeightWidthChecked with the output as the convolution's input, dilation 1):
    per spatial dim (before, after) with total = max((in - 1) * s + k - out, 0), before =
    total // 2, after = total - before. Input (y, x) scatters to output (y * s - before + ky,
    ...), taps outside the output dropped. ValueError unless ComputeOutSize(padding, out, k,
    s) gives back ``in_hw`` (the kernel refuses such a model)."""
    pads = []
    for n, o, k, s in zip(in_hw, out_hw, kernel, stride):
        v = o + s - 1 if padding is Padding.SAME else o + s - k
        back = v // s if v >= 0 else -(-v // s)  # C division
        if back != n:
            raise ValueError(
                f"output size {o} with kernel {k}, stride {s}, {padding.name} gives input "
                f"size {back}, not {n}"
            )
        total = max((n - 1) * s + k - o, 0)
        pads.append((total // 2, total - total // 2))
    return tuple(pads)


def transpose_conv_torch_args(in_hw, out_hw, kernel, stride, padding: Padding):
    """torch's (padding, output_padding) for conv_transpose2d giving TFLite's TRANSPOSE_CONV
    output (same size, same alignment), or None when torch cannot express it.

    torch drops p rows before the full output of length (in - 1) * s + k and keeps
    full - 2 * p + op rows (0 <= op < s; dilation 1), so p is TFLite's padding before and
    op = out - full + 2 * p. With TFLite's total padding t = full - out > 0 that is
    op = 2 * (t // 2) - t: 0 for an even t, -1 for an odd t, where TFLite pads one row more
    after than before, which torch's symmetric padding cannot express (SAME with an odd t,
    e.g. k = 3, s = 2, out = 2 * in): such cases are left out of the comparisons. VALID (t = 0,
    op = (out - k) % s) and SAME with an even t or with t clipped to 0 are always
    expressible."""
    torch_pad, out_pad = [], []
    pads = transpose_conv_padding(in_hw, out_hw, kernel, stride, padding)
    for (before, _), n, o, k, s in zip(pads, in_hw, out_hw, kernel, stride):
        op = o - ((n - 1) * s + k) + 2 * before
        if not 0 <= op < s:
            return None
        torch_pad.append(before)
        out_pad.append(op)
    return tuple(torch_pad), tuple(out_pad)


@dataclass(frozen=True)
class RunResult:
    """Output codes of one run and whether the XNNPACK delegate took the operator."""

    y: np.ndarray
    delegated: bool


def run(model: bytes, inputs: list[np.ndarray], kernels: Kernels) -> RunResult:
    """Run ``model`` single-threaded on ``inputs`` (graph input order) with ``kernels``."""
    it = Interpreter(
        model_content=model, num_threads=1, experimental_op_resolver_type=kernels.value
    )
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], v)
    it.invoke()
    y = it.get_tensor(it.get_output_details()[0]["index"]).copy()
    delegated = any(op["op_name"] == "DELEGATE" for op in it._get_ops_details())
    return RunResult(y, delegated)
