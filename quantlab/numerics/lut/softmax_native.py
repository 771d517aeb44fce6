"""``lut_softmax``'s element-wise passes in C, for a softmax over the last axis of contiguous
int8 or int16 codes.

Every step runs in one C pass per row (``softmax_rows``; ``quantlab.numerics.native``: C99, no
fast-math, no contraction), the same operations as ``composite.lut_softmax``; ``exp_rows`` and
``product_rows`` are its first and last steps alone, with the two per-row terms in torch:

- exp: ``index = max(x - max(x) + 32768, 0)`` in int32, ``e = map[index]`` through the exp
  table's signed code map (int16), and the row's sum of e in int64;
- product: ``p = fl64(fl64(e * r) * ratio)``, each a single IEEE double operation as torch's
  float64 kernels compute it (e * r is exact: |e * r| <= 2**30), rounded half up and clamped
  to [qmin, qmax] (``composite._product_half_up_codes``, the same codes). The loop rounds by
  ``floor(fl64(p + 0.5))`` (where every e and r is known nonnegative, the truncation of
  ``min(fl64(p + 0.5), qmax)``), which is round_half_up(p) for every double |p| < 2**52 but
  one (beyond, both saturate):
  p + 0.5 is exact unless its value needs a finer step than the doubles around it have, and
  rounding it can only change the floor when it carries p + 0.5 up to an integer n. For
  n = 2**m with m >= 1, p >= 2**(m-1) has a step no finer than that of [2**(m-1), 2**m), where
  p + 0.5 lies, so the sum is exact; for other n >= 1, p and n lie in one binade and the sum is
  exact; for n <= 0 the sum's magnitude is below p's and it is exact. Only n = 1 with p in
  [0.25, 0.5) remains, where the step of p is 2**-54 and of [0.5, 1) 2**-53: p = 0.5 - 2**-54
  gives p + 0.5 = 1 - 2**-54, a tie that rounds to 1, where round_half_up(p) is 0. The loop
  gives that p the code 0. The tests check both forms against ``requant_half_up`` of the int64
  product there and on the doubles within 8 steps of k + 1/2 for small k and around powers of
  two.

- per row, between them: ``s = clamp(round_half_up(fl64(sum * sum_ratio)), -32768, 32767)``
  (``requant_half_up``: the sum is an exact double, below 2**53; half up as floor plus 1 where
  the fraction is >= 0.5, exact), and ``r`` the reciprocal table's output at s, read from its
  code map by the code as unsigned (what ``SegmentLut.evaluate`` gathers).

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

/* codes of round_half_up(p), p = fl64(fl64(e * r) * ratio), for one row, as floor(p + 0.5)
   (nonneg: every p >= 0, so the conversion's truncation) except at the one double where
   p + 0.5 rounds up to an integer, p = 0.5 - 2**-54 (module docstring), whose code is 0;
   clamped to [lo, hi] */
#define PRODUCT_ROW(NAME, Y)                                                               \
  CLONES static void NAME(const int16_t *restrict e, double r, int64_t n, double ratio,   \
                          int nonneg, double lo, double hi, Y *restrict o) {             \
    const double below_half = 0x1.fffffffffffffp-2;                                        \
    if (nonneg) {                                                                          \
      for (int64_t j = 0; j < n; ++j) {                                                    \
        double p = (double)e[j] * r;                                                       \
        p = p * ratio;                                                                     \
        double s = p == below_half ? 0.0 : p + 0.5;                                        \
        o[j] = (Y)(s > hi ? hi : s);                                                       \
      }                                                                                    \
    } else {                                                                               \
      for (int64_t j = 0; j < n; ++j) {                                                    \
        double p = (double)e[j] * r;                                                       \
        p = p * ratio;                                                                     \
        double s = p == below_half ? 0.0 : floor(p + 0.5);                                 \
        s = s < lo ? lo : s;                                                               \
        o[j] = (Y)(s > hi ? hi : s);                                                       \
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

/* the whole softmax per row: exp and its sum, the sum's code s = clamp(round_half_up(
   fl64(sum * sratio)), -32768, 32767) (floor plus 1 where the fraction is >= 0.5, exact), the
   reciprocal table's output at s (rmap: by the code read as unsigned), the product */
#define SOFTMAX(NAME, EXP, PROD, X, Y)                                                     \
  void NAME(const X *x, int64_t rows, int64_t n, const int16_t *emap, double sratio,       \
            const int16_t *rmap, double ratio, int nonneg, double lo, double hi,           \
            int16_t *e, Y *out, int threads) {                                             \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                      \
    for (int64_t i = 0; i < rows; ++i) {                                                   \
      double p = (double)EXP(x + i * n, n, emap, e + i * n) * sratio;                      \
      const double f = floor(p);                                                           \
      p = p - f >= 0.5 ? f + 1.0 : f;                                                      \
      p = p < -32768.0 ? -32768.0 : p;                                                     \
      p = p > 32767.0 ? 32767.0 : p;                                                       \
      const double r = (double)rmap[(uint16_t)(int16_t)p];                                 \
      PROD(e + i * n, r, n, ratio, nonneg, lo, hi, out + i * n);                           \
    }                                                                                      \
  }
SOFTMAX(sm_rows_i8_i8, exp_row_i8, product_row_i8, int8_t, int8_t)
SOFTMAX(sm_rows_i8_i16, exp_row_i8, product_row_i16, int8_t, int16_t)
SOFTMAX(sm_rows_i16_i8, exp_row_i16, product_row_i8, int16_t, int8_t)
SOFTMAX(sm_rows_i16_i16, exp_row_i16, product_row_i16, int16_t, int16_t)

#define QAT_CHUNK 512
#define QAT_GROUP 8
#define QAT_GROUP_VALUES 8192
/* the QAT softmax (``qat_rows``) for g rows of n float32 values: float32 operations as
   torch's, no contraction. Each step runs over the g rows before the next, so that one row's
   serial chain (its maximum's reduction; its sum, reciprocal and fake quants) overlaps the
   others' work. Per row:
   - the maximum m (a reduction in any order: the largest value, whatever the order, where the
     row holds no NaN; +0 and -0 give the same codes) and whether the row holds a NaN; a row
     with a NaN, or whose m is infinite (x - m is then NaN somewhere), gives NaN outputs, as
     torch's passes;
   - per chunk of the row, the codes k = -d, e = evals[k] and the row sum of e in 8 double
     lanes (exact in any order: ``composite.qat_softmax``), rounded once to float32;
   - the sum's fake quant, the clipped reciprocal's fake quant rq;
   - the product e * rq, and with ``fuse_out`` its fake quant (out_rf, out_sf, code bounds
     [out_lo, out_hi]) in the same loop */
CLONES static void qat_group(const float *restrict x, int64_t g, int64_t n,
                            const float *restrict evals, float inv_in, float inv_sum,
                            float sum_scale, float floor_, float inv_recip, float recip_scale,
                            int fuse_out, float out_rf, float out_sf, float out_lo,
                            float out_hi, float *restrict o) {
  int64_t j;
  float top[QAT_GROUP], rq[QAT_GROUP];
  int bad[QAT_GROUP];
  double total[QAT_GROUP];
  for (int64_t r = 0; r < g; ++r) {
    const float *xr = x + r * n;
    float m = -INFINITY;
    int nan = 0;
    _Pragma("omp simd reduction(max : m) reduction(| : nan)")
    for (j = 0; j < n; ++j) {
      m = xr[j] > m ? xr[j] : m;
      nan |= xr[j] != xr[j];
    }
    top[r] = m;
    bad[r] = nan || m == INFINITY || m == -INFINITY;
  }
  for (int64_t r = 0; r < g; ++r) {
    const float *xr = x + r * n;
    float *orow = o + r * n;
    const float m = top[r];
    double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    for (int64_t c = 0; c < n && !bad[r]; c += QAT_CHUNK) {
      const int64_t len = n - c < QAT_CHUNK ? n - c : QAT_CHUNK;
      int32_t k[QAT_CHUNK];
      for (j = 0; j < len; ++j)
        k[j] = (int32_t)(-round_clamped((xr[c + j] - m) * inv_in, -32768.0f, 32767.0f));
      for (j = 0; j < len; ++j) orow[c + j] = evals[k[j]];
      for (j = 0; j + 8 <= len; j += 8)
        for (int t = 0; t < 8; ++t) acc[t] += (double)orow[c + j + t];
      for (; j < len; ++j) acc[0] += (double)orow[c + j];
    }
    double sum = 0.0;
    for (int t = 0; t < 8; ++t) sum += acc[t];
    total[r] = sum;
  }
  for (int64_t r = 0; r < g; ++r) {
    const float sum = (float)total[r];
    const float s = round_clamped(sum * inv_sum, -32768.0f, 32767.0f) * sum_scale;
    const float recip = 1.0f / (s < floor_ ? floor_ : s);
    rq[r] = round_clamped(recip * inv_recip, -32768.0f, 32767.0f) * recip_scale;
  }
  for (int64_t r = 0; r < g; ++r) {
    float *orow = o + r * n;
    const float q = rq[r];
    if (bad[r])
      for (j = 0; j < n; ++j) orow[j] = NAN;
    else if (fuse_out)
      for (j = 0; j < n; ++j) {
        const float p = orow[j] * q;
        orow[j] = round_clamped(p * out_rf, out_lo, out_hi) * out_sf + 0.0f;
      }
    else
      for (j = 0; j < n; ++j) orow[j] = orow[j] * q;
  }
}

/* groups of up to QAT_GROUP rows and QAT_GROUP_VALUES values (a group's outputs stay in the
   core's cache between its steps) */
void sm_qat_rows(const float *x, int64_t rows, int64_t n, const float *evals, float inv_in,
                 float inv_sum, float sum_scale, float floor_, float inv_recip,
                 float recip_scale, int fuse_out, float out_rf, float out_sf, float out_lo,
                 float out_hi, float *out, int threads) {
  const int64_t fit = QAT_GROUP_VALUES / n;
  const int64_t g = fit < 1 ? 1 : fit > QAT_GROUP ? QAT_GROUP : fit;
  const int64_t groups = (rows + g - 1) / g;
  _Pragma("omp parallel for num_threads(threads) schedule(static)")
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t len = rows - i * g < g ? rows - i * g : g;
    qat_group(x + i * g * n, len, n, evals, inv_in, inv_sum, sum_scale, floor_, inv_recip,
              recip_scale, fuse_out, out_rf, out_sf, out_lo, out_hi, out + i * g * n);
  }
}
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
    for name in _ROWS.values():
        f = getattr(lib, name)
        f.argtypes = [p, i64, i64, p, f64, p, f64, i32, f64, f64, p, p, i32]
        f.restype = None
    f32 = ctypes.c_float
    lib.sm_qat_rows.argtypes = [p, i64, i64, p, f32, f32, f32, f32, f32, f32, i32]
    lib.sm_qat_rows.argtypes += [f32, f32, f32, f32, p, i32]
    lib.sm_qat_rows.restype = None


_PRODUCT = {torch.int8: "sm_product_i8", torch.int16: "sm_product_i16"}
_EXP = {torch.int8: "sm_exp_i8", torch.int16: "sm_exp_i16"}
_SUFFIX = {torch.int8: "i8", torch.int16: "i16"}
_ROWS = {(a, b): f"sm_rows_{_SUFFIX[a]}_{_SUFFIX[b]}" for a in _SUFFIX for b in _SUFFIX}
KERNELS = native.Kernels("softmax", _SOURCE, configure, "softmax kernel")


def _maps_apply(codes: Tensor, exp_map: Tensor) -> bool:
    """Whether the exp pass takes ``codes`` (contiguous int8/int16 CPU codes, non-empty rows)
    with ``exp_map`` (the exp table's signed code map: 65536 contiguous int16 entries)."""
    return (
        codes.dtype in _EXP
        and codes.device.type == "cpu"
        and codes.is_contiguous()
        and codes.dim() > 0
        and codes.shape[-1] > 0
        and exp_map.dtype == torch.int16
        and exp_map.numel() == 65536
        and exp_map.is_contiguous()
    )


def _rows_of(codes: Tensor) -> tuple:
    """(row length, rows, threads, an int16 buffer for e) of codes over their last axis."""
    n = codes.shape[-1]
    rows = codes.numel() // n
    threads = max(1, min(torch.get_num_threads(), rows))
    return n, rows, threads, torch.empty(codes.shape, dtype=torch.int16)


def softmax_rows(
    codes: Tensor,
    exp_map: Tensor,
    sum_ratio: float,
    recip_map: Tensor,
    ratio: float,
    qmin: int,
    qmax: int,
    out_dtype: torch.dtype,
    nonnegative: bool,
) -> Tensor | None:
    """``lut_softmax``'s codes over the last axis in one C pass per row: ``exp_rows``, then per
    row ``s = requant_half_up(sum, sum_ratio, INT16)`` and ``r = recip_map[s]`` (the reciprocal
    table's code map, indexed by the code read as unsigned: what ``evaluate`` gathers), then
    ``product_rows``; or None where the C loops do not apply."""
    if (
        not _maps_apply(codes, exp_map)
        or out_dtype not in _PRODUCT
        or recip_map.dtype != torch.int16
        or recip_map.numel() != 65536
        or not recip_map.is_contiguous()
    ):
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    with torch._C.DisableTorchFunction():
        n, rows, threads, e = _rows_of(codes)
        out = torch.empty(codes.shape, dtype=out_dtype)
        getattr(lib, _ROWS[codes.dtype, out_dtype])(
            codes.data_ptr(), rows, n, exp_map.data_ptr(), float(sum_ratio),
            recip_map.data_ptr(), float(ratio), int(bool(nonnegative and ratio > 0)),
            float(qmin), float(qmax), e.data_ptr(), out.data_ptr(), threads,
        )  # fmt: skip
        return out


def exp_rows(codes: Tensor, exp_map: Tensor) -> tuple | None:
    """(e as int16, the row sums of e as int64 of shape ``codes.shape[:-1] + (1,)``) of int8 or
    int16 ``codes`` over their last axis through ``exp_map`` (the exp table's signed code map,
    int16), or None where the C loop does not apply (not contiguous int8/int16 CPU codes, an
    empty row, no kernel)."""
    if not _maps_apply(codes, exp_map):
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    with torch._C.DisableTorchFunction():
        n, rows, threads, e = _rows_of(codes)
        sums = torch.empty(codes.shape[:-1] + (1,), dtype=torch.int64)
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


def qat_rows(
    x: Tensor,
    exp_values: Tensor,
    inv_in: float,
    inv_sum: float,
    sum_scale: float,
    floor: float,
    inv_recip: float,
    recip_scale: float,
    out_quant: tuple[float, float, int, int] | None = None,
) -> Tensor | None:
    """``composite.qat_softmax``'s product e * r over the last axis of contiguous float32
    ``x`` in one C pass per row, for HALF_EVEN fake quants by the float32 reciprocal of the
    scale (torch's kernel: ``round_clamped(v * inv)`` times the scale, each a float32
    operation): d = fq(x - max(x)), e = ``exp_values[-d code]``, the row sum of e in double
    (exact in any order, as ``composite.qat_softmax`` proves), rounded once to float32, its
    fake quant, the clipped reciprocal's fake quant r, e * r; with ``out_quant`` = (rf, sf,
    lo, hi), e * r fake-quantized as ``fake_quant_native.reciprocal`` does, in the same loop.
    A row holding a NaN, or whose maximum is infinite, gives NaN (as the torch passes). Every
    other argument a float32 value. None where the loop does not apply."""
    if (
        x.dtype != torch.float32
        or x.device.type != "cpu"
        or not x.is_contiguous()
        or x.dim() == 0
        or x.shape[-1] == 0
        or exp_values.dtype != torch.float32
        or exp_values.numel() != 32769
        or not exp_values.is_contiguous()
    ):
        return None
    lib = KERNELS.lib()
    if lib is None:
        return None
    fuse, (rf, sf, lo, hi) = out_quant is not None, out_quant or (1.0, 1.0, 0, 0)
    with torch._C.DisableTorchFunction():
        n = x.shape[-1]
        rows = x.numel() // n
        threads = max(1, min(torch.get_num_threads(), rows))
        out = torch.empty(x.shape, dtype=torch.float32)
        lib.sm_qat_rows(
            x.data_ptr(), rows, n, exp_values.data_ptr(), inv_in, inv_sum, sum_scale, floor,
            inv_recip, recip_scale, int(fuse), rf, sf, lo, hi, out.data_ptr(), threads,
        )  # fmt: skip
        return out
