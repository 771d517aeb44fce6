"""``lut_softmax``'s element-wise passes in C, for a softmax over the last axis of contiguous
int8 or int16 codes.

The per-row terms stay torch's (the sum's requantization and the reciprocal table, one value
per row). The rest runs in two C loops per row (``quantlab.numerics.native``: C99, no fast-math,
no contraction), the same operations as ``composite.lut_softmax``:

- exp: ``index = max(x - max(x) + 32768, 0)`` in int32, ``e = map[index]`` through the exp
  table's signed code map (int16), and the row's sum of e in int64;
- product: ``p = fl64(fl64(e * r) * ratio)``, each a single IEEE double operation as torch's
  float64 kernels compute it (e * r is exact: |e * r| <= 2**30), rounded half up as
  ``floor(p)`` plus 1 where ``p - floor(p) >= 0.5`` (the difference is exact), clamped to
  [qmin, qmax]; where every e and r is known nonnegative, p is clamped at qmax before rounding
  and no lower clamp is needed (``composite._product_half_up_codes``, the same two forms).

So the codes are ``lut_softmax``'s, bit for bit; the tests check that against the torch passes on
random and adversarial rows in all three builds.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from quantlab.numerics import native

_SOURCE = (
    native.PRELUDE
    + r"""
/* e = map[max(x - max(x) + 32768, 0)] for one row of int8 or int16 codes X; returns the
   row's sum of e */
#define EXP_ROW(NAME, ENTRY, X)                                                            \
  CLONES static int64_t NAME(const X *restrict x, int64_t n, const int16_t *restrict map, \
                             int16_t *restrict e) {                                       \
    int32_t top = x[0];                                                                    \
    for (int64_t j = 1; j < n; ++j) top = x[j] > top ? x[j] : top;                         \
    int64_t sum = 0;                                                                       \
    for (int64_t j = 0; j < n; ++j) {                                                      \
      int32_t i = (int32_t)x[j] - top + 32768;                                             \
      i = i < 0 ? 0 : i;                                                                   \
      e[j] = map[i];                                                                       \
      sum += e[j];                                                                         \
    }                                                                                      \
    return sum;                                                                            \
  }                                                                                        \
  void ENTRY(const X *x, int64_t rows, int64_t n, const int16_t *map, int16_t *e,          \
             int64_t *sums, int threads) {                                                 \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                      \
    for (int64_t r = 0; r < rows; ++r) sums[r] = NAME(x + r * n, n, map, e + r * n);       \
  }
EXP_ROW(exp_row_i8, sm_exp_i8, int8_t)
EXP_ROW(exp_row_i16, sm_exp_i16, int16_t)

/* codes of round_half_up(p), p = fl64(fl64(e * r) * ratio), for one row: f = floor(p), plus
   1 where p - f >= 0.5 (exact), clamped to [lo, hi] (nonneg: p clamped at hi first, no lower
   clamp) */
#define PRODUCT_ROW(NAME, Y)                                                               \
  CLONES static void NAME(const int16_t *restrict e, double r, int64_t n, double ratio,   \
                          int nonneg, double lo, double hi, Y *restrict o) {             \
    if (nonneg) {                                                                          \
      for (int64_t j = 0; j < n; ++j) {                                                    \
        double p = (double)e[j] * r;                                                       \
        p = p * ratio;                                                                     \
        p = p > hi ? hi : p;                                                               \
        const double f = floor(p);                                                         \
        o[j] = (Y)(p - f >= 0.5 ? f + 1.0 : f);                                            \
      }                                                                                    \
    } else {                                                                               \
      for (int64_t j = 0; j < n; ++j) {                                                    \
        double p = (double)e[j] * r;                                                       \
        p = p * ratio;                                                                     \
        const double f = floor(p);                                                         \
        p = p - f >= 0.5 ? f + 1.0 : f;                                                    \
        p = p < lo ? lo : p;                                                               \
        o[j] = (Y)(p > hi ? hi : p);                                                       \
      }                                                                                    \
    }                                                                                      \
  }
PRODUCT_ROW(product_row_i8, int8_t)
PRODUCT_ROW(product_row_i16, int16_t)

