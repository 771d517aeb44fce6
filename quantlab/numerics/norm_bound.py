"""A proven bound on how far the normalisation composite can land from float LayerNorm.

``norm_error_bound`` returns, per output element, B with |y_chain - y_float| <= B, where
y_float is float64 LayerNorm / GroupNorm / InstanceNorm of the dequantized input (the float
model's op on the same input) and y_chain the dequantized output of ``norm_integer.norm_fixed``
(``NormChain.FIXED``) or of ``norm_calibrate.norm_fake`` (``NormChain.FAKE``). It propagates,
step by step (norm.py's numbering), the true value t and an error e with |t_hat - t| <= e:

* a requantization to scale s adds rho s + |t| kappa: rho = 1/2 for the HALF_* roundings (1 for
  FLOOR/TRUNC), kappa the relative error of the encoded multiplier (FIXED) or 8 float32 units
  (FAKE: the float32 product, the division in quantize and the dequantizing product);
* the add rule's integer multipliers mx = round(sx / inter) add |code| |mx inter - sx|;
* a float32 sum of N terms (FAKE) adds (N u / (1 - N u)) sum|terms|, u = 2**-24;
* products: |a_hat b_hat - a b| <= e_a (|b| + e_b) + |a| e_b; squares likewise;
* rsqrt: the table's own error at each variance code the chain can reach (FIXED: the built
  LUT against 1/sqrt; FAKE: rounding of the exact value), plus 0.5 u_lo**-1.5 times the
  variance error (mean value theorem on [u_lo, inf), u_lo = smallest reachable v + eps),
  capped by max(r, qmax s_rsqrt) (the table's output and r are both in [0, that]).
A saturating step is off by at most max(e, |t| - qmax s): saturation only moves a value
toward the true one or by its overshoot.
Only the MUL_SHIFT requantization is covered (the J6 profiles' assumed scheme).
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor

from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import (
    J6_NORM,
    EpsMode,
    NormContract,
    NormLayout,
    NormScales,
    eps_codes,
    f32,
    real_multiplier,
    rsqrt_lut,
)
from quantlab.numerics.requant import Requant, make_requant
from quantlab.numerics.rounding import Round
from quantlab.numerics.scaled_add import inter_scale

U32 = 2.0**-24  # float32 unit roundoff
KAPPA_FAKE = 8 * U32  # relative error of one fake-quantized float32 step (module docstring)
KAPPA_FORMED = 2.0**-48  # forming a float64 multiplier from float32 scales (a few ulps)


class NormChain(enum.Enum):
    """Which chain a bound is for: FIXED (norm_fixed, integer) or FAKE (norm_fake, float32)."""

    FIXED = "fixed"
    FAKE = "fake"


def _rho(mode: Round) -> float:
    return 0.5 if mode in (Round.HALF_EVEN, Round.HALF_UP, Round.HALF_AWAY) else 1.0


class _Chain:
    """Per-step error terms of one chain."""

    def __init__(self, chain: NormChain, c: NormContract, rounding: Round) -> None:
        if chain is NormChain.FIXED and c.requant is not Requant.MUL_SHIFT:
            raise ValueError(
                f"norm_error_bound covers the MUL_SHIFT requantization, got {c.requant.name}"
            )
        self.chain, self.c = chain, c
        fixed = chain is NormChain.FIXED
        self.rho = _rho(c.requant_round if fixed else rounding)
        self.rho_affine = _rho(c.affine_round if fixed else rounding)

    def kappa(self, real: float) -> float:
        """Relative error of the multiplier ``real`` as the chain applies it."""
        if self.chain is NormChain.FAKE:
            return KAPPA_FAKE
        p = make_requant(
            torch.tensor(real, dtype=torch.float64), Requant.MUL_SHIFT, self.c.requant_mult_bits
        )
        enc = int(p.multiplier) * 2.0 ** (int(p.shift) - p.mult_bits)
        return abs(enc - real) / real + KAPPA_FORMED

    def requant(self, t_abs: Tensor, e_in: Tensor, s: float, dt: DType, real: float) -> Tensor:
        """Error after requantizing a value within e_in of a true value of magnitude t_abs;
        a saturated result is off by at most its overshoot |t| - qmax s."""
        e = e_in + self.rho * s + (t_abs + e_in) * self.kappa(real)
        return torch.maximum(e, t_abs - dt.qmax * s)

    def add_terms(self, sx: float, sy: float, code_x: Tensor, code_y: Tensor) -> Tensor:
        """Fixed: |code_x| |mx inter - sx| + |code_y| |my inter - sy| of the add rule."""
        if self.chain is NormChain.FAKE:
            return (code_x * sx + code_y * sy) * (2 * U32)  # the input's and the sum's rounding
        s = inter_scale(sx, sy, self.c.add_inter_shift)
        inter = float(s.inter)
        return code_x * abs(s.mx * inter - f32(sx)) + code_y * abs(s.my * inter - f32(sy))

    def add_real(self, sx: float, sy: float, so: float) -> float:
        """The add rule's requantization multiplier inter / s_out."""
        return float(inter_scale(sx, sy, self.c.add_inter_shift).inter) / f32(so)

    def sum_terms(self, abs_terms: Tensor) -> Tensor:
        """FAKE: float32 summation error of a row mean (per row); FIXED: 0 (exact)."""
        if self.chain is NormChain.FIXED:
            return torch.zeros(abs_terms.shape[0], 1, dtype=torch.float64)
        n = abs_terms.shape[1]
        return abs_terms.mean(1, keepdim=True) * (n * U32 / (1 - n * U32))


