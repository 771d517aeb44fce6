"""Exact integer GEMM (conv1d/conv2d, linear, batched matmul) for int8/int16 operand codes.

Every function returns the exact sum of products as int64. The fast paths run float BLAS on
integer-valued tensors and are exact by a bound, not by luck (bit-exact-emulation s.2.1): if
every operand is an integer and K * max|a| * max|b| <= 2**p (p = 24 for float32, 53 for
float64), every partial sum any kernel forms (any blocking, order or FMA) is an integer of
magnitude <= 2**p, so no rounding ever happens.

* float32 on K-chunks: K is split so that each chunk meets the 2**24 bound (int8 x int8 with
  max|a| = max|b| = 128: 1024 terms); chunk results are summed in float64, exact while the whole
  sum is <= 2**53.
* float64 directly (int16 operands): exact for K * max|a| * max|b| <= 2**53 (int16 x int16:
  K <= 2**23).
* int64 torch kernels: slow, exact below 2**63 (used when neither bound holds).
Precision flags are pinned on every call (float32 matmul precision "highest", oneDNN fp32
precision "ieee", NNPACK off: no reduced-precision or transform-based algorithm).
``quantlab.numerics.selftest`` checks the claim once per process, before the first product, with
adversarial operands; AUTO stops using a path that fails it (with a warning).

Quantized ops (``qconv2d``, ``qconv1d``, ``qlinear``, ``qmatmul``) combine the exact sum with a
bias, the platform's int32 accumulator contract and requantization. They read platform fields
only; they never look at the platform's name.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.quantize import QuantStats
from quantlab.numerics.requant import make_requant, requant_scale, requantize
from quantlab.numerics.rounding import Round, round_float
from quantlab.numerics.shapes import along_axis

if TYPE_CHECKING:
    from quantlab.platforms import PlatformConfig

FLOAT32_EXACT = 1 << 24
FLOAT64_EXACT = 1 << 53
MIN_CHUNK_K = 64  # below this many terms per float32 chunk, float64 is the faster exact path
SINGLE_THREAD_MACS = 1 << 22  # smaller products run on one thread (thread hand-off dominates)
SPLIT_MIN_MACS = 1 << 25  # FLOAT32_SPLIT pays its extra element-wise passes only above this
OPERAND_DTYPES = (torch.int8, torch.int16)


class Overflow(enum.Enum):
    """What an int32 accumulator does past its range: SATURATE clamps, WRAP is two's complement."""

    SATURATE = "saturate"
    WRAP = "wrap"


class GemmPath(enum.Enum):
    """How the exact sum is computed. AUTO picks the fastest path whose bound holds.

    FLOAT32:       float32 BLAS on K-chunks within 2**24, chunks summed in float64.
    FLOAT32_SPLIT: convolutions only: the left operand a (|a| <= 32768) is split exactly into
                   a = 256 * hi + lo with hi = round_half_even(a / 256), |hi|, |lo| <= 128;
                   both halves run as one float32 chunked conv (stacked on the batch axis,
                   bound 128 * max|b| per product) and are combined in float64.
    FLOAT64:       float64 BLAS, exact within 2**53.
    INT64:         torch int64 kernels (slow; exact below 2**63).
    """

    AUTO = "auto"
    FLOAT32 = "float32"
    FLOAT32_SPLIT = "float32_split"
    FLOAT64 = "float64"
    INT64 = "int64"


def pin_exact_flags() -> None:
    """Pin the flags the exactness proof relies on (cheap; called by every fast path)."""
    if torch.get_float32_matmul_precision() != "highest":
        torch.set_float32_matmul_precision("highest")
    mk = torch.backends.mkldnn
    if getattr(mk.matmul, "fp32_precision", "ieee") != "ieee":
        mk.matmul.fp32_precision = "ieee"
    if getattr(mk.conv, "fp32_precision", "ieee") != "ieee":
        mk.conv.fp32_precision = "ieee"
    if torch._C._get_nnpack_enabled():
        torch.backends.nnpack.set_flags(False)


