"""``norm_fake`` for rows over the trailing dims (LayerNorm) with its elementwise steps in C.

The composite's two row reductions stay torch's ``mean`` (so their bits are torch's); every
elementwise step between them runs in one C loop per row (``quantlab.numerics.native``: C99,
no fast-math, no contraction), the same float32 operations in the same order as
``norm_calibrate._norm_fake_steps`` with NaN made code 0 at each step:

- a step's fake quant ``fq(x) = round(clamp(fl(x / s), lo, hi)) * s + 0`` with NaN -> +0: the
  division, product and sum are single IEEE float32 operations, as torch's kernels are; the
  rounding is half to even by adding and subtracting 1.5 * 2**23, exact for |q| <= 2**22 (the
  sum lies in [2**23, 2**24), where floats are the integers, so it rounds q to the nearest
  integer, ties to the even one, and the subtraction is exact); the code bounds are at most
  2**16 in magnitude;
- ``x - mu``, ``d * d``, ``d * r``, ``y * gamma``, ``y + beta``: single float32 operations;
- ``rsqrt(v + eps)`` as ``1 / sqrt(v + fl32(eps))``: torch computes ``v + eps`` in float32
  (eps cast to float32) and its rsqrt as one division by one square root, both rounded once.

A row's loops are compiled three times on x86-64, for AVX-512, for AVX2 and for the baseline
instruction set, and the loader picks the one the CPU runs (GCC's ``target_clones``); vector
and scalar forms of these operations round alike, and the tests check all three builds.

Only HALF_EVEN rounding and float32 inputs without gradient take it; the caller computes
anything else by torch. The tests demand identical bits against the torch steps.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from quantlab.numerics import native
from quantlab.numerics.dtypes import DType
from quantlab.numerics.norm import NormAxes, NormLayout, NormScales
from quantlab.numerics.quantize import code_range

_SOURCE = (
    native.PRELUDE
    + r"""
/* one step's fake quant at scale s, codes [lo, hi]; NaN -> +0 */
static inline float fq(float x, float s, float lo, float hi) {
  const float q = x / s;
  const float y = round_clamped(q, lo, hi) * s + 0.0f;
  return q != q ? 0.0f : y;
}

CLONES void k1_row(const float *restrict x, float mu, int64_t n, const float *restrict st,
                   float *restrict d, float *restrict sq) {
  const float s1 = st[3], l1 = st[4], h1 = st[5];
  const float s2 = st[6], l2 = st[7], h2 = st[8];
  for (int64_t j = 0; j < n; ++j) {
    const float v = fq(x[j] - mu, s1, l1, h1);
    d[j] = v;
    sq[j] = fq(v * v, s2, l2, h2);
  }
}

/* mu = fq(m); d = fq(x - mu); sq = fq(d * d), row by row (st: scale, lo, hi of each step) */
void norm_k1(const float *x, const float *m, int64_t rows, int64_t n, const float *st,
             float *d, float *sq, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    k1_row(x + r * n, fq(m[r], st[0], st[1], st[2]), n, st, d + r * n, sq + r * n);
}

CLONES void k2_row(const float *restrict d, float rr, int64_t n, const float *restrict st,
                   const float *restrict g, const float *restrict b, float *restrict o) {
  const float s5 = st[15], l5 = st[16], h5 = st[17];
  const float s6 = st[18], l6 = st[19], h6 = st[20];
  const float s7 = st[21], l7 = st[22], h7 = st[23];
  if (g && b) {
    for (int64_t j = 0; j < n; ++j)
      o[j] = fq(fq(fq(d[j] * rr, s5, l5, h5) * g[j], s6, l6, h6) + b[j], s7, l7, h7);
  } else if (g) {
    for (int64_t j = 0; j < n; ++j) o[j] = fq(fq(d[j] * rr, s5, l5, h5) * g[j], s6, l6, h6);
  } else if (b) {
    for (int64_t j = 0; j < n; ++j) o[j] = fq(fq(d[j] * rr, s5, l5, h5) + b[j], s7, l7, h7);
  } else {
    for (int64_t j = 0; j < n; ++j) o[j] = fq(d[j] * rr, s5, l5, h5);
  }
}

