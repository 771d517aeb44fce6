"""Choosing a provably exact path for an integer GEMM (bit-exact-emulation s.2.1).

If every operand is an integer and K * max|a| * max|b| <= 2**p (p = 24 for float32, 53 for
float64), every partial sum any kernel forms (any blocking, order or FMA) is an integer of
magnitude <= 2**p, so no rounding ever happens.

* INT32 (int8 x int8 matrix products: a matmul with a 2-d or 1-d right operand, a convolution
  with one group as weights times its im2col columns): torch's int8 matrix product
  (``torch._int_mm``) with int32 sums. Every product is at most 2**14 in magnitude, so
  K <= INT32_MAX_TERMS = 2**16 terms keep every partial sum, in any order, below 2**30; a
  kernel that offsets a to unsigned (a + 128 <= 255) keeps its sums below 2**16 * 255 * 128 <
  2**31 too. The bound leaves the kernel no room to round or wrap; that it does not saturate
  (non-VNNI int8 instructions clamp pair sums to int16) is checked by the start-up self-test on
  operands that would saturate.
* INT32_SPLIT (the same products with an int16 operand): each int16 operand splits exactly into
  int8 halves a = 256 * hi + lo, hi = (a + 128) >> 8 and lo = a - 256 * hi both in
  [-128, 127] (every |a| <= INT8_HALVES_MAX = 32639); every half product is an INT32 product
  and ``sum_k a_k b_k = 256 * sum_k hi_k b_k + sum_k lo_k b_k`` (four terms, 65536 / 256 / 1,
  for two int16 operands) is combined in int64 (below K * 2**30).
* INT32_DEPTHWISE (depthwise convolutions: one input channel per group, int8/int16 codes): a
  direct C loop per channel with int32 sums (``depthwise_native``), for kh * kw * max|a| *
  max|b| <= INT32_MAX: every product is within 2**30 and every partial sum is a sum of some of
  the terms, so nothing wraps; AUTO takes it where the kernels are built.
* FLOAT32 on K-chunks: K is split so that each chunk meets the 2**24 bound (int8 x int8 with
  max|a| = max|b| = 128: 1024 terms); chunk results are summed in float64, exact while the whole
  sum is <= 2**53. Under AUTO, a matmul or 1x1 convolution whose measured left rows keep
  sum_k |a_k| * max|b| < 2**24 runs as one product instead (``kernels.rows_fit_float32``).
* FLOAT32_SPLIT (convolutions): the left operand is split exactly into 256 * hi + lo.
* FLOAT64 directly (int16 operands): exact for K * max|a| * max|b| <= 2**53.
* INT64 torch kernels: slow, exact below 2**63 (used when neither bound holds).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import Tensor

from quantlab.numerics.dtypes import FLOAT32_EXACT, FLOAT64_EXACT

MIN_CHUNK_K = 64  # below this many terms per float32 chunk, float64 is the faster exact path
SPLIT_MIN_MACS = 1 << 25  # FLOAT32_SPLIT pays its extra element-wise passes only above this
# ... or from this many groups on: torch runs a grouped float64 convolution group by group
# (a depthwise conv of 960 channels at 7x7 takes ~3 ms in float64, ~0.35 ms split)
SPLIT_MIN_GROUPS = 64
INT32_MAX_TERMS = 1 << 16  # int8 x int8 terms an INT32 sum may hold (module docstring)
INT32_MAX = (1 << 31) - 1  # the largest sum bound of an INT32_DEPTHWISE path
DEPTHWISE_MIN_POSITIONS_PER_TAP = 4  # AUTO's INT32_DEPTHWISE from here on (``depthwise_pays``)
DEPTHWISE_MAX_TAPS = 4096  # kernel taps (and strides) the C loop keeps tables of on its stack
INT8_HALVES_MAX = 32639  # 256 * 127 + 127: the largest |int16 code| two int8 halves hold
IM2COL_MIN_CHANNELS = 16  # a strided int8 convolution takes INT32 from this many channels on
OPERAND_DTYPES = (torch.int8, torch.int16)


class GemmPath(enum.Enum):
    """How the exact sum is computed. AUTO picks the fastest path whose bound holds.

    INT32:         int8 x int8 matrix products (matmuls, convolutions with one group) in
                   int32 (``torch._int_mm``), at most INT32_MAX_TERMS terms per sum.
    INT32_SPLIT:   the same products with int16 operands, as INT32 products of their int8
                   halves combined in int64 (|int16 codes| <= INT8_HALVES_MAX).
    INT32_DEPTHWISE: depthwise convolutions of int8/int16 codes by a C loop per channel with
                   int32 sums, K * max|a| * max|b| <= INT32_MAX.
    FLOAT32:       float32 BLAS on K-chunks within 2**24, chunks summed in float64.
    FLOAT32_SPLIT: convolutions only: the left operand a (|a| <= 32768) is split exactly into
                   a = 256 * hi + lo with hi = round_half_even(a / 256), |hi|, |lo| <= 128;
                   both halves run as one float32 chunked conv (stacked on the batch axis,
                   bound 128 * max|b| per product) and are combined in float64.
    FLOAT64:       float64 BLAS, exact within 2**53.
    INT64:         torch int64 kernels (slow; exact below 2**63).
    """

    AUTO = "auto"
    INT32 = "int32"
    INT32_SPLIT = "int32_split"
    INT32_DEPTHWISE = "int32_depthwise"
    FLOAT32 = "float32"
    FLOAT32_SPLIT = "float32_split"
    FLOAT64 = "float64"
    INT64 = "int64"


@dataclass(frozen=True)
class GemmPlan:
    """The path chosen for one GEMM and the number of K-terms (or channels) per float32 chunk."""

    path: GemmPath
    chunk: int  # FLOAT32(_SPLIT): units per chunk (a conv unit is one input channel); else 0
    bound: int  # max|a| * max|b|


def operand_bound(t: Tensor) -> int:
    """max|t| for int16 codes (their data range decides the path); the int8 dtype bound 128
    for int8 codes (no pass over the data: 1024 terms per float32 chunk instead of 1032)."""
    if t.dtype == torch.int8:
        return 128
    if t.numel() == 0:
        return 0
    lo, hi = torch.aminmax(t)
    return max(-int(lo), int(hi))


def plan_gemm(
    a_max: int,
    b_max: int,
    k: int,
    unit: int = 1,
    path: GemmPath = GemmPath.AUTO,
    split_a: bool = False,
    disabled: Collection[GemmPath] = (),
    int_product: tuple[torch.dtype, torch.dtype] | None = None,
    depthwise: bool = False,
) -> GemmPlan:
    """Choose a provably exact path for a K-term sum of products (K = ``k`` units of ``unit``).

    ``int_product``: the operand dtypes when the GEMM is a matrix product torch's int8 kernel
    runs (``int_product_matmul`` / ``int_product_conv``), else None; with K * unit <=
    INT32_MAX_TERMS, AUTO then takes INT32 for two int8 operands, INT32_SPLIT for int16 ones
    within INT8_HALVES_MAX. ``depthwise``: the GEMM is a convolution ``depthwise_conv`` accepts;
    AUTO then takes INT32_DEPTHWISE (next) when K * unit * max|a| * max|b| <= INT32_MAX.
    FLOAT32 chunks hold c units with c * unit * a_max * b_max <= 2**24; AUTO
    takes it when a chunk holds at least MIN_CHUNK_K terms (or all of K). Else, when
    ``split_a`` (convolutions) and a_max <= 32768, FLOAT32_SPLIT under the same rule with
    a_max = 128. Else FLOAT64 when K * unit * a_max * b_max <= 2**53, else INT64. AUTO never
    picks a path in ``disabled`` (``exact.auto_excluded``: the fast paths that failed the
    start-up self-test, and the int8 product where it is slow). A forced path whose bound fails
    raises.
    """
    bound = a_max * b_max
    total = k * unit * bound
    per_unit = unit * bound
    c = k if per_unit == 0 else min(k, FLOAT32_EXACT // per_unit)
    f32_ok = c >= 1
    split_unit = unit * 128 * b_max
    c_split = k if split_unit == 0 else min(k, FLOAT32_EXACT // split_unit)
    # the float64 combination 256 * sum(hi * b) + sum(lo * b) stays below 2**53
    split_total = k * unit * 32768 * b_max
    split_ok = split_a and a_max <= 32768 and c_split >= 1 and split_total <= FLOAT64_EXACT
    terms_ok = int_product is not None and k * unit <= INT32_MAX_TERMS
    int32_ok = terms_ok and int_product == (torch.int8, torch.int8)
    halves_ok = terms_ok and max(a_max, b_max) <= INT8_HALVES_MAX
    depthwise_ok = depthwise and total <= INT32_MAX
    if path is GemmPath.AUTO:
        if int32_ok and GemmPath.INT32 not in disabled:
            return GemmPlan(GemmPath.INT32, 0, bound)
        if halves_ok and not int32_ok and GemmPath.INT32_SPLIT not in disabled:
            return GemmPlan(GemmPath.INT32_SPLIT, 0, bound)
        if depthwise_ok and GemmPath.INT32_DEPTHWISE not in disabled:
            return GemmPlan(GemmPath.INT32_DEPTHWISE, 0, bound)
        f32_ok = f32_ok and GemmPath.FLOAT32 not in disabled
        if f32_ok and (c == k or c * unit >= MIN_CHUNK_K):
            return GemmPlan(GemmPath.FLOAT32, _balanced_chunk(k, max(c, 1)), bound)
        split_ok = split_ok and GemmPath.FLOAT32_SPLIT not in disabled
        if split_ok and (c_split == k or c_split * unit >= MIN_CHUNK_K):
            return GemmPlan(GemmPath.FLOAT32_SPLIT, _balanced_chunk(k, c_split), bound)
        if total <= FLOAT64_EXACT and GemmPath.FLOAT64 not in disabled:
            return GemmPlan(GemmPath.FLOAT64, 0, bound)
        return GemmPlan(GemmPath.INT64, 0, bound)
    if path is GemmPath.INT32:
        if not int32_ok:
            raise ValueError(
                "path INT32 needs int8 x int8 operands in a matrix product (a matmul with a 1-d "
                "or 2-d right operand, a convolution with one group and numeric padding) of at "
                f"most {INT32_MAX_TERMS} terms; use AUTO, FLOAT32, FLOAT64 or INT64"
            )
        return GemmPlan(GemmPath.INT32, 0, bound)
    if path is GemmPath.INT32_SPLIT:
        if not halves_ok:
            raise ValueError(
                "path INT32_SPLIT needs int8/int16 operands within +-"
                f"{INT8_HALVES_MAX} in a matrix product (a matmul with a 1-d or 2-d right "
                "operand, a convolution with one group and numeric padding) of at most "
                f"{INT32_MAX_TERMS} terms; use AUTO, FLOAT64 or INT64"
            )
        return GemmPlan(GemmPath.INT32_SPLIT, 0, bound)
    if path is GemmPath.INT32_DEPTHWISE:
        if not depthwise_ok:
            raise ValueError(
                "path INT32_DEPTHWISE needs a depthwise conv1d/conv2d (one input channel per "
                "group) of int8/int16 codes with numeric padding and kh * kw * max|x| * max|w| "
                f"<= {INT32_MAX} (here {total}); use AUTO, FLOAT32, FLOAT64 or INT64"
            )
        return GemmPlan(GemmPath.INT32_DEPTHWISE, 0, bound)
    if path is GemmPath.FLOAT32:
        if not f32_ok:
            raise ValueError(
                f"path FLOAT32 cannot be exact here: one chunk unit of {unit} terms with "
                f"max|a|*max|b| = {bound} exceeds 2**24; use AUTO, FLOAT64 or INT64"
            )
        if total > FLOAT64_EXACT:
            raise ValueError(f"sum bound {total} exceeds 2**53 for float64 chunk sums; use INT64")
        return GemmPlan(GemmPath.FLOAT32, _balanced_chunk(k, c), bound)
    if path is GemmPath.FLOAT32_SPLIT:
        if not split_ok:
            raise ValueError(
                "path FLOAT32_SPLIT needs a convolution with max|a| <= 32768 and one chunk unit "
                f"within 2**24 (unit {unit}, max|b| {b_max}); use AUTO, FLOAT64 or INT64"
            )
        return GemmPlan(GemmPath.FLOAT32_SPLIT, _balanced_chunk(k, c_split), bound)
    if path is GemmPath.FLOAT64:
        if total > FLOAT64_EXACT:
            raise ValueError(f"path FLOAT64 cannot be exact: K*max|a|*max|b| = {total} > 2**53")
        return GemmPlan(GemmPath.FLOAT64, 0, bound)
    if path is GemmPath.INT64:
        return GemmPlan(GemmPath.INT64, 0, bound)
    raise ValueError(f"unknown path {path!r}; allowed: {', '.join(p.name for p in GemmPath)}")


def _balanced_chunk(k: int, c: int) -> int:
    """Chunk size <= c giving the fewest chunks, as equal as possible and, where that keeps
    the count, a multiple of 8 (BLAS / oneDNN kernels prefer blocked sizes)."""
    if c >= k:
        return k
    n = -(-k // c)
    size = -(-k // n)
    rounded = -(-size // 8) * 8
    return rounded if rounded <= c else size


def conv_macs(x: Tensor, w: Tensor, groups: int) -> int:
    """An estimate of a convolution's multiply-adds (input size x output channels per group x
    kernel taps; exact for stride 1 with 'same' padding), used to pick a path."""
    return x.numel() * (w.shape[0] // groups) * math.prod(w.shape[2:])


def split_pays(macs: int, groups: int) -> bool:
    """Whether AUTO may split a convolution's left operand (FLOAT32_SPLIT) rather than run it
    in float64: from SPLIT_MIN_MACS multiply-adds or SPLIT_MIN_GROUPS groups on (measured)."""
    return macs >= SPLIT_MIN_MACS or groups >= SPLIT_MIN_GROUPS


def per_axis(v, nsp: int) -> tuple:
    """A conv parameter (an int, a string or a tuple of ints) as one value per spatial axis."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nsp


