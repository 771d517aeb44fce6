"""Seeded random one-op cases for LiteRT: conv, depthwise, transposed conv, fully connected,
add, the LUT ops and resizes.

Every case is drawn from ``np.random.default_rng(seed)`` (TRANSPOSE_CONV: ``10_000 + seed``).
Besides plain random cases a case can be a ``Variant``: TIES (power-of-two scales, so that the
real multiplier is 2**-k and many accumulators sit exactly on a rounding tie), RELU6_TIE (an
output scale for which 6.0f / scale is exactly k + 0.5 in float32, the fused RELU6 bound's tie),
WIDE (16x8: operands near their extremes with matching signs, so that the sums pass 2**31) or,
for TRANSPOSE_CONV, EXTREME (activation codes and int8 zero points at the ends of their range,
weights +-127 or 0).
The output scale is fitted to the exact accumulators so that outputs span the output range
and some saturate.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np
from litert_models import (
    LUT_OUTPUT,
    Activation,
    AddCase,
    ConvCase,
    FullyConnectedCase,
    LutCase,
    Padding,
    QParams,
    QuantizeCase,
    ResizeCase,
    TransposeConvCase,
    conv_output_size,
    same_padding_before,
    transpose_conv_padding,
    transpose_conv_torch_args,
)
from oracle_ops import conv_sums, depthwise_sums, fc_sums


class Variant(enum.Enum):
    PLAIN = "plain"
    TIES = "ties"
    RELU6_TIE = "relu6_tie"
    WIDE = "wide"
    EXTREME = "extreme"  # codes and zero points at the ends of their ranges (TRANSPOSE_CONV)


def variant_of(seed: int, wide_allowed: bool) -> Variant:
    """A fixed mix: every 5th case TIES, every 7th RELU6_TIE, every 11th WIDE (16x8 only)."""
    if wide_allowed and seed % 11 == 3:
        return Variant.WIDE
    if seed % 7 == 2:
        return Variant.RELU6_TIE
    if seed % 5 == 1:
        return Variant.TIES
    return Variant.PLAIN


def _act_codes(rng, shape, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, shape).astype(dtype)


def _zero_point(rng, dtype, asymmetric: bool = True) -> int:
    """A zero point in [-100, 100] for int8 (0 for int16 or when not ``asymmetric``)."""
    z = int(rng.integers(-100, 101))
    return z if asymmetric and np.dtype(dtype) == np.int8 else 0


def _scale(rng, lo, hi) -> np.float32:
    return np.float32(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def relu6_tie_scale(rng) -> np.float32:
    """A float32 scale s with fl32(6.0f / s) == k + 0.5 exactly (k in 20..120)."""
    while True:
        k = int(rng.integers(20, 121))
        s = np.float32(6.0 / (k + 0.5))
        if np.float32(6.0) / s == np.float32(k + 0.5):
            return s


def _weights(rng, shape, variant: Variant, out_axis: int = 0) -> np.ndarray:
    if variant is Variant.WIDE:  # one sign per output channel (axis ``out_axis``)
        sign_shape = [1] * len(shape)
        sign_shape[out_axis] = shape[out_axis]
        return (rng.choice([-1, 1], size=sign_shape) * np.full(shape, 127)).astype(np.int8)
    if variant is Variant.TIES:
        return rng.integers(-8, 9, shape).astype(np.int8)
    if variant is Variant.EXTREME:
        return rng.choice([-127, 127, 0], size=shape, p=[0.45, 0.45, 0.1]).astype(np.int8)
    return rng.integers(-127, 128, shape).astype(np.int8)


def _x(rng, shape, dtype, zx, variant: Variant) -> np.ndarray:
    if variant is Variant.WIDE:  # mostly the top code: sums of one sign, far past 2**24
        info = np.iinfo(dtype)
        top = rng.choice(
            [int(info.max), int(info.max) - 2, int(info.min)], size=shape, p=[0.6, 0.3, 0.1]
        )
        return top.astype(dtype)
    if variant is Variant.TIES:  # small sums, so that a multiplier 2**-k with small k fits
        info = np.iinfo(dtype)
        return np.clip(zx + rng.integers(-6, 7, shape), info.min, info.max).astype(dtype)
    if variant is Variant.EXTREME:
        info = np.iinfo(dtype)
        ends = [int(info.min), int(info.max), int(info.min) + 1, int(info.max) - 1]
        return rng.choice(ends, shape).astype(dtype)
    return _act_codes(rng, shape, dtype)


def _scales(rng, variant: Variant, n_w: int, act_dtype) -> tuple[np.float32, np.ndarray]:
    """(sx, w_scale (n_w,)); TIES: powers of two."""
    if variant is Variant.TIES:
        sx = np.float32(2.0 ** -int(rng.integers(4, 9)))
        sw = (2.0 ** -rng.integers(5, 9, n_w)).astype(np.float32)
        return sx, sw
    sx = _scale(rng, 1e-5, 1e-3) if np.dtype(act_dtype) == np.int16 else _scale(rng, 2e-3, 5e-2)
    return sx, np.array([_scale(rng, 1e-3, 2e-2) for _ in range(n_w)], np.float32)


def _fit_output(
    rng, acc, sx, sw, dtype, variant: Variant, activation, asym, zy: int | None = None
) -> QParams:
    """Output quantization: sy = max|real output| / qmax / u, u uniform in [0.4, 1.3] (u < 1
    saturates the largest outputs); TIES: M = 2**-k; RELU6_TIE: a RELU6 tie scale. The zero
    point is ``zy``, or drawn by ``_zero_point`` when None."""
    if zy is None:
        zy = _zero_point(rng, dtype, asym)
    if variant is Variant.RELU6_TIE and activation is Activation.RELU6:
        return QParams(relu6_tie_scale(rng), zy)
    qmax = float(np.iinfo(dtype).max)
    if variant is Variant.TIES:
        # M = 2**-k (k >= 1) for the widest channel: outputs acc / 2**k, ties every 2**k values
        k = max(1, int(np.ceil(np.log2(max(float(np.abs(acc).max()), 1.0) / qmax))))
        k = max(1, k + int(rng.integers(-1, 2)))  # some saturate
        return QParams(np.float32(float(sx) * float(sw.max()) * 2.0**k), zy)
    real = np.abs(acc.astype(np.float64) * np.float64(sx) * sw.astype(np.float64))
    top = max(float(real.max()), 1e-6)
    sy = np.float32(top / qmax / rng.uniform(0.4, 1.3))
    return QParams(sy, zy)


def conv_case(seed: int, depthwise: bool, act_dtype, bias_dtype, asymmetric=True) -> ConvCase:
    """A random CONV_2D (or DEPTHWISE_CONV_2D) case; variant chosen by ``variant_of(seed)``;
    ``asymmetric=False``: int8 zero points 0."""
    rng = np.random.default_rng(seed)
    act_dtype = np.dtype(act_dtype)
    variant = variant_of(seed, True)
    activation = [Activation.NONE, Activation.RELU, Activation.RELU6][seed % 3]
    if variant is Variant.RELU6_TIE:
        activation = Activation.RELU6
    while True:
        if depthwise:
            cin = int(rng.integers(1, 7))
            mult = int(rng.integers(1, 4))
            groups = cin
        else:
            groups = int(rng.choice([1, 1, 1, 2]))
            cin = groups * int(rng.integers(1, 6))
            mult = 0
        k = tuple(int(v) for v in rng.integers(1, 4, 2))
        if variant is Variant.WIDE:
            k = (3, 3)
            if not depthwise:
                groups, cin = 1, int(rng.integers(100, 130))
        hw = tuple(int(v) for v in rng.integers(3, 9, 2))
        stride = tuple(int(v) for v in rng.integers(1, 3, 2))
        dilation = tuple(int(v) for v in rng.integers(1, 3, 2))
        padding = Padding.SAME if rng.random() < 0.5 else Padding.VALID
        out_hw = conv_output_size(hw, k, stride, dilation, padding)
        if min(out_hw) >= 1:
            break
    n = int(rng.integers(1, 3))
    zx = _zero_point(rng, act_dtype, asymmetric)
    x = _x(rng, (n, *hw, cin), act_dtype, zx, variant)
    out_ch = cin * mult if depthwise else groups * int(rng.integers(1, 5))
    w_shape = (1, *k, out_ch) if depthwise else (out_ch, *k, cin // groups)
    w = _weights(rng, w_shape, variant, 3 if depthwise else 0)
    per_channel = rng.random() < 0.75
    sx, sw = _scales(rng, variant, out_ch if per_channel else 1, act_dtype)
    pads = same_padding_before(hw, k, stride, dilation, padding)
    if depthwise:
        acc = depthwise_sums(x, zx, w, mult, stride, dilation, pads, out_hw)
    else:
        acc = conv_sums(x, zx, w, stride, dilation, pads, out_hw)
    bias = _bias(rng, acc, bias_dtype, out_ch)
    swc = np.broadcast_to(sw, (out_ch,))
    total = acc + bias.astype(np.int64)
    yq = _fit_output(rng, total, sx, swc, act_dtype, variant, activation, asymmetric)
    return ConvCase(
        x, QParams(sx, zx), w, sw, bias, yq, stride, dilation, padding, activation, mult
    )


def transpose_conv_variant(seed: int, wide_allowed: bool) -> Variant:
    """TRANSPOSE_CONV's mix: every 9th case WIDE (16x8 only), every 7th RELU6_TIE, every 5th
    TIES, every 6th EXTREME."""
    if wide_allowed and seed % 9 == 4:
        return Variant.WIDE
    if seed % 7 == 2:
        return Variant.RELU6_TIE
    if seed % 5 == 1:
        return Variant.TIES
    if seed % 6 == 3:
        return Variant.EXTREME
    return Variant.PLAIN


def transpose_conv_sums(c: TransposeConvCase) -> np.ndarray:
    """Exact sums of TFLite's TRANSPOSE_CONV, no bias (int64 NHWC): input (y, x) of channel i
    adds w[o, ky, kx, i] * (x - zx) to output (y * sh - top + ky, x * sw - left + kx) of
    channel o; taps outside the output are dropped (reference transpose_conv.h)."""
    x = c.x.astype(np.int64) - c.xq.zero_point
    w = c.w.astype(np.int64)
    n, h, wd, _ = x.shape
    o, kh, kw, _ = w.shape
    (sh, sw), (oh, ow) = c.stride, c.out_hw
    (top, _), (left, _) = transpose_conv_padding((h, wd), c.out_hw, (kh, kw), c.stride, c.padding)
    full = np.zeros(
        (n, max((h - 1) * sh + kh, top + oh), max((wd - 1) * sw + kw, left + ow), o), np.int64
    )
    for ky in range(kh):
        for kx in range(kw):
            rows = slice(ky, ky + (h - 1) * sh + 1, sh)
            cols = slice(kx, kx + (wd - 1) * sw + 1, sw)
            full[:, rows, cols] += np.einsum("nhwi,oi->nhwo", x, w[:, ky, kx, :])
    return full[:, top : top + oh, left : left + ow]


def _transpose_conv_geometry(rng, variant: Variant):
    """(in_hw, kernel, stride, padding, out_hw) that torch can express (SAME or VALID with
    even odds; strides 1-3, kernels 1-5; WIDE: a 5x5 kernel at stride 1)."""
    padding = Padding.SAME if rng.random() < 0.5 else Padding.VALID
    while True:
        if variant is Variant.WIDE:  # 25 taps on each interior output
            k, s, hw = (5, 5), (1, 1), tuple(int(v) for v in rng.integers(5, 8, 2))
        else:
            k = tuple(int(v) for v in rng.integers(1, 6, 2))
            s = tuple(int(v) for v in rng.integers(1, 4, 2))
            hw = tuple(int(v) for v in rng.integers(1, 7, 2))
        if padding is Padding.SAME:  # ComputeOutSize(SAME, out, k, s) = ceil(out / s) = in
            out = [int(rng.integers((n - 1) * st + 1, n * st + 1)) for n, st in zip(hw, s)]
        else:  # (out + s - k) // s = in
            out = [(n - 1) * st + kk + int(rng.integers(0, st)) for n, kk, st in zip(hw, k, s)]
        out = (out[0], out[1])
        if transpose_conv_torch_args(hw, out, k, s, padding) is not None:
            return hw, k, s, padding, out


def _transpose_conv_zero_point(rng, dtype, variant: Variant) -> int:
    """int8: in [-100, 100], EXTREME: -128, 127 or that; int16: 0 (no draw)."""
    if np.dtype(dtype) != np.int8:
        return 0
    z = int(rng.integers(-100, 101))
    return int(rng.choice([-128, 127, z])) if variant is Variant.EXTREME else z


def transpose_conv_case(seed: int, act_dtype, bias_dtype) -> TransposeConvCase:
    """A random TRANSPOSE_CONV case of ``transpose_conv_variant(seed)`` (int8 with zero points,
    or 16x8 with a ``bias_dtype`` bias); every 8th case has no bias. Only geometries that
    torch's conv_transpose2d can express are drawn (``transpose_conv_torch_args``)."""
    rng = np.random.default_rng(10_000 + seed)
    act_dtype = np.dtype(act_dtype)
    variant = transpose_conv_variant(seed, act_dtype == np.int16)
    activation = [Activation.NONE, Activation.RELU, Activation.RELU6][seed % 3]
    if variant is Variant.RELU6_TIE:
        activation = Activation.RELU6
    hw, k, stride, padding, out_hw = _transpose_conv_geometry(rng, variant)
    n = int(rng.integers(1, 3))
    cin = int(rng.integers(24, 31)) if variant is Variant.WIDE else int(rng.integers(1, 7))
    cout = int(rng.integers(1, 7))
    zx = _transpose_conv_zero_point(rng, act_dtype, variant)
    x = _x(rng, (n, *hw, cin), act_dtype, zx, variant)
    w = _weights(rng, (cout, *k, cin), variant)
    per_channel = rng.random() < 0.75
    sx, sw = _scales(rng, variant, cout if per_channel else 1, act_dtype)
    c = TransposeConvCase(
        x,
        QParams(sx, zx),
        w,
        sw,
        None,
        QParams(np.float32(1), 0),
        stride,
        padding,
        activation,
        out_hw,
    )
    acc = transpose_conv_sums(c)
    bias = None
    if seed % 8 != 5:
        bias = _bias(rng, acc, bias_dtype, cout)
        acc = acc + bias.astype(np.int64)
    zy = _transpose_conv_zero_point(rng, act_dtype, variant)
    swc = np.broadcast_to(sw, (cout,))
    yq = _fit_output(rng, acc, sx, swc, act_dtype, variant, activation, True, zy)
    return dataclasses.replace(c, bias=bias, yq=yq)


