"""``norm_fake`` for rows over the trailing dims (LayerNorm) with its elementwise steps in C.

The composite's two row reductions have torch's ``mean`` bits. Where they can, they are
summed in C in torch's own order (``torch_row_sum``: its cascade of vector accumulators, then
one division by n), and the whole composite runs as one pass per row (``norm_rows``). That
order is the process's torch's only if random probe rows say so (``_lanes``); otherwise, and
for rows torch sums otherwise (``torch_sum_lanes``), torch's ``mean`` runs between two C
passes. Every elementwise step runs in C (``quantlab.numerics.native``: C99, no fast-math, no
contraction), the same float32 operations in the same order as
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
#ifdef _OPENMP
#include <omp.h>
#endif

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

/* torch's float32 sum of one contiguous row of n >= V values (SumKernel.cpp's
   vectorized_inner_sum with V-lane vectors, float accumulators): row_sum's four interleaved
   vector accumulators over n / V vectors, summed in multi_row_sum's cascade of four levels
   (level step 2**max(4, ceil(log2(n / 4V)) / 4)), the remaining vectors into the first,
   the other three into it in order; then 0 + the scalar tail in order + the V lanes in
   order, and the zero-filled output's += (0 + s). Each addition is one float32 rounding, in
   this order; the lanes are independent, so vector and scalar code round alike. */
#define QL_LANES 16
static int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t v = (uint64_t)x - 1; v; v >>= 1) ++bits;
  return bits;
}

#if defined(__GNUC__)
#define QL_INLINE static inline __attribute__((always_inline))
#else
#define QL_INLINE static inline
#endif
QL_INLINE float row_sum_lanes(const float *restrict x, int64_t n, const int V) {
  const int64_t vecs = n / V, size = vecs / 4;
  const int64_t lp = ceil_log2(size) / 4 > 4 ? ceil_log2(size) / 4 : 4;
  const int64_t step = (int64_t)1 << lp, mask = step - 1;
  float acc[4][4][QL_LANES] = {{{0}}};
  int64_t i = 0;
  while (i + step <= size) {
    for (int64_t j = 0; j < step; ++j, ++i)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < V; ++l) acc[0][k][l] += x[(i * 4 + k) * V + l];
    for (int j = 1; j < 4; ++j) {
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < V; ++l) {
          acc[j][k][l] += acc[j - 1][k][l];
          acc[j - 1][k][l] = 0.0f;
        }
      if ((i & (mask << (j * lp))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < V; ++l) acc[0][k][l] += x[(i * 4 + k) * V + l];
  for (int j = 1; j < 4; ++j)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < V; ++l) acc[0][k][l] += acc[j][k][l];
  for (int64_t v = size * 4; v < vecs; ++v)
    for (int l = 0; l < V; ++l) acc[0][0][l] += x[v * V + l];
  for (int k = 1; k < 4; ++k)
    for (int l = 0; l < V; ++l) acc[0][0][l] += acc[0][k][l];
  float s = 0.0f;
  for (int64_t j = vecs * V; j < n; ++j) s += x[j];
  for (int l = 0; l < V; ++l) s += acc[0][0][l];
  return 0.0f + s;
}

/* V a constant in each, so that the lane loops vectorize */
CLONES float row_sum8(const float *restrict x, int64_t n) { return row_sum_lanes(x, n, 8); }
CLONES float row_sum16(const float *restrict x, int64_t n) { return row_sum_lanes(x, n, 16); }

static inline float torch_row_sum(const float *x, int64_t n, int V) {
  return V == 16 ? row_sum16(x, n) : row_sum8(x, n);
}

/* torch's mean of each of ``rows`` contiguous rows (its sum / n, one float32 division) */
void torch_row_means(const float *x, int64_t rows, int64_t n, int V, float *out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = torch_row_sum(x + r * n, n, V) / (float)n;
}

/* the whole composite row by row, its two means by torch_row_sum (V lanes); scratch holds
   2n floats per thread (d and the squares) */
void norm_rows(const float *x, int64_t rows, int64_t n, int V, float eps, const float *st,
               const float *g, const float *b, float *out, float *scratch, int threads) {
  #pragma omp parallel num_threads(threads)
  {
#ifdef _OPENMP
    float *d = scratch + 2 * n * (int64_t)omp_get_thread_num();
#else
    float *d = scratch;
#endif
    float *sq = d + n;
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float *xr = x + r * n;
      const float mu = fq(torch_row_sum(xr, n, V) / (float)n, st[0], st[1], st[2]);
      k1_row(xr, mu, n, st, d, sq);
      const float v = fq(torch_row_sum(sq, n, V) / (float)n, st[9], st[10], st[11]);
      const float rr = fq(1.0f / sqrtf(v + eps), st[12], st[13], st[14]);
      k2_row(d, rr, n, st, g, b, out + r * n);
    }
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
    lib.torch_row_means.argtypes = [p, i64, i64, i32, p]
    lib.norm_rows.argtypes = [p, i64, i64, i32, f32, p, p, p, p, p, i32]
    lib.torch_row_means.restype = lib.norm_rows.restype = None


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
            or not x.is_cpu
            or x.requires_grad
        ):
            return None
        shape = self.layout.normalized_shape
        if x.shape[x.dim() - len(shape) :] != shape:
            self.layout.rows(x)  # raises its ValueError
        with torch._C.DisableTorchFunction():
            n = self.n
            n_rows = x.numel() // n
            g, b, st = self.gamma, self.beta, self.steps.data_ptr()
            lanes = torch_sum_lanes(n_rows, n)
            if lanes:  # the whole composite in one pass over the rows (x is contiguous)
                threads = max(1, min(torch.get_num_threads(), n_rows))
                out = torch.empty_like(x)
                scratch = torch.empty(threads, 2, n)
                self.lib.norm_rows(
                    x.data_ptr(), n_rows, n, lanes, self.eps, st,
                    None if g is None else g.data_ptr(), None if b is None else b.data_ptr(),
                    out.data_ptr(), scratch.data_ptr(), threads,
                )  # fmt: skip
                return out
            rows = x.view(n_rows, n)
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


_GRAIN_SIZE = 32768  # at::internal::GRAIN_SIZE: a single row this long is summed by threads
# rows on which torch's sum and torch_row_sum must agree before the C loop stands in for it:
# one vector up to the cascade's second level, with and without a scalar tail
_PROBE_LENGTHS = (16, 23, 64, 100, 384, 513, 1000, 2100, 9001, 40000)


@functools.lru_cache(maxsize=1)
def _lanes() -> int:
    """The lane count (8 or 16) with which ``torch_row_sum`` gives the bits of this process's
    torch sum on every probe row (random values at several magnitudes), else 0. Measured, not
    assumed: torch 2.13's AVX-512 and AVX2 dispatches both sum with 8 lanes here."""
    lib = KERNELS.lib()
    if lib is None:
        return 0
    g = torch.Generator().manual_seed(0)
    probes = [
        torch.randn(2, n, generator=g) * 10.0 ** float(k % 5 * 6 - 12)
        for k, n in enumerate(_PROBE_LENGTHS)
    ]
    with torch._C.DisableTorchFunction():
        for lanes in (8, 16):
            for rows in probes:
                got = torch.empty(2)
                lib.torch_row_means(rows.data_ptr(), 2, rows.shape[1], lanes, got.data_ptr())
                if not torch.equal(got.view(torch.int32), rows.mean(1).view(torch.int32)):
                    break
            else:
                return lanes
    return 0