def int_product_matmul(a: Tensor, b: Tensor) -> tuple[torch.dtype, torch.dtype] | None:
    """The operand dtypes when ``a @ b`` (torch.matmul semantics) is a product torch's int8
    kernel runs (INT32 / INT32_SPLIT): int8/int16 operands, a right operand of one or two
    dimensions (the left one's leading axes fold into rows), no empty axis; else None."""
    if (
        a.dtype in OPERAND_DTYPES
        and b.dtype in OPERAND_DTYPES
        and b.dim() <= 2
        and a.numel() > 0
        and b.numel() > 0
    ):
        return (a.dtype, b.dtype)
    return None


def int_product_conv(
    x_shape: tuple[int, ...],
    x_dtype: torch.dtype,
    w: Tensor,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> tuple[torch.dtype, torch.dtype] | None:
    """The operand dtypes when a convolution of batched input codes of ``x_shape`` is a
    product torch's int8 kernel runs (INT32 / INT32_SPLIT), else None: int8/int16 operands, one
    group, zero padding given as numbers (a 1x1 kernel also takes "valid" or "same"), a
    non-empty output, and stride 1 or at least IM2COL_MIN_CHANNELS input channels (the im2col
    copy of a strided convolution over a few channels costs more than the float32 convolution
    it replaces; measured)."""
    nsp = len(x_shape) - 2
    if x_dtype not in OPERAND_DTYPES or w.dtype not in OPERAND_DTYPES:
        return None
    if groups != 1 or not w.numel() or not math.prod(x_shape):
        return None
    ksize = tuple(w.shape[2:])
    pointwise = all(k == 1 for k in ksize)
    if isinstance(padding, str):
        if not (pointwise and padding in ("valid", "same")):
            return None
        padding = 0
    if min(conv_output_size(x_shape, ksize, stride, padding, dilation)) <= 0:
        return None
    if all(s == 1 for s in per_axis(stride, nsp)) or x_shape[1] >= IM2COL_MIN_CHANNELS:
        return (x_dtype, w.dtype)
    return None


def conv_output_size(x_shape: tuple[int, ...], ksize, stride=1, padding=0, dilation=1) -> tuple:
    """The spatial output size of a convolution of batched input of ``x_shape`` with a kernel
    of spatial size ``ksize`` and numeric (or "valid") padding."""
    nsp = len(x_shape) - 2
    padding = 0 if padding == "valid" else padding
    stride, padding, dilation = (per_axis(v, nsp) for v in (stride, padding, dilation))
    return tuple(
        (size + 2 * p - d * (k - 1) - 1) // s + 1
        for size, k, s, p, d in zip(x_shape[2:], ksize, stride, padding, dilation)
    )


def depthwise_conv(
    x_shape: tuple[int, ...],
    x_dtype: torch.dtype,
    w: Tensor,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
) -> bool:
    """Whether a convolution of batched input codes of ``x_shape`` is one the INT32_DEPTHWISE
    kernel runs: int8/int16 operands, 1 or 2 spatial axes, one input channel per group
    (``groups`` = input channels, any number of output channels per group), zero padding given
    as numbers (or "valid"), a non-empty input and output, at most DEPTHWISE_MAX_TAPS kernel
    taps and stride."""
    if not (
        x_dtype in OPERAND_DTYPES
        and w.dtype in OPERAND_DTYPES
        and len(x_shape) in (3, 4)
        and groups == x_shape[1]
        and w.shape[1] == 1
        and (not isinstance(padding, str) or padding == "valid")
        and math.prod(x_shape) > 0
        and 0 < w.numel() <= DEPTHWISE_MAX_TAPS * w.shape[0]
        and max(per_axis(stride, len(x_shape) - 2)) <= DEPTHWISE_MAX_TAPS
    ):
        return False
    return min(conv_output_size(x_shape, w.shape[2:], stride, padding, dilation)) > 0


def depthwise_pays(x_shape: tuple[int, ...], w: Tensor, stride=1, padding=0, dilation=1) -> bool:
    """Whether AUTO may take INT32_DEPTHWISE for a ``depthwise_conv``: each output plane has
    at least DEPTHWISE_MIN_POSITIONS_PER_TAP positions per kernel tap. Below that the C loop's
    per-row work outweighs its sums and torch's float32 convolution is as fast or faster
    (measured at 2 threads on MobileNetV2's and EfficientNet-Lite0's depthwise layers: 5x5 on
    7x7 output planes ran 0.9x to 1.3x torch's time; 3x3 from 7x7 and 5x5 from 14x14 on, 0.4x
    to 1.0x)."""
    positions = math.prod(conv_output_size(x_shape, w.shape[2:], stride, padding, dilation))
    return positions >= DEPTHWISE_MIN_POSITIONS_PER_TAP * math.prod(w.shape[2:])


def depthwise_choice(
    x_shape: tuple[int, ...],
    x_dtype: torch.dtype,
    w: Tensor,
    stride,
    padding,
    dilation,
    groups: int,
    disabled: Collection[GemmPath],
) -> tuple[bool, Collection[GemmPath]]:
    """(``depthwise_conv``, ``disabled`` with INT32_DEPTHWISE added where the convolution is
    one but AUTO's ``depthwise_pays`` does not hold): ``plan_gemm``'s ``depthwise`` and
    ``disabled`` arguments for a convolution."""
    depthwise = depthwise_conv(x_shape, x_dtype, w, stride, padding, dilation, groups)
    if depthwise and not depthwise_pays(x_shape, w, stride, padding, dilation):
        disabled = {*disabled, GemmPath.INT32_DEPTHWISE}
    return depthwise, disabled


def plan_conv(
    x: Tensor,
    w: Tensor,
    groups: int = 1,
    path: GemmPath = GemmPath.AUTO,
    disabled: Collection[GemmPath] = (),
    stride=1,
    padding=0,
    dilation=1,
) -> GemmPlan:
    """The plan ``int_conv1d`` / ``int_conv2d`` use for these operands (units = input channels
    per group, each of prod(kernel) terms; FLOAT32_SPLIT only from SPLIT_MIN_MACS or
    SPLIT_MIN_GROUPS on; INT32 / INT32_SPLIT for an ``int_product_conv``, INT32_DEPTHWISE for a
    ``depthwise_conv``, under AUTO where ``depthwise_pays``; ``x`` batched)."""
    big = split_pays(conv_macs(x, w, groups), groups) or path is GemmPath.FLOAT32_SPLIT
    cin_g = x.shape[-w.dim() + 1] // groups
    unit = math.prod(w.shape[2:])
    depthwise, disabled = depthwise_choice(
        tuple(x.shape), x.dtype, w, stride, padding, dilation, groups, disabled
    )
    return plan_gemm(
        operand_bound(x),
        operand_bound(w),
        cin_g,
        unit,
        path,
        split_a=big,
        disabled=disabled,
        int_product=int_product_conv(tuple(x.shape), x.dtype, w, stride, padding, dilation, groups),
        depthwise=depthwise,
    )


def plan_matmul(
    a: Tensor, b: Tensor, path: GemmPath = GemmPath.AUTO, disabled: Collection[GemmPath] = ()
) -> GemmPlan:
    """The plan ``int_matmul`` / ``int_linear`` use for ``a @ b`` (K = a's last axis; INT32 /
    INT32_SPLIT for an ``int_product_matmul``)."""
    return plan_gemm(
        operand_bound(a),
        operand_bound(b),
        a.shape[-1],
        1,
        path,
        disabled=disabled,
        int_product=int_product_matmul(a, b),
    )
