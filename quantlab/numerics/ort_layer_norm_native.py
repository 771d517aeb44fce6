"""``ort_layer_norm``'s MLAS rows (n >= 8) in C: the same float64 and float32 operations in the
same order as ``ort_layer_norm._mlas_rows`` (its docstring states them), one row per OpenMP
iteration.

Compiled by ``quantlab.numerics.native`` (C99, no fast-math, no contraction: ``d * d + v`` is
two roundings as written). The fused steps call C99's ``fmaf``, correctly rounded by the
standard (the FMA instruction where the CPU has one, else the C library's exact emulation),
and ``sqrtf`` is IEEE's square root; float64 lane sums and the conversion to float32 round to
nearest even. The tests demand identical bits against the torch form, on every tail length,
on all three builds (AVX-512, AVX2, baseline).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from quantlab.numerics import native

_SOURCE = (
    native.PRELUDE
    + r"""
CLONES static void mlas_row(const float *restrict x, int64_t n, const float *restrict g,
                            const float *restrict b, float eps, float *restrict y) {
  double lane[4] = {0.0, 0.0, 0.0, 0.0};
  const int64_t q4 = n / 4 * 4, q8 = n / 8 * 8, t4 = q8 + (n - q8) / 4 * 4;
  for (int64_t i = 0; i < q4; i += 4)
    for (int j = 0; j < 4; ++j) lane[j] += (double)x[i + j];
  double total = (lane[0] + lane[2]) + (lane[1] + lane[3]);
  for (int64_t k = q4; k < n; ++k) total += (double)x[k];
  const float mean = (float)(total / (double)n);
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t i = 0; i < q8; i += 8)
    for (int j = 0; j < 8; ++j) {
      const float d = x[i + j] - mean;
      acc[j] = fmaf(d, d, acc[j]);
    }
  float half[4];
  for (int j = 0; j < 4; ++j) half[j] = acc[j] + acc[j + 4];
  float var = (half[0] + half[2]) + (half[1] + half[3]);
  for (int64_t k = q8; k < t4; ++k) {
    const float d = x[k] - mean;
    var = var + d * d;
  }
  for (int64_t k = t4; k < n; ++k) {
    const float d = x[k] - mean;
    var = fmaf(d, d, var);
  }
  const float inv = 1.0f / sqrtf(var / (float)n + eps);
  if (b) {
    for (int64_t j = 0; j < n; ++j) y[j] = fmaf((x[j] - mean) * inv, g[j], b[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) y[j] = ((x[j] - mean) * inv) * g[j];
  }
}

void mlas_rows(const float *x, int64_t rows, int64_t n, const float *g, const float *b,
               float eps, float *y, int threads) {
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) mlas_row(x + r * n, n, g, b, eps, y + r * n);
}
"""
)


def configure(lib: ctypes.CDLL) -> None:
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.mlas_rows.argtypes = [p, i64, i64, p, p, f32, p, i32]
    lib.mlas_rows.restype = None


KERNELS = native.Kernels("ort_layer_norm", _SOURCE, configure, "onnxruntime LayerNorm kernel")


def mlas_rows(rows: Tensor, g: Tensor, b: Tensor | None, eps32: Tensor) -> Tensor | None:
    """``_mlas_rows`` of float32 (r, n) ``rows`` (n >= 8) by the C kernel; None when it is not
    built (the caller computes by torch)."""
    lib = KERNELS.lib()
    if lib is None:
        return None
    with torch._C.DisableTorchFunction():
        x = rows.contiguous()
        g = g.contiguous()
        b = None if b is None else b.contiguous()
        y = torch.empty_like(x)
        threads = max(1, min(torch.get_num_threads(), x.shape[0]))
        lib.mlas_rows(
            x.data_ptr(), x.shape[0], x.shape[1], g.data_ptr(),
            None if b is None else b.data_ptr(), float(eps32), y.data_ptr(), threads,
        )  # fmt: skip
    return y