def _table_error(chain: NormChain, s: NormScales, eps: float, c: NormContract, rho: float):
    """(err per variance code 0..qmax, eps offset in float, table eps): |r_hat - f(code s_var)|."""
    dt = c.inter_dtype
    codes = torch.arange(0, dt.qmax + 1, dtype=torch.int64)
    table_eps = eps if (chain is NormChain.FAKE or c.eps_mode is EpsMode.IN_TABLE) else 0.0
    f = torch.rsqrt(codes.to(torch.float64) * s.var + table_eps) if table_eps > 0 else None
    if f is None:
        f = torch.rsqrt((codes.to(torch.float64) * s.var).clamp_min(1e-300))
    if chain is NormChain.FAKE:
        over = (f - dt.qmax * s.rsqrt).clamp_min(0)
        return over + rho * s.rsqrt + f * KAPPA_FAKE, table_eps
    r = rsqrt_lut(s, eps, c).evaluate(codes.to(dt.torch_dtype)).to(torch.float64) * s.rsqrt
    return (r - f).abs(), table_eps


def norm_error_bound(
    codes: Tensor,
    in_scale: float,
    layout: NormLayout,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    scales: NormScales,
    out_scale: float,
    out_dtype: DType,
    contract: NormContract = J6_NORM,
    chain: NormChain = NormChain.FIXED,
    rounding: Round = Round.HALF_EVEN,
) -> Tensor:
    """Per-element bound B (float64, the input's shape; inf where the rsqrt input can reach 0) on
    |chain output - float64 norm of codes * in_scale| (module docstring). Arguments as
    ``norm_fixed``; ``rounding`` is the FAKE chain's fake-quant rounding."""
    c, s = contract, scales
    out_dtype = DType.parse(out_dtype)
    k = _Chain(chain, c, rounding)
    dt, s_in, s_out = c.inter_dtype, f32(in_scale), f32(out_scale)
    x = codes.to(torch.float64)
    q = layout.rows(x.abs())
    xr = layout.rows(x) * s_in
    n = xr.shape[1]
    m = xr.mean(1, keepdim=True)
    d = xr - m
    v = (d * d).mean(1, keepdim=True)
    r = torch.rsqrt(v + eps)
    # 1 mean, 2 diff
    r_mean = float(real_multiplier((s_in,), s.mean, n, Requant.MUL_SHIFT))
    e_m = k.requant(m.abs(), k.sum_terms(xr.abs()), s.mean, dt, r_mean)
    t2 = k.add_terms(s_in, s.mean, q, (m.abs() + e_m) / s.mean)
    e_d = k.requant(d.abs(), e_m + t2, s.diff, dt, k.add_real(s_in, s.mean, s.diff))
    # 3 square, 4 var
    r_sq = float(real_multiplier((s.diff, s.diff), s.square, 1, Requant.MUL_SHIFT))
    e_sq = k.requant(d * d, e_d * (2 * d.abs() + e_d), s.square, dt, r_sq)
    e_v = e_sq.mean(1, keepdim=True) + k.sum_terms(d * d + e_sq)
    r_var = float(real_multiplier((s.square,), s.var, n, Requant.MUL_SHIFT))
    e_v = k.requant(v, e_v, s.var, dt, r_var)
    # 5 rsqrt: the worst table error over reachable codes, plus the variance error's effect
    err, table_eps = _table_error(chain, s, eps, c, k.rho)
    e_u, lo_u, shift = e_v, torch.full_like(v, table_eps), 0
    if chain is NormChain.FIXED and c.eps_mode is EpsMode.ADD_CODES:
        shift = eps_codes(eps, s.var)
        e_u = e_v + abs(shift * s.var - eps)
        lo_u = torch.full_like(v, shift * s.var)
        e_u = torch.maximum(e_u, v + eps - dt.qmax * s.var)  # v + eps codes saturate
    lo_code = torch.ceil((v - e_v) / s.var).clamp(0, dt.qmax).to(torch.int64) + shift
    hi_code = torch.floor((v + e_v) / s.var).clamp(0, dt.qmax).to(torch.int64) + shift
    top = err.numel() - 1
    t_max = torch.stack(
        [err[min(int(a), top) : min(int(b), top) + 1].max() for a, b in zip(lo_code, hi_code)]
    ).reshape(-1, 1)
    u_lo = torch.maximum(v + eps - e_u, lo_u)
    lip = 0.5 * u_lo.clamp_min(1e-300) ** -1.5
    e_r = torch.where(u_lo > 0, t_max + lip * e_u, torch.inf)
    e_r = torch.minimum(e_r, torch.maximum(r, torch.full_like(r, dt.qmax * s.rsqrt)))  # both >= 0
    # 6 normed (the output when neither gamma nor beta follows)
    last = weight is None and bias is None
    s_n, n_dt = (s_out, out_dtype) if last else (s.normed, dt)
    nrm = d * r
    e_n_in = e_d * (r + e_r) + d.abs() * e_r
    r_n = float(real_multiplier((s.diff, s.rsqrt), s_n, 1, Requant.MUL_SHIFT))
    e_n = k.requant(nrm.abs(), e_n_in, s_n, n_dt, r_n)
    e, t = e_n.reshape(x.shape), nrm.reshape(x.shape).abs()
    if weight is not None:
        g = layout.affine(weight.detach().to(torch.float64).abs(), x, "weight")
        e_g = torch.maximum(k.rho_affine * s.gamma + 2 * g * U32, g - c.affine_dtype.qmax * s.gamma)
        s_w, w_dt = (s_out, out_dtype) if bias is None else (s.scaled, dt)
        r_w = float(real_multiplier((s_n, s.gamma), s_w, 1, Requant.MUL_SHIFT))
        e = k.requant(t * g, e * (g + e_g) + t * e_g, s_w, w_dt, r_w)
        t, s_n = t * g, s_w
    if bias is not None:
        b = layout.affine(bias.detach().to(torch.float64).abs(), x, "bias")
        e_b = torch.maximum(k.rho_affine * s.beta + 2 * b * U32, b - c.affine_dtype.qmax * s.beta)
        t8 = k.add_terms(s_n, s.beta, (t + e) / s_n, (b + e_b) / s.beta)
        real = k.add_real(s_n, s.beta, s_out)
        e = k.requant(t + b, e + e_b + t8, s_out, out_dtype, real)
    return e.expand(x.shape).clone()