/* v = fq(v0); rr = fq(1 / sqrt(v + eps)); y = fq(d * rr), then the gamma and beta steps */
void norm_k2(const float *d, const float *v0, int64_t rows, int64_t n, float eps,
             const float *st, const float *g, const float *b, float *out, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float v = fq(v0[r], st[9], st[10], st[11]);
    const float rr = fq(1.0f / sqrtf(v + eps), st[12], st[13], st[14]);
    k2_row(d + r * n, rr, n, st, g, b, out + r * n);
  }
}
"""
)


def configure(lib: ctypes.CDLL) -> None:
    """Set the argument types of the kernels in ``lib``."""
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.norm_k1.argtypes = [p, p, i64, i64, p, p, p, i32]
    lib.norm_k2.argtypes = [p, p, i64, i64, f32, p, p, p, p, i32]
    lib.norm_k1.restype = lib.norm_k2.restype = None


KERNELS = native.Kernels("norm_fake", _SOURCE, configure, "LayerNorm kernel")


def _step(scale: float, dtype: DType) -> tuple[float, float, float]:
    lo, hi = code_range(dtype)
    return (float(torch.tensor(scale, dtype=torch.float32)), float(lo), float(hi))


@functools.lru_cache(maxsize=4096)
def _steps(
    scales: NormScales, out_scale: float, out_dtype: DType, inter: DType, has_g: bool, has_b: bool
) -> Tensor:
    """(scale, lo, hi) of the eight steps as the kernels read them (float32, 24 values); a
    step the call does not have is zeros."""
    steps = [_step(getattr(scales, k), inter) for k in ("mean", "diff", "square", "var", "rsqrt")]
    out = _step(out_scale, out_dtype)
    unused = (0.0, 0.0, 0.0)
    if not (has_g or has_b):
        steps += [out, unused, unused]
    else:
        g_step = (_step(scales.scaled, inter) if has_b else out) if has_g else unused
        steps += [_step(scales.normed, inter), g_step, out if has_b else unused]
    return torch.tensor([v for step in steps for v in step], dtype=torch.float32)


def _flat(t: Tensor | None) -> Tensor | None:
    if t is None:
        return None
    t = t.detach().reshape(-1)
    return t if t.dtype == torch.float32 and t.is_contiguous() else t.to(torch.float32).contiguous()


@dataclass(frozen=True, eq=False)
class RowsKernel:
    """``norm_fake``'s value (HALF_EVEN) for one LAST layout by the C kernels, its constants (eps,
    the eight steps' scales and code bounds, flat float32 gamma and beta) worked out once:
    ``kernel(x)`` gives the value for ``x``, or None where the kernels do not apply to ``x``
    (not a contiguous float32 CPU tensor, a gradient)."""

    lib: Any
    layout: NormLayout  # a LAST layout
    n: int  # values per row: the product of normalized_shape
    eps: float
    steps: Tensor  # _steps: 24 float32 values
    gamma: Tensor | None  # fake-quantized, flat float32, contiguous
    beta: Tensor | None

    def __call__(self, x: Tensor) -> Tensor | None:
        if (
            x.dtype != torch.float32
            or not x.is_contiguous()  # torch's row means of other strides may sum in another order
            or x.device.type != "cpu"
            or x.requires_grad
        ):
            return None
        shape = self.layout.normalized_shape
        if x.shape[x.dim() - len(shape) :] != shape:
            self.layout.rows(x)  # raises its ValueError
        with torch._C.DisableTorchFunction():
            rows = x.view(-1, self.n)
            n_rows, n = rows.shape
            g, b, st = self.gamma, self.beta, self.steps.data_ptr()
            d = torch.empty_like(rows)
            sq = torch.empty_like(rows)
            out = torch.empty_like(rows)
            threads = max(1, min(torch.get_num_threads(), n_rows))
            m = rows.mean(1)
            self.lib.norm_k1(
                rows.data_ptr(), m.data_ptr(), n_rows, n, st, d.data_ptr(), sq.data_ptr(),
                threads,
            )  # fmt: skip
            v0 = sq.mean(1)
            self.lib.norm_k2(
                d.data_ptr(), v0.data_ptr(), n_rows, n, self.eps, st,
                None if g is None else g.data_ptr(), None if b is None else b.data_ptr(),
                out.data_ptr(), threads,
            )  # fmt: skip
            return out.view(x.shape)


def rows_kernel(
    layout: NormLayout,
    eps: float,
    scales: NormScales,
    out_scale: float,
    out_dtype: DType,
    inter: DType,
    gamma: Tensor | None,
    beta: Tensor | None,
) -> RowsKernel | None:
    """The ``RowsKernel`` of these constants, or None where the C kernels do not apply to any
    input (another layout, a gradient on gamma or beta, no kernel)."""
    if layout.axes is not NormAxes.LAST or any(
        t is not None and t.requires_grad for t in (gamma, beta)
    ):
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    st = _steps(scales, out_scale, out_dtype, inter, gamma is not None, beta is not None)
    n = math.prod(layout.normalized_shape)
    return RowsKernel(lib, layout, n, eps, st, _flat(gamma), _flat(beta))