def _bias(rng, acc, bias_dtype, n) -> np.ndarray:
    spread = min(max(float(np.abs(acc).max()), 1.0), 2.0**23)  # |bias| < 2**24: float32-exact
    return np.round(rng.normal(size=n) * spread * 0.3).astype(bias_dtype)


def fully_connected_case(
    seed: int, act_dtype, bias_dtype, per_channel: bool, asymmetric: bool = True
) -> FullyConnectedCase:
    """A random FULLY_CONNECTED case (bias_dtype None: no bias)."""
    rng = np.random.default_rng(seed)
    act_dtype = np.dtype(act_dtype)
    variant = variant_of(seed, True)
    activation = [Activation.NONE, Activation.RELU, Activation.RELU6][seed % 3]
    if variant is Variant.RELU6_TIE:
        activation = Activation.RELU6
    b = int(rng.integers(1, 5))
    depth = int(rng.integers(1, 64))
    if variant is Variant.WIDE:
        depth = int(rng.integers(1000, 1100))
    units = int(rng.integers(1, 17))
    zx = _zero_point(rng, act_dtype, asymmetric)
    x = _x(rng, (b, depth), act_dtype, zx, variant)
    w = _weights(rng, (units, depth), variant)
    sx, sw = _scales(rng, variant, units if per_channel else 1, act_dtype)
    acc = fc_sums(x, zx, w)
    bias = None if bias_dtype is None else _bias(rng, acc, bias_dtype, units)
    total = acc if bias is None else acc + bias.astype(np.int64)
    swc = np.broadcast_to(sw, (units,))
    yq = _fit_output(rng, total, sx, swc, act_dtype, variant, activation, asymmetric)
    return FullyConnectedCase(x, QParams(sx, zx), w, sw, bias, yq, activation)


