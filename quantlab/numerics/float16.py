"""float16 (IEEE binary16) emulation: correctly rounded elementwise ops and GEMM / conv.

Elementwise ``add``, ``sub``, ``mul``, ``div``: evaluated in float32, then rounded once to
float16 (round to nearest, ties to even). This equals the correctly rounded float16 result:
binary32 has p' = 24 >= 2p + 2 = 24 bits for binary16's p = 11, the condition under which double
rounding is innocuous for + - * / (Figueroa 1995; Roux 2014, including underflow). Products of
two float16 values are even exact in float32 (11 + 11 significant bits).

GEMM / conv accumulation model (``matmul``, ``linear``, ``conv1d``, ``conv2d``): every product
exact, the K products (and the bias) summed exactly, one final rounding to float16 (ties to
even) -- an accumulator wide enough never to round, so the result does not depend on order.
How it is computed: ``s`` = float64 BLAS sum and ``t`` = float64 sum of |products|; the float64
error is at most gamma_K * t (gamma_K = K u / (1 - K u), u = 2**-53), so wherever both ends of
``s +- 2 K u t (+ ulp)`` round to the same float16 value, that value is the exact model's
answer. The few remaining elements (a sum within the error of a float16 rounding boundary) are
recomputed exactly with Python integers. Non-finite inputs follow float64 IEEE arithmetic.
Saturation (``saturate=True``, platform.float16_saturate): a result beyond +-65504 computed
from finite inputs becomes +-65504 instead of +-inf, decided per element (an inf input makes
only the outputs it reaches inf). An exactly zero sum is +0.0 (IEEE round to nearest).

float64 -> float16 conversion uses numpy (correctly rounded); torch converts float64 -> float16
through float32, which rounds twice.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from quantlab.numerics.rounding import Round, rshift_round_int

F16_MAX = 65504.0
_U = 2.0**-53


def _check_f16(t: Tensor, name: str) -> None:
    if not isinstance(t, Tensor) or t.dtype != torch.float16:
        got = t.dtype if isinstance(t, Tensor) else type(t)
        raise TypeError(f"{name} must be a float16 tensor, got {got}")


def round_to_float16(x: Tensor) -> Tensor:
    """Correctly round float32/float64 to float16 (nearest, ties to even; inf on overflow)."""
    if x.dtype == torch.float16:
        return x
    if x.dtype == torch.float32:
        return x.to(torch.float16)  # one rounding
    if x.dtype != torch.float64:
        raise TypeError(f"round_to_float16 expects float32 or float64, got {x.dtype}")
    with np.errstate(over="ignore"):
        return torch.from_numpy(x.detach().cpu().numpy().astype(np.float16))


def _saturate(r16: Tensor, finite: Tensor) -> Tensor:
    over = torch.isinf(r16) & finite
    if not bool(over.any()):
        return r16
    return torch.where(over, torch.sign(r16) * F16_MAX, r16.float()).to(torch.float16)


def _elementwise(a: Tensor, b: Tensor, op, saturate: bool) -> Tensor:
    _check_f16(a, "a")
    _check_f16(b, "b")
    r32 = op(a.float(), b.float())
    r16 = r32.to(torch.float16)
    if saturate:
        r16 = _saturate(r16, torch.isfinite(a) & torch.isfinite(b) & torch.isfinite(r32))
    return r16


def add(a: Tensor, b: Tensor, saturate: bool = False) -> Tensor:
    """a + b correctly rounded to float16 (float32 then one rounding; see module docstring)."""
    return _elementwise(a, b, torch.add, saturate)


def sub(a: Tensor, b: Tensor, saturate: bool = False) -> Tensor:
    """a - b correctly rounded to float16."""
    return _elementwise(a, b, torch.sub, saturate)


def mul(a: Tensor, b: Tensor, saturate: bool = False) -> Tensor:
    """a * b correctly rounded to float16 (the float32 product is exact)."""
    return _elementwise(a, b, torch.mul, saturate)


def div(a: Tensor, b: Tensor, saturate: bool = False) -> Tensor:
    """a / b correctly rounded to float16 (x / 0 is +-inf and 0 / 0 NaN, never saturated)."""
    return _elementwise(a, b, torch.div, saturate)


# --------------------------------------------------------------------------- exact dot products


def _exact_dot_f16(a_row: np.ndarray, b_col: np.ndarray) -> float:
    """sum(a_k * b_k) of float16 values, exact (integers scaled by 2**48), rounded to float16."""
    scale = 1 << 24  # every float16 value is a multiple of 2**-24
    total = 0
    for x, y in zip(a_row.tolist(), b_col.tolist()):
        total += int(x * scale) * int(y * scale)  # x * 2**24 is an exact integer in float64
    return _round_scaled_to_f16(total, 48)


def _round_scaled_to_f16(n: int, frac_bits: int) -> float:
    """Round n / 2**frac_bits to the nearest float16 (ties to even), exactly; an exact zero is
    +0.0, an underflow keeps the sign of n."""
    if n == 0:
        return 0.0
    sign = -1.0 if n < 0 else 1.0
    m = abs(n)
    e = m.bit_length() - 1 - frac_bits  # floor(log2(|value|))
    q_exp = max(e, -14) - 10  # the float16 quantum at this magnitude (subnormals: 2**-24)
    shift = frac_bits + q_exp  # value / 2**q_exp = m / 2**shift
    k = m << -shift if shift <= 0 else rshift_round_int(m, shift, Round.HALF_EVEN)
    v = math.ldexp(k, q_exp)
    return sign * (math.inf if v >= 65520.0 else v)


def _matmul_rounded(a: Tensor, b: Tensor, saturate: bool) -> Tensor:
    """Exact-sum-then-round float16 matmul of float64 tensors holding float16 values.

    An output whose products are all exactly zero is +0.0; one whose error interval holds a
    float16 rounding boundary or zero (whose sign is then unknown) is recomputed exactly.
    With ``saturate`` an output that overflowed from finite inputs (its sum of |products| is
    finite) becomes +-65504, decided per output element.
    """
    s = torch.matmul(a, b)
    t = torch.matmul(a.abs(), b.abs())
    k = a.shape[-1]
    err = 2.0 * k * _U * t
    err = err + (s.abs() + err) * 2.0**-51 + 2.0**-1074  # covers the rounding of s +- err
    finite = torch.isfinite(s) & torch.isfinite(t)
    lo = round_to_float16(torch.where(finite, s - err, s))
    hi = round_to_float16(torch.where(finite, s + err, s))
    zero = finite & (t == 0)  # every product is exactly zero: the sum is +0.0
    out = torch.where(zero, torch.zeros((), dtype=lo.dtype), lo)
    unsure = finite & ~zero & ((lo != hi) | (torch.signbit(lo) != torch.signbit(hi)))
    if bool(unsure.any()):
        ab, bb = torch.broadcast_tensors(a[..., :, :1], b[..., :1, :])  # batch shape
        a_full = a.expand(*ab.shape[:-2], a.shape[-2], k).numpy()
        b_full = b.expand(*bb.shape[:-2], k, b.shape[-1]).numpy()
        for idx in unsure.nonzero().tolist():
            *batch, i, j = idx
            row = a_full[(*batch, i)]
            col = b_full[(*batch, slice(None), j)]
            out[tuple(idx)] = _exact_dot_f16(row, col)
    if saturate:
        out = _saturate(out, torch.isfinite(t))
    return out


def matmul(a: Tensor, b: Tensor, saturate: bool = False) -> Tensor:
    """float16 a @ b (torch.matmul shapes): exact products, exact sum, one rounding."""
    _check_f16(a, "a")
    _check_f16(b, "b")
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    squeeze_a, squeeze_b = a.dim() == 1, b.dim() == 1
    if squeeze_a:
        a64 = a64.unsqueeze(0)
    if squeeze_b:
        b64 = b64.unsqueeze(-1)
    if a64.shape[-1] != b64.shape[-2]:
        raise ValueError(f"matmul shapes {tuple(a.shape)} and {tuple(b.shape)} do not match")
    out = _matmul_rounded(a64, b64, saturate)
    if squeeze_b:
        out = out.squeeze(-1)
    if squeeze_a:
        out = out.squeeze(-1 if squeeze_b else -2)
    return out


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None, saturate: bool = False) -> Tensor:
    """float16 x @ w.T + bias with the bias inside the exact sum (one rounding)."""
    _check_f16(x, "x")
    _check_f16(w, "w")
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear input {tuple(x.shape)} does not match weight {tuple(w.shape)}")
    a = x.to(torch.float64)
    b = w.to(torch.float64).t()
    if bias is not None:
        _check_f16(bias, "bias")
        a = torch.cat([a, torch.ones(*a.shape[:-1], 1, dtype=torch.float64)], dim=-1)
        b = torch.cat([b, bias.to(torch.float64).reshape(1, -1)], dim=0)
    if a.dim() == 1:
        return _matmul_rounded(a.unsqueeze(0), b, saturate).squeeze(0)
    return _matmul_rounded(a, b, saturate)


def _conv_padding(padding, kernel, stride, dilation) -> tuple[int, int, int, int]:
    """(left, right, top, bottom) zero padding of a conv2d: an int or pair (symmetric), or
    "valid" (none) / "same" (stride 1; the odd unit on the right / bottom, as PyTorch)."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0, 0, 0
        if padding != "same":
            raise ValueError(f"padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
        if any(s != 1 for s in stride):
            raise ValueError(f"padding='same' needs stride 1, got stride={stride}")
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        return total[1] // 2, total[1] - total[1] // 2, total[0] // 2, total[0] - total[0] // 2
    ph, pw = torch.nn.modules.utils._pair(padding)
    return pw, pw, ph, ph


def conv2d(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    saturate: bool = False,
) -> Tensor:
    """float16 conv2d (zero padding) with the same model: exact products and sum, one rounding.

    Computed as im2col (``F.unfold``, exact data movement) and ``_matmul_rounded`` per group.
    """
    _check_f16(x, "x")
    _check_f16(w, "w")
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
    if x.dim() != 4 or w.dim() != 4:
        raise ValueError(f"conv2d needs 4-d input and weight, got {x.dim()}-d and {w.dim()}-d")
    n, cin, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    if groups < 1 or cin % groups or cout % groups or cin_g * groups != cin:
        raise ValueError(
            f"conv2d weight {tuple(w.shape)} with groups={groups} does not fit {cin} input channels"
        )
    pair = torch.nn.modules.utils._pair
    stride, dilation = pair(stride), pair(dilation)
    left, right, top, bottom = _conv_padding(padding, (kh, kw), stride, dilation)
    x64 = F.pad(x.to(torch.float64), (left, right, top, bottom))
    h, wd = x64.shape[2:]
    ho = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cols = F.unfold(x64, (kh, kw), dilation, 0, stride)  # (N, Cin*kh*kw, L)
    kg = cin_g * kh * kw
    cols = cols.reshape(n, groups, kg, ho * wo)
    wm = w.to(torch.float64).reshape(groups, cout // groups, kg)
    if bias is not None:
        _check_f16(bias, "bias")
        wm = torch.cat([wm, bias.to(torch.float64).reshape(groups, cout // groups, 1)], dim=-1)
        cols = torch.cat([cols, torch.ones(n, groups, 1, ho * wo, dtype=torch.float64)], dim=2)
    out = _matmul_rounded(wm.unsqueeze(0), cols, saturate).reshape(n, cout, ho, wo)
    return out.squeeze(0) if unbatched else out


def conv1d(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    saturate: bool = False,
) -> Tensor:
    """float16 conv1d as conv2d over a height-1 image (same accumulation model)."""
    _check_f16(x, "x")
    unbatched = x.dim() == 2
    xb = x.unsqueeze(0) if unbatched else x
    one = lambda v: (1, _first(v))  # noqa: E731
    out = conv2d(
        xb.unsqueeze(2),
        w.unsqueeze(2),
        bias,
        one(stride),
        padding if isinstance(padding, str) else (0, _first(padding)),
        one(dilation),
        groups,
        saturate,
    ).squeeze(2)
    return out.squeeze(0) if unbatched else out


def _first(v) -> int:
    return v if isinstance(v, int) else v[0]