#define PRODUCT(NAME, ROW, Y)                                                              \
  void NAME(const int16_t *e, const int16_t *r, int64_t rows, int64_t n, double ratio,     \
            int nonneg, double lo, double hi, Y *out, int threads) {                      \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                      \
    for (int64_t i = 0; i < rows; ++i)                                                     \
      ROW(e + i * n, (double)r[i], n, ratio, nonneg, lo, hi, out + i * n);                 \
  }
PRODUCT(sm_product_i8, product_row_i8, int8_t)
PRODUCT(sm_product_i16, product_row_i16, int16_t)
"""
)


def configure(lib: ctypes.CDLL) -> None:
    """Set the argument types of the kernels in ``lib``."""
    p, i64, i32, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
    for name in ("sm_exp_i8", "sm_exp_i16"):
        f = getattr(lib, name)
        f.argtypes = [p, i64, i64, p, p, p, i32]
        f.restype = None
    for name in ("sm_product_i8", "sm_product_i16"):
        f = getattr(lib, name)
        f.argtypes = [p, p, i64, i64, f64, i32, f64, f64, p, i32]
        f.restype = None


KERNELS = native.Kernels("softmax", _SOURCE, configure, "softmax kernel")
_PRODUCT = {torch.int8: "sm_product_i8", torch.int16: "sm_product_i16"}
_EXP = {torch.int8: "sm_exp_i8", torch.int16: "sm_exp_i16"}


def exp_rows(codes: Tensor, exp_map: Tensor) -> tuple | None:
    """(e as int16, the row sums of e as int64 of shape ``codes.shape[:-1] + (1,)``) of int8 or
    int16 ``codes`` over their last axis through ``exp_map`` (the exp table's signed code map,
    int16), or None where the C loop does not apply (not contiguous int8/int16 CPU codes, an
    empty row, no kernel)."""
    if (
        codes.dtype not in _EXP
        or codes.device.type != "cpu"
        or not codes.is_contiguous()
        or codes.dim() == 0
        or codes.shape[-1] == 0
        or exp_map.dtype != torch.int16
        or exp_map.numel() != 65536
        or not exp_map.is_contiguous()
    ):
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    with torch._C.DisableTorchFunction():
        n = codes.shape[-1]
        rows = codes.numel() // n
        e = torch.empty(codes.shape, dtype=torch.int16)
        sums = torch.empty(codes.shape[:-1] + (1,), dtype=torch.int64)
        threads = max(1, min(torch.get_num_threads(), rows))
        getattr(lib, _EXP[codes.dtype])(
            codes.data_ptr(), rows, n, exp_map.data_ptr(), e.data_ptr(), sums.data_ptr(), threads
        )
        return e, sums


def product_rows(
    e: Tensor,
    r: Tensor,
    ratio: float,
    qmin: int,
    qmax: int,
    out_dtype: torch.dtype,
    nonnegative: bool,
) -> Tensor | None:
    """``composite._product_half_up_codes(e, r, ratio, ...)`` for contiguous int16 ``e`` and
    one int16 ``r`` per row (shape ``e.shape[:-1] + (1,)``), or None where the C loop does not
    apply."""
    if (
        e.dtype != torch.int16
        or r.dtype != torch.int16
        or not e.is_contiguous()
        or e.device.type != "cpu"
        or e.dim() == 0
        or tuple(r.shape) != tuple(e.shape[:-1]) + (1,)
        or out_dtype not in _PRODUCT
    ):
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    with torch._C.DisableTorchFunction():
        n = e.shape[-1]
        rows = e.numel() // n if n else 0
        out = torch.empty(e.shape, dtype=out_dtype)
        if rows:
            rc = r.contiguous()
            threads = max(1, min(torch.get_num_threads(), rows))
            getattr(lib, _PRODUCT[out_dtype])(
                e.data_ptr(), rc.data_ptr(), rows, n, float(ratio),
                int(bool(nonnegative and ratio > 0)), float(qmin), float(qmax),
                out.data_ptr(), threads,
            )  # fmt: skip
        return out