def add_case(seed: int, act_dtype, asymmetric: bool = True) -> AddCase:
    """A random ADD case: two same-shape operands with their own scales and zero points."""
    rng = np.random.default_rng(seed)
    act_dtype = np.dtype(act_dtype)
    variant = variant_of(seed, False)
    activation = [Activation.NONE, Activation.RELU, Activation.RELU6][seed % 3]
    if variant is Variant.RELU6_TIE:
        activation = Activation.RELU6
    shape = tuple(int(v) for v in rng.integers(1, 9, int(rng.integers(1, 4))))
    a = _act_codes(rng, shape, act_dtype)
    b = _act_codes(rng, shape, act_dtype)
    lo, hi = (1e-4, 2e-3) if act_dtype == np.int16 else (5e-3, 1e-1)
    if variant is Variant.TIES:
        e = int(np.round(np.log2(lo)))
        sa, sb = (np.float32(2.0 ** (e - int(rng.integers(0, 4)))) for _ in range(2))
    else:
        sa, sb = _scale(rng, lo, hi), _scale(rng, lo, hi)
    aq = QParams(sa, _zero_point(rng, act_dtype, asymmetric))
    bq = QParams(sb, _zero_point(rng, act_dtype, asymmetric))
    real = (a.astype(np.float64) - aq.zero_point) * sa + (b.astype(np.float64) - bq.zero_point) * sb
    qmax = float(np.iinfo(act_dtype).max)
    sy = np.float32(max(float(np.abs(real).max()), 1e-6) / qmax / rng.uniform(0.4, 1.3))
    if variant is Variant.TIES:
        sy = np.float32(2.0 ** np.round(np.log2(float(sy))))
    if variant is Variant.RELU6_TIE:
        sy = relu6_tie_scale(rng)
    sy = max(sy, np.float32(2 * max(sa, sb) / (1 << 14)))  # the kernels need sy >~ 2*max/2**20
    return AddCase(a, aq, b, bq, QParams(sy, _zero_point(rng, act_dtype, asymmetric)), activation)


