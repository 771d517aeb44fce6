"""The ascending order of a batch's float32 values for the MSE search, by a radix sort in C.

The MSE search sorts every batch's nonzero values once per op (``mse_search.BatchValues``), and
numpy's comparison sort took a third of a detector's calibration. Each float32 maps to a uint32
key whose unsigned order is the values' order (sign bit set: all bits flipped; clear: the sign
bit set), so three counting passes over 11, 11 and 10 bits of the keys (least significant
first, each stable) leave them in ascending order; each key maps back to its float32, written as
float64 (exact). The result is the array ``np.sort(x).astype(np.float64)`` gives, for any x
without NaN (-0.0 is ordered before +0.0, which compare equal). ``sort_float64`` returns None
where the C kernel cannot be built; callers then sort with numpy.
"""

from __future__ import annotations

import ctypes

import numpy as np

from quantlab.numerics import native

_SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline uint32_t key_of(uint32_t u) { return (u & 0x80000000u) ? ~u : (u | 0x80000000u); }
static inline uint32_t bits_of(uint32_t k) { return (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k; }

/* keys of x[0..n) sorted ascending by three stable counting passes (11, 11, 10 bits), then
   written back as float64; a and b: scratch of n uint32 each */
void radix_sort_f32_to_f64(const float *restrict x, int64_t n, uint32_t *restrict a,
                           uint32_t *restrict b, double *restrict out) {
  static const int shift[3] = {0, 11, 22};
  int64_t count[3][2048];
  memset(count, 0, sizeof(count));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    const uint32_t k = key_of(u);
    a[i] = k;
    count[0][k & 2047u]++;
    count[1][(k >> 11) & 2047u]++;
    count[2][k >> 22]++;
  }
  uint32_t *src = a, *dst = b;
  for (int p = 0; p < 3; ++p) {
    int64_t *c = count[p];
    int skip = 0;
    for (int d = 0; d < 2048; ++d)
      if (c[d] == n) skip = 1; /* every key has this digit: the pass changes nothing */
    if (skip) continue;
    int64_t total = 0;
    for (int d = 0; d < 2048; ++d) {
      const int64_t v = c[d];
      c[d] = total;
      total += v;
    }
    const int s = shift[p];
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t k = src[i];
      dst[c[(k >> s) & 2047u]++] = k;
    }
    uint32_t *t = src;
    src = dst;
    dst = t;
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = bits_of(src[i]);
    float f;
    memcpy(&f, &u, 4);
    out[i] = (double)f;
  }
}
"""


def _configure(lib: ctypes.CDLL) -> None:
    p = ctypes.c_void_p
    lib.radix_sort_f32_to_f64.argtypes = [p, ctypes.c_int64, p, p, p]
    lib.radix_sort_f32_to_f64.restype = None


KERNELS = native.Kernels("radix_sort", _SOURCE, _configure, "radix sort")


def sort_float64(x: np.ndarray) -> np.ndarray | None:
    """``np.sort(x).astype(np.float64)`` for a 1-d float32 array ``x`` without NaN, by the C
    radix sort (module docstring); None where ``x`` is of another dtype or the kernel is not
    available."""
    if x.dtype != np.float32 or x.ndim != 1:
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    x = np.ascontiguousarray(x)
    n = x.size
    scratch = np.empty((2, n), np.uint32)
    out = np.empty(n, np.float64)
    lib.radix_sort_f32_to_f64(
        x.ctypes.data, n, scratch[0].ctypes.data, scratch[1].ctypes.data, out.ctypes.data
    )
    return out