def torch_sum_lanes(rows: int, n: int) -> int:
    """The lane count V with which ``torch_row_sum`` gives torch's ``sum`` (so its ``mean``) of
    a contiguous float32 (rows, n) tensor over dim 1, bit for bit; 0 where it does not: a
    torch whose sum the probes do not reproduce (``_lanes``), rows shorter than 16 values
    (shorter than one vector, torch sums them in its scalar loop), or one row torch sums in
    parallel pieces (at least GRAIN_SIZE values with several threads)."""
    lanes = _lanes()
    if n < 16 or (rows == 1 and n >= _GRAIN_SIZE and torch.get_num_threads() > 1):
        return 0
    return lanes


def torch_row_means(rows: Tensor) -> Tensor | None:
    """``rows.mean(1)`` of a contiguous float32 (rows, n) CPU tensor by the C loop, the same
    bits; None where ``torch_sum_lanes`` gives 0 or there is no kernel."""
    lanes = torch_sum_lanes(*rows.shape)
    lib = KERNELS.lib()
    if not lanes or lib is None:
        return None
    out = torch.empty(rows.shape[0])
    lib.torch_row_means(rows.data_ptr(), rows.shape[0], rows.shape[1], lanes, out.data_ptr())
    return out


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
    n = math.prod(layout.normalized_shape)
    if n == 0:  # rows of no values: the torch steps
        return None
    st = _steps(scales, out_scale, out_dtype, inter, gamma is not None, beta is not None)
    return RowsKernel(lib, layout, n, eps, st, _flat(gamma), _flat(beta))