def lut_case(seed: int, op: str) -> LutCase:
    """LOGISTIC / TANH on every int8 code: a random input scale (a power of two every third
    seed) and zero point in [-128, 127]; the output parameters the kernel requires."""
    rng = np.random.default_rng(seed)
    x = np.arange(-128, 128).astype(np.int8)
    sx = np.float32(2.0 ** -int(rng.integers(3, 7))) if seed % 3 == 2 else _scale(rng, 5e-3, 0.1)
    return LutCase(op, x, QParams(sx, int(rng.integers(-128, 128))), LUT_OUTPUT[op])


def resize_case(seed: int, act_dtype, nearest: bool = False) -> ResizeCase:
    """A random RESIZE_BILINEAR (or RESIZE_NEAREST_NEIGHBOR) case: input 1-9 x 1-9 pixels, 1-4
    channels, output 1-20 x 1-20 (up- and downsampling, odd ratios), codes over the whole range
    (the extremes included) with a zero point for int8, and the mappings torch's calls give, in
    turn: bilinear with half-pixel centres or align_corners, nearest as torch's "nearest"
    (neither) or "nearest-exact" (half-pixel centres)."""
    rng = np.random.default_rng(seed)
    h, w, ch = (int(v) for v in rng.integers(1, 10, 3))
    ch = 1 + ch % 4
    out_hw = tuple(int(v) for v in rng.integers(1, 21, 2))
    x = _act_codes(rng, (int(rng.integers(1, 3)), h, w, ch), act_dtype)
    info = np.iinfo(act_dtype)
    x.flat[0], x.flat[-1] = info.min, info.max
    xq = QParams(_scale(rng, 5e-3, 1e-1), _zero_point(rng, act_dtype))
    odd = seed % 2 == 1
    if nearest:
        return ResizeCase(x, xq, out_hw, False, odd, nearest=True)
    return ResizeCase(x, xq, out_hw, odd, not odd)


