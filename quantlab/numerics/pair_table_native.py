"""``pair_table.lookup`` in one C pass, for contiguous CPU codes whose broadcast is a repeat.

The index of a pair is ``256 * (x mod 256) + (y mod 256)``, as ``pair_table.lookup`` forms it
(an int32 index in torch), and the result is the table's entry: a copy, so the bits are the
table's. The loop ``out[i] = table[(x[i % nx] << 8) | y[i % ny]]`` (``quantlab.numerics.native``)
covers operands that each either have the output's shape or repeat along its leading dims (their
shape, leading 1s dropped, is a suffix of the output's shape: a mask added to every head's
scores), both contiguous; ``lookup_native`` declines (None) anything else, and torch's passes
serve it. Table entries of 1, 2, 4 and 8 bytes; OpenMP on torch's intra-op thread count, each
thread a contiguous share of the output; operands of the output's size (a residual add) take
a loop with no repeat to follow (0.74x the time of the general loop on a (1, 128, 384) add).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from quantlab.numerics import native

MIN_ELEMENTS = 1  # one C call beats the torch passes at every size (empty: torch)
ELEMENT_SIZES = (1, 2, 4, 8)

_SOURCE = r"""
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

/* out[i] = table[(x[i % nx] << 8) | y[i % ny]] for i in [0, n); nx and ny divide n */
#define PAIR_LOOKUP(T, TT)                                                                \
  void pair_lookup_t##T(const uint8_t *restrict x, int64_t nx, const uint8_t *restrict y,  \
                        int64_t ny, const TT *restrict table, TT *restrict out, int64_t n, \
                        int threads) {                                                    \
    _Pragma("omp parallel num_threads(threads)") {                                        \
      const int64_t t = omp_get_thread_num(), k = omp_get_num_threads();                  \
      const int64_t start = t * n / k, end = (t + 1) * n / k;                             \
      if (nx == n && ny == n) { /* the same shapes: no repeat to follow */                \
        for (int64_t i = start; i < end; ++i)                                             \
          out[i] = table[((uint32_t)x[i] << 8) | y[i]];                                   \
      } else {                                                                            \
        int64_t jx = start % nx, jy = start % ny;                                         \
        for (int64_t i = start; i < end; ++i) {                                           \
          out[i] = table[((uint32_t)x[jx] << 8) | y[jy]];                                 \
          if (++jx == nx) jx = 0;                                                         \
          if (++jy == ny) jy = 0;                                                         \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  }
PAIR_LOOKUP(1, uint8_t)
PAIR_LOOKUP(2, uint16_t)
PAIR_LOOKUP(4, uint32_t)
PAIR_LOOKUP(8, uint64_t)
"""


def configure(lib: ctypes.CDLL) -> None:
    """Set the argument types of the kernels in ``lib``."""
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for t in ELEMENT_SIZES:
        fn = getattr(lib, f"pair_lookup_t{t}")
        fn.argtypes = [p, i64, p, i64, p, p, i64, ctypes.c_int]
        fn.restype = None


KERNELS = native.Kernels("pair_lookup", _SOURCE, configure, "pair-table look-up")


def repeat_shape(x: Tensor, y: Tensor) -> tuple | None:
    """The broadcast shape of ``x`` and ``y`` when one of them has it (as many values as the
    output) and the other repeats along its leading dims (its shape, leading 1s dropped, is a
    suffix of the first's), else None."""
    big, small = (x, y) if x.numel() >= y.numel() else (y, x)
    dims = tuple(small.shape)
    while dims and dims[0] == 1:
        dims = dims[1:]
    if len(dims) > big.dim() or tuple(big.shape[big.dim() - len(dims) :]) != dims:
        return None
    return (1,) * (small.dim() - big.dim()) + tuple(big.shape)


def lookup_native(table: Tensor, x: Tensor, y: Tensor) -> Tensor | None:
    """``pair_table.lookup(table, x, y)`` by the C pass (the same entries), or None where it
    does not apply (module docstring; no outputs, not CPU, another entry
    size, no kernel)."""
    if (
        x.device.type != "cpu"
        or y.device.type != "cpu"
        or table.device.type != "cpu"
        or table.dim() != 1
        or table.numel() != 1 << 16
        or not table.is_contiguous()
        or table.element_size() not in ELEMENT_SIZES
    ):
        return None
    shape = repeat_shape(x, y)
    if shape is None or not x.is_contiguous() or not y.is_contiguous():
        return None
    n = max(x.numel(), y.numel())
    if n < MIN_ELEMENTS:
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    with torch._C.DisableTorchFunction():  # not the model's ops
        out = torch.empty(shape, dtype=table.dtype)
        threads = max(1, min(torch.get_num_threads(), n >> 14))
        fn = getattr(lib, f"pair_lookup_t{table.element_size()}")
        fn(
            x.data_ptr(), x.numel(), y.data_ptr(), y.numel(), table.data_ptr(), out.data_ptr(),
            n, threads,
        )  # fmt: skip
        return out