_SELFTEST_STARTED = False
DISABLED_PATHS: set[GemmPath] = set()  # float paths that failed the start-up self-test


def _ensure_selftest() -> None:
    """Run ``selftest.run_selftest`` once per process; AUTO then avoids any failing path."""
    global _SELFTEST_STARTED
    if _SELFTEST_STARTED:
        return
    _SELFTEST_STARTED = True
    from quantlab.numerics.selftest import run_selftest

    for case in run_selftest():
        if not case.ok:
            DISABLED_PATHS.add(case.path)
            warnings.warn(
                f"exact GEMM self-test: {case.name} on path {case.path.name} differs from int64 "
                f"in {case.mismatches}/{case.outputs} outputs; AUTO will not use this path",
                RuntimeWarning,
                stacklevel=3,
            )


@contextmanager
def _threads_for(macs: int) -> Iterator[None]:
    """One intra-op thread for small products: on a busy machine, waking a second thread costs
    tens of milliseconds, far more than the product (speed only; results are identical)."""
    n = torch.get_num_threads()
    if macs >= SINGLE_THREAD_MACS or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _check_operand(t: Tensor, name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int8/int16 codes, got {type(t)}")
    if t.dtype not in OPERAND_DTYPES:
        raise TypeError(f"{name} must hold int8 or int16 codes, got {t.dtype}")


def operand_bound(t: Tensor) -> int:
    """max|t| for int16 codes (their data range decides the path); the int8 dtype bound 128
    for int8 codes (no pass over the data: 1024 terms per float32 chunk instead of 1032)."""
    if t.dtype == torch.int8:
        return 128
    if t.numel() == 0:
        return 0
    lo, hi = torch.aminmax(t)
    return max(-int(lo), int(hi))


@dataclass(frozen=True)
class GemmPlan:
    """The path chosen for one GEMM and the number of K-terms (or channels) per float32 chunk."""

    path: GemmPath
    chunk: int  # FLOAT32: units per chunk (a conv unit is one input channel); else 0
    bound: int  # max|a| * max|b|


def plan_gemm(
    a_max: int,
    b_max: int,
    k: int,
    unit: int = 1,
    path: GemmPath = GemmPath.AUTO,
    split_a: bool = False,
) -> GemmPlan:
    """Choose a provably exact path for a K-term sum of products (K = ``k`` units of ``unit``).

    FLOAT32 chunks hold c units with c * unit * a_max * b_max <= 2**24; AUTO takes it when a
    chunk holds at least MIN_CHUNK_K terms (or all of K). Else, when ``split_a`` (convolutions)
    and a_max <= 32768, FLOAT32_SPLIT under the same rule with a_max = 128. Else FLOAT64 when
    K * unit * a_max * b_max <= 2**53, else INT64. A forced path whose bound fails raises.
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
    if path is GemmPath.AUTO:
        f32_ok = f32_ok and GemmPath.FLOAT32 not in DISABLED_PATHS
        if f32_ok and (c == k or c * unit >= MIN_CHUNK_K):
            return GemmPlan(GemmPath.FLOAT32, _balanced_chunk(k, max(c, 1)), bound)
        split_ok = split_ok and GemmPath.FLOAT32_SPLIT not in DISABLED_PATHS
        if split_ok and (c_split == k or c_split * unit >= MIN_CHUNK_K):
            return GemmPlan(GemmPath.FLOAT32_SPLIT, _balanced_chunk(k, c_split), bound)
        if total <= FLOAT64_EXACT and GemmPath.FLOAT64 not in DISABLED_PATHS:
            return GemmPlan(GemmPath.FLOAT64, 0, bound)
        return GemmPlan(GemmPath.INT64, 0, bound)
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


def _sum_chunks_f64(parts) -> Tensor:
    """Sum exact float32 chunk results in float64 (exact: the caller's plan keeps the whole sum
    below 2**53), one in-place add per chunk."""
    acc = None
    for part in parts:
        if acc is None:
            acc = part.to(torch.float64)
        else:
            acc.add_(part)
    return acc


# --------------------------------------------------------------------------- matmul / linear


def int_matmul(a: Tensor, b: Tensor, path: GemmPath = GemmPath.AUTO) -> Tensor:
    """Exact a @ b (torch.matmul semantics: 1-d, 2-d and broadcast batches) as int64.

    Operands: int8/int16 code tensors. Exactness: see the module docstring (no saturation, no
    wrap; apply ``accumulate`` for the device's int32 contract).
    """
    _check_operand(a, "a")
    _check_operand(b, "b")
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError("int_matmul needs tensors with at least one dimension")
    k = a.shape[-1]
    kb = b.shape[0] if b.dim() == 1 else b.shape[-2]
    if k != kb:
        raise ValueError(
            f"int_matmul shapes {tuple(a.shape)} and {tuple(b.shape)} do not match: "
            f"a has K={k} columns, b has {kb} rows"
        )
    _ensure_selftest()
    plan = plan_gemm(operand_bound(a), operand_bound(b), k, 1, path)
    pin_exact_flags()
    with _threads_for(a.numel() * max(1, b.numel() // max(k, 1))):
        return _matmul_planned(a, b, k, plan)


def _matmul_planned(a: Tensor, b: Tensor, k: int, plan: GemmPlan) -> Tensor:
    if plan.path is GemmPath.INT64:
        return torch.matmul(a.to(torch.int64), b.to(torch.int64))
    if plan.path is GemmPath.FLOAT64:
        return torch.matmul(a.to(torch.float64), b.to(torch.float64)).to(torch.int64)
    af, bf = a.to(torch.float32), b.to(torch.float32)
    if plan.chunk >= k:
        return torch.matmul(af, bf).to(torch.int64)

    def parts():
        for k0 in range(0, k, plan.chunk):
            k1 = k0 + plan.chunk
            bs = bf[k0:k1] if bf.dim() == 1 else bf[..., k0:k1, :]
            yield torch.matmul(af[..., k0:k1], bs)

    return _sum_chunks_f64(parts()).to(torch.int64)


def int_linear(x: Tensor, w: Tensor, path: GemmPath = GemmPath.AUTO) -> Tensor:
    """Exact x @ w.T as int64 (F.linear without bias): x (..., in), w (out, in) codes."""
    _check_operand(w, "w")
    if w.dim() != 2:
        raise ValueError(f"int_linear weight must be 2-d (out, in), got shape {tuple(w.shape)}")
    _check_operand(x, "x")
    if x.dim() == 0 or x.shape[-1] != w.shape[1]:
        raise ValueError(
            f"int_linear input {tuple(x.shape)} does not match weight {tuple(w.shape)}: "
            f"last dim must be {w.shape[1]}"
        )
    return int_matmul(x, w.t(), path)


# --------------------------------------------------------------------------- convolution


def _conv_exact(
    x: Tensor,
    w: Tensor,
    nsp: int,
    conv: Callable[..., Tensor],
    stride,
    padding,
    dilation,
    groups: int,
    path: GemmPath,
) -> Tensor:
    _check_operand(x, "x")
    _check_operand(w, "w")
    if w.dim() != nsp + 2:
        raise ValueError(f"conv{nsp}d weight must be {nsp + 2}-d, got shape {tuple(w.shape)}")
    unbatched = x.dim() == nsp + 1
    if unbatched:
        x = x.unsqueeze(0)
    if x.dim() != nsp + 2:
        raise ValueError(f"conv{nsp}d input must be {nsp + 1}-d or {nsp + 2}-d, got {x.dim()}-d")
    if groups < 1 or x.shape[1] % groups or w.shape[0] % groups:
        raise ValueError(
            f"groups={groups} must divide input channels {x.shape[1]} and output channels "
            f"{w.shape[0]}"
        )
    cin_g = x.shape[1] // groups
    if w.shape[1] != cin_g:
        raise ValueError(
            f"conv{nsp}d weight {tuple(w.shape)} expects {w.shape[1] * groups} input channels "
            f"with groups={groups}, input has {x.shape[1]}"
        )
    _ensure_selftest()
    plan = plan_conv(x, w, groups, path)
    pin_exact_flags()
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    with _threads_for(conv_macs(x, w, groups)):
        out = _conv_planned(x, w, conv, kw, groups, cin_g, plan)
    return out.squeeze(0) if unbatched else out


def _conv_planned(x, w, conv, kw, groups: int, cin_g: int, plan: GemmPlan) -> Tensor:
    if plan.path is GemmPath.INT64:
        out = conv(x.to(torch.int64), w.to(torch.int64), **kw)
    elif plan.path is GemmPath.FLOAT64:
        out = conv(x.to(torch.float64), w.to(torch.float64), **kw).to(torch.int64)
    elif plan.path is GemmPath.FLOAT32_SPLIT:
        xf = x.to(torch.float32)
        hi = torch.round(xf * (1.0 / 256))  # exact scaling; |hi| <= 128
        lo = xf - hi * 256  # exact; |lo| <= 128
        both = _conv_chunks_f32(torch.cat([hi, lo]), w, conv, kw, groups, cin_g, plan.chunk)
        n = x.shape[0]
        out = (both[:n] * 256 + both[n:]).to(torch.int64)  # float64, exact below 2**53
    elif plan.chunk >= cin_g:
        out = conv(x.to(torch.float32), w.to(torch.float32), **kw).to(torch.int64)
    else:
        out = _conv_chunks_f32(x.to(torch.float32), w, conv, kw, groups, cin_g, plan.chunk)
        out = out.to(torch.int64)
    return out


def _conv_chunks_f32(xf: Tensor, w: Tensor, conv, kw, groups: int, cin_g: int, chunk: int):
    """Sum over input-channel chunks of float32 convs (each exact), in float64."""
    n = xf.shape[0]
    sp = xf.shape[2:]
    xg = xf.reshape(n, groups, cin_g, *sp)
    wf = w.to(torch.float32)

    def parts():
        for c0 in range(0, cin_g, chunk):
            c1 = min(c0 + chunk, cin_g)
            xs = xg[:, :, c0:c1].reshape(n, groups * (c1 - c0), *sp)
            yield conv(xs, wf[:, c0:c1], **kw)

    return _sum_chunks_f64(parts())


def conv_macs(x: Tensor, w: Tensor, groups: int) -> int:
    """An estimate of a convolution's multiply-adds (input size x output channels per group x
    kernel taps; exact for stride 1 with 'same' padding), used to pick threads and paths."""
    return x.numel() * (w.shape[0] // groups) * math.prod(w.shape[2:])


def plan_conv(x: Tensor, w: Tensor, groups: int = 1, path: GemmPath = GemmPath.AUTO) -> GemmPlan:
    """The plan ``int_conv1d`` / ``int_conv2d`` use for these operands (units = input channels
    per group, each of prod(kernel) terms; FLOAT32_SPLIT only from SPLIT_MIN_MACS on)."""
    big = conv_macs(x, w, groups) >= SPLIT_MIN_MACS or path is GemmPath.FLOAT32_SPLIT
    cin_g = x.shape[-w.dim() + 1] // groups
    unit = math.prod(w.shape[2:])
    return plan_gemm(operand_bound(x), operand_bound(w), cin_g, unit, path, split_a=big)


def int_conv2d(
    x: Tensor,
    w: Tensor,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
    path: GemmPath = GemmPath.AUTO,
) -> Tensor:
    """Exact F.conv2d (zero padding, no bias) of int8/int16 codes as int64.

    x: (N, C, H, W) or (C, H, W); w: (O, C/groups, kh, kw). Chunks split input channels.
    """
    return _conv_exact(x, w, 2, F.conv2d, stride, padding, dilation, groups, path)


def int_conv1d(
    x: Tensor,
    w: Tensor,
    stride: int | tuple[int] = 1,
    padding: int | tuple[int] | str = 0,
    dilation: int | tuple[int] = 1,
    groups: int = 1,
    path: GemmPath = GemmPath.AUTO,
) -> Tensor:
    """Exact F.conv1d (zero padding, no bias) of int8/int16 codes as int64.

    x: (N, C, L) or (C, L); w: (O, C/groups, k).
    """
    return _conv_exact(x, w, 1, F.conv1d, stride, padding, dilation, groups, path)


# --------------------------------------------------------------------------- accumulator


def accumulate(
    acc: Tensor, dtype: DType = DType.INT32, overflow: Overflow = Overflow.SATURATE
) -> tuple[Tensor, int]:
    """Apply the accumulator contract to exact sums: (values in ``dtype``'s range, count).

    SATURATE clamps to [dtype.qmin, dtype.qmax]; WRAP is two's complement modulo 2**bits.
    Returns int64 values (so later integer math cannot wrap by accident) and the number of
    elements that were outside the range.
    """
    if acc.is_floating_point():
        raise TypeError(f"accumulate expects exact integer sums, got {acc.dtype}")
    if not dtype.is_int:
        raise ValueError(f"accumulator dtype must be an integer format, got {dtype.name}")
    a = acc.to(torch.int64)
    lo, hi = dtype.qmin, dtype.qmax
    outside = (a < lo) | (a > hi)
    count = int(outside.sum())
    if count == 0:
        return a, 0
    if overflow is Overflow.SATURATE:
        return a.clamp(lo, hi), count
    if overflow is Overflow.WRAP:
        return ((a - lo) % (1 << dtype.bits)) + lo, count
    raise ValueError(f"unknown overflow mode {overflow!r}; allowed: SATURATE, WRAP")


# --------------------------------------------------------------------------- quantized ops


@dataclass
class GemmStats:
    """What a quantized GEMM had to force: accumulator overflow, bias and output saturation."""

    outputs: int = 0
    acc_overflow: int = 0  # accumulator values outside int32 (saturated or wrapped)
    bias_saturated: int = 0  # integer bias values clamped to int32
    saturated: int = 0  # output codes clamped to the output dtype

    def add(self, other: GemmStats) -> None:
        self.outputs += other.outputs
        self.acc_overflow += other.acc_overflow
        self.bias_saturated += other.bias_saturated
        self.saturated += other.saturated


def acc_scale(x_scale: Tensor | float, w_scale: Tensor | float) -> Tensor:
    """Scale of the integer accumulator: float32 product fl32(x_scale * w_scale) (ONNX)."""
    return torch.as_tensor(x_scale, dtype=torch.float32) * torch.as_tensor(
        w_scale, dtype=torch.float32
    )


def quantize_bias(
    bias: Tensor, x_scale: Tensor | float, w_scale: Tensor | float, stats: GemmStats | None = None
) -> Tensor:
    """int32 bias codes = round_half_even(fl32(bias / fl32(x_scale * w_scale))) as int64.

    The ONNX Runtime quantizer's rule (numpy float32 division, ``round`` half to even); values
    beyond int32 saturate (counted in ``stats.bias_saturated``). j6-numerics s.6: the J6 bias
    reaches the compiler as float32; this integer handling is assumed for every platform.
    """
    if not bias.is_floating_point():
        raise TypeError(f"bias must be a float tensor (real values), got {bias.dtype}")
    if not bool(torch.isfinite(bias).all()):
        raise ValueError("bias must be finite (no NaN or inf)")
    q = round_float(bias.to(torch.float32) / acc_scale(x_scale, w_scale), Round.HALF_EVEN)
    lo, hi = DType.INT32.qmin, DType.INT32.qmax
    if stats is not None:
        stats.bias_saturated += int(((q < lo) | (q > hi)).sum())
    # clamp in float64 (int32 bounds are exact there), then convert: float32 cannot hold 2**31-1
    return q.to(torch.float64).clamp(lo, hi).to(torch.int64)


def check_gemm_operands(x: Tensor, w: Tensor, platform: PlatformConfig) -> None:
    """Reject an int16 x int16 GEMM on a platform that allows fewer int16 operands (s.6)."""
    n16 = int(x.dtype == torch.int16) + int(w.dtype == torch.int16)
    if n16 > platform.max_int16_gemm_operands:
        raise ValueError(
            f"a GEMM with {n16} int16 operands is not available on {platform.name} "
            f"(platform.max_int16_gemm_operands={platform.max_int16_gemm_operands}); "
            "use int8 for one operand"
        )


def _shape_bias(b: Tensor, acc: Tensor, axis: int) -> Tensor:
    return along_axis(b, acc, axis, "bias")


def finish_gemm(
    acc: Tensor,
    x_scale: Tensor | float,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    platform: PlatformConfig,
    channel_axis: int,
) -> tuple[Tensor, GemmStats]:
    """Exact sums -> outputs: + int32 bias, accumulator contract, then requant or wide output.

    Order: bias (``quantize_bias``) is added to the exact sum, then the platform's accumulator
    contract (``platform.accumulator``, ``accumulator_overflow``) applies once.
    out_dtype INT8/INT16: ``requantize`` with ``platform.requant``, ``requant_round``,
      ``requant_mult_bits`` and M = requant_scale(x_scale, w_scale, out_scale).
    out_dtype INT32 (high-precision output): the int32 accumulator (torch.int32), whose scale
      is ``acc_scale(x_scale, w_scale)``.
    out_dtype FLOAT32 (high-precision float output): fl32(fl32(acc) * acc_scale).
    Per-channel ``w_scale`` (1-d) applies along ``channel_axis`` of the output.
    """
    stats = GemmStats(outputs=acc.numel())
    if bias is not None:
        acc = acc + _shape_bias(quantize_bias(bias, x_scale, w_scale, stats), acc, channel_axis)
    acc32, over = accumulate(acc, platform.accumulator, platform.accumulator_overflow)
    stats.acc_overflow = over
    ws = torch.as_tensor(w_scale, dtype=torch.float32)
    if out_dtype is DType.INT32:
        return acc32.to(torch.int32), stats
    if out_dtype is DType.FLOAT32:
        s = acc_scale(x_scale, ws)
        if s.dim() == 1:
            s = _shape_bias(s, acc32, channel_axis)
        return acc32.to(torch.float32) * s, stats
    if out_dtype not in (DType.INT8, DType.INT16):
        raise ValueError(
            f"out_dtype must be INT8, INT16, INT32 or FLOAT32 for a quantized GEMM, "
            f"got {out_dtype.name}"
        )
    if out_scale is None:
        raise ValueError(f"out_scale is needed for a requantized {out_dtype.name} output")
    real = requant_scale(x_scale, ws, out_scale, platform.requant)
    params = make_requant(real, platform.requant, platform.requant_mult_bits)
    q = QuantStats()
    codes = requantize(acc32, params, out_dtype, platform.requant_round, axis=channel_axis, stats=q)
    stats.saturated = q.saturated
    return codes, stats


def qconv2d(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    platform: PlatformConfig,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] | str = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
) -> tuple[Tensor, GemmStats]:
    """Quantized conv2d: exact ``int_conv2d`` then ``finish_gemm`` (output channels on dim 1).

    w_scale: scalar or per output channel (O,); bias: float (O,) or None.
    """
    check_gemm_operands(x_codes, w_codes, platform)
    acc = int_conv2d(x_codes, w_codes, stride, padding, dilation, groups)
    axis = 1 if acc.dim() == 4 else 0
    return finish_gemm(acc, x_scale, w_scale, bias, out_scale, out_dtype, platform, axis)


def qconv1d(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    platform: PlatformConfig,
    stride: int | tuple[int] = 1,
    padding: int | tuple[int] | str = 0,
    dilation: int | tuple[int] = 1,
    groups: int = 1,
) -> tuple[Tensor, GemmStats]:
    """Quantized conv1d: exact ``int_conv1d`` then ``finish_gemm`` (output channels on dim 1)."""
    check_gemm_operands(x_codes, w_codes, platform)
    acc = int_conv1d(x_codes, w_codes, stride, padding, dilation, groups)
    axis = 1 if acc.dim() == 3 else 0
    return finish_gemm(acc, x_scale, w_scale, bias, out_scale, out_dtype, platform, axis)


def qlinear(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    platform: PlatformConfig,
) -> tuple[Tensor, GemmStats]:
    """Quantized linear: exact x @ w.T, w (out, in) with per-out-channel scales on the last dim."""
    check_gemm_operands(x_codes, w_codes, platform)
    acc = int_linear(x_codes, w_codes)
    return finish_gemm(acc, x_scale, w_scale, bias, out_scale, out_dtype, platform, -1)


def qmatmul(
    x_codes: Tensor,
    x_scale: Tensor | float,
    w_codes: Tensor,
    w_scale: Tensor | float,
    bias: Tensor | None,
    out_scale: Tensor | float | None,
    out_dtype: DType,
    platform: PlatformConfig,
) -> tuple[Tensor, GemmStats]:
    """Quantized matmul x @ w (torch.matmul shapes); a 1-d w_scale is per column of w (last dim).

    For int16 operands on J6 apply ``clamp_int16_operand`` and ``coarsen_int16_matmul_scale``
    first (the simulator does this when quantizing the operands).
    """
    check_gemm_operands(x_codes, w_codes, platform)
    acc = int_matmul(x_codes, w_codes)
    return finish_gemm(acc, x_scale, w_scale, bias, out_scale, out_dtype, platform, -1)


# --------------------------------------------------------------------------- J6 int16 operands


def int16_operand_range(platform: PlatformConfig) -> tuple[int, int]:
    """Usable int16 GEMM operand codes: [-32768, platform.int16_operand_max] (s.6, inferred)."""
    return DType.INT16.qmin, platform.int16_operand_max


def clamp_int16_operand(
    codes: Tensor, platform: PlatformConfig, stats: QuantStats | None = None
) -> Tensor:
    """Saturate int16 operand codes to ``int16_operand_range`` (J6: int16 = two int8 halves).

    Returns int16 codes; values above ``platform.int16_operand_max`` are counted as saturated.
    """
    if codes.dtype != torch.int16:
        raise TypeError(f"clamp_int16_operand expects int16 codes, got {codes.dtype}")
    lo, hi = int16_operand_range(platform)
    if stats is not None:
        stats.total += codes.numel()
        stats.saturated += int((codes > hi).sum())
    return codes.clamp(lo, hi)


def int16_matmul_scale_factor(k: int, platform: PlatformConfig) -> float:
    """max(32767 / int16_operand_max, sqrt(K / 2)) when ``platform.int16_matmul_coarsen``, else 1.

    j6-numerics s.6: the plugin's integer matmul coarsens each int16 operand's scale by this
    factor so that a K-term int16 x int16 sum cannot overflow int32. float64 arithmetic.
    """
    if k < 1:
        raise ValueError(f"K must be >= 1, got {k}")
    if not platform.int16_matmul_coarsen:
        return 1.0
    return max(32767.0 / platform.int16_operand_max, math.sqrt(k / 2.0))


def coarsen_int16_matmul_scale(scale: Tensor | float, k: int, platform: PlatformConfig) -> Tensor:
    """scale * int16_matmul_scale_factor(K), one float32 product (the operand's new scale)."""
    f = int16_matmul_scale_factor(k, platform)
    return torch.as_tensor(scale, dtype=torch.float32) * torch.tensor(f, dtype=torch.float32)