def quantize_case(seed: int, dtype) -> QuantizeCase:
    """A QUANTIZE (or QuantizeLinear) case: float32 values of a random shape of 1 to 4 dims
    (every count of elements mod 8, so LiteRT's int16 scalar tail holds 0 to 7 of them): values
    within 3 ulps of rounding ties (k + 0.5) * s and random ones across the code range and
    beyond; every third seed also NaN, infinities and values beyond the int32 range. A random
    scale (a power of two every fourth seed, where ties are exact) and zero point (int8 and
    uint8: any; int16: 0 or a small one)."""
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 5))
    shape = tuple(int(v) for v in rng.integers(1, 9, rank))
    n = int(np.prod(shape))
    s = np.float32(2.0 ** -int(rng.integers(2, 8))) if seed % 4 == 3 else _scale(rng, 1e-3, 1.0)
    info = np.iinfo(dtype)
    if np.dtype(dtype) == np.int16:
        zp = int(rng.integers(-50, 51)) if seed % 2 else 0
    else:
        zp = int(rng.integers(int(info.min), int(info.max) + 1))
    k = rng.integers(int(info.min) - zp - 4, int(info.max) - zp + 4, n)
    ties = ((k + 0.5) * s).astype(np.float32)
    steps = rng.integers(-3, 4, n)
    near = ties.copy()
    for i in range(n):  # nextafter |step| times towards the step's sign
        for _ in range(abs(int(steps[i]))):
            near[i] = np.nextafter(near[i], np.float32(np.sign(steps[i]) * np.inf))
    wide = (rng.standard_normal(n) * (info.max - info.min) * s).astype(np.float32)
    x = np.where(rng.random(n) < 0.7, near, wide).astype(np.float32)
    if seed % 3 == 0:
        special = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9], np.float32)
        picks = rng.integers(0, n, min(n, 3))
        x[picks] = special[rng.integers(0, special.size, picks.size)]
    return QuantizeCase(x.reshape(shape), QParams(s, zp), dtype)
