"""The runtime test cases computed by quantlab: a platform profile's public numerics on a case.

LiteRT cases (NHWC, ``litert_models``) and onnxruntime cases (NCHW, ``onnx_qlinear_models``)
go through ``qconv2d`` / ``qconv_transpose`` / ``qlinear`` / ``qmatmul`` with the profile's
per-family contract (``platform.gemm_contract(op type, activation=dtype)``), the case's zero
points and integer bias codes, then the fused activation's code bounds by the profile's
``bound_rule``; ADD goes through the simulator's ``add_codes`` (the profile's ``add_rule``),
SUB through ``sub_codes``; the LUT ops through ``build_zero_point_lut`` with the profile's LUT
format; the resizes by the profile's ``resize`` rule.
Nothing here restates a runtime rule: the rules are the profile's.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from litert_models import (
    Activation,
    AddCase,
    ConvCase,
    FullyConnectedCase,
    ResizeCase,
    TransposeConvCase,
    conv_output_size,
    same_padding_before,
    transpose_conv_torch_args,
)

from quantlab.numerics import DType, bound_codes, qconv2d, qlinear, qmatmul
from quantlab.numerics.gemm import qconv_transpose
from quantlab.numerics.litert_resize import (
    tflite_resize_bilinear,
    tflite_resize_nearest,
    xnnpack_resize_bilinear,
)
from quantlab.numerics.lut.zero_point import build_zero_point_lut
from quantlab.numerics.ort_resize import ort_nearest_indices
from quantlab.numerics.quantize import dequantize, quantize
from quantlab.numerics.resize import resize_bilinear_fixed
from quantlab.platform_rules import ResizeRule
from quantlab.simulate.fixed_common import add_codes, sub_codes

_DTYPE = {
    np.dtype(np.int8): DType.INT8,
    np.dtype(np.uint8): DType.UINT8,
    np.dtype(np.int16): DType.INT16,
}
_BOUNDS = {Activation.NONE: None, Activation.RELU: (0.0, None), Activation.RELU6: (0.0, 6.0)}


def _activation(codes: torch.Tensor, act: Activation, yq, dt: DType, platform) -> np.ndarray:
    bounds = _BOUNDS[act]
    if bounds is not None:
        lo, hi = bound_codes(*bounds, float(yq.scale), dt, yq.zero_point, platform.bound_rule)
        codes = codes.to(torch.int64).clamp_min(lo).clamp_max(hi)
    return codes.to(dt.torch_dtype).numpy()


def _per_channel(w_scale, n: int) -> torch.Tensor:
    return torch.from_numpy(np.broadcast_to(np.asarray(w_scale, np.float32), (n,)).copy())


def litert_conv(c: ConvCase, platform) -> np.ndarray:
    """CONV_2D / DEPTHWISE_CONV_2D of a LiteRT case under ``platform`` (output NHWC)."""
    dt = _DTYPE[c.x.dtype]
    hw, k = c.x.shape[1:3], c.w.shape[1:3]
    out_hw = conv_output_size(hw, k, c.stride, c.dilation, c.padding)
    ph, pw = same_padding_before(hw, k, c.stride, c.dilation, c.padding)
    x = torch.from_numpy(c.x).permute(0, 3, 1, 2)
    tail = [k[i] * c.dilation[i] + c.stride[i] * out_hw[i] for i in range(2)]
    # padding with the zero point: a tap outside the input adds w * (zx - zx) = 0
    x = F.pad(x.to(torch.int32), (pw, tail[1], ph, tail[0]), value=c.xq.zero_point).to(x.dtype)
    if c.depth_multiplier:
        w = torch.from_numpy(c.w[0]).permute(2, 0, 1).unsqueeze(1)
        groups = c.x.shape[3]
    else:
        w = torch.from_numpy(c.w).permute(0, 3, 1, 2)
        groups = c.x.shape[3] // c.w.shape[3]
    contract = platform.gemm_contract("conv2d", activation=dt)
    y, _ = qconv2d(
        x.contiguous(),
        float(c.xq.scale),
        w.contiguous(),
        _per_channel(c.w_scale, w.shape[0]),
        torch.from_numpy(c.bias.astype(np.int64)),
        float(c.yq.scale),
        dt,
        contract,
        stride=c.stride,
        dilation=c.dilation,
        groups=groups,
        zero_points=(c.xq.zero_point, c.yq.zero_point),
    )
    y = y[:, :, : out_hw[0], : out_hw[1]].permute(0, 2, 3, 1)
    return _activation(y, c.activation, c.yq, dt, platform)


def litert_transpose_conv(c: TransposeConvCase, platform) -> np.ndarray:
    """TRANSPOSE_CONV of a LiteRT case under ``platform``'s contract for ``conv_transpose2d``
    (torch layout: x NCHW, weights (I, O, KH, KW); the padding / output_padding that give
    TFLite's output, ``transpose_conv_torch_args``), output NHWC."""
    dt = _DTYPE[c.x.dtype]
    args = transpose_conv_torch_args(c.x.shape[1:3], c.out_hw, c.w.shape[1:3], c.stride, c.padding)
    if args is None:
        raise ValueError("TFLite pads this TRANSPOSE_CONV one row more after: no torch form")
    pad, out_pad = args
    y, _ = qconv_transpose(
        torch.from_numpy(c.x).permute(0, 3, 1, 2).contiguous(),
        float(c.xq.scale),
        torch.from_numpy(c.w).permute(3, 0, 1, 2).contiguous(),  # (I, O, KH, KW)
        _per_channel(c.w_scale, c.w.shape[0]),
        None if c.bias is None else torch.from_numpy(c.bias.astype(np.int64)),
        float(c.yq.scale),
        dt,
        platform.gemm_contract("conv_transpose2d", False, activation=dt),
        stride=c.stride,
        padding=pad,
        output_padding=out_pad,
        zero_points=(c.xq.zero_point, c.yq.zero_point),
    )
    return _activation(y.permute(0, 2, 3, 1), c.activation, c.yq, dt, platform)


def litert_fully_connected(c: FullyConnectedCase, platform) -> np.ndarray:
    """FULLY_CONNECTED of a LiteRT case under ``platform``."""
    dt = _DTYPE[c.x.dtype]
    bias = None if c.bias is None else torch.from_numpy(c.bias.astype(np.int64))
    y, _ = qlinear(
        torch.from_numpy(c.x),
        float(c.xq.scale),
        torch.from_numpy(c.w),
        _per_channel(c.w_scale, c.w.shape[0]),
        bias,
        float(c.yq.scale),
        dt,
        platform.gemm_contract("linear", activation=dt),
        zero_points=(c.xq.zero_point, c.yq.zero_point),
    )
    return _activation(y, c.activation, c.yq, dt, platform)


def litert_add(c: AddCase, platform) -> np.ndarray:
    """ADD of a LiteRT case under ``platform`` (the simulator's add by ``add_rule``)."""
    return _elementwise(add_codes, c, platform)


def litert_sub(c: AddCase, platform) -> np.ndarray:
    """SUB (a - b) of a LiteRT case under ``platform`` (the simulator's sub: ``sub_codes``)."""
    return _elementwise(sub_codes, c, platform)


def _elementwise(kernel, c: AddCase, platform) -> np.ndarray:
    """``kernel`` (``add_codes`` or ``sub_codes``) on the case's codes, scales and zero points,
    then its fused activation."""
    dt = _DTYPE[c.a.dtype]
    codes = kernel(
        platform,
        torch.from_numpy(c.a),
        float(c.aq.scale),
        torch.from_numpy(c.b),
        float(c.bq.scale),
        float(c.yq.scale),
        dt,
        (c.aq.zero_point, c.bq.zero_point, c.yq.zero_point),
    )
    return _activation(codes, c.activation, c.yq, dt, platform)


def ort_qlinearconv(c, platform) -> np.ndarray:
    """QLinearConv of an onnxruntime case (symmetric int8 weights, zw = 0) under ``platform``."""
    if c.zw != 0 or c.w.dtype != np.int8:
        raise ValueError("quantlab weights are symmetric int8: the case needs zw = 0")
    dt = _DTYPE[c.x.dtype]
    top, left, bottom, right = c.pads
    x = torch.from_numpy(c.x).to(torch.int32)
    x = F.pad(x, (left, right, top, bottom), value=c.zx).to(dt.torch_dtype)
    y, _ = qconv2d(
        x,
        float(c.sx),
        torch.from_numpy(c.w),
        _per_channel(c.sw, c.w.shape[0]),
        None if c.bias is None else torch.from_numpy(c.bias.astype(np.int64)),
        float(c.sy),
        dt,
        platform.gemm_contract("conv2d", activation=dt),
        stride=c.stride,
        dilation=c.dilation,
        groups=c.group,
        zero_points=(c.zx, c.zy),
    )
    return y.numpy()


def ort_qlinearmatmul(c, platform) -> np.ndarray:
    """QLinearMatMul of an onnxruntime case (int8 B, zb = 0) under ``platform``."""
    if np.any(c.zb != 0) or c.b.dtype != np.int8:
        raise ValueError("quantlab weights are symmetric int8: the case needs zb = 0")
    dt = _DTYPE[c.a.dtype]
    y, _ = qmatmul(
        torch.from_numpy(c.a),
        float(c.sa),
        torch.from_numpy(c.b),
        _per_channel(c.sb, c.b.shape[1]) if c.sb.size > 1 else float(c.sb.reshape(-1)[0]),
        None,
        float(c.sy),
        dt,
        platform.gemm_contract("matmul", activation=dt),
        zero_points=(c.za, c.zy),
    )
    return y.numpy()


def ort_lut(c, platform) -> np.ndarray:
    """A DequantizeLinear -> float op(s) -> QuantizeLinear case (``ort_lut_models``)
    under ``platform``: the simulator's LUT on codes with zero points (``ZeroPointLut``)."""
    dt = _DTYPE[c.x.dtype]
    table = build_zero_point_lut(
        c.op, dt, float(c.sx), c.zx, dt, float(c.sy), c.zy, fmt=platform.lut_format()
    )
    return table.evaluate(torch.from_numpy(c.x)).numpy()


def litert_lut(c, platform) -> np.ndarray:
    """LOGISTIC / TANH of a LiteRT case (``litert_models.LutCase``) under ``platform``."""
    table = build_zero_point_lut(
        c.op,
        DType.INT8,
        float(c.xq.scale),
        c.xq.zero_point,
        DType.INT8,
        float(c.yq.scale),
        c.yq.zero_point,
        fmt=platform.lut_format(),
    )
    return table.evaluate(torch.from_numpy(c.x)).numpy()


def litert_resize(c: ResizeCase, platform) -> np.ndarray:
    """RESIZE_BILINEAR or RESIZE_NEAREST_NEIGHBOR of a LiteRT case (the mappings torch's calls
    give: bilinear with half-pixel centres or align_corners, nearest with neither or with
    half-pixel centres, torch's "nearest-exact") under ``platform.resize``, at the input's
    quantization: LiteRT's own kernels (LITERT, and LITERT_XNNPACK but for int8 bilinear:
    XNNPACK's), or a nearest selection (onnxruntime's indices under ONNXRUNTIME, torch's
    otherwise) and, for bilinear, grid_sample's sampler on the centred codes (GRID_SAMPLER) or
    float between dequantize and quantize (ONNXRUNTIME)."""
    dt = _DTYPE[c.x.dtype]
    x = torch.from_numpy(c.x).permute(0, 3, 1, 2)
    rule, zp = platform.resize, c.xq.zero_point
    litert = rule in (ResizeRule.LITERT, ResizeRule.LITERT_XNNPACK)
    if c.nearest and litert:
        y = tflite_resize_nearest(x, c.out_hw, c.align_corners, c.half_pixel_centers)
    elif c.nearest and rule is ResizeRule.ONNXRUNTIME and not c.half_pixel_centers:
        iy, ix = (ort_nearest_indices(n, m) for n, m in zip(x.shape[2:], c.out_hw, strict=True))
        y = x[:, :, iy][:, :, :, ix]
    elif c.nearest:
        mode = "nearest-exact" if c.half_pixel_centers else "nearest"
        y = F.interpolate(x.double(), size=c.out_hw, mode=mode).to(x.dtype)
    elif rule is ResizeRule.LITERT_XNNPACK and dt is DType.INT8:
        y = xnnpack_resize_bilinear(x, c.out_hw, c.align_corners, c.half_pixel_centers)
    elif litert:
        y = tflite_resize_bilinear(x, dt, c.out_hw, c.align_corners, c.half_pixel_centers)
    elif rule is ResizeRule.GRID_SAMPLER:
        xc = x.to(torch.int64) - zp
        acc = resize_bilinear_fixed(xc, DType.INT32, c.out_hw, c.align_corners,
                                    weight_frac_bits=platform.grid_weight_frac_bits,
                                    coord_round=platform.grid_round,
                                    out_rounding=platform.grid_round)  # fmt: skip
        y = (acc.to(torch.int64) + zp).clamp(dt.qmin, dt.qmax).to(dt.torch_dtype)
    else:
        v = dequantize(x, float(c.xq.scale), zero_point=zp)
        r = F.interpolate(v, size=c.out_hw, mode="bilinear", align_corners=c.align_corners)
        y = quantize(r, float(c.xq.scale), dt, platform.fake_round, zero_point=zp)
    return y.permute(0, 2, 3, 1).numpy()


def quantize_case_codes(c, platform) -> np.ndarray:
    """Fixed mode's codes of a QuantizeCase (``litert_models``) under ``platform``
    (``PlatformConfig.quantize_codes``): a 4-d case is the runtime's N, H, W, C tensor, which
    quantlab holds as N, C, H, W."""
    out = _DTYPE[np.dtype(c.dtype)]
    x = torch.from_numpy(c.x)
    if x.dim() == 4:
        x = x.permute(0, 3, 1, 2).contiguous()
    codes = platform.quantize_codes(x, float(c.yq.scale), out, c.yq.zero_point)
    if codes.dim() == 4:
        codes = codes.permute(0, 2, 3, 1)
    return codes.numpy()
