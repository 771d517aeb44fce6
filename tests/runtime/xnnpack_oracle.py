"""LiteRT's default interpreter on int8 ops (the XNNPACK delegate) restated in numpy.

Sources (google/XNNPACK): ``src/operators/convolution-nhwc.c`` and ``fully-connected-nc.c``
(requantization scale), ``src/qs8-qc8w-gemm``, ``qs8-qc8w-dwconv`` (fp32 requantization:
``cvtepi32_ps``, ``mul_ps``, ``cvtps_epi32`` / magic-bias rounding), ``src/xnnpack/
requantization.h`` (``xnn_qs8_quantize``, the fused-activation bounds),
``src/microparams-init.c`` (``xnn_init_qs8_add_minmax_scalar_params``), ``src/qs8-vadd``;
the delegate (``tflite/delegates/xnnpack/xnnpack_delegate.cc``) passes the fused activation
as a float range (RELU: [0, inf), RELU6: [0, 6]).

Rules (int8 activations, zero points zx, zy; weights symmetric):
- CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED: acc = int32 (wrapping) bias + sum w*(x - zx)
  (the delegate folds -zx * sum(w) into the packed bias and pads with zx); per channel
  s = fl32(fl32(sx * sw) / sy); y = clamp(rne(fl32(fl32(acc) * s)) + zy, lo, hi): one float32
  product, ties to even.
- Bounds: lo/hi = lrintf(clamp(fl32(fl32(f / sy) + zy), -128, 127)) for f in the float range
  (ties to even): RELU6's upper bound rounds 6.0f / sy + zy half to even.
- ADD: ra = fl32(sa / sy), rb likewise; e = binary exponent of max(ra, rb); shift = 20 - e;
  ma = rne(ra * 2**shift), mb likewise; acc = 2**(shift-1) - ma*za - mb*zb + ma*a + mb*b
  (int32), y = clamp((acc >> shift) + zy, lo, hi): one rounding, ties toward +inf.
"""

from __future__ import annotations

import numpy as np
from litert_models import Activation, AddCase, ConvCase, FullyConnectedCase
from oracle_ops import conv_acc, fc_acc, round_half_even, wrap_int32


def quantize_bound(f: float, scale: np.float32, zp: int) -> int:
    """xnn_qs8_quantize: lrintf(fminf(fmaxf(f / scale + (float) zp, -128), 127))."""
    with np.errstate(over="ignore"):
        v = np.float32(f) / np.float32(scale) + np.float32(zp)
    return int(round_half_even(np.clip(v, np.float32(-128), np.float32(127))))


def activation_range(act: Activation, scale: np.float32, zp: int) -> tuple[int, int]:
    """The int8 output bounds of a fused activation (NONE: the whole int8 range)."""
    lo, hi = -128, 127
    if act in (Activation.RELU, Activation.RELU6):
        lo = quantize_bound(0.0, scale, zp)
    if act is Activation.RELU6:
        hi = quantize_bound(6.0, scale, zp)
    return lo, hi


def requantize_fp32(acc: np.ndarray, sx, w_scale, sy, zy: int, act: Activation) -> np.ndarray:
    """fp32 requantization of int32 accumulators (..., O) with per-channel scales."""
    sw = np.broadcast_to(np.asarray(w_scale, np.float32), (acc.shape[-1],))
    s = (np.float32(sx) * sw) / np.float32(sy)  # two float32 operations, left to right
    f = wrap_int32(acc).astype(np.float32) * s
    lo, hi = activation_range(act, sy, zy)
    return np.clip(round_half_even(f.astype(np.float64)) + zy, lo, hi).astype(np.int8)


def conv(c: ConvCase) -> np.ndarray:
    """Output codes of XNNPACK's int8 conv or depthwise conv for a ConvCase."""
    return requantize_fp32(
        conv_acc(c), c.xq.scale, c.w_scale, c.yq.scale, c.yq.zero_point, c.activation
    )


def fully_connected(c: FullyConnectedCase) -> np.ndarray:
    """Output codes of XNNPACK's int8 fully connected layer for a FullyConnectedCase."""
    return requantize_fp32(
        fc_acc(c), c.xq.scale, c.w_scale, c.yq.scale, c.yq.zero_point, c.activation
    )


def add_params(sa, sb, sy) -> tuple[int, int, int]:
    """(ma, mb, shift) of xnn_init_qs8_add_minmax_scalar_params (positive scales)."""
    ra = np.float32(sa) / np.float32(sy)
    rb = np.float32(sb) / np.float32(sy)
    exponent = int((int(np.float32(max(ra, rb)).view(np.uint32)) >> 23) - 127)
    shift = 20 - exponent
    ma = int(round_half_even(np.float64(ra) * 2.0**shift))  # exact scaling, then lrintf
    mb = int(round_half_even(np.float64(rb) * 2.0**shift))
    return ma, mb, shift


def add(c: AddCase) -> np.ndarray:
    """Output codes of XNNPACK's int8 add for an AddCase."""
    ma, mb, shift = add_params(c.aq.scale, c.bq.scale, c.yq.scale)
    bias = (1 << (shift - 1)) - ma * c.aq.zero_point - mb * c.bq.zero_point
    acc = wrap_int32(bias + ma * c.a.astype(np.int64) + mb * c.b.astype(np.int64))
    lo, hi = activation_range(c.activation, c.yq.scale, c.yq.zero_point)
    return np.clip((acc >> shift) + c.yq.zero_point, lo, hi).astype(np.int8)
